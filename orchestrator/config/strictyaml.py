"""YAML for configuration files, safe by construction.

PyYAML's safe loader still expands aliases (a 300-byte "billion laughs" file becomes gigabytes
once something walks it), lets a later duplicate key silently win, follows nesting until Python's
recursion limit, and turns a 5,000-digit integer into a ValueError. Configuration files need none
of that, so this loader refuses aliases, merge keys (`<<`) and duplicate keys (naming the line), limits
nesting depth and scalar size, and every failure is a `YAMLProblem` with the line it is on.

Plain scalars are typed as YAML 1.2's core schema types them, not as PyYAML's YAML 1.1: `1:30` is
text (1.1: the sexagesimal 90), `yes`/`on` are text, `2024-01-01` is text, `1e-3` is a number
(1.1: text), `0o17` is octal. A decimal with a leading zero (`010`: 8 in YAML 1.1, 10 in 1.2) is
refused, because whichever the reader meant, the other one is a silent surprise.
"""

from __future__ import annotations

import re

import yaml

MAX_DEPTH = 32  # cluster files nest 4 levels; anything this deep is not a configuration
MAX_SCALAR_CHARS = 10_000


class YAMLProblem(ValueError):
    def __init__(self, message: str, line: int | None = None):
        super().__init__(f"line {line}: {message}" if line else message)
        self.message, self.line = message, line


MERGE_KEY = "<<"
YAML11_TAGS = {"tag:yaml.org,2002:" + t for t in ("bool", "int", "float", "timestamp", "merge")}
CORE_SCHEMA = [  # YAML 1.2 core schema (null is the same in 1.1), with the first characters PyYAML indexes by
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    ("tag:yaml.org,2002:float", r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                                r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", "-+0123456789."),
]


class StrictLoader(yaml.SafeLoader):
    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in YAML11_TAGS]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            if isinstance(index, yaml.ScalarNode) and index.value == MERGE_KEY:
                raise YAMLProblem(_MERGE_REFUSED, event.start_mark.line + 1)
            raise YAMLProblem(f"aliases (*{event.anchor}) are not accepted in bertctl files: write the value out",
                              event.start_mark.line + 1)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YAMLProblem(f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise YAMLProblem("a key must be a plain value", key_node.start_mark.line + 1) from None
            if key == MERGE_KEY and key_node.style is None:
                raise YAMLProblem(_MERGE_REFUSED, key_node.start_mark.line + 1)
            if key in seen:
                raise YAMLProblem(f"duplicate key {key!r} (first on line {seen[key]})", key_node.start_mark.line + 1)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)

    def construct_scalar(self, node):
        if len(node.value) > MAX_SCALAR_CHARS:
            raise YAMLProblem(f"a value of {len(node.value)} characters (at most {MAX_SCALAR_CHARS})", node.start_mark.line + 1)
        return super().construct_scalar(node)

    def construct_core_int(self, node) -> int:
        text = self.construct_scalar(node)
        if text.startswith(("0o", "0x")):
            return int(text[2:], 8 if text[1] == "o" else 16)
        digits = text.lstrip("+-")
        if len(digits) > 1 and digits.startswith("0"):
            octal = set(digits) <= set("01234567")
            raise YAMLProblem(f"{text}: a leading zero is ambiguous, {f'octal {int(digits, 8)}' if octal else 'not a number'} "
                              f"in YAML 1.1 but {int(text)} in YAML 1.2: write {int(text)}"
                              f"{f' (or 0o{digits.lstrip(chr(48))} for octal)' if octal else ''}, or quote it for text",
                              node.start_mark.line + 1)
        return int(text)


_MERGE_REFUSED = "merge keys (<<) are not accepted in bertctl files: write the keys out"
for _tag, _pattern, _first in CORE_SCHEMA:
    StrictLoader.add_implicit_resolver(_tag, re.compile(_pattern), list(_first))
StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_core_int)


def load(text: str):
    """The YAML document in `text`; YAMLProblem (with its line) for anything a config file must not be."""
    try:
        data = yaml.load(text, Loader=StrictLoader)  # StrictLoader is a SafeLoader
    except YAMLProblem:
        raise
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise YAMLProblem(f"{at}invalid YAML: {problem}") from None
    except (ValueError, RecursionError) as e:  # int() past Python's digit limit, and the like
        raise YAMLProblem(f"unreadable value: {str(e).splitlines()[0]}") from None
    check_encodable(data)
    return data


def check_encodable(value, path: str = "") -> None:
    """Every string must be writable as UTF-8 (a lone surrogate from a `\\ud800` escape is not)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise YAMLProblem(f"{path or 'a value'}: not valid Unicode text (a lone surrogate)") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            check_encodable(k, path)
            check_encodable(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_encodable(v, f"{path}[{i}]")
