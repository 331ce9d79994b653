"""Which of the carried wheels this Python needs, and whether the folder holds them (standard library only).

    python benchmarks/gpu/wheels.py FOLDER     # prints the wheel files to install, one a line; exit 2 with
                                               # one line naming what is missing and how to get it

The GPU machine's Python has torch and most of bertctl's needs but reaches no registry: what it lacks
travels as wheels, pinned in benchmarks/gpu/requirements.txt and downloaded by `make gpu-wheels`. A
pinned package this Python already has at that version or newer is used as it is; each other one
needs a wheel in FOLDER built for this Python (a `py3` wheel, or `cpXY` for this interpreter's version).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

REQUIREMENTS = Path(__file__).with_name("requirements.txt")
MAKE_HINT = "make gpu-wheels GPU_PYTHON={version} (on a machine with a registry; then carry {folder} along)"


def normalize(name: str) -> str:
    """PEP 503 names: `pydantic_core`, `Pydantic-Core` and `pydantic.core` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned() -> list[tuple[str, str]]:
    """(name, version) of every `name==version` line of requirements.txt."""
    pins = []
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins.append((name.strip(), version.strip()))
    return pins


def release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version (`2.11.0+cu130` -> (2, 11, 0)); enough to compare pins."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def installed_at_least(name: str, version: str) -> bool:
    try:
        return release(metadata.version(name)) >= release(version)
    except metadata.PackageNotFoundError:
        return False


def fits_this_python(wheel: str) -> bool:
    """A wheel's file name: NAME-VERSION(-BUILD)-PYTAG-ABITAG-PLATFORM.whl; pure or for this CPython."""
    python_tags, abi_tags = wheel[:-len(".whl")].split("-")[-3:-1]
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return any(t in ("py3", here) for t in python_tags.split(".")) or "abi3" in abi_tags.split(".")


def wheels_to_install(folder: Path) -> list[Path]:
    """The wheel of every pinned package this Python lacks; ValueError (one line) when one is missing."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    hint = MAKE_HINT.format(version=version, folder=folder)
    found = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    chosen = []
    for name, version_pin in pinned():
        if installed_at_least(name, version_pin):
            continue
        mine = [w for w in found if normalize(w.name.split("-")[0]) == normalize(name) and w.name.split("-")[1] == version_pin]
        if not mine:
            raise ValueError(f"{folder}: no wheel of {name}=={version_pin}, which this Python lacks: {hint}")
        usable = [w for w in mine if fits_this_python(w.name)]
        if not usable:
            raise ValueError(f"{folder}: {mine[0].name} is not for this Python ({sys.version.split()[0]}): {hint}")
        chosen.append(usable[0])
    return chosen


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python benchmarks/gpu/wheels.py FOLDER", file=sys.stderr)
        return 2
    try:
        wheels = wheels_to_install(Path(argv[0]))
    except ValueError as e:
        print(f"device_run: {e}", file=sys.stderr)
        return 2
    for wheel in wheels:
        print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
