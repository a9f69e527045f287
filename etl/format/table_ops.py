"""Column helpers for million-row Arrow tables: lookups, codes and masks as numpy arrays, so
the manifest reader, the planner and the version tools do per-row work in C, not per Python
object."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray


def positions_in(
    values: pa.ChunkedArray | pa.Array, keys: pa.ChunkedArray | pa.Array
) -> NDArray[np.int64]:
    """Each value's first position in `keys`, -1 where it is not there (one hash lookup)."""
    if not len(values):
        return np.zeros(0, dtype=np.int64)
    found = pc.index_in(values, value_set=keys) if len(keys) else pa.nulls(len(values), pa.int32())
    return np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), dtype=np.int64)


def take_or_null(column: pa.ChunkedArray | pa.Array, positions: NDArray[np.int64]) -> pa.Array:
    """column[positions], null where a position is -1."""
    return pc.take(column, pa.array(np.maximum(positions, 0), mask=positions < 0))


def value_codes(
    column: pa.ChunkedArray | pa.Array,
) -> tuple[tuple[str, ...], NDArray[np.int32]]:
    """The distinct values of a string column, in order of first appearance, and each row's
    index into them, -1 for a null (one dictionary encoding per chunk, merged)."""
    names: dict[str, int] = {}
    parts = [np.empty(0, dtype=np.int32)]
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    for chunk in chunks:
        encoded = chunk.dictionary_encode()
        local = [names.setdefault(v, len(names)) for v in encoded.dictionary.to_pylist()]
        indices = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)
        parts.append(np.asarray([*local, -1], dtype=np.int32)[indices])
    return tuple(names), np.concatenate(parts)


def fixed_width(column: pa.ChunkedArray) -> NDArray[np.bytes_] | None:
    """A string column whose values all have one length (hex digests), as a numpy array of
    that many bytes per value (compared with memcmp, not per Python string); None for any
    other column. A copy only when the column has several chunks."""
    if column.type != pa.string() or column.null_count:
        return None
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not len(array):
        return None
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32, len(array) + 1, array.offset * 4)
    width = int(offsets[1] - offsets[0])
    if width <= 0 or int(offsets[-1] - offsets[0]) != width * len(array):
        return None
    if not np.all(np.diff(offsets) == width):
        return None
    data = np.frombuffer(data_buffer, np.uint8, offsets[-1] - offsets[0], offsets[0])
    return data.view(f"S{width}")


def bool_mask(result: Any) -> NDArray[np.bool_]:
    """A boolean numpy array of an Arrow or numpy result; null counts as False."""
    if isinstance(result, pa.ChunkedArray | pa.Array):
        return np.asarray(pc.fill_null(result, False).to_numpy(zero_copy_only=False), dtype=bool)
    return np.asarray(result, dtype=bool)


def sorted_by(table: pa.Table, key: str) -> pa.Table:
    """`table` sorted by column `key` (stable), each column in one chunk.

    NOTE: `Table.sort_by` takes every column before letting go of any, so a listing of 10M
    files briefly needs two copies of itself; this takes a column at a time (`taken`). The
    caller must hold no other reference to `table` for the memory to go.
    """
    if table.num_rows < 2:
        return table.combine_chunks()
    return taken(table, pc.sort_indices(table.column(key)))


def taken(table: pa.Table, indices: pa.Array | NDArray[np.integer[Any]]) -> pa.Table:
    """`table.take(indices)`, each column in one chunk, made a column at a time and dropping
    each column of `table` once taken: the peak is the result, what else holds `table`'s
    buffers, and one column, not two copies of the table."""
    schema, columns = table.schema, []
    for _ in schema.names:
        columns.append(table.column(0).take(indices).combine_chunks())
        table = table.remove_column(0)
    return pa.Table.from_arrays(columns, schema=schema)


def merge_sorted(
    streams: Sequence[Iterable[pa.Table | pa.RecordBatch]], key: str
) -> Iterator[pa.Table]:
    """The rows of `streams`, each sorted by column `key` (text or numbers) with no key in
    two streams, as one stream of tables in `key` order.

    NOTE: it holds one piece of each stream at a time. Each step takes from every stream the
    rows up to the smallest last key among the pieces held (no row still to come from any
    stream can sort before them), sorts those and refills the pieces used up, so the memory is
    the streams' pieces, not their rows.
    """
    sources = [iter(stream) for stream in streams]
    heads = [_next_rows(source) for source in sources]
    while True:
        live = [(i, head) for i, head in enumerate(heads) if head is not None]
        if not live:
            return
        kind = live[0][1].schema.field(key).type
        bound = pc.min(pa.array([head.column(key)[-1].as_py() for _, head in live], kind))
        taken: list[pa.Table] = []
        for i, head in live:
            n = int(pc.sum(pc.less_equal(head.column(key), bound)).as_py() or 0)
            taken.append(head.slice(0, n))
            heads[i] = head.slice(n) if n < head.num_rows else _next_rows(sources[i])
        rows = pa.concat_tables(taken)
        yield sorted_by(rows, key) if len(live) > 1 else rows


FILE_BATCH_ROWS = 1 << 14
"""Rows of each record batch in an Arrow file a run writes and maps back (the listing, the
plan's tables, a version's manifest). Once mapped, every batch costs ~470 B of heap a column
(Arrow's array and buffer objects): a 10M-row manifest written in the merge's ~2,000-row
pieces held 34 MiB of them. Larger batches cost a larger copy to gather: at 1M files the
listing phase peaked at 193 MiB with 1 << 14, 211 with 1 << 15 and 250 with 1 << 16."""


def rebatched(pieces: Iterable[pa.Table], rows: int = FILE_BATCH_ROWS) -> Iterator[pa.Table]:
    """The rows of `pieces`, in order, as tables of `rows` rows in one chunk each (the last
    may be shorter): what a file writer turns into one record batch apiece. Holds one
    batch's worth of pieces, and copies a batch at a time."""
    held: list[pa.Table] = []
    count = 0
    for piece in pieces:
        if not piece.num_rows:
            continue
        held.append(piece)
        count += piece.num_rows
        if count < rows:
            continue
        table = pa.concat_tables(held)
        full = count - count % rows
        for start in range(0, full, rows):
            yield table.slice(start, rows).combine_chunks()
        held, count = ([table.slice(full)] if count > full else []), count - full
    if count:
        yield pa.concat_tables(held).combine_chunks()


def _next_rows(source: Iterator[pa.Table | pa.RecordBatch]) -> pa.Table | None:
    """The next piece of `source` that has rows, as a table; None at its end."""
    for piece in source:
        if piece.num_rows:
            return piece if isinstance(piece, pa.Table) else pa.Table.from_batches([piece])
    return None


def ascending(
    column: pa.ChunkedArray, release: Callable[[], None] = lambda: None, rows: int = 1 << 18
) -> bool:
    """Whether each value sorts after the one before it, looked at `rows` at a time with the
    pages read let go of (`release`) after each."""
    for start in range(0, len(column) - 1, rows):
        part = column.slice(start, rows + 1)  # one value more: pairs across slices
        if bool_mask(pc.less(part.slice(1), part.slice(0, len(part) - 1))).any():
            return False
        release()
    return True


def bisect_right(column: pa.ChunkedArray | pa.Array, value: Any, lo: int = 0) -> int:
    """The first position at or after `lo` whose value sorts after `value`, in a column sorted
    in ascending order: ~log2(n) values read, so a merge join can find its next slice of a
    memory-mapped 10M-row column without touching the rest."""
    return _bisect(column, value, lo, after=True)


def bisect_left(column: pa.ChunkedArray | pa.Array, value: Any, lo: int = 0) -> int:
    """The first position at or after `lo` whose value does not sort before `value` (as
    `bisect_right`)."""
    return _bisect(column, value, lo, after=False)


def _bisect(column: pa.ChunkedArray | pa.Array, value: Any, lo: int, after: bool) -> int:
    hi = len(column)
    while lo < hi:
        mid = (lo + hi) // 2
        found = column[mid].as_py()
        if found < value or (after and found == value):
            lo = mid + 1
        else:
            hi = mid
    return lo


_HEX_VALUES = np.full(256, 255, dtype=np.uint8)
_HEX_VALUES[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint8)
_HEX_VALUES[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16, dtype=np.uint8)

DIGEST_KEY_BYTES = 16
"""Bytes of a digest a `DigestSet` keeps: the first 128 bits (all of xxh3_128; a shorter
digest is padded with zeros)."""


def digest_key(text: str) -> bytes:
    """The `DigestSet` key of one hex digest; ValueError when it is not hex."""
    head = text[: 2 * DIGEST_KEY_BYTES]
    return bytes.fromhex(head.ljust(2 * DIGEST_KEY_BYTES, "0"))


class DigestSet:
    """Hex digests as a sorted numpy array of 16-byte keys: `in` is a binary search, and 10M
    digests take 160 MB where a Python set of their strings takes 2.5 GB. Two digests that
    agree in their first 128 bits are one key, as equal content hashes mean one content
    everywhere else."""

    def __init__(self, pieces: Iterable[pa.ChunkedArray | pa.Array] = ()) -> None:
        """The digests of `pieces` (slices of string columns, converted one at a time)."""
        parts = [np.empty(0, dtype=f"S{DIGEST_KEY_BYTES}")]
        parts += [_digest_keys(piece) for piece in pieces]
        self._keys = np.unique(np.concatenate(parts))

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, text: object) -> bool:
        if not isinstance(text, str) or not len(self._keys):
            return False
        try:
            probe = np.array([digest_key(text)], dtype=self._keys.dtype)
        except ValueError:
            return False
        at = int(np.searchsorted(self._keys, probe)[0])
        return at < len(self._keys) and bool(self._keys[at : at + 1] == probe)


def _digest_keys(digests: pa.ChunkedArray | pa.Array) -> NDArray[np.bytes_]:
    """The keys of the hex digests among `digests` (nulls and empty or non-hex values left
    out), a slice of a column at a time: vectorised where every value is 32 or more hex digits."""
    texts = digests if isinstance(digests, pa.ChunkedArray) else pa.chunked_array([digests])
    texts = texts.filter(pc.greater(pc.fill_null(pc.utf8_length(texts), 0), 0))
    width = 2 * DIGEST_KEY_BYTES
    head = pc.utf8_rpad(pc.utf8_slice_codeunits(texts, 0, width), width, "0")
    fixed = fixed_width(head if isinstance(head, pa.ChunkedArray) else pa.chunked_array([head]))
    if fixed is not None and fixed.dtype.itemsize == width:
        nibbles = _HEX_VALUES[np.frombuffer(np.ascontiguousarray(fixed), np.uint8)]
        nibbles = nibbles.reshape(-1, width)
        hexadecimal = (nibbles != 255).all(axis=1)
        pairs = (nibbles[hexadecimal, 0::2] << 4) | nibbles[hexadecimal, 1::2]
        return np.ascontiguousarray(pairs).view(f"S{DIGEST_KEY_BYTES}").ravel()
    keys = []
    for text in texts.to_pylist():
        try:
            keys.append(digest_key(text))
        except ValueError:
            continue
    return np.array(keys, dtype=f"S{DIGEST_KEY_BYTES}")
