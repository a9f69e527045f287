"""Deciding each checked file's fate, pure and columnar: `check_window` joins a window of the
listing with what the previous version knew of it, `decide` makes a bucket's files (grouped by
content hash) kept, packed or rejected, and `assemble` turns the decisions into the `Plan`.
`etl.run.staged` drives them a window and a bucket at a time."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from etl.config import PipelineConfig
from etl.engine.parallel import worker_count
from etl.format.mapped import Mapped
from etl.format.names import sample_id
from etl.format.sample_columns import CARRIED, carried, carried_fields
from etl.format.schema import SAMPLES_SCHEMA, samples_schema
from etl.format.shards import shard_name
from etl.format.table_ops import (
    bool_mask,
    positions_in,
    sorted_by,
    taken,
    value_codes,
)
from etl.run.plan import Plan, pack_order, split_names
from etl.run.tasks import PackTask, ShardBatches, Texts, batch_size
from etl.sources.entries import FILE_COLUMNS, FileColumns, SourceFile
from etl.sources.listed_rejects import SourceReject, rejects_table


def check_window(
    files: pa.Table,
    digests: pa.ChunkedArray | pa.Array,
    failed: pa.Array,
    old_ids: pa.ChunkedArray | pa.Array,
    old_hashes: pa.ChunkedArray | pa.Array,
) -> pa.Table:
    """The files not already rejects (`failed` names those) with what the content-keyed
    decisions need of each: its content hash ('digest') and, from the previous version's row
    of the same source (`same_source`), its sample id ('old_id', null for none) and whether it
    held the same content ('old_same'). So deciding never looks a file's old row up again."""
    readable = ~bool_mask(pc.is_in(files.column("source"), value_set=failed))
    unhashed = readable & ~bool_mask(pc.is_valid(digests))
    if unhashed.any():
        source = files.column("source")[int(np.argmax(unhashed))].as_py()
        raise ValueError(f"no content hash for {source}: files_to_hash was not honoured")
    same = pc.fill_null(pc.equal(old_hashes, digests), False)
    checked = (
        files.append_column("digest", digests)
        .append_column("old_id", old_ids)
        .append_column("old_same", same)
    )
    return checked if readable.all() else checked.filter(pa.array(readable))


CHECKED_COLUMNS = (
    pa.field("digest", pa.string()),
    pa.field("old_id", pa.string()),
    pa.field("old_same", pa.bool_()),
)
"""The columns `check_window` adds to the listing's."""


@dataclass(frozen=True)
class Decided:
    """What `decide` made of some checked files: rows to keep, rows to pack, rejects, counts."""

    reused: pa.Table
    packing: pa.Table
    rejects: list[SourceReject]
    counts: Counter[str]


def decide(
    config: PipelineConfig,
    checked: pa.Table,
    classes: tuple[str, ...],
    stored: pa.Table | None = None,
    remembered: pa.Table | None = None,
) -> Decided:
    """Reuse stored pixels, repeat remembered rejects, drop duplicates, or pack: every choice
    keyed by content, for `checked` files (`check_window`'s columns) that hold every file
    sharing a content hash with any of them. `stored` are the previous version's samples whose
    hash may match, `remembered` its content rejects that may (both None: a first run or a
    rebuild); a bucket of content hashes passes its own share of each."""
    rejects: list[SourceReject] = []
    class_names, class_codes = value_codes(checked.column("class_name"))
    label_of = {name: i for i, name in enumerate(classes)}
    labels = np.array([*(label_of.get(c, -1) for c in class_names), -1])[class_codes]
    digests = checked.column("digest")
    for f, digest in _with_digests(checked, digests, labels < 0):
        message = f"class {f.class_name!r} is not in source.classes"
        rejects.append(_reject(f, "unknown_label", message, digest))
    candidate = labels >= 0

    # exact duplicates by content
    if config.validate_stage.duplicates != "allow":
        candidate = _drop_duplicates(checked, digests, candidate, config, rejects)

    # reuse stored pixels, repeat remembered rejects, or pack
    counts: Counter[str] = Counter()
    in_old = bool_mask(pc.is_valid(checked.column("old_id")))
    same = bool_mask(checked.column("old_same"))
    counts["unchanged"] = int((candidate & in_old & same).sum())
    counts["changed"] = int((candidate & in_old & ~same).sum())
    stored_pos = np.full(checked.num_rows, -1, dtype=np.int64)
    repeat = np.zeros(checked.num_rows, dtype=bool)
    if stored is not None:
        # a file's own previous row where its content is unchanged, else any row of the same
        # content: two files of one content keep their own rows, so a rerun changes nothing
        stored_pos = positions_in(digests, stored.column("source_hash"))
        own = positions_in(checked.column("old_id"), stored.column("sample_id"))
        stored_pos = np.where((own >= 0) & same, own, stored_pos)
    if remembered is not None:
        remembered_pos = positions_in(digests, remembered.column("source_hash"))
        repeat = candidate & (stored_pos < 0) & (remembered_pos >= 0)
        verdicts = remembered.select(["reason", "message"]).to_pylist()
        for (f, digest), at in zip(
            _with_digests(checked, digests, repeat), remembered_pos[repeat].tolist(), strict=True
        ):
            rejects.append(_reject(f, verdicts[at]["reason"], verdicts[at]["message"], digest))
    reuse = candidate & (stored_pos >= 0)
    pack = candidate & ~reuse & ~repeat
    counts["moved"] = int((reuse & ~in_old).sum())
    counts["new"] = int((pack & ~in_old).sum())

    identity = _identity(checked, labels, classes, config)
    reused = _reused_rows(stored, identity, reuse, stored_pos)
    return Decided(reused, _to_pack(identity, pack), rejects, counts)


COUNTED = ("unchanged", "changed", "deleted", "moved", "new")


def assemble(
    config: PipelineConfig,
    version: int,
    classes: tuple[str, ...],
    decided: Decided,
    rejects: pa.Table,
    maps: tuple[Mapped, ...] = (),
    writer: str = "",
) -> Plan:
    """The plan of `decided` (the whole listing's decisions; its counts with 'deleted' in
    them), with the rejects made before deciding (sorted by source): its shards, cut into
    batches of sources (`batch_size`), each made into a task when a worker takes it."""
    counts, packing = decided.counts, decided.packing
    everything = rejects
    if decided.rejects:
        everything = sorted_by(
            pa.concat_tables([rejects, rejects_table(decided.rejects)]), "source"
        )
    found = {name: counts[name] for name in COUNTED if counts.get(name)}
    found["deleted"] = counts.get("deleted", 0)
    found["rejected"] = everything.num_rows
    per_shard = config.samples_per_shard
    rows = packing.num_rows
    batch = batch_size(rows, per_shard, config.sample_bytes, worker_count(config.run))

    def task(shard: int, start: int, stop: int, shard_start: int, capacity: int) -> PackTask:
        return _pack_task(
            shard_name(version, shard, writer),
            start,
            start - shard_start,
            capacity,
            packing.slice(start, stop - start),
        )

    tasks: ShardBatches[PackTask] = ShardBatches(rows, per_shard, batch, task)
    return Plan(
        version=version,
        classes=classes,
        packing=packing,
        tasks=tasks,
        reused=decided.reused,
        rejects=everything,
        counts=found,
        maps=maps,
    )


def _drop_duplicates(
    files: pa.Table,
    digests: pa.ChunkedArray | pa.Array,
    candidate: NDArray[np.bool_],
    config: PipelineConfig,
    rejects: list[SourceReject],
) -> NDArray[np.bool_]:
    """`candidate` without the files whose content another candidate has too: all but the
    first by source ('keep_first') or all of them ('reject_all'), each a 'duplicate' reject
    naming up to 3 others. Objects are made only for files that share a hash."""
    rows = np.flatnonzero(candidate)
    _, codes = value_codes(digests.filter(pa.array(candidate)))
    shared = np.bincount(codes)[codes] > 1 if len(codes) else np.zeros(0, dtype=bool)
    if not shared.any():
        return candidate
    by_hash: dict[str, list[tuple[int, SourceFile]]] = defaultdict(list)
    mask = np.zeros(len(candidate), dtype=bool)
    mask[rows[shared]] = True
    for (f, digest), row in zip(
        _with_digests(files, digests, mask), np.flatnonzero(mask).tolist(), strict=True
    ):
        by_hash[digest].append((row, f))
    kept = candidate.copy()
    for digest, group in by_hash.items():
        sources = [f.source for _, f in group]
        first = min(sources)
        for row, f in group:
            if f.source != first or config.validate_stage.duplicates == "reject_all":
                others = sorted(s for s in sources if s != f.source)[:3]
                message = f"same bytes as {', '.join(others)}"
                rejects.append(_reject(f, "duplicate", message, digest))
                kept[row] = False
    return kept


def _identity(
    files: pa.Table, labels: NDArray[np.int64], classes: tuple[str, ...], config: PipelineConfig
) -> pa.Table:
    """The listed files with what a sample of each would be called: label, class name and
    split (the listing's, else one drawn from a hash of the path)."""
    splits: list[pa.Array] = []
    for batch in files.select(["source", "split"]).to_batches(max_chunksize=1 << 16):
        drawn = pa.array(split_names(batch.column(0).to_pylist(), config.source.split))
        splits.append(pc.coalesce(batch.column(1), drawn))
    safe = np.maximum(labels, 0)
    return (
        files.append_column("label", pa.array(safe.astype(np.int32)))
        .append_column("class", pa.array(classes or ("",), pa.string()).take(pa.array(safe)))
        .append_column("split_name", pa.chunked_array(splits, pa.string()))
    )


def _reused_rows(
    stored: pa.Table | None,
    identity: pa.Table,
    reuse: NDArray[np.bool_],
    stored_pos: NDArray[np.int64],
) -> pa.Table:
    """Previous rows holding the pixels of the reused files (their pixels and checksums) under
    the files' current identity, in source order (the listing's).

    A sample_id is a hash of the source: taken from the previous row of the same source where
    there is one ('old_id'), computed only for moved files."""
    schema = samples_schema(carried_fields(identity.schema))
    if stored is None or not reuse.any():
        return schema.empty_table()
    mine = identity.filter(pa.array(reuse))
    ids = mine.column("old_id")
    moved = bool_mask(pc.is_null(ids))
    if moved.any():
        computed = [sample_id(s) for s in mine.column("source").filter(pa.array(moved)).to_pylist()]
        ids = pc.replace_with_mask(ids, pa.array(moved), pa.array(computed, pa.string()))
    columns = {
        "sample_id": ids,
        "source": mine.column("source"),
        "source_size": mine.column("size"),
        "source_mtime_ns": mine.column("mtime_ns"),
        "source_ctime_ns": mine.column("ctime_ns"),
        "source_inode": mine.column("inode"),
        "label": mine.column("label"),
        "class_name": mine.column("class"),
        "split": mine.column("split_name"),
        **{name[len(CARRIED) :]: mine.column(name) for name in carried(mine.column_names)},
    }
    # NOTE: only the columns that stay are taken from the previous version, and not at all
    # when every row is kept in place (a no-change rerun): a take copies each column it gets.
    kept = [name for name in SAMPLES_SCHEMA.names if name not in columns]
    rows = stored_pos[reuse]
    kept_rows = stored.select(kept)
    if not (len(rows) == kept_rows.num_rows and (rows == np.arange(len(rows))).all()):
        kept_rows = kept_rows.take(pa.array(rows))
    columns.update(zip(kept, kept_rows.columns, strict=True))
    names = schema.names
    return pa.table([columns[name] for name in names], names=names).cast(schema)


PACKING_COLUMNS = (*FILE_COLUMNS, "label", "class", "split_name", "digest", "order")
"""The columns of `Plan.packing`: the listing's, what the sample will be called, its content
hash, and its position key in the shards (`pack_order`); then the declared columns the listing
carries (`etl.format.sample_columns.CARRIED`)."""


def _to_pack(identity: pa.Table, pack: NDArray[np.bool_]) -> pa.Table:
    """The files to pack with their content hash, in the order shards are filled.

    NOTE: shards are filled in a hash order of the source path, not in path order: path order
    puts one class in a shard, which makes every locality-friendly read order (block shuffle,
    streaming whole shards) see one class at a time. The order is still a pure function of the
    paths, so loky, Dask and a rerun produce the same shards. The rows are taken once, a
    column at a time: a filter then a take held two copies of the listing at 10M files."""
    rows = np.flatnonzero(pack)
    sources = identity.column("source").take(pa.array(rows))
    order = np.empty(len(rows), dtype=np.uint64)
    for start in range(0, len(rows), 1 << 16):
        batch = sources.slice(start, 1 << 16).to_pylist()
        order[start : start + len(batch)] = [pack_order(s) for s in batch]
    del sources
    sort = np.argsort(order, kind="stable")
    chosen = identity.select([*PACKING_COLUMNS[:-1], *carried(identity.column_names)])
    return taken(chosen, rows[sort]).append_column("order", pa.array(order[sort]))


def _pack_task(shard: str, start: int, slot: int, capacity: int, rows: pa.Table) -> PackTask:
    return PackTask(
        shard,
        start,
        slot,
        capacity,
        Texts.of_arrow(rows.column("source")),
        Texts.of_arrow(rows.column("path")),
        Texts.of_arrow(rows.column("digest")),
    )


def _reject(f: SourceFile, reason: str, message: str, digest: str) -> SourceReject:
    return SourceReject(f.source, reason, message, f.size, f.mtime_ns, digest, f.ctime_ns, f.inode)


def _with_digests(
    files: pa.Table, digests: pa.ChunkedArray | pa.Array, mask: NDArray[np.bool_]
) -> Iterator[tuple[SourceFile, str]]:
    """The listed files where `mask` holds, as objects with their content hash: for the few
    that become rejects."""
    chosen = pa.array(mask)
    table = files.select(list(FILE_COLUMNS)).filter(chosen)
    return zip(FileColumns(table), digests.filter(chosen).to_pylist(), strict=True)
