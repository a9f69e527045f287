"""Orchestration only: config -> sources -> plan -> execute -> commit, returning a report.

Order of durability: shards are renamed into place by the workers and fsynced before
`execute.pack` returns its last result, then the manifest version folder is renamed into place
here. A run killed at any point leaves the previous version untouched; its leftovers are
removed by the next run, under the lock.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from etl.config import PipelineConfig
from etl.engine import interrupt, parallel
from etl.errors import (
    OUTPUT_ERRNOS,
    ConfigError,
    ExecutionError,
    ManifestError,
    OutputError,
    WorkerDied,
    output_error,
    temporary_error,
)
from etl.format import spill
from etl.format.commit import clean_leftovers, commit_version
from etl.format.lock import DatasetLock
from etl.format.manifest import Manifest, list_versions, read_manifest
from etl.format.mapped import releasing
from etl.format.sample_columns import type_name
from etl.format.schema import REJECTS_SCHEMA, ManifestMeta, sample_shape_of
from etl.format.shards import ShardInfo
from etl.progress import Progress
from etl.run import execute, to_store
from etl.run.phases import convert_while_waiting, phase, release_freed_memory
from etl.run.plan import Plan, settled_hashes
from etl.run.report import RunReport, by_reason
from etl.run.results import ShardGaps, packed_rejects, packed_samples
from etl.run.staged import staged_plan
from etl.sources import readers
from etl.sources.entries import FileColumns, ListContext, SourceListing, SourceReject
from etl.sources.registry import check_columns, check_exists, kind_of, list_sources
from etl.storage.location import is_url


def check_paths(config: PipelineConfig) -> None:
    """The output must not live inside a folder source: a rerun would try to pack its shards."""
    out, src = config.output.dir, config.source.path
    if kind_of(config.source).walks_path and _inside(out, src):
        raise ConfigError(
            f"output.dir: {out} is inside source.path {src}; put the output elsewhere"
        )
    if isinstance(out, Path) and out.exists() and not out.is_dir():
        raise ConfigError(f"output.dir: {out} exists and is not a folder")


def _inside(out: Path | str, src: Path | str) -> bool:
    """Whether `out` is `src` or under it: two paths, or two URLs ('s3://b/x' is under 's3://b')."""
    if isinstance(out, Path) and isinstance(src, Path):
        return out == src or out.is_relative_to(src)
    if isinstance(out, str) and isinstance(src, str):
        return out == src or out.startswith(src.rstrip("/") + "/")
    return False


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


def run(
    config: PipelineConfig,
    *,
    dry_run: bool = False,
    rebuild: bool = False,
    progress: Progress | None = None,
    on_plan: Callable[[Plan], None] | None = None,
) -> RunReport:
    """Pack `config.source` into `config.output.dir` as a new manifest version.

    An output whose latest version was made with different output-shaping settings is refused
    unless `rebuild`, which packs everything again as a new version. An output.dir in object
    storage is packed in a local work folder and published there (`etl.run.to_store`).
    """
    progress = progress or Progress()
    config = _user_code_in_processes(config)
    check_paths(config)
    check_columns(config)
    check_exists(config.source)

    if not is_url(config.output.dir):
        return _run_in_folder(config, "", dry_run, rebuild, progress, on_plan)
    with to_store.prepared(config) as work:
        report = _run_in_folder(work.config, work.writer, dry_run, rebuild, progress, on_plan)
        return to_store.published(work, report, dry_run, progress)


def _run_in_folder(
    config: PipelineConfig,
    writer: str,
    dry_run: bool,
    rebuild: bool,
    progress: Progress,
    on_plan: Callable[[Plan], None] | None,
) -> RunReport:
    """`run` into the local folder `config.output.dir`, its new shards tagged `writer`."""
    run = _Run(
        config, Path(config.output.dir), dry_run, rebuild, progress, time.perf_counter(), writer
    )
    return _run_here(run, on_plan)


def _run_here(run: _Run, on_plan: Callable[[Plan], None] | None) -> RunReport:
    """`run` into the local folder `run.root`, under its lock."""
    config, root = run.config, run.root
    if run.dry_run and not root.exists():
        temporary = Path(tempfile.gettempdir())
        try:
            with (
                parallel.engine(config.run, readable=_worker_inputs(config)),
                readers.released(None),
            ):
                return _run_locked(run, on_plan)
        except OSError as exc:
            if exc.errno not in OUTPUT_ERRNOS or not _under(exc.filename, temporary):
                raise
            raise temporary_error(exc, temporary) from None
    spool = readers.spool_path(root)
    with contextlib.ExitStack() as locked:
        try:
            root.mkdir(parents=True, exist_ok=True)
            locked.enter_context(DatasetLock(root))
        except OSError as exc:
            if exc.errno in OUTPUT_ERRNOS:
                raise output_error(exc, root) from None
            raise
        before = max(list_versions(root), default=0)
        try:
            with (
                parallel.engine(config.run, writable_root=root, readable=_worker_inputs(config)),
                readers.released(spool),
            ):
                return _run_locked(run, on_plan)
        except (interrupt.Interrupted, KeyboardInterrupt) as exc:
            signum = exc.signum if isinstance(exc, interrupt.Interrupted) else signal.SIGINT
            message = f"interrupted: {_cleaned_up(root, before)}"
            raise interrupt.Interrupted(signum, message) from None
        except WorkerDied as exc:
            fix = "out of memory? lower run.n_jobs or output.shard_size"
            raise ExecutionError(f"{exc}: {fix}; {_cleaned_up(root, before)}") from None
        except OSError as exc:
            if exc.errno not in OUTPUT_ERRNOS or not _under(exc.filename, root):
                raise
            raise OutputError(f"{output_error(exc, root)}; {_cleaned_up(root, before)}") from None


def _user_code_in_processes(config: PipelineConfig) -> PipelineConfig:
    """`config` with backend 'auto' made 'loky' where packing calls user code
    (`PipelineConfig.runs_user_code`): no task of such a run runs in this process."""
    if config.run.backend != "auto" or not config.runs_user_code:
        return config
    return config.model_copy(update={"run": config.run.model_copy(update={"backend": "loky"})})


def _under(filename: object, root: Path) -> bool:
    """Whether an OSError's file is in the output folder (no file: a write or an fsync)."""
    if filename is None:
        return True
    return Path(os.fsdecode(filename)).resolve().is_relative_to(root.resolve())  # type: ignore[arg-type]


def _cleaned_up(root: Path, before: int) -> str:
    """After a run stopped: remove what it left (still under the lock) and say what is
    committed, for the end of the one line that says why it stopped."""
    latest = max(list_versions(root), default=0)
    with contextlib.suppress(OSError):  # a read-only or failing disk: the next run cleans up
        clean_leftovers(root, latest)
    if latest == before:
        intact = f"the previous version {before} is intact" if before else "no version existed"
        return f"nothing committed; {intact}"
    return f"version {latest} was committed"


def _worker_inputs(config: PipelineConfig) -> list[Path]:
    """What workers read besides the output, on a shared file system: the source, except where
    records reach workers through the spool in the output folder (a Python source, tables) or
    the source is in object storage (each worker reads its objects from the store)."""
    path = config.source.path
    return [] if kind_of(config.source).spooled or not isinstance(path, Path) else [path]


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


@dataclass
class _Run:
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
class _Packed:
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


def _run_locked(run: _Run, on_plan: Callable[[Plan], None] | None) -> RunReport:
    """The phases of a run, in order: list, hash, plan, pack, commit."""
    config, root, dry_run = run.config, run.root, run.dry_run
    _open_previous(run)
    # NOTE: the workers start as soon as the listing shows enough work for them (NOTE [ head
    # start ]), while the run hashes and plans, where packing is all but certain: a first run,
    # or a kind that reads every record anyway. A rerun starts them only if its hash or pack
    # phase has that much work: a no-change rerun needs none.
    early = not dry_run and (run.reusable is None or not kind_of(config.source).by_path)
    with (
        spill.scratch(None if dry_run else root) as folder,
        parallel.workers_starting(config.run, wanted=False) as starting,
    ):
        listing = _list(run, folder)
        if early and parallel.worth_processes(config.run, listing.listed):
            starting.begin()
        plan = _plan(run, listing, folder, starting)
        if on_plan is not None:
            on_plan(plan)
        if dry_run:
            return run.report(
                version=run.latest or None,
                committed=False,
                listed=listing.listed,
                packed_new=0,
                reused=plan.reused.num_rows,
                rejected=plan.rejects.num_rows,
                rejects_by_reason=by_reason(plan.rejects),
                plan_counts={**plan.counts, "to_pack": plan.to_pack},
                shards_written=0,
                bytes_written=0,
                samples_total=plan.reused.num_rows + plan.to_pack,
                dry_run=True,
            )
        with (
            spill.SortedSpill(folder, plan.samples_schema, "source", "samples") as new_samples,
            spill.SortedSpill(folder, REJECTS_SCHEMA, "source", "rejects-new") as new_rejects,
        ):
            packed = _pack(run, plan, new_samples, new_rejects, folder, starting)
            samples = plan.reused.num_rows + packed.packed_new
            if samples + packed.rejects.num_rows != listing.listed:
                raise RuntimeError(
                    f"accounting bug: {samples} packed + {packed.rejects.num_rows} "
                    f"rejected != {listing.listed} listed"
                )
            return _commit(run, listing.listed, plan, packed)


def _open_previous(run: _Run) -> None:
    """The version this run builds on, checked against the config; leftovers removed."""
    versions = list_versions(run.root)
    run.latest = versions[-1] if versions else 0
    if not run.dry_run:
        clean_leftovers(run.root, run.latest)
    run.previous = _read_previous(run.root, run.latest, run.rebuild)
    if run.reusable is not None:
        run.config.check_same_output(
            run.reusable.meta.config,
            run.reusable.meta.config_digest,
            f"{run.root}: version {run.latest}",
            "restore them, choose another output.dir, or pass --rebuild",
        )


def _list(run: _Run, scratch: Path) -> SourceListing:
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


def _plan(run: _Run, listing: SourceListing, folder: Path, starting: parallel.Starting) -> Plan:
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


def _pack(
    run: _Run,
    plan: Plan,
    new_samples: spill.SortedSpill,
    new_rejects: spill.SortedSpill,
    folder: Path,
    starting: parallel.Starting,
) -> _Packed:
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
    results = execute.pack(plan.tasks, run.config, run.root, run.progress.advance, starting)
    with run.phase("pack"), contextlib.closing(results) as packed:
        for result in packed:
            if isinstance(result, execute.Sealed):
                gaps.add(result.name, result.gaps, result.offsets)
                if result.shard is not None:
                    new_shards.append(result.shard)
                continue
            new_samples.add(packed_samples(plan.packing, result, run.config.ragged))
            if result.rejects:
                new_rejects.add(packed_rejects(plan.packing, result))
            plan.release_pages()
    run.progress.stop()
    rejects = new_rejects.written(folder / "rejects-all.arrow", plan.rejects)
    plan.release_pages()
    return _Packed(new_samples, rejects.table, sorted(new_shards, key=lambda s: s.name), gaps)


def _commit(run: _Run, listed: int, plan: Plan, packed: _Packed) -> RunReport:
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
    sample_shape, format_version = sample_shape_of(config.sample_shape)
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
    )
    # deferred: no commit after a signal; none cut short by one
    with run.phase("commit"), interrupt.deferred():
        builds_on = previous.shards if previous is not None else None
        merged = map(packed.gaps.with_final_rows, packed.new_samples.merged(plan.reused))
        samples = releasing(merged, plan.release_pages)
        commit_version(run.root, meta, samples, rejects, packed.new_shards, builds_on)
    return run.report(version=plan.version, committed=True, notes=notes, **counts)
