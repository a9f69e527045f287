"""Rows partitioned by content hash, on disk: every row whose hash falls in bucket b is
appended to one Arrow stream file, so the plan can take content-keyed decisions (duplicates,
stored pixels, remembered rejects) a bucket at a time, with every row that shares a hash in
the same bucket. What a bucket holds is about `BUCKET_ROWS` rows, whatever the dataset's size.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import xxhash
from numpy.typing import NDArray

from etl.format.spill import Seals
from etl.format.table_ops import fixed_width, taken

BUCKET_ROWS = 1 << 17
"""Rows a bucket is meant to hold: the plan's working set per bucket is a few hundred bytes a
row (hash tables, masks, the rows taken), tens of MB."""

_MIX = np.uint64(0x9E3779B97F4A7C15)


def bucket_count(rows: int) -> int:
    """Buckets for `rows` rows: enough that each holds about BUCKET_ROWS."""
    return max(1, -(-rows // BUCKET_ROWS))


def buckets_of(digests: pa.ChunkedArray | pa.Array, count: int) -> NDArray[np.int32]:
    """The bucket of each hash, a function of its first 8 characters (equal hashes, equal
    buckets; hex digests spread evenly). Nulls go to bucket 0. Worked out a slice at a time:
    a whole 10M-row manifest's prefixes would be a 120 MB copy."""
    out = np.zeros(len(digests), dtype=np.int32)
    if count == 1:
        return out
    for start in range(0, len(digests), SLICE_ROWS):
        part = digests.slice(start, SLICE_ROWS)
        out[start : start + len(part)] = _buckets_of_slice(part, count)
    return out


SLICE_ROWS = 1 << 18


def _buckets_of_slice(digests: pa.ChunkedArray | pa.Array, count: int) -> NDArray[np.uint64]:
    head = pc.utf8_rpad(pc.utf8_slice_codeunits(pc.fill_null(digests, ""), 0, 8), 8, "0")
    fixed = fixed_width(pa.chunked_array([head]) if isinstance(head, pa.Array) else head)
    if fixed is not None and fixed.dtype.itemsize == 8:
        words = np.ascontiguousarray(fixed).view(np.uint64)
    else:  # not 8 one-byte characters (never a hex digest): hash each in Python
        texts = head.to_pylist()
        words = np.fromiter((xxhash.xxh3_64_intdigest(t.encode()) for t in texts), np.uint64)
    mixed = (words * _MIX) >> np.uint64(32)
    return (mixed * np.uint64(count)) >> np.uint64(32)


class Buckets:
    """`count` append-only Arrow stream files of one schema under `folder` (`name`-NNNNN.arrow);
    `add` deals a table's rows out by bucket, `take` reads one bucket back (and removes its
    file)."""

    def __init__(self, folder: Path, schema: pa.Schema, count: int, name: str = "bucket") -> None:
        self.folder, self.schema, self.count, self.name = folder, schema, count, name
        self.rows = 0
        self._writers: dict[int, ipc.RecordBatchStreamWriter] = {}
        self._seals = Seals()

    def __enter__(self) -> Buckets:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()
        for b in range(self.count):
            self._path(b).unlink(missing_ok=True)

    def _path(self, bucket: int) -> Path:
        return self.folder / f"{self.name}-{bucket:05d}.arrow"

    def add(self, table: pa.Table, buckets: NDArray[np.int32]) -> None:
        """Append each row of `table` to the file of its bucket (`buckets`, one per row). The
        rows are written at once: a slice kept waiting would keep the whole table alive."""
        if not table.num_rows:
            return
        order = np.argsort(buckets, kind="stable")
        grouped = taken(table.cast(self.schema), order)
        ends = np.searchsorted(buckets[order], np.arange(self.count + 1), side="left")
        for b in np.flatnonzero(np.diff(ends)).tolist():
            start, stop = int(ends[b]), int(ends[b + 1])
            if b not in self._writers:
                self._writers[b] = ipc.new_stream(str(self._path(b)), self.schema)
            self._writers[b].write_table(grouped.slice(start, stop - start))
        self.rows += table.num_rows

    def _close(self) -> None:
        for bucket, writer in self._writers.items():
            writer.close()
            self._seals.seal(self._path(bucket))  # NOTE [ sealed scratch ] in etl.format.spill
        self._writers.clear()

    def take(self, bucket: int) -> pa.Table:
        """Every row added to `bucket`, in the order added, read into memory; its file is
        removed. Call after the last `add`."""
        self._close()
        path = self._path(bucket)
        if not self._seals.holds(path):  # never written to: no rows went to this bucket
            return self.schema.empty_table()
        self._seals.check(path)  # a written bucket gone missing is an error, not no rows
        with pa.OSFile(str(path)) as file:
            table = ipc.open_stream(file).read_all()
        path.unlink()
        return table
