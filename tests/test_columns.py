"""`etl.format.columns.sorted_by` against Python's own stable sort of the same rows."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from etl.format.columns import sorted_by

SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("n", pa.int64()),
        pa.field("path", pa.binary()),
    ],
    metadata={b"kind": b"test"},
)


@given(
    keys=st.lists(st.text(max_size=4), max_size=40),
    chunk=st.integers(1, 8),
)
def test_sorted_by_is_a_stable_sort_that_keeps_the_schema(keys: list[str], chunk: int) -> None:
    rows = [
        {"source": k, "n": i, "path": k.encode("utf-8", "surrogatepass")}
        for i, k in enumerate(keys)
    ]
    batches = [
        pa.RecordBatch.from_pylist(rows[i : i + chunk], schema=SCHEMA)
        for i in range(0, len(rows), chunk)
    ]
    table = pa.Table.from_batches(batches, schema=SCHEMA)
    result = sorted_by(table, "source")
    # Arrow orders strings by their UTF-8 bytes, as Python does by code point
    want = sorted(rows, key=lambda r: r["source"].encode("utf-8", "surrogatepass"))
    assert result.to_pylist() == want
    assert result.schema.equals(SCHEMA, check_metadata=True)
    assert all(column.num_chunks <= 1 for column in result.columns)
