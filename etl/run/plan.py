"""Pure planning: (sources, content hashes, previous manifest, config) -> pack, keep, reject.

No I/O happens here, and nothing here makes a Python object per source: the listing, the
previous manifest and the decisions are Arrow and numpy columns, so a plan over 10M files
costs bytes per file. Objects are made only for rejects; what a worker will do (`PackTask`s) is
built as it is dispatched, a few buffers a shard.

Work is decided by content: a source whose path and stat match the previous manifest keeps its
stored pixels without being read; any source whose content hash equals pixels already stored
(a moved, renamed or touched file) reuses them without decoding; a source whose hash matches a
remembered reject is rejected again without decoding. Only the rest is packed, into new
shards: shards are immutable.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from numpy.typing import NDArray

from etl.config import PipelineConfig
from etl.format.columns import (
    DigestSet,
    bool_mask,
    positions_in,
    sorted_by,
    take_or_null,
    taken,
    value_codes,
)
from etl.format.manifest import CHECK_ROWS, SAMPLES_SCHEMA, Manifest
from etl.format.mapped import Mapped
from etl.format.names import sample_id
from etl.format.shards import shard_name
from etl.images.rejects import CONTENT_REJECTS
from etl.run.tasks import Chunks, PackTask, Texts
from etl.sources.entries import (
    FILE_COLUMNS,
    FileColumns,
    SourceFile,
    SourceListing,
    SourceReject,
    rejects_table,
)

TRAIN = "train"


@dataclass(frozen=True)
class Plan:
    version: int
    classes: tuple[str, ...]
    packing: pa.Table
    """The sources to pack, in the order shards are filled, with what their samples will be
    called: the listing's columns, label, class, split_name and digest (the content hash)."""
    tasks: Sequence[PackTask]
    """One task per new shard, a slice of `packing`, built when taken (`Chunks`)."""
    reused: pa.Table
    """Manifest rows whose stored pixels are kept, with label, split and stat brought up to date
    (SAMPLES_SCHEMA, sorted by source)."""
    rejects: pa.Table
    """Every source that will not be a sample, with why (REJECTS_SCHEMA, sorted by source)."""
    counts: Mapping[str, int] = field(default_factory=dict)
    """unchanged, changed, new, moved, deleted, rejected: what the plan found."""
    maps: tuple[Mapped, ...] = ()
    """The files `packing`, `reused` and `rejects` are mapped from, when the plan was made on
    disk."""

    def release_pages(self) -> None:
        """Let go of the pages of the plan's tables read so far (`Mapped.release`)."""
        for mapped in self.maps:
            mapped.release()

    @property
    def to_pack(self) -> int:
        """Sources in `tasks`."""
        return int(self.packing.num_rows)


def pack_order(source: str) -> int:
    """Position key of a source within the shards a run writes: a seeded hash of its path."""
    return xxhash.xxh3_64_intdigest(b"order:" + source.encode("utf-8"))


def assign_split(source: str, fractions: Mapping[str, float]) -> str:
    """Deterministic split by a hash of the path: a sample keeps its split as other files come
    and go. Fractions are taken in sorted split-name order; the remainder is 'train'."""
    return split_names([source], fractions)[0]


def split_names(sources: Iterable[str], fractions: Mapping[str, float]) -> list[str]:
    """`assign_split` of many sources: one hash each, then one vectorised comparison."""
    names = sorted(fractions)
    edges = np.cumsum([fractions[name] for name in names], dtype=np.float64)
    draws = np.fromiter(
        (xxhash.xxh3_64_intdigest(b"split:" + s.encode("utf-8")) for s in sources), np.float64
    )
    choices = [*names, TRAIN]
    return [choices[i] for i in np.searchsorted(edges, draws / 2.0**64, side="right").tolist()]


_STAT_COLUMNS = ["source_size", "source_mtime_ns", "source_ctime_ns", "source_inode"]
_FILE_STAT = ["size", "mtime_ns", "ctime_ns", "inode"]
"""What must all match the previous manifest for a file to count as unchanged unread.

NOTE: size and mtime alone miss a file rewritten in place with its old mtime put back
(`touch -r`, `cp -p`, rsync, some editors); ctime cannot be set back from user space and a
replaced file has a new inode, as git's index compares too. A chmod, a rename or a copy
elsewhere changes them as well: that costs a re-hash, never a re-pack (same content)."""


def _numbers(column: pa.ChunkedArray | pa.Array) -> tuple[NDArray[Any], NDArray[np.bool_]]:
    """An integer column as numpy values (nulls as 0) and its validity."""
    valid = np.asarray(pc.is_valid(column).to_numpy(zero_copy_only=False), dtype=bool)
    values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)
    return np.asarray(values), valid


def known_digests(
    files: pa.Table, samples: pa.Table | None, rejects: pa.Table | None = None
) -> pa.Array:
    """For each listed file, the content hash the previous version recorded for the same
    source and the same whole stat key (null where none: a new, changed or touched file, or a
    row written before ctime and inode were recorded). `samples` and `rejects` are the
    previous version's rows, or the slice of them a window of the listing can match."""
    known = pa.nulls(files.num_rows, pa.string())
    if not files.num_rows:
        return known
    mine = [_numbers(files.column(c))[0] for c in _FILE_STAT]
    for rows in (samples, rejects):
        if rows is None or not rows.num_rows:
            continue
        where = positions_in(files.column("source"), rows.column("source"))
        same = where >= 0
        at = np.maximum(where, 0)
        for ours, theirs in zip(mine, _STAT_COLUMNS, strict=True):
            values, valid = _numbers(rows.column(theirs))
            same &= valid[at] & (values[at].astype(np.int64) == ours.astype(np.int64))
        digests = take_or_null(rows.column("source_hash"), np.where(same, where, -1))
        known = pc.coalesce(known, digests)
    return known


def hash_wanted(files: pa.Table, known: pa.Array | pa.ChunkedArray) -> NDArray[np.bool_]:
    """Which files have a content hash known neither from listing (`content_hash`) nor from
    the previous version (`known`, by path and stat)."""
    return bool_mask(pc.and_(pc.is_null(files.column("content_hash")), pc.is_null(known)))


def needs_hash(listing: SourceListing, previous: Manifest | None) -> NDArray[np.bool_]:
    """Which listed files have a content hash known neither from listing (`content_hash`) nor
    from the previous manifest by path and stat."""
    files = listing.files.table
    if previous is None:
        return hash_wanted(files, pa.nulls(files.num_rows, pa.string()))
    return hash_wanted(files, known_digests(files, previous.samples, previous.rejects))


def files_to_hash(listing: SourceListing, previous: Manifest | None) -> FileColumns:
    """The listed files `needs_hash` picks."""
    return FileColumns(listing.files.table.filter(pa.array(needs_hash(listing, previous))))


def settled_hashes(previous: Manifest | None) -> DigestSet:
    """Contents `make_plan` never packs: pixels already stored, or a remembered content reject.
    A lister that must copy what is to be packed (a Python source's spool) skips these."""
    if previous is None:
        return DigestSet()
    columns = (
        previous.samples.column("source_hash"),
        remembered_rejects(previous).column("source_hash"),
    )

    def pieces() -> Iterator[pa.ChunkedArray]:
        for column in columns:
            for start in range(0, len(column), CHECK_ROWS):
                yield column.slice(start, CHECK_ROWS)
                previous.release_pages()

    return DigestSet(pieces())


def remembered_rejects(previous: Manifest) -> pa.Table:
    """The previous version's rejects that belong to content (a hash repeats the verdict)."""
    rejects = previous.rejects
    content = pc.and_(
        pc.is_in(rejects.column("reason"), pa.array(sorted(CONTENT_REJECTS), pa.string())),
        pc.invert(pc.fill_null(pc.equal(rejects.column("source_hash"), ""), True)),
    )
    return rejects.filter(content)


def _reject(f: SourceFile, reason: str, message: str, digest: str) -> SourceReject:
    return SourceReject(f.source, reason, message, f.size, f.mtime_ns, digest, f.ctime_ns, f.inode)


def resolve_classes(
    config: PipelineConfig,
    names: Iterable[str],
    prior: tuple[str, ...],
    declared: tuple[str, ...] | None = None,
) -> tuple[str, ...]:
    """Label order: a fixed `classes:` list, else the prior version's classes followed by the
    new names, in the order the source declares them (`SourceListing.classes`) and then sorted,
    so adding a class never renumbers existing ones."""
    if config.source.classes is not None:
        return tuple(config.source.classes)
    known = set(prior)
    ordered = [name for name in declared or () if name not in known]
    known.update(ordered)
    return (*prior, *ordered, *sorted(set(names) - known))


Hashes: TypeAlias = "Mapping[str, str] | pa.Array | pa.ChunkedArray"
"""What the hash phase found: a column of one hash per listed file (null where none), or a
{source: hash} mapping of the files hashed."""


def _hash_column(hashes: Hashes, files: pa.Table) -> pa.Array | pa.ChunkedArray:
    """Each listed file's hash from the hash phase, null where it has none."""
    if isinstance(hashes, pa.Array | pa.ChunkedArray):
        if len(hashes) != files.num_rows:
            raise ValueError(f"{len(hashes)} hashes for a listing of {files.num_rows} files")
        return hashes
    found = pa.array(list(hashes.values()), pa.string())
    where = positions_in(files.column("source"), pa.array(list(hashes), pa.string()))
    return take_or_null(found, where)


def _with_digests(
    files: pa.Table, digests: pa.ChunkedArray | pa.Array, mask: NDArray[np.bool_]
) -> Iterator[tuple[SourceFile, str]]:
    """The listed files where `mask` holds, as objects with their content hash: for the few
    that become rejects."""
    chosen = pa.array(mask)
    table = files.select(list(FILE_COLUMNS)).filter(chosen)
    return zip(FileColumns(table), digests.filter(chosen).to_pylist(), strict=True)


def same_source(files: pa.Table, samples: pa.Table | None) -> tuple[pa.Array, pa.Array]:
    """For each file, the sample id and the content hash of the previous version's row of the
    same source (null where there is none), where `samples` are that version's rows or the
    slice of them a window of the listing can match."""
    if samples is None or not samples.num_rows:
        none = pa.nulls(files.num_rows, pa.string())
        return none, none
    where = positions_in(files.column("source"), samples.column("source"))
    ids = take_or_null(samples.column("sample_id"), where)
    return ids, take_or_null(samples.column("source_hash"), where)


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
        stored_pos = positions_in(digests, stored.column("source_hash"))
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
) -> Plan:
    """The plan of `decided` (the whole listing's decisions; its counts with 'deleted' in
    them), with the rejects made before deciding (sorted by source): its shards, one task each,
    made when a worker takes it."""
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
    tasks: Chunks[PackTask] = Chunks(
        packing.num_rows,
        per_shard,
        lambda start, stop: _pack_task(
            shard_name(version, start // per_shard), start, packing.slice(start, stop - start)
        ),
    )
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


def make_plan(
    config: PipelineConfig,
    listing: SourceListing,
    hashes: Hashes,
    hash_rejects: Iterable[SourceReject],
    previous: Manifest | None,
    version: int,
    prior_classes: tuple[str, ...] = (),
) -> Plan:
    """Decide every source's fate, with the whole listing in memory (`etl.run.staged` makes
    the same plan a window and a bucket at a time). `hashes` holds the content hash of each
    file `needs_hash` picks that could be read (a file with a `content_hash` from listing needs
    none); `hash_rejects` the ones that could not. `previous` is the manifest whose pixels may
    be reused (None for a first run or a rebuild); `prior_classes` the label order to extend."""
    files = listing.files.table
    rejects: list[SourceReject] = list(listing.rejects) + list(hash_rejects)
    failed = pa.array(sorted({r.source for r in rejects}), pa.string())
    samples = previous.samples if previous is not None else None
    known = known_digests(files, samples, previous.rejects if previous is not None else None)
    # NOTE: a hash from listing wins over the stat: those kinds have no stat that proves a
    # value unchanged (an LMDB value rewritten with the same length keeps size and mtime 0)
    digests = pc.coalesce(files.column("content_hash"), known, _hash_column(hashes, files))
    old_ids, old_hashes = same_source(files, samples)
    checked = check_window(files, digests, failed, old_ids, old_hashes)
    names = value_codes(files.column("class_name"))[0]
    classes = resolve_classes(config, names, prior_classes, listing.classes)
    before = sorted_by(rejects_table(rejects), "source")
    if previous is None:
        return assemble(config, version, classes, decide(config, checked, classes), before)
    decided = decide(config, checked, classes, previous.samples, remembered_rejects(previous))
    decided.counts["deleted"] = previous.samples.num_rows - (len(old_ids) - old_ids.null_count)
    return assemble(config, version, classes, decided, before)


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
    if stored is None or not reuse.any():
        return SAMPLES_SCHEMA.empty_table()
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
    }
    # NOTE: only the columns that stay are taken from the previous version, and not at all
    # when every row is kept in place (a no-change rerun): a take copies each column it gets.
    kept = [name for name in SAMPLES_SCHEMA.names if name not in columns]
    rows = stored_pos[reuse]
    kept_rows = stored.select(kept)
    if not (len(rows) == kept_rows.num_rows and (rows == np.arange(len(rows))).all()):
        kept_rows = kept_rows.take(pa.array(rows))
    columns.update(zip(kept, kept_rows.columns, strict=True))
    names = SAMPLES_SCHEMA.names
    return pa.table([columns[name] for name in names], names=names).cast(SAMPLES_SCHEMA)


PACKING_COLUMNS = (*FILE_COLUMNS, "label", "class", "split_name", "digest", "order")
"""The columns of `Plan.packing`: the listing's, what the sample will be called, its content
hash, and its position key in the shards (`pack_order`)."""


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
    chosen = identity.select(list(PACKING_COLUMNS[:-1]))
    return taken(chosen, rows[sort]).append_column("order", pa.array(order[sort]))


def _pack_task(shard: str, start: int, rows: pa.Table) -> PackTask:
    return PackTask(
        shard,
        start,
        Texts.of_arrow(rows.column("source")),
        Texts.of_arrow(rows.column("path")),
        Texts.of_arrow(rows.column("digest")),
    )
