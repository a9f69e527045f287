"""`etl.format.table_ops.sorted_by` and `merge_sorted` against Python's own sort of the same
rows."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from etl.format.table_ops import DigestSet, merge_sorted, rebatched, sorted_by

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


@given(
    keys=st.sets(st.text(max_size=5), max_size=60),
    streams=st.integers(1, 5),
    piece=st.integers(1, 7),
    seed=st.randoms(use_true_random=False),
)
def test_merge_sorted_of_sorted_streams_is_their_sorted_union(
    keys: set[str], streams: int, piece: int, seed: Any
) -> None:
    rows = [{"source": k, "n": i, "path": k.encode("utf-8")} for i, k in enumerate(keys)]
    dealt: list[list[dict[str, Any]]] = [[] for _ in range(streams)]
    for row in rows:
        dealt[seed.randrange(streams)].append(row)

    def pieces(part: list[dict[str, Any]]) -> list[pa.RecordBatch]:
        part = sorted(part, key=lambda r: r["source"].encode("utf-8"))
        cut = [part[i : i + piece] for i in range(0, len(part), piece)]
        # an empty piece now and then: a stream may yield one
        return [pa.RecordBatch.from_pylist(c, schema=SCHEMA) for c in [[], *cut, []]]

    merged = list(merge_sorted([pieces(part) for part in dealt], "source"))
    got = [r for table in merged for r in table.to_pylist()]
    assert got == sorted(rows, key=lambda r: r["source"].encode("utf-8"))
    assert all(table.schema.equals(SCHEMA) for table in merged)
    # one piece of each stream at a time, never the whole of them
    assert all(table.num_rows <= streams * piece for table in merged)


def test_merge_sorted_of_no_streams_is_empty() -> None:
    assert list(merge_sorted([], "source")) == []
    assert list(merge_sorted([[], [SCHEMA.empty_table()]], "source")) == []


@given(
    stored=st.lists(st.integers(0, 60), max_size=40),
    asked=st.lists(st.integers(0, 60), max_size=20),
    algorithm=st.sampled_from(["xxh3_64", "xxh3_128", "sha256", "blake3"]),
)
def test_a_digest_set_answers_as_a_set_of_strings(
    stored: list[int], asked: list[int], algorithm: str
) -> None:
    """Digests of every length the tool writes, slices with nulls and empty values, and
    texts that are no digest: `in` agrees with a Python set of the strings."""
    from etl.format.checksums import digest

    texts = [digest(str(i).encode(), algorithm) for i in stored]
    pieces = [pa.array([*texts[:5], None, ""]), pa.chunked_array([texts[5:]], pa.string())]
    digests = DigestSet(pieces)
    plain = set(texts)
    assert len(digests) == len(plain)
    for text in [digest(str(i).encode(), algorithm) for i in asked] + ["", "zz", "abc"]:
        assert (text in digests) == (text in plain), text


@given(st.lists(st.integers(0, 9), max_size=12), st.integers(1, 7))
def test_rebatched_pieces_are_whole_batches_in_order(sizes: list[int], rows: int) -> None:
    """Pieces of any size (empty ones too) come out as the same rows in the same order, in
    one-chunk tables of `rows` rows, the last shorter."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    pieces = [pa.table({"n": list(range(s, s + n))}) for s, n in zip(starts, sizes, strict=True)]
    out = list(rebatched(iter(pieces), rows))
    assert [v for t in out for v in t.column("n").to_pylist()] == list(range(sum(sizes)))
    assert all(t.column("n").num_chunks == 1 for t in out)
    lengths = [t.num_rows for t in out]
    assert all(n == rows for n in lengths[:-1]) and 0 < (lengths or [1])[-1] <= rows
