"""A run's phases, in the order `etl.run.pipeline` calls them: the version it builds on
(`open_previous`), list, hash and plan (`plan_run`), pack, commit; each one's wall time, and the
memory it freed handed back before the next starts, so one phase's peak is not carried into
the next."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from etl.config import PipelineConfig
from etl.engine import interrupt, parallel
from etl.errors import (
    ManifestError,
)
from etl.format import spill
from etl.format.commit import clean_leftovers, commit_version, remove_due_retirements
from etl.format.manifest import Manifest, list_versions, read_manifest
from etl.format.mapped import releasing
from etl.format.sample_columns import type_name
from etl.format.schema import ManifestMeta, sample_shape_of
from etl.format.shards import ShardInfo
from etl.progress import Progress
from etl.run import execute
from etl.run.plan import Plan, settled_hashes
from etl.run.report import RunReport, by_reason
from etl.run.results import ShardGaps, packed_rejects, packed_samples
from etl.run.staged import staged_plan
from etl.sources import readers
from etl.sources.entries import FileColumns, ListContext, SourceListing
from etl.sources.listed_rejects import SourceReject
from etl.sources.registry import kind_of, list_sources


def convert_while_waiting() -> None:
    """Make pyarrow ready to convert Python values, on a thread, while this process waits for
    the hash phase's workers to start.

    NOTE: the first `pa.array` of a process imports pandas when it is installed (pyarrow
    checks whether the values are pandas objects; apache/arrow#34994): 0.2 s of a 300-photo
    run, spent in `plan` with nothing else to do. Started here it overlaps with the workers'
    start-up (0.4 s). Harmless if the main thread gets there first: imports are locked.
    """
    threading.Thread(target=pa.array, args=([0],), name="etl-arrow-warm", daemon=True).start()


@contextlib.contextmanager
def phase(phases: dict[str, float], name: str) -> Iterator[None]:
    """Records the block's wall time as phases[name], and hands back the memory the block
    freed (`release_freed_memory`)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = time.perf_counter() - start
        release_freed_memory()


def release_freed_memory() -> None:
    """Return to the system what Arrow's allocator keeps of the memory freed so far.

    NOTE: mimalloc keeps freed pages for reuse, so the resident set after a phase carried its
    peak into the next: 60 to 100 MiB at 1M files (session 18, VmHWM per phase). One call
    between phases costs milliseconds; lowering its purge delay for the whole run
    (MIMALLOC_PURGE_DELAY=0) slowed the plan by 20 to 40 %.
    """
    pa.default_memory_pool().release_unused()


RELEASE_ROWS = 1 << 16
"""Rows read from mapped files between two `release_pages`: a few MB of pages resident."""


def _same_content(previous: Manifest, plan: Plan, rejects: pa.Table) -> bool:
    """Whether the plan's kept rows and these rejects are the previous version's, compared a
    slice at a time with the mapped pages let go of after each (both may exceed memory)."""
    samples = plan.reused
    if samples.num_rows != previous.samples.num_rows or not previous.rejects.equals(rejects):
        return False
    for start in range(0, samples.num_rows, RELEASE_ROWS):
        same = previous.samples.slice(start, RELEASE_ROWS).equals(
            samples.slice(start, RELEASE_ROWS)
        )
        previous.release_pages()
        plan.release_pages()
        if not same:
            return False
    return True


@dataclass
class RunState:
    """What the phases of one run share: its settings, and the version it builds on."""

    config: PipelineConfig
    root: Path
    dry_run: bool
    rebuild: bool
    progress: Progress
    started: float
    writer: str = ""
    """Tags the new shards' names: set by a run that publishes to object storage."""
    latest: int = 0
    """The latest committed version (0: none)."""
    previous: Manifest | None = None
    """The latest version as read, if it could be."""
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def reusable(self) -> Manifest | None:
        """The version whose samples and rejects this run may reuse: none under --rebuild."""
        return None if self.rebuild else self.previous

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        return phase(self.phases, name)

    def report(self, **values: Any) -> RunReport:
        return RunReport(
            output=self.root,
            seconds=time.perf_counter() - self.started,
            phases=self.phases,
            **values,
        )


@dataclass(frozen=True)
class Packed:
    """What the pack phase produced: the new samples (on disk until the commit), the new
    version's rejects and its new shards."""

    new_samples: spill.SortedSpill
    """Their 'row' still the slot planned (`ShardGaps.with_final_rows`)."""
    rejects: pa.Table
    new_shards: list[ShardInfo]
    gaps: ShardGaps

    @property
    def packed_new(self) -> int:
        return self.new_samples.rows


def _read_previous(root: Path, latest: int, rebuild: bool) -> Manifest | None:
    """The version a run builds on. A damaged one stops an incremental run, which would carry
    the damage forward; --rebuild packs from the sources past it (label numbers start afresh)."""
    if not latest:
        return None
    try:
        return read_manifest(root, latest)
    except ManifestError as exc:
        if rebuild:
            return None
        raise ManifestError(f"{exc}; or 'etl run --rebuild' packs a new version") from None


def open_previous(run: RunState) -> None:
    """The version this run builds on, checked against the config; leftovers removed."""
    versions = list_versions(run.root)
    run.latest = versions[-1] if versions else 0
    if not run.dry_run:
        clean_leftovers(run.root, run.latest)
        remove_due_retirements(run.root)  # NOTE [ a grace period ]: at a run, as at a compaction
    run.previous = _read_previous(run.root, run.latest, run.rebuild)
    # the decode the version was packed with, unless pipeline.yaml says (NOTE in `resolved`)
    run.config = run.config.resolved(run.reusable.meta.config if run.reusable else None)
    if run.reusable is not None:
        run.config.check_same_output(
            run.reusable.meta.config,
            run.reusable.meta.config_digest,
            f"{run.root}: version {run.latest}",
            "restore them, choose another output.dir, or pass --rebuild",
        )


def list_inputs(run: RunState, scratch: Path) -> SourceListing:
    """Every input of the source; record kinds spool what the plan may pack (NOTE [spool]), a
    folder's listing goes to `scratch`."""
    config = run.config
    reads_every_record = not kind_of(config.source).by_path
    # NOTE: only record kinds look at `stored`, and as a Python set it costs ~250 B a sample
    context = ListContext(
        checksum=config.output.checksum,
        stored=settled_hashes(run.reusable) if reads_every_record else frozenset(),
        spool=None if run.dry_run else readers.spool_path(run.root),
        scratch=scratch,
        columns=config.sample_columns,
    )
    with run.phase("list"):
        return list_sources(config.source, context)


def kept_objects(config: PipelineConfig, folder: Path) -> Path | None:
    """Where the hash phase keeps objects of a source in a store for the pack phase to read
    instead of a second GET (`etl.sources.kept`): the run's scratch folder, on this machine's
    disk (only objects are kept: a local file is read again); None on a Dask cluster (its
    workers do not share the disk) and for sources read otherwise."""
    if config.run.backend == "dask" or not kind_of(config.source).by_path:
        return None
    keep = folder / "objects"
    keep.mkdir(exist_ok=True)
    return keep


def plan_run(
    run: RunState, listing: SourceListing, folder: Path, starting: parallel.Starting
) -> Plan:
    """Hash what the previous version does not vouch for, and decide every file's fate
    (`etl.run.staged`), a window of the listing at a time; the time spent hashing is the
    'hash' phase, the rest 'plan'."""
    config = run.config
    hashing = [0.0]

    def hash_files(files: pa.Table) -> tuple[pa.Array, list[SourceReject]]:
        start = time.perf_counter()
        if parallel.worth_processes(config.run, files.num_rows):
            starting.begin()  # a rerun's: files to hash are likely files to pack
        try:
            return execute.hash_sources(
                FileColumns(files),
                config.output.checksum,
                config.run,
                run.progress.advance,
                source_config=config.source,
                starting=starting,
                keep=kept_objects(config, folder),
            )
        finally:
            hashing[0] += time.perf_counter() - start

    convert_while_waiting()
    prior = tuple(run.previous.meta.classes) if run.previous is not None else ()
    start = time.perf_counter()
    run.progress.start("hash", len(listing.files))
    try:
        plan = staged_plan(
            config,
            listing,
            hash_files,
            run.reusable,
            run.latest + 1,
            prior,
            folder,
            run.progress.advance,
            run.writer,
        )
    finally:
        run.progress.stop()
        release_freed_memory()
    run.phases["hash"] = hashing[0]
    run.phases["plan"] = time.perf_counter() - start - hashing[0]
    return plan


def pack(
    run: RunState,
    plan: Plan,
    new_samples: spill.SortedSpill,
    new_rejects: spill.SortedSpill,
    folder: Path,
    starting: parallel.Starting,
) -> Packed:
    """Fill the plan's shards in the workers; their samples go to `new_samples` and their
    rejects to `new_rejects` as each shard finishes. The version's rejects (the plan's and
    these) are written to `folder` and mapped.

    NOTE [ new samples on disk ]: workers send back columns (`PackResult`) and each shard's rows
    leave memory for a sorted run on disk (`SortedSpill`); the commit merges them with the
    reused rows a piece at a time. Kept in memory as dicts they cost ~1 KB an image (tracemalloc,
    12,000 photos), and as Arrow tables ~175 B a row plus a second copy to sort at the commit.
    """
    new_shards: list[ShardInfo] = []
    gaps = ShardGaps()
    run.progress.start("pack", plan.to_pack)
    if parallel.worth_processes(run.config.run, plan.to_pack):
        starting.begin()  # a rerun's, unless its hash phase began it
    # closing: an interrupted loop stops the workers before the run cleans up (see
    # NOTE [ stop the workers on the way out ] in etl.engine.parallel).
    keep = kept_objects(run.config, folder)
    results = execute.pack(plan.tasks, run.config, run.root, run.progress.advance, starting, keep)
    with run.phase("pack"), contextlib.closing(results) as packed:
        for result in packed:
            if isinstance(result, execute.Sealed):
                gaps.add(result.name, result.gaps, result.offsets)
                if result.shard is not None:
                    new_shards.append(result.shard)
                continue
            new_samples.add(packed_samples(plan.packing, result, run.config.flat))
            if result.rejects:
                new_rejects.add(packed_rejects(plan.packing, result))
            plan.release_pages()
    run.progress.stop()
    rejects = new_rejects.written(folder / "rejects-all.arrow", plan.rejects)
    plan.release_pages()
    return Packed(new_samples, rejects.table, sorted(new_shards, key=lambda s: s.name), gaps)


def commit(run: RunState, listed: int, plan: Plan, packed: Packed) -> RunReport:
    """Publish the new version, unless nothing changed since the latest one."""
    config, rejects = run.config, packed.rejects
    counts: dict[str, Any] = dict(
        listed=listed,
        packed_new=packed.packed_new,
        reused=plan.reused.num_rows,
        rejected=rejects.num_rows,
        rejects_by_reason=by_reason(rejects),
        plan_counts=plan.counts,
        shards_written=len(packed.new_shards),
        bytes_written=sum(s.bytes for s in packed.new_shards),
        samples_total=plan.reused.num_rows + packed.packed_new,
    )
    notes: list[str] = []
    previous = run.reusable
    if previous is not None and not packed.new_shards and _same_content(previous, plan, rejects):
        notes.append(f"nothing changed since version {run.latest}")
        return run.report(version=run.latest, committed=False, notes=notes, **counts)
    codec = config.output.codec
    sample_shape, format_version = sample_shape_of(config.sample_shape, codec.encoded)
    meta = ManifestMeta(
        version=plan.version,
        format_version=format_version,
        sample_shape=sample_shape,
        layout=config.output.layout,
        classes=plan.classes,
        checksum=config.output.checksum,
        config_digest=config.digest(),
        config=config.output_shaping(),
        columns=tuple((c.name, type_name(c.type)) for c in config.sample_columns),
        codec=codec.shaping() if codec.encoded else None,
    )
    # deferred: no commit after a signal; none cut short by one
    with run.phase("commit"), interrupt.deferred():
        builds_on = previous.shards if previous is not None else None
        merged = map(packed.gaps.with_final_rows, packed.new_samples.merged(plan.reused))
        samples = releasing(merged, plan.release_pages)
        commit_version(run.root, meta, samples, rejects, packed.new_shards, builds_on)
    return run.report(version=plan.version, committed=True, notes=notes, **counts)
