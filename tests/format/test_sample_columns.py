"""The types a config declares for per-sample columns, the strict check of each value (where
pyarrow alone would truncate, overflow or split a string), how a selection's values are
batched, and a manifest whose column metadata is damaged: an error, never a crash."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.errors import ManifestError
from etl.format.sample_columns import (
    BadValue,
    SampleColumn,
    checked,
    from_text,
    parse_type,
    type_name,
)
from etl.format.schema import ManifestMeta
from etl.format.values import dense_values


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("string", pa.string()),
        (" float32 ", pa.float32()),
        ("list<list<float32>>", pa.list_(pa.list_(pa.float32()))),
        (
            "struct<x: int8, tags: list<string>>",
            pa.struct([("x", pa.int8()), ("tags", pa.list_(pa.string()))]),
        ),
        ("list<struct<a: bool>>", pa.list_(pa.struct([("a", pa.bool_())]))),
    ],
)
def test_types_read_and_write_back(text: str, expected: pa.DataType) -> None:
    assert parse_type(text) == expected
    assert parse_type(type_name(expected)) == expected


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "type is empty"),
        ("float", "unknown type 'float'"),
        ("list<>", "unknown type '>'"),
        ("list<int8", "expected '>'"),
        ("list<int8>>", "unexpected '>'"),
        ("struct<a int8>", "expected ':'"),
        ("struct<a: int8, a: bool>", "named twice"),
        ("struct<1a: int8>", "cannot read '1a"),
        ("int8 $", "cannot read '$'"),
        ("list<" * 3000 + "int8" + ">" * 3000, "nested deeper than 16 levels"),
        ("struct<a: " * 40 + "int8" + ">" * 40, "nested deeper than 16 levels"),
    ],
)
def test_a_bad_type_says_what_is_wrong(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=None) as caught:
        parse_type(text)
    assert said in str(caught.value)


BOXES = pa.list_(pa.list_(pa.float32()))


class _Unprintable:
    """A record's own object whose repr fails: the message names its type instead."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


META = pa.struct([("origin", pa.string()), ("year", pa.int16())])


@pytest.mark.parametrize(
    ("value", "type_", "said"),
    [
        (1.5, pa.int64(), "1.5 is not int64"),  # pyarrow alone stores 1
        (True, pa.int64(), "True is not int64"),
        (1, pa.bool_(), "1 is not bool"),
        ("abc", pa.list_(pa.string()), "'abc' is not list<string>"),  # pyarrow: ['a','b','c']
        (1e300, pa.float32(), "out of range for float32"),  # pyarrow: inf
        (float("nan"), pa.float64(), "NaN"),
        (2**70, pa.int64(), "out of range for int64"),
        (-1, pa.uint8(), "out of range for uint8"),
        (1, pa.string(), "1 is not string"),
        ([[1, "x"]], BOXES, "at [0][1]: 'x' is not float32"),
        ({"origin": "a", "lens": 1}, META, "no field 'lens'"),  # pyarrow drops it
        ({"origin": "a", "year": 1 << 20}, META, "at .year: 1048576 is out of range"),
        ([1, 2], META, "is not struct<origin: string, year: int16>"),
        (_Unprintable(), pa.string(), "a _Unprintable is not string"),
    ],
)
def test_a_value_that_does_not_fit_is_named(value: object, type_: pa.DataType, said: str) -> None:
    with pytest.raises(BadValue) as caught:
        checked(value, type_)
    assert said in str(caught.value)


def test_values_that_fit_become_what_arrow_stores() -> None:
    assert checked(np.int64(3), pa.int8()) == 3
    assert checked(3, pa.float32()) == 3.0
    assert checked(np.array([1.0, 2.0]), pa.list_(pa.float32())) == [1.0, 2.0]
    assert checked({"origin": "a"}, META) == {"origin": "a", "year": None}
    assert checked(math.inf, pa.float32()) == math.inf
    assert checked(None, BOXES) is None
    assert from_text("007", pa.string()) == "007"
    assert from_text("", pa.string()) == ""
    assert from_text("", pa.int32()) is None
    assert from_text(" -12 ", pa.int32()) == -12
    assert from_text("TRUE", pa.bool_()) is True
    assert from_text("[[1, 2]]", BOXES) == [[1.0, 2.0]]
    with pytest.raises(BadValue, match=r"'1\.0' is not int32"):
        from_text("1.0", pa.int32())
    with pytest.raises(BadValue, match="is not list<list<float32>>"):
        from_text("[[1,", BOXES)


def test_a_column_names_itself_and_its_key() -> None:
    score = SampleColumn("score", pa.float32(), "quality", required=True)
    assert score.value({"quality": 2}) == 2.0
    with pytest.raises(BadValue, match="column 'score' is required, and 'quality' is missing"):
        score.value({})
    with pytest.raises(BadValue, match="column 'score': 'x' is not float32"):
        score.value({"quality": "x"}, text=True)


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
        max_leaves=8,
    )
)
def test_any_value_is_stored_as_checked_or_refused(value: object) -> None:
    """Whatever a source hands over, `checked` either refuses it or gives a value Arrow stores
    and reads back unchanged: never a silently different one."""
    for type_ in (pa.int16(), pa.float32(), pa.string(), BOXES, META, pa.list_(pa.bool_())):
        try:
            fit = checked(value, type_)
        except BadValue:
            continue
        assert pa.array([fit], type_).to_pylist() == [_as_float32(fit, type_)]


def _as_float32(value: object, type_: pa.DataType) -> object:
    """`value` with each float32 leaf rounded as float32 stores it (what declaring float32
    asks for), computed with numpy."""
    if value is None:
        return None
    if type_ == pa.float32():
        return float(np.float32(value))  # type: ignore[arg-type]
    if pa.types.is_list(type_):
        return [_as_float32(v, type_.value_type) for v in value]  # type: ignore[attr-defined]
    return value


def test_dense_values_only_where_every_value_has_one_shape() -> None:
    fixed = pa.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], pa.list_(pa.list_(pa.int32())))
    assert dense_values(fixed).shape == (2, 2, 2)
    assert dense_values(fixed.slice(1)).tolist() == [[[5, 6], [7, 8]]]
    assert dense_values(pa.array([1.0, 2.0], pa.float32())).dtype == np.float32
    assert dense_values(pa.array([[1], [1, 2]])) is None  # ragged
    assert dense_values(pa.array([1, None])) is None  # a null
    assert dense_values(pa.array(["a"])) is None  # text
    assert dense_values(pa.array([], pa.list_(pa.float32()))).shape == (0, 0)


@pytest.mark.parametrize(
    "columns",
    [
        "caption",
        [["caption"]],
        [["caption", 3]],
        [["label", "string"]],  # a manifest column
        [["a", "string"], ["a", "int8"]],
        [["a", "list<" * 5000 + "int8" + ">" * 5000]],  # deeper than recursion allows
        [["a", "nonsense"]],
    ],
)
def test_damaged_column_metadata_is_a_manifest_error(columns: object, tmp_path: Path) -> None:
    meta = ManifestMeta(1, (4, 4, 3), "HWC", ("a",), "xxh3_64", "d", {})
    metadata = meta.to_metadata()
    metadata[b"etl.columns"] = json.dumps(columns).encode()
    with pytest.raises(ManifestError, match="schema metadata is incomplete"):
        ManifestMeta.from_metadata(metadata, tmp_path / "manifest.arrow")
