"""A pack result joined back to the rows the plan made for its task: the new manifest rows of
one shard, as Arrow columns, and its rejects. Pure: no I/O."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from etl.format.codecs import CODECS
from etl.format.coherence import ENCODED_COLUMNS, RAGGED_COLUMNS
from etl.format.names import sample_id
from etl.format.sample_columns import CARRIED, carried, carried_fields
from etl.format.schema import REJECTS_SCHEMA, SAMPLES_SCHEMA, samples_schema
from etl.run.execute import PackResult


def packed_samples(packing: pa.Table, result: PackResult, ragged: bool = False) -> pa.Table:
    """The manifest rows of the sources `result` stored (SAMPLES_SCHEMA, in shard order), each
    'row' still its slot (`ShardGaps.with_final_rows` makes it its row, and sets the offset of
    a `ragged` sample, one that keeps its aspect ratio). `packing` is the plan's table of
    sources to pack, whose rows the task was cut from."""
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
        **_ragged_columns(result, stored, ragged),
        **{name[len(CARRIED) :]: rows.column(name) for name in carried(rows.column_names)},
    }
    names = schema.names
    return pa.table([columns[name] for name in names], names=names).cast(schema)


def _ragged_columns(
    result: PackResult, stored: NDArray[np.bool_], ragged: bool
) -> dict[str, pa.Array]:
    """The `sample_*` columns (RAGGED_COLUMNS, ENCODED_COLUMNS) of samples in a flat shard:
    each one's height and width, codec and stored bytes, its offset still null
    (`ShardGaps.with_final_rows` sets it once the shard is sealed); all null for fixed-size
    samples stored raw. (The codec columns of a version stored raw are dropped as it is
    written: `ManifestMeta.file_schema`.)"""
    count = int(stored.sum())
    if not ragged:
        names = (*RAGGED_COLUMNS, *ENCODED_COLUMNS)
        return {name: pa.nulls(count, SAMPLES_SCHEMA.field(name).type) for name in names}
    codecs = pa.array(CODECS, pa.string()).take(pa.array(result.codecs[stored]))
    return {
        "sample_offset": pa.nulls(count, pa.int64()),
        "sample_height": pa.array(result.sample_heights[stored].astype(np.int32)),
        "sample_width": pa.array(result.sample_widths[stored].astype(np.int32)),
        "sample_codec": codecs,
        "sample_bytes": pa.array(result.sample_bytes[stored].astype(np.int64)),
    }


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
    a reject, and fixing a piece of rows is a few vectorised searches, whatever the shards.
    Where samples keep their aspect ratio, also each slot's byte offset (8 bytes a sample)."""

    def __init__(self) -> None:
        self._names: list[str] = []
        self._gaps: list[NDArray[np.int64]] = []
        self._keys: NDArray[np.int64] | None = None
        self._offsets: dict[str, NDArray[np.int64]] = {}
        self._flat: tuple[pa.Array, NDArray[np.int64], NDArray[np.int64]] | None = None

    def add(
        self, shard: str, gaps: NDArray[np.int64], offsets: NDArray[np.int64] | None = None
    ) -> None:
        if offsets is not None:
            self._offsets[shard] = offsets
            self._flat = None
        if len(gaps):
            self._names.append(shard)
            self._gaps.append((len(self._names) - 1 << 32) | gaps.astype(np.int64))
            self._keys = None

    def with_final_rows(self, samples: pa.Table) -> pa.Table:
        """`samples` with the 'row' of each sample of a shard with gaps, still its slot, made
        its row in the sealed shard: its slot less the gaps before it; and the offset of each
        new sample that keeps its aspect ratio set from its slot."""
        if self._offsets and samples.num_rows:
            samples = self._with_offsets(samples)
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

    def _with_offsets(self, samples: pa.Table) -> pa.Table:
        """Set 'sample_offset' where it is null (a new sample, 'row' still its slot) from its
        shard's slot offsets."""
        offsets = samples.column("sample_offset")
        if not offsets.null_count:
            return samples
        if self._flat is None:
            names = pa.array(list(self._offsets), pa.string())
            bases = np.zeros(len(names) + 1, np.int64)
            np.cumsum([len(o) for o in self._offsets.values()], out=bases[1:])
            self._flat = names, bases, np.concatenate(list(self._offsets.values()))
        names, bases, flat = self._flat
        which = pc.index_in(samples.column("shard"), value_set=names)
        at = np.asarray(pc.fill_null(which, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
        new = at >= 0
        if not new.any():
            return samples
        slots = np.asarray(samples.column("row").to_numpy(), dtype=np.int64)
        values = np.array(pc.fill_null(offsets, 0).to_numpy(zero_copy_only=False), np.int64)
        values[new] = flat[bases[at[new]] + slots[new]]
        mask = pa.array(~new & offsets.is_null().to_numpy(zero_copy_only=False))
        column = pa.array(values, pa.int64(), mask=mask.to_numpy(zero_copy_only=False))
        index = samples.schema.get_field_index("sample_offset")
        return samples.set_column(index, samples.schema.field(index), column)
