"""What every configuration schema shares: frozen sections that refuse unknown keys, and problems
that name the key to fix.

A `ConfigProblem` travels inside pydantic's ValidationError untouched (as the error's context), so
whoever reports it reads the key and the message as data (`first_problem`) instead of parsing text.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

# integers past this are typos or attacks, never a batch size or a step count
MAX_INTEGER = 2**53


class Section(BaseModel):
    """A config section: unknown keys are errors, values are immutable once validated, numbers are
    finite and bounded, and `true` is not a number."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, value in data.items():
            field = cls.model_fields.get(name) if isinstance(name, str) else None
            if field is None:
                continue
            wanted = unwrap_optional(field.annotation)
            if isinstance(value, bool) and wanted in (int, float):
                raise ConfigProblem(name, f"expected a number, got {str(value).lower()}")
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INTEGER:
                raise ConfigProblem(name, f"{str(value)[:20]}... is far too large (at most 2**53)")
        return data


class ConfigProblem(ValueError):
    """A rule broken by a combination of values: the dotted key to fix (relative to the section that
    checks it) and what is wrong with it."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


def first_problem(error: ValidationError, model: type[BaseModel]) -> tuple[str | None, str]:
    """pydantic's first complaint as (dotted key, one-line message).

    A misspelled key also makes the real one "missing": the misspelling is reported first.
    """
    err = sorted(error.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden")[0]
    loc = [str(p) for p in err["loc"]]
    kind = err["type"]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigProblem):
        return ".".join(loc + [cause.key]), cause.message
    key = ".".join(loc) or None
    if kind == "extra_forbidden":
        parent = model_at(model, loc[:-1])
        valid = ", ".join(sorted(parent.model_fields)) if parent else "?"
        return key, f"unknown key '{loc[-1]}' (valid keys here: {valid})"
    if kind == "missing":
        return key, "required key is missing"
    message = err["msg"].removeprefix("Value error, ")
    if kind not in ("value_error", "assertion_error") and "input" in err and "got" not in message:
        message += f", got {short_repr(err['input'])}"
    return key, message


def model_at(model: type[BaseModel], loc: list[str]) -> type[BaseModel] | None:
    """The section class at a dotted location of `model`, or None where the path leaves the schema."""
    current: Any = model
    for part in loc:
        if is_free_mapping(current):
            current = mapping_value_type(current)
        elif is_model(current) and part in current.model_fields:
            current = unwrap_optional(current.model_fields[part].annotation)
        else:
            return None
    return current if is_model(current) else None


def unwrap_optional(annotation: Any) -> Any:
    """Optional[X] -> X, so that nested keys of optional sections can be addressed."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def is_free_mapping(t: Any) -> bool:
    """A `dict[str, X]` field: its keys are the user's (env names, output names), not the schema's."""
    return typing.get_origin(t) is dict


def mapping_value_type(t: Any) -> Any:
    return unwrap_optional(typing.get_args(t)[1])


def short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
