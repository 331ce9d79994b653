"""Where the shipped templates, cluster files and dataset manifests live.

In a source checkout (or an editable install) they are the top-level folders next to this package;
a normal install puts them in site-packages/bertctl_share/ next to this package (pyproject.toml).
"""

from __future__ import annotations

import os
from pathlib import Path

from trainer.config.paths import DEFAULT_BERTCTL_HOME

KINDS = ("templates", "clusters", "datasets")


def shipped_dir(kind: str) -> Path:
    assert kind in KINDS, kind
    top = Path(__file__).resolve().parent.parent  # the checkout, or site-packages
    for candidate in (top / kind, top / "bertctl_share" / kind):
        if candidate.is_dir():
            return candidate
    raise RuntimeError(f"bertctl is installed without its {kind}/ folder (looked in {top})")


def bertctl_home() -> Path:
    """Per-user state: the experiment registry and prepared datasets ($BERTCTL_HOME, ~/.bertctl)."""
    return Path(os.environ.get("BERTCTL_HOME") or DEFAULT_BERTCTL_HOME).expanduser()


def search_dirs(kind: str) -> list[Path]:
    """User folders first ($BERTCTL_CLUSTERS / $BERTCTL_DATASETS, colon-separated), then the shipped one."""
    env = {"clusters": "BERTCTL_CLUSTERS", "datasets": "BERTCTL_DATASETS"}.get(kind)
    user = [Path(p).expanduser() for p in os.environ.get(env, "").split(":") if p] if env else []
    return user + [shipped_dir(kind)]


def source_root() -> Path | None:
    """The source checkout this bertctl runs from (an editable install), or None for an installed package."""
    top = Path(__file__).resolve().parent.parent
    return top if (top / "pyproject.toml").is_file() else None
