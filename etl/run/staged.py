"""The plan of a listing of any size, made a window and a bucket at a time with its tables on
disk, so the parent's memory follows `WINDOW_ROWS` and `buckets.BUCKET_ROWS`, not the number
of files. It is the plan the whole listing would give at once (the tests' oracle,
`tests/helpers/plan_oracle.py`), made by the same functions:

1. Windows of the listing in source order, each merge-joined with the slice of the previous
   version's rows (sorted by source) it can match: the stat proves some hashes known; the
   rest are hashed (`hash_files`) right then. Each checked row goes to the bucket of its
   content hash (`etl.run.hash_buckets`), and so does each previous sample the window passed, so
   the manifest is read once, in order.
2. Once every class name is known (the labels need them all), each bucket is decided
   (`decide.decide`) with its previous samples and the remembered rejects whose hash falls in
   it.
   Rows to keep go to a spill sorted by source, rows to pack to one sorted by pack order.
3. Both spills are written out as one Arrow file each and mapped: `Plan.reused` and
   `Plan.packing`, which the pack phase and the commit read a piece at a time.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from etl.config import PipelineConfig
from etl.format.manifest import Manifest
from etl.format.mapped import Mapped, releasing
from etl.format.sample_columns import carried_fields
from etl.format.schema import REJECTS_SCHEMA, SAMPLES_SCHEMA, samples_schema
from etl.format.spill import SortedSpill
from etl.format.table_ops import ascending, bisect_right, sorted_by, value_codes
from etl.run.decide import CHECKED_COLUMNS, Decided, assemble, check_window, decide
from etl.run.hash_buckets import Buckets, bucket_count, buckets_of
from etl.run.plan import (
    Plan,
    hash_wanted,
    known_digests,
    remembered_rejects,
    resolve_classes,
    same_source,
)
from etl.sources.entries import SourceListing
from etl.sources.listed_rejects import SourceReject, rejects_table

WINDOW_ROWS = 1 << 18
"""Listed files checked at a time: hashed together, then dealt out to the buckets."""

HashFiles = Callable[[pa.Table], tuple[pa.Array, list[SourceReject]]]
"""Content hashes of the listed files given, one per file in order (null where a file could
not be read), and the rejects of those that could not."""


def staged_plan(
    config: PipelineConfig,
    listing: SourceListing,
    hash_files: HashFiles,
    previous: Manifest | None,
    version: int,
    prior_classes: tuple[str, ...],
    folder: Path,
    on_known: Callable[[int], None] = lambda n: None,
    writer: str = "",
) -> Plan:
    """The plan of `listing`, hashing what the previous version does not vouch for as it
    goes; temporary files go in `folder`, and the plan's two tables stay there (mapped) until
    the caller removes it. `on_known(n)`: n more files needed no hashing. `writer` tags the
    new shards' names (`shard_name`)."""
    files = listing.files.table
    previous = _in_source_order(previous)
    rejects = SortedSpill(folder, REJECTS_SCHEMA, "source", "rejects")
    count = bucket_count(max(files.num_rows, previous.samples.num_rows if previous else 0))
    names: set[str] = set()
    matched = 0
    schema = pa.schema([*files.schema, *CHECKED_COLUMNS])
    with (
        rejects,
        Buckets(folder, schema, count) as buckets,
        Buckets(folder, SAMPLES_SCHEMA, count, "stored") as stored,
    ):
        window_of = _PreviousBySource(previous)
        for start in range(0, files.num_rows, WINDOW_ROWS):
            window = files.slice(start, WINDOW_ROWS)
            samples, previous_rejects = window_of.upto(window.column("source")[-1].as_py())
            checked, listed_before = _checked_window(
                window, samples, previous_rejects, hash_files, rejects, on_known
            )
            matched += listed_before
            names.update(value_codes(window.column("class_name"))[0])
            buckets.add(checked, buckets_of(checked.column("digest"), count))
            _store(stored, samples)
            del window, checked, samples
            _release(listing, previous)
        _store(stored, window_of.rest())
        classes = resolve_classes(config, names, prior_classes, listing.classes)
        stored_by_bucket = stored if previous is not None else None
        decided, maps = _decide_buckets(
            config, buckets, stored_by_bucket, classes, previous, folder, rejects
        )
        listed = listing.rejects
        rejected = rejects.written(
            folder / "rejects.arrow",
            listed.table,
            through=lambda pieces: releasing(pieces, partial(_release_rejects, listing)),
        )
    if previous is not None:
        decided.counts["deleted"] = previous.samples.num_rows - matched
    kept = (*maps, rejected)
    return assemble(config, version, classes, decided, rejected.table, kept, writer)


def _checked_window(
    window: pa.Table,
    samples: pa.Table | None,
    previous_rejects: pa.Table | None,
    hash_files: HashFiles,
    rejects: SortedSpill,
    on_known: Callable[[int], None],
) -> tuple[pa.Table, int]:
    """One window of listed files checked against the previous version's `samples` and
    `previous_rejects` of the same sources: hashed where the previous version does not vouch
    for them (the unreadable ones rejected), then each file's digest, id and verdict
    (`check_window`); and how many of them the previous version listed."""
    known = known_digests(window, samples, previous_rejects)
    wanted = hash_wanted(window, known)
    on_known(int((~wanted).sum()))
    hashed: pa.Array = pa.nulls(window.num_rows, pa.string())
    failed = pa.array([], pa.string())  # a listed reject is never a listed file
    if wanted.any():
        found, unreadable = hash_files(window.filter(pa.array(wanted)))
        hashed = pc.replace_with_mask(hashed, pa.array(wanted), found)
        rejects.add(rejects_table(unreadable))
        failed = pa.array([r.source for r in unreadable], pa.string())
    digests = pc.coalesce(window.column("content_hash"), known, hashed)
    old_ids, old_hashes = same_source(window, samples)
    checked = check_window(window, digests, failed, old_ids, old_hashes)
    return checked, len(old_ids) - old_ids.null_count


def _store(stored: Buckets, samples: pa.Table | None) -> None:
    """Deal previous samples out to the buckets of their content hash: each bucket is decided
    with its own share of them, read back from disk in one piece, instead of taking rows from
    all over the mapped manifest (a bucket's rows are spread across every page of it)."""
    if samples is not None and samples.num_rows:
        # NOTE: without a version's own columns: what a sample carries now is the listing's
        base = samples.select(SAMPLES_SCHEMA.names)
        stored.add(base, buckets_of(samples.column("source_hash"), stored.count))


def _decide_buckets(
    config: PipelineConfig,
    buckets: Buckets,
    stored: Buckets | None,
    classes: tuple[str, ...],
    previous: Manifest | None,
    folder: Path,
    rejects: SortedSpill,
) -> tuple[Decided, tuple[Mapped, Mapped]]:
    """`decide` of each bucket with the previous samples (`stored`) and remembered rejects
    whose content hash falls in it; the rows to keep and to pack gathered in key order into
    mapped files in `folder`, the rejects into `rejects`."""
    count = buckets.count
    remembered = remembered_bucket = None
    if previous is not None:
        remembered = remembered_rejects(previous)
        remembered_bucket = buckets_of(remembered.column("source_hash"), count)
        _release(None, previous)
    counts: Counter[str] = Counter()
    packing: SortedSpill | None = None
    schema = samples_schema(carried_fields(buckets.schema))
    with SortedSpill(folder, schema, "source", "reused") as reused:
        for bucket in range(count):
            rows = buckets.take(bucket)
            mine = remembered
            if remembered is not None:
                mine = remembered.filter(pa.array(remembered_bucket == bucket))
            samples = stored.take(bucket) if stored is not None else None
            decided = decide(config, rows, classes, samples, mine)
            del rows, samples
            # each bucket's rows come in source order and are packed in pack order: runs
            reused.add_sorted(decided.reused)
            if packing is None:
                packing = SortedSpill(folder, decided.packing.schema, "order", "packing")
            packing.add_sorted(decided.packing)
            counts.update(decided.counts)
            rejects.add(rejects_table(decided.rejects))
        assert packing is not None, "a listing makes at least one bucket"
        with packing:
            kept = reused.written(folder / "reused.arrow")
            packed = packing.written(folder / "packing.arrow")
        return Decided(kept.table, packed.table, [], counts), (kept, packed)


def _release_rejects(listing: SourceListing) -> None:
    if listing.rejects.mapped is not None:
        listing.rejects.mapped.release()


def _release(listing: SourceListing | None, previous: Manifest | None) -> None:
    """Let go of the mapped pages of the listing and the previous version read so far: each
    window and bucket reads its own share of them, and the next one never needs those."""
    if listing is not None:
        listing.files.release_pages()
    if previous is not None:
        previous.release_pages()


class _PreviousBySource:
    """The previous version's samples and rejects, sorted by source, handed out in
    consecutive slices: each window of the listing (sorted too) gets the rows up to its last
    source, found by bisection, so no window looks at more than its share."""

    def __init__(self, previous: Manifest | None) -> None:
        self._samples = previous.samples if previous is not None else None
        self._rejects = previous.rejects if previous is not None else None
        self._at = [0, 0]

    def upto(self, last: str) -> tuple[pa.Table | None, pa.Table | None]:
        """(samples, rejects) with sources after the previous call's `last` and up to this
        one's."""
        if self._samples is None or self._rejects is None:
            return None, None
        slices = []
        for i, table in enumerate((self._samples, self._rejects)):
            end = bisect_right(table.column("source"), last, self._at[i])
            slices.append(table.slice(self._at[i], end - self._at[i]))
            self._at[i] = end
        return slices[0], slices[1]

    def rest(self) -> pa.Table | None:
        """The samples after the last call's `last`: sources no longer listed."""
        if self._samples is None:
            return None
        return self._samples.slice(self._at[0])


def _in_source_order(previous: Manifest | None) -> Manifest | None:
    """`previous` with its samples and rejects each sorted by source: as this tool writes
    them, and re-sorted in memory only for a version written out of order."""
    if previous is None:
        return None
    tables = {}
    for name in ("samples", "rejects"):
        table = getattr(previous, name)
        if not ascending(table.column("source"), previous.release_pages):
            tables[name] = sorted_by(table, "source")
    return dataclasses.replace(previous, **tables) if tables else previous
