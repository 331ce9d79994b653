"""Reading YAML config files into pydantic models, with `-o key.path=value` overrides.

Every failure becomes a `UserError` naming the file (or the override), the dotted key and what was
expected, so the CLI can print one line and exit 2. Used for cluster files and dataset manifests.
"""

from __future__ import annotations

import copy
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from orchestrator import resources
from orchestrator.config import strictyaml
from orchestrator.errors import UserError
from trainer.config.base import first_problem, is_free_mapping, is_model, mapping_value_type, unwrap_optional
from trainer.config.regular import read_regular_text, require_regular

MAX_FILE_BYTES = 10 << 20  # a cluster file or manifest is a few KB; a larger one is not a configuration


@dataclass(frozen=True)
class LoadedFile:
    """A validated config file and where it came from (for rendered scripts and the registry)."""

    config: Any
    path: Path
    source: str  # shipped files by their short name (clusters/x.yaml), others by their path
    overrides: tuple[str, ...]


def named_files(kind: str) -> dict[str, Path]:
    """Every file of a kind (clusters, datasets) by name; user folders shadow shipped files."""
    found: dict[str, Path] = {}
    for folder in reversed(resources.search_dirs(kind)):
        for path in sorted(folder.glob("*.yaml")):
            found[path.stem] = path
    return dict(sorted(found.items()))


def find_named_file(kind: str, name: str, noun: str, option: str) -> Path:
    """A name from `named_files`, or a path to a YAML file."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        path = Path(name).expanduser()
        try:
            require_regular(path)
        except FileNotFoundError:
            raise UserError(f"{noun} file not found", where=clip(name)) from None
        except (OSError, ValueError) as e:  # a name too long for the file system, a NUL, a FIFO
            reason = e.strerror if isinstance(e, OSError) else str(e)
            raise UserError(f"{noun} file cannot be looked up: {reason}", where=clip(name)) from None
        return path
    known = named_files(kind)
    if name not in known:
        raise UserError(f"unknown {noun} '{name}' (known: {', '.join(known) or 'none'})", where=option)
    return known[name]


def load_named(kind: str, name: str, overrides, model: type[BaseModel], noun: str, option: str,
               resolve: Callable[[dict[str, Any], list[str], str], dict[str, Any]] | None = None) -> LoadedFile:
    """Find, read, override and validate one config file; every failure is a one-line UserError.
    `resolve` turns what the file leaves to the machine (e.g. `auto`) into values before validation."""
    path = find_named_file(kind, name, noun, option)
    raw = apply_overrides(read_mapping(path), list(overrides), model)
    where = str(path) if not overrides else f"{path} (with -o {' -o '.join(clip(o) for o in overrides)})"
    if resolve is not None:
        raw = resolve(raw, list(overrides), where)
    config = validate(model, raw, where)
    by_name = path != Path(name).expanduser()
    if by_name and getattr(config, "name", name) != name:  # ids, scripts and `submit` hints use `name:`
        raise UserError(f"must be the file's name {name!r} ({option} finds the file by it), got {config.name!r}",
                        where=where, key="name")
    shipped = resources.shipped_dir(kind)
    source = f"{kind}/{path.name}" if path.resolve().parent == shipped.resolve() else str(path)
    return LoadedFile(config=config, path=path, source=source, overrides=tuple(overrides))


def read_mapping(path: Path) -> dict[str, Any]:
    """The YAML file's top-level mapping, or a UserError that says what is wrong with the file."""
    try:
        text = read_regular_text(path, limit=MAX_FILE_BYTES, encoding="utf-8")
    except FileNotFoundError:
        raise UserError("file not found", where=str(path)) from None
    except OSError as e:  # a FIFO or device where the file belongs, too large, no permission
        raise UserError(f"cannot read file: {e.strerror}", where=str(path)) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read file: {e}", where=str(path)) from None
    try:
        data = strictyaml.load(text)
    except strictyaml.YAMLProblem as e:
        raise UserError(str(e), where=str(path)) from None
    if not isinstance(data, dict):
        raise UserError(f"expected a mapping of keys at the top level, got {type(data).__name__}", where=str(path))
    return data


def apply_overrides(raw: dict[str, Any], overrides: list[str], model: type[BaseModel]) -> dict[str, Any]:
    """A copy of `raw` with each `key.path=value` set; keys are checked against `model`'s schema.

    A value is taken as the schema's type of its key asks: text for a text key, exactly as typed
    (`-o slurm.mem=0`, `-o 'train_dir=/data/my dir #1'`), and `null` for none where the key is
    optional; otherwise it is read as a YAML value (`1e-3`, `true`, `[6,3,2,5]`), which the model's
    validation then type-checks like a value from the file.
    """
    result = copy.deepcopy(raw)  # the file has no aliases, so this copies a tree, never a bomb
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        where = f"-o {clip(item)}"
        if not sep or not key:
            raise UserError("expected key.path=value", where=where)
        path = key.split(".")
        annotation = check_key_path(model, path, where)
        node = result
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[path[-1]] = parse_value(text, annotation, where)
    return result


def validate(model: type[BaseModel], raw: dict[str, Any], where: str) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        key, message = first_problem(e, model)
        raise UserError(message, where=where, key=key) from None


def check_key_path(model: type[BaseModel], path: list[str], where: str) -> Any:
    """The schema's type at a dotted key; a key the schema does not have is refused, listing the valid
    keys at that level."""
    current: Any = model
    annotation: Any = model
    for depth, part in enumerate(path):
        if is_free_mapping(current):
            annotation = typing.get_args(current)[1]
            current = mapping_value_type(current)
            continue
        if not is_model(current):
            raise UserError(f"'{'.'.join(path[:depth])}' is a value, not a section", where=where)
        if part not in current.model_fields:
            valid = ", ".join(sorted(current.model_fields))
            prefix = ".".join(path[:depth])
            here = f" under {prefix}" if prefix else ""
            raise UserError(f"unknown key '{'.'.join(path)}' (valid keys{here}: {valid})", where=where)
        if part in getattr(current, "derived_fields", ()):
            raise UserError(f"'{'.'.join(path)}' is derived, not set: {current.derived_fields[part]}", where=where)
        annotation = current.model_fields[part].annotation
        current = unwrap_optional(annotation)
    return annotation


def clip(text: str, width: int = 80) -> str:
    """An override as shown in a message: long values cut, so the message stays one readable line."""
    return text if len(text) <= width else text[: width - 3] + "..."


def parse_value(text: str, annotation: Any, where: str) -> Any:
    """An override's text as the value its key's type asks for (see apply_overrides)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError("not valid Unicode text (a lone surrogate)", where=where) from None
    optional = type(None) in typing.get_args(annotation)
    if is_text(unwrap_optional(annotation)):
        return None if optional and text in ("null", "~", "") else text
    if not text.strip():
        return None
    try:
        return strictyaml.load(text)
    except strictyaml.YAMLProblem as e:
        raise UserError(e.message, where=where) from None


def is_text(annotation: Any) -> bool:
    """str, an annotated str (OneLine, MountPath), or a Literal of strings."""
    if annotation is str:
        return True
    if typing.get_origin(annotation) is typing.Annotated:
        return is_text(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) is typing.Literal:
        return all(isinstance(a, str) for a in typing.get_args(annotation))
    return False


def schema_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key a `-o` override can set in `model` (free mappings as `section.` prefixes)."""
    keys = []
    for name, field in model.model_fields.items():
        if name in getattr(model, "derived_fields", ()):
            continue
        annotation = unwrap_optional(field.annotation)
        if is_model(annotation):
            keys += schema_keys(annotation, f"{prefix}{name}.")
        elif is_free_mapping(annotation):
            keys.append(f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys
