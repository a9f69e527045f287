"""A pack result joined back to the rows the plan made for its task: the new manifest rows of
one shard, as Arrow columns, and its rejects. Pure: no I/O."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from etl.format.manifest import REJECTS_SCHEMA, samples_schema
from etl.format.names import sample_id
from etl.format.sample_columns import CARRIED, carried, carried_fields
from etl.run.execute import PackResult


def packed_samples(packing: pa.Table, result: PackResult) -> pa.Table:
    """The manifest rows of the sources `result` stored (SAMPLES_SCHEMA, in shard order), each
    'row' still its slot (`ShardGaps.with_final_rows` makes it its row). `packing` is the
    plan's table of sources to pack, whose rows the task was cut from."""
    stored = result.rows >= 0
    rows = packing.slice(result.start, result.items).filter(pa.array(stored))
    schema = samples_schema(carried_fields(packing.schema))
    if not rows.num_rows:
        return schema.empty_table()
    ids = [sample_id(source) for source in rows.column("source").to_pylist()]
    columns = {
        "sample_id": pa.array(ids, pa.string()),
        "source": rows.column("source"),
        "source_size": rows.column("size"),
        "source_mtime_ns": rows.column("mtime_ns"),
        "source_ctime_ns": pc.fill_null(rows.column("ctime_ns"), 0),
        "source_inode": pc.fill_null(rows.column("inode"), 0),
        "source_hash": rows.column("digest"),
        "source_height": pa.array(result.heights[stored].astype(np.int32)),
        "source_width": pa.array(result.widths[stored].astype(np.int32)),
        "label": rows.column("label"),
        "class_name": rows.column("class"),
        "split": rows.column("split_name"),
        "shard": pa.repeat(pa.scalar(result.shard), rows.num_rows),
        "row": pa.array(result.rows[stored]),
        "checksum": result.checksums.to_arrow(),
        **{name[len(CARRIED) :]: rows.column(name) for name in carried(rows.column_names)},
    }
    names = schema.names
    return pa.table([columns[name] for name in names], names=names).cast(schema)


def packed_rejects(packing: pa.Table, result: PackResult) -> pa.Table:
    """The rejects of `result` (REJECTS_SCHEMA, in shard order), with the stat and content
    hash their sources were planned with."""
    if not result.rejects:
        return REJECTS_SCHEMA.empty_table()
    at = pa.array([result.start + index for index, _, _ in result.rejects], pa.int64())
    planned = packing.take(at)
    columns = {
        "source": planned.column("source"),
        "reason": pa.array([reason for _, reason, _ in result.rejects], pa.string()),
        "message": pa.array([message for _, _, message in result.rejects], pa.string()),
        "source_size": planned.column("size"),
        "source_mtime_ns": planned.column("mtime_ns"),
        "source_ctime_ns": pc.fill_null(planned.column("ctime_ns"), 0),
        "source_inode": pc.fill_null(planned.column("inode"), 0),
        "source_hash": planned.column("digest"),
    }
    names = REJECTS_SCHEMA.names
    return pa.table([columns[name] for name in names], names=names).cast(REJECTS_SCHEMA)


class ShardGaps:
    """The slots rejects left empty in the shards a run sealed (`etl.run.execute.Sealed`), kept
    as one sorted array of (shard, slot) keys: a run with rejects in every shard costs 8 bytes
    a reject, and fixing a piece of rows is a few vectorised searches, whatever the shards."""

    def __init__(self) -> None:
        self._names: list[str] = []
        self._gaps: list[NDArray[np.int64]] = []
        self._keys: NDArray[np.int64] | None = None

    def add(self, shard: str, gaps: NDArray[np.int64]) -> None:
        if len(gaps):
            self._names.append(shard)
            self._gaps.append((len(self._names) - 1 << 32) | gaps.astype(np.int64))
            self._keys = None

    def with_final_rows(self, samples: pa.Table) -> pa.Table:
        """`samples` with the 'row' of each sample of a shard with gaps, still its slot, made
        its row in the sealed shard: its slot less the gaps before it."""
        if not self._names or not samples.num_rows:
            return samples
        if self._keys is None:
            self._keys = np.sort(np.concatenate(self._gaps))
        names = pa.array(self._names, pa.string())
        which = pc.index_in(samples.column("shard"), value_set=names)
        if which.null_count == len(which):
            return samples
        at = np.asarray(pc.fill_null(which, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
        slots = np.asarray(samples.column("row").to_numpy(), dtype=np.int64)
        mine = at >= 0
        first = np.searchsorted(self._keys, at[mine] << 32)
        before = np.searchsorted(self._keys, (at[mine] << 32) | slots[mine]) - first
        rows = slots.copy()
        rows[mine] -= before
        column = samples.schema.get_field_index("row")
        return samples.set_column(column, "row", pa.array(rows, samples.schema.field("row").type))
