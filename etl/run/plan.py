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

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from numpy.typing import NDArray

from etl.config import PipelineConfig
from etl.format.coherence import CHECK_ROWS
from etl.format.manifest import Manifest
from etl.format.mapped import Mapped
from etl.format.sample_columns import carried_fields
from etl.format.schema import samples_schema
from etl.format.table_ops import (
    DigestSet,
    bool_mask,
    positions_in,
    take_or_null,
)
from etl.images.rejects import CONTENT_REJECTS
from etl.run.tasks import PackTask
from etl.sources.entries import (
    FileColumns,
    SourceListing,
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
    """Batches of `packing` that fill the new shards, each built when taken (`ShardBatches`)."""
    reused: pa.Table
    """Manifest rows whose stored pixels are kept, with label, split and stat brought up to date
    (`samples_schema`, sorted by source)."""
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
    def samples_schema(self) -> pa.Schema:
        """The schema of the version's samples: SAMPLES_SCHEMA and the declared columns."""
        return samples_schema(carried_fields(self.packing.schema))

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
    """Contents a plan never packs: pixels already stored, or a remembered content reject.
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


def hash_column(hashes: Hashes, files: pa.Table) -> pa.Array | pa.ChunkedArray:
    """Each listed file's hash from the hash phase, null where it has none."""
    if isinstance(hashes, pa.Array | pa.ChunkedArray):
        if len(hashes) != files.num_rows:
            raise ValueError(f"{len(hashes)} hashes for a listing of {files.num_rows} files")
        return hashes
    found = pa.array(list(hashes.values()), pa.string())
    where = positions_in(files.column("source"), pa.array(list(hashes), pa.string()))
    return take_or_null(found, where)


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
