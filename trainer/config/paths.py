"""Paths in configuration files: `~` and `$VARS`, expanded on the node that uses them.

Never by the orchestrator for a job's paths, because the login node's environment is not the job's.
"""

from __future__ import annotations

import os
import re

DEFAULT_BERTCTL_HOME = "~/.bertctl"

_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")


class PathError(ValueError):
    """A configured path that cannot be resolved on this node."""


def expand_path(path: str) -> str:
    """`~` and `$VARS` expanded on the node that reads the file.

    $BERTCTL_HOME defaults to ~/.bertctl, as on the login node; any other variable must be set,
    so that an unset one is an error rather than a directory literally named `$FOO`.
    """

    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name in os.environ:
            return os.environ[name]
        if name == "BERTCTL_HOME":
            return os.path.expanduser(DEFAULT_BERTCTL_HOME)
        raise PathError(f"path {path!r} uses ${name}, which is not set in this environment")

    return os.path.expanduser(_VARIABLE.sub(value, path))
