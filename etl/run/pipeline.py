"""Orchestration only: config -> sources -> plan -> execute -> commit, returning a report.

Order of durability: shards are renamed into place by the workers and fsynced before
`execute.pack` returns its last result, then the manifest version folder is renamed into place
here. A run killed at any point leaves the previous version untouched; its leftovers are
removed by the next run, under the lock.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from joblib.externals.loky.process_executor import TerminatedWorkerError

from etl.config import FolderSource, PipelineConfig
from etl.errors import (
    OUTPUT_ERRNOS,
    ConfigError,
    ExecutionError,
    ManifestError,
    OutputError,
    output_error,
)
from etl.format.commit import clean_leftovers, commit_version
from etl.format.lock import DatasetLock
from etl.format.manifest import (
    REJECTS_SCHEMA,
    SAMPLES_SCHEMA,
    Manifest,
    ManifestMeta,
    list_versions,
    read_manifest,
    table_from_rows,
)
from etl.format.shards import ShardInfo
from etl.progress import Progress
from etl.run import execute, interrupt
from etl.run.plan import Plan, files_to_hash, make_plan, settled_hashes
from etl.sources import readers
from etl.sources.base import ListContext, SourceReject
from etl.sources.listing import check_exists, list_sources


@dataclass
class RunReport:
    output: Path
    version: int | None
    """The version committed, or the unchanged latest one when there was nothing to do."""
    committed: bool
    listed: int
    packed_new: int
    reused: int
    rejected: int
    rejects_by_reason: dict[str, int]
    plan_counts: Mapping[str, int]
    shards_written: int
    bytes_written: int
    samples_total: int
    seconds: float
    dry_run: bool = False
    notes: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds spent in each phase that ran: list, hash (starting the workers included),
    plan, pack, commit; the rest of `seconds` is checks, the lock and cleaning up."""

    @property
    def images_per_second(self) -> float:
        return self.packed_new / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "output": str(self.output),
            "version": self.version,
            "committed": self.committed,
            "dry_run": self.dry_run,
            "listed": self.listed,
            "packed_new": self.packed_new,
            "reused": self.reused,
            "samples_total": self.samples_total,
            "rejected": self.rejected,
            "rejects_by_reason": self.rejects_by_reason,
            "plan": dict(self.plan_counts),
            "shards_written": self.shards_written,
            "bytes_written": self.bytes_written,
            "seconds": round(self.seconds, 3),
            "images_per_second": round(self.images_per_second, 1),
            "notes": self.notes,
            "phases": {name: round(seconds, 3) for name, seconds in self.phases.items()},
        }


def check_paths(config: PipelineConfig) -> None:
    """The output must not live inside a folder source: a rerun would try to pack its shards."""
    out = config.output.dir
    if isinstance(config.source, FolderSource):
        src = config.source.path
        if out == src or out.is_relative_to(src):
            raise ConfigError(
                f"output.dir: {out} is inside source.path {src}; put the output elsewhere"
            )
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output.dir: {out} exists and is not a folder")


def _reject_row(r: SourceReject) -> dict[str, Any]:
    return {
        "source": r.source,
        "reason": r.reason,
        "message": r.message,
        "source_size": r.size,
        "source_mtime_ns": r.mtime_ns,
        "source_ctime_ns": r.ctime_ns,
        "source_inode": r.inode,
        "source_hash": r.source_hash,
    }


def _same_content(previous: Manifest, samples: pa.Table, rejects: pa.Table) -> bool:
    return previous.samples.equals(samples) and previous.rejects.equals(rejects)


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
    unless `rebuild`, which packs everything again as a new version.
    """
    progress = progress or Progress()
    started = time.perf_counter()
    check_paths(config)
    check_exists(config.source)
    root = config.output.dir
    if dry_run and not root.exists():
        with (
            execute.engine(config.run, readable=_worker_inputs(config)),
            readers.released(None),
        ):
            return _run_locked(config, root, dry_run, rebuild, progress, on_plan, started)
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
                execute.engine(config.run, writable_root=root, readable=_worker_inputs(config)),
                readers.released(spool),
            ):
                return _run_locked(config, root, dry_run, rebuild, progress, on_plan, started)
        except (interrupt.Interrupted, KeyboardInterrupt) as exc:
            signum = exc.signum if isinstance(exc, interrupt.Interrupted) else signal.SIGINT
            message = f"interrupted: {_cleaned_up(root, before)}"
            raise interrupt.Interrupted(signum, message) from None
        except TerminatedWorkerError as exc:
            died = _DIED.search(str(exc))
            what = f"a worker process died ({died.group(1) if died else 'killed'}): out of memory?"
            fix = "lower run.n_jobs or output.shard_size"
            raise ExecutionError(f"{what} {fix}; {_cleaned_up(root, before)}") from None
        except OSError as exc:
            if exc.errno not in OUTPUT_ERRNOS or not _under(exc.filename, root):
                raise
            raise OutputError(f"{output_error(exc, root)}; {_cleaned_up(root, before)}") from None


_DIED = re.compile(r"exit codes of the workers are \{(.*?)\}")


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
    """What workers read besides the output: the source, except where records reach workers
    through the spool in the output folder (a Python source, tables)."""
    return [] if config.source.kind in readers.SPOOLED_KINDS else [config.source.path]


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


def _run_locked(
    config: PipelineConfig,
    root: Path,
    dry_run: bool,
    rebuild: bool,
    progress: Progress,
    on_plan: Callable[[Plan], None] | None,
    started: float,
) -> RunReport:
    phases: dict[str, float] = {}
    versions = list_versions(root)
    latest = versions[-1] if versions else 0
    if not dry_run:
        clean_leftovers(root, latest)
    previous = _read_previous(root, latest, rebuild)
    if previous is not None and not rebuild:
        config.check_same_output(
            previous.meta.config,
            previous.meta.config_digest,
            f"{root}: version {latest}",
            "restore them, choose another output.dir, or pass --rebuild",
        )
    reusable = None if rebuild else previous
    prior_classes = tuple(previous.meta.classes) if previous is not None else ()

    context = ListContext(
        checksum=config.output.checksum,
        stored=settled_hashes(reusable),
        spool=None if dry_run else readers.spool_path(root),
    )
    reads_every_record = config.source.kind not in readers.FILE_KINDS
    with (
        _phase(phases, "list"),
        execute.workers_starting(config.run, reads_every_record and not dry_run),
    ):
        listing = list_sources(config.source, context)
    with _phase(phases, "hash"):
        _convert_while_waiting()
        needs_hash = files_to_hash(listing, reusable)
        progress.start("hash", len(needs_hash))
        hashes, hash_rejects = execute.hash_sources(
            needs_hash,
            config.output.checksum,
            config.run,
            progress.advance,
            source_config=config.source,
        )
        progress.stop()
    with _phase(phases, "plan"):
        plan = make_plan(config, listing, hashes, hash_rejects, reusable, latest + 1, prior_classes)
    if on_plan is not None:
        on_plan(plan)

    if dry_run:
        return RunReport(
            output=root,
            version=latest or None,
            committed=False,
            listed=listing.listed,
            packed_new=0,
            reused=plan.reused.num_rows,
            rejected=len(plan.rejects),
            rejects_by_reason=dict(Counter(r.reason for r in plan.rejects)),
            plan_counts={**plan.counts, "to_pack": plan.to_pack},
            shards_written=0,
            bytes_written=0,
            samples_total=plan.reused.num_rows + plan.to_pack,
            seconds=time.perf_counter() - started,
            dry_run=True,
            phases=phases,
        )

    # NOTE: each shard's rows become Arrow columns as they arrive: as Python dicts they took
    # ~1 KB an image in this process until the commit (tracemalloc, 12,000 photos).
    new_tables: list[pa.Table] = []
    rejects = list(plan.rejects)
    new_shards: list[ShardInfo] = []
    progress.start("pack", plan.to_pack)
    # closing: an interrupted loop stops the workers before the run cleans up (see
    # NOTE [ stop the workers on the way out ] in etl.run.execute).
    with (
        _phase(phases, "pack"),
        contextlib.closing(execute.pack(plan.tasks, config, root, progress.advance)) as packed,
    ):
        for result in packed:
            new_tables.append(table_from_rows(result.samples, SAMPLES_SCHEMA))
            rejects.extend(result.rejects)
            if result.shard is not None:
                new_shards.append(result.shard)
    progress.stop()

    packed_new = sum(t.num_rows for t in new_tables)
    samples = pa.concat_tables([plan.reused, *new_tables]).sort_by("source")  # one chunk
    reject_rows = [_reject_row(r) for r in sorted(rejects, key=lambda r: r.source)]
    if samples.num_rows + len(reject_rows) != listing.listed:
        raise RuntimeError(
            f"accounting bug: {samples.num_rows} packed + {len(reject_rows)} rejected "
            f"!= {listing.listed} listed"
        )
    rejects_table = table_from_rows(reject_rows, REJECTS_SCHEMA)
    report_args: dict[str, Any] = dict(
        output=root,
        listed=listing.listed,
        packed_new=packed_new,
        reused=plan.reused.num_rows,
        rejected=len(reject_rows),
        rejects_by_reason=dict(sorted(Counter(r["reason"] for r in reject_rows).items())),
        plan_counts=plan.counts,
        shards_written=len(new_shards),
        bytes_written=sum(s.bytes for s in new_shards),
        samples_total=samples.num_rows,
    )
    notes: list[str] = []
    workers = execute.worker_count(config.run)
    if len(plan.tasks) and len(plan.tasks) < workers:
        notes.append(
            f"only {len(plan.tasks)} shard(s) to pack for {workers} workers: "
            "a smaller output.shard_size would spread the work"
        )
    if (
        previous is not None
        and not rebuild
        and not new_shards
        and _same_content(previous, samples, rejects_table)
    ):
        return RunReport(
            version=latest,
            committed=False,
            seconds=time.perf_counter() - started,
            notes=[*notes, f"nothing changed since version {latest}"],
            phases=phases,
            **report_args,
        )
    meta = ManifestMeta(
        version=plan.version,
        sample_shape=config.sample_shape,
        layout=config.output.layout,
        classes=plan.classes,
        checksum=config.output.checksum,
        config_digest=config.digest(),
        config=config.output_shaping(),
    )
    with (
        _phase(phases, "commit"),
        interrupt.deferred(),
    ):  # no commit after a signal; none cut short by one
        builds_on = reusable.shards if reusable is not None else None
        commit_version(root, meta, samples, rejects_table, new_shards, builds_on)
    return RunReport(
        version=plan.version,
        committed=True,
        seconds=time.perf_counter() - started,
        notes=notes,
        phases=phases,
        **report_args,
    )


def _convert_while_waiting() -> None:
    """Make pyarrow ready to convert Python values, on a thread, while this process waits for
    the hash phase's workers to start.

    NOTE: the first `pa.array` of a process imports pandas when it is installed (pyarrow
    checks whether the values are pandas objects; apache/arrow#34994): 0.2 s of a 300-photo
    run, spent in `plan` with nothing else to do. Started here it overlaps with the workers'
    start-up (0.4 s). Harmless if the main thread gets there first: imports are locked.
    """
    threading.Thread(target=pa.array, args=([0],), name="etl-arrow-warm", daemon=True).start()


@contextlib.contextmanager
def _phase(phases: dict[str, float], name: str) -> Iterator[None]:
    """Records the block's wall time as phases[name]."""
    start = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = time.perf_counter() - start
