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
from pathlib import Path

from etl.config import PipelineConfig
from etl.engine import interrupt, parallel
from etl.errors import (
    OUTPUT_ERRNOS,
    ConfigError,
    ExecutionError,
    OutputError,
    WorkerDied,
    output_error,
    temporary_error,
)
from etl.format import spill
from etl.format.commit import clean_leftovers
from etl.format.lock import DatasetLock
from etl.format.manifest import list_versions
from etl.format.schema import REJECTS_SCHEMA
from etl.progress import Progress
from etl.run import to_store
from etl.run.phases import RunState, commit, list_inputs, open_previous, pack, plan_run
from etl.run.plan import Plan
from etl.run.report import RunReport, by_reason
from etl.sources import readers
from etl.sources.registry import check_columns, check_exists, kind_of, released
from etl.storage.location import StoreUrl


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
    return isinstance(src, StoreUrl) and src.contains(out)


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

    if not isinstance(config.output.dir, StoreUrl):
        return _run_in_folder(config, "", dry_run, rebuild, progress, on_plan)
    with to_store.prepared(config, dry_run) as work:
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
    run = RunState(
        config, Path(config.output.dir), dry_run, rebuild, progress, time.perf_counter(), writer
    )
    return _run_here(run, on_plan)


def _run_here(run: RunState, on_plan: Callable[[Plan], None] | None) -> RunReport:
    """`run` into the local folder `run.root`, under its lock."""
    config, root = run.config, run.root
    if run.dry_run and not root.exists():
        temporary = Path(tempfile.gettempdir())
        try:
            with (
                parallel.engine(config.run, readable=_worker_inputs(config)),
                released(None),
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
                released(spool),
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


def _run_locked(run: RunState, on_plan: Callable[[Plan], None] | None) -> RunReport:
    """The phases of a run, in order: list, hash, plan, pack, commit."""
    config, root, dry_run = run.config, run.root, run.dry_run
    open_previous(run)
    # NOTE: the workers start as soon as the listing shows enough work for them (NOTE [ head
    # start ]), while the run hashes and plans, where packing is all but certain: a first run,
    # or a kind that reads every record anyway. A rerun starts them only if its hash or pack
    # phase has that much work: a no-change rerun needs none.
    early = not dry_run and (run.reusable is None or not kind_of(config.source).by_path)
    with (
        spill.scratch(None if dry_run else root) as folder,
        parallel.workers_starting(config.run, wanted=False) as starting,
    ):
        listing = list_inputs(run, folder)
        if early and parallel.worth_processes(config.run, listing.listed):
            starting.begin()
        plan = plan_run(run, listing, folder, starting)
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
            packed = pack(run, plan, new_samples, new_rejects, folder, starting)
            samples = plan.reused.num_rows + packed.packed_new
            if samples + packed.rejects.num_rows != listing.listed:
                raise RuntimeError(
                    f"accounting bug: {samples} packed + {packed.rejects.num_rows} "
                    f"rejected != {listing.listed} listed"
                )
            return commit(run, listing.listed, plan, packed)
