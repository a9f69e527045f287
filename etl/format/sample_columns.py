"""Per-sample columns a config declares (a caption, boxes, any attribute): their types as
written in pipeline.yaml, and the strict check of each value before it becomes Arrow.

Strict because pyarrow alone is lenient where a silently wrong sample would follow: it
truncates 1.5 to 1 in an integer column, turns a string into a list of its characters, makes
1e300 an infinity in float32 and drops a struct's unknown keys. Here each of those is a
`BadValue` naming the column and where in the value, which the run makes a reject."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

INTEGERS = {
    name: (getattr(pa, name)(), int(np.iinfo(name).min), int(np.iinfo(name).max))
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
}
FLOATS = {"float32": pa.float32(), "float64": pa.float64()}
SIMPLE_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "bool": pa.bool_(),
    "binary": pa.binary(),
    **{name: spec[0] for name, spec in INTEGERS.items()},
    **FLOATS,
}
"""The type names a config may use, besides list<T> and struct<name: T, ...>."""

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
"""A column's name: an identifier, so SQL and Python name it without quoting."""
_TOKEN = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*|[<>,:])")
_FLOAT32_MAX = float(np.finfo(np.float32).max)
MAX_TYPE_DEPTH = 16
"""Deeper nesting of list<> and struct<> is refused: no RecursionError from a hostile type."""


class BadValue(ValueError):
    """A value that does not fit its column's type; the text names the column and the value."""


def parse_type(text: str) -> pa.DataType:
    """The Arrow type a config writes as text: a simple name (`SIMPLE_TYPES`), `list<T>` or
    `struct<name: T, ...>`, nested freely. ValueError saying what is wrong."""
    tokens = _tokens(text)
    found, at = _parse(tokens, 0, text, 0)
    if at != len(tokens):
        raise ValueError(f"type {text!r}: unexpected {tokens[at]!r}")
    return found


def type_name(type_: pa.DataType) -> str:
    """How a config writes `type_` (the inverse of `parse_type`)."""
    if pa.types.is_list(type_):
        return f"list<{type_name(type_.value_type)}>"
    if pa.types.is_struct(type_):
        fields = ", ".join(f"{f.name}: {type_name(f.type)}" for f in type_)
        return f"struct<{fields}>"
    for name, simple in SIMPLE_TYPES.items():
        if simple == type_:
            return name
    return str(type_)


def _tokens(text: str) -> list[str]:
    tokens, at = [], 0
    while at < len(text.rstrip()):
        match = _TOKEN.match(text, at)
        if match is None:
            raise ValueError(f"type {text!r}: cannot read {text[at:].strip()!r}")
        tokens.append(match.group(1))
        at = match.end()
    if not tokens:
        raise ValueError("type is empty; e.g. string, float32, list<float32>")
    return tokens


def _parse(tokens: list[str], at: int, text: str, depth: int) -> tuple[pa.DataType, int]:
    def expect(token: str, where: int) -> int:
        if where >= len(tokens) or tokens[where] != token:
            got = repr(tokens[where]) if where < len(tokens) else "the end"
            raise ValueError(f"type {text!r}: expected {token!r}, found {got}")
        return where + 1

    if at >= len(tokens):
        raise ValueError(f"type {text!r}: a type is missing at the end")
    if depth > MAX_TYPE_DEPTH:
        raise ValueError(f"type {text[:40]!r}...: nested deeper than {MAX_TYPE_DEPTH} levels")
    name = tokens[at]
    if name == "list":
        inner, at = _parse(tokens, expect("<", at + 1), text, depth + 1)
        return pa.list_(inner), expect(">", at)
    if name == "struct":
        at = expect("<", at + 1)
        fields: list[pa.Field] = []
        while True:
            field_name = tokens[at] if at < len(tokens) else ""
            if not NAME.match(field_name):
                raise ValueError(f"type {text!r}: expected a field name, found {field_name!r}")
            if field_name in {f.name for f in fields}:
                raise ValueError(f"type {text!r}: field {field_name!r} is named twice")
            inner, at = _parse(tokens, expect(":", at + 1), text, depth + 1)
            fields.append(pa.field(field_name, inner))
            if at < len(tokens) and tokens[at] == ",":
                at += 1
                continue
            return pa.struct(fields), expect(">", at)
    if name not in SIMPLE_TYPES:
        known = ", ".join(SIMPLE_TYPES)
        raise ValueError(f"type {text!r}: unknown type {name!r}; types are {known}, list<T>, "
                         "struct<name: T, ...>")  # fmt: skip
    return SIMPLE_TYPES[name], at + 1


def checked(value: Any, type_: pa.DataType, where: str = "") -> Any:
    """`value` as the Python value Arrow stores for `type_` (None stays None), or `BadValue`
    naming `where` in it ('[0].x': a list's item, a struct's field). No truncation, no
    overflow, no unknown struct field."""
    if value is None:
        return None
    if pa.types.is_boolean(type_):
        if isinstance(value, bool | np.bool_):
            return bool(value)
    elif pa.types.is_integer(type_):
        if isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
            _, low, high = INTEGERS[type_name(type_)]
            if low <= int(value) <= high:
                return int(value)
            raise BadValue(f"{_at(where)}{_shown(value)} is out of range for {type_name(type_)}")
    elif pa.types.is_floating(type_):
        if isinstance(value, int | float | np.integer | np.floating) and not isinstance(
            value, bool | np.bool_
        ):
            number = float(value)
            if math.isnan(number):
                # NOTE: NaN equals nothing, itself included, so a version holding one would
                # never compare unchanged; null says "missing" and compares equal
                raise BadValue(f"{_at(where)}NaN; leave the value out (null) where it is missing")
            if type_ == pa.float32() and math.isfinite(number) and abs(number) > _FLOAT32_MAX:
                raise BadValue(f"{_at(where)}{_shown(value)} is out of range for float32")
            return number
    elif pa.types.is_string(type_):
        if isinstance(value, str):
            return value
    elif pa.types.is_binary(type_):
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
    elif pa.types.is_list(type_):
        if isinstance(value, list | tuple | np.ndarray):
            return [checked(v, type_.value_type, f"{where}[{i}]") for i, v in enumerate(value)]
    elif pa.types.is_struct(type_) and isinstance(value, Mapping):
        names = [f.name for f in type_]
        unknown = sorted(str(k) for k in value if k not in names)
        if unknown:
            raise BadValue(f"{_at(where)}no field {unknown[0]!r} (fields: {', '.join(names)})")
        return {f.name: checked(value.get(f.name), f.type, f"{where}.{f.name}") for f in type_}
    return _bad(f"{_at(where)}{_shown(value)} is not {type_name(type_)}")


def _shown(value: Any) -> str:
    """A value as a message shows it: its repr, cut at 60 characters; a value whose repr
    fails (a record's own object) by its type."""
    try:
        text = repr(value)
    except Exception:
        return f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def _bad(message: str) -> Any:
    raise BadValue(message)


def _at(where: str) -> str:
    """Where in a nested value a message is about: 'at [0][2]: ', nothing at the top."""
    return f"at {where}: " if where else ""


_INTEGER_TEXT = re.compile(r"^[+-]?\d+$")
_BOOLS = {"true": True, "false": False, "1": True, "0": False}


def from_text(text: str | None, type_: pa.DataType) -> Any:
    """The value a text cell (a CSV listing, a WebDataset .txt member) holds for `type_`: the
    text itself for a string, a number or a bool written out, JSON for a list or a struct.
    An empty cell is null."""
    if text is None or (text == "" and not pa.types.is_string(type_)):
        return None
    try:
        if pa.types.is_string(type_):
            return text
        if pa.types.is_binary(type_):
            return text.encode()
        if pa.types.is_integer(type_) and _INTEGER_TEXT.match(text.strip()):
            return checked(int(text), type_)
        if pa.types.is_floating(type_):
            return checked(float(text), type_)
        if pa.types.is_boolean(type_) and text.strip().lower() in _BOOLS:
            return _BOOLS[text.strip().lower()]
        if pa.types.is_nested(type_):
            return checked(json.loads(text), type_)
    except (ValueError, RecursionError) as exc:  # float('x'), JSONDecodeError
        if isinstance(exc, BadValue):
            raise
    shown = repr(text) if len(text) <= 60 else repr(text[:57]) + "..."
    raise BadValue(f"{shown} is not {type_name(type_)}")


@dataclass(frozen=True)
class SampleColumn:
    """One declared column: its name in the manifest, its type, the key a source holds it
    under (`from` in the config; its name by default), and whether a sample needs it."""

    name: str
    type: pa.DataType
    key: str
    required: bool = False

    def value(self, record: Mapping[str, Any], text: bool = False) -> Any:
        """This column's checked value in `record` (by `key`; cells are text when `text`)."""
        raw = record.get(self.key)
        try:
            value = from_text(raw, self.type) if text else checked(raw, self.type)
        except BadValue as exc:
            said = str(exc)
            joined = " " if said.startswith("at ") else ": "
            raise BadValue(f"column {self.name!r}{joined}{said}") from None
        if value is None and self.required:
            raise BadValue(f"column {self.name!r} is required, and {self.key!r} is missing")
        return value


def values_of(
    columns: tuple[SampleColumn, ...], record: Mapping[str, Any], text: bool = False
) -> tuple[Any, ...]:
    """Each column's value in `record`, checked; `BadValue` naming the first that is not."""
    return tuple(column.value(record, text) for column in columns)


CARRIED = "column."
"""The prefix a declared column's name has in a run's working tables (listing, plan), where
names such as 'path' or 'size' are taken; the manifest stores it under its own name."""


def carried(table_names: list[str]) -> list[str]:
    """The declared columns a working table carries, by their names there (in order)."""
    return [name for name in table_names if name.startswith(CARRIED)]


def carried_fields(schema: pa.Schema) -> list[pa.Field]:
    """The declared columns a working table carries, as the manifest's fields (own names)."""
    return [pa.field(f.name[len(CARRIED) :], f.type) for f in schema if f.name.startswith(CARRIED)]
