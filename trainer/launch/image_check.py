"""`python -m trainer.launch.image_check`: does this Python have everything bertctl needs?

Run by a job on a stock container image (`container.install: wheel`) after bertctl's wheel was
installed without its dependencies: it compares the packages bertctl's metadata requires with the
ones installed and lists what the image lacks (exit 2), so the job stops before any rank starts.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata


def missing_requirements(distribution: str = "bertctl") -> list[str]:
    """Requirements (without extras) whose package is not installed."""
    missing = []
    for requirement in metadata.requires(distribution) or []:
        if "extra ==" in requirement:
            continue
        name = re.split(r"[ <>=!~;\[(]", requirement, maxsplit=1)[0]
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(requirement.split(";")[0].strip())
    return missing


def main() -> int:
    try:
        missing = missing_requirements()
    except metadata.PackageNotFoundError:
        print("error: bertctl is not installed in this Python", file=sys.stderr)
        return 2
    if missing:
        print(f"error: the image lacks {len(missing)} package(s) bertctl needs: {', '.join(missing)} "
              "(add them to the image, or build one with the Dockerfile)", file=sys.stderr)
        return 2
    print(f"image check: every package bertctl {metadata.version('bertctl')} needs is installed", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
