"""The `etl` command: parses arguments, calls the library, prints, and maps our errors to exit
codes. Anything that is not an `EtlError` is a bug and keeps its traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, ClassVar

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress
from rich.progress import Task as RichTask
from rich.table import Table
from rich.text import Text

from etl import pipeline
from etl.config import load_config
from etl.errors import EtlError
from etl.plan import Plan

app = typer.Typer(
    name="etl",
    help="Pack images into uint8 memmap shards with an Arrow manifest, for PyTorch training.\n\n"
    "Example:  etl sample-data data/sample && etl run pipeline.yaml",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
err = Console(stderr=True)
out = Console()

ConfigArg = Annotated[Path, typer.Argument(help="Path to pipeline.yaml.", show_default=False)]


class RateColumn(ProgressColumn):
    """Items per second, as a data engineer reads throughput."""

    def render(self, task: RichTask) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:>7.0f}/s" if speed else "      ?/s")


class BarProgress(pipeline.Progress):
    """A rich progress bar per phase, with rate and ETA, drawn on stderr."""

    LABELS: ClassVar[dict[str, str]] = {"hash": "hashing sources", "pack": "decode, resize, pack"}

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None

    def start(self, phase: str, total: int) -> None:
        if not self.enabled or total == 0:
            return
        self._bar = RichProgress(
            TextColumn("{task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            RateColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=err,
            transient=False,
        )
        self._bar.start()
        self._task = self._bar.add_task(self.LABELS.get(phase, phase), total=total)

    def advance(self, n: int) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.advance(self._task, n)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        self._bar = None
        self._task = None


def _print_plan(plan: Plan, verbose: bool) -> None:
    counts = ", ".join(f"{k} {v}" for k, v in sorted(plan.counts.items()))
    out.print(
        f"plan for version {plan.version}: {counts}; to pack {plan.to_pack} "
        f"in {len(plan.tasks)} shard(s)"
    )
    if verbose:
        for task in plan.tasks:
            for item in task.items:
                out.print(f"  pack   {item.source}  -> {task.shard}")
        for reject in plan.rejects:
            out.print(f"  reject {reject.source}  ({reject.reason}: {reject.message})")


def _print_report(report: pipeline.RunReport) -> None:
    table = Table(title=None, show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    state = "committed" if report.committed else ("dry run" if report.dry_run else "unchanged")
    table.add_row("output", f"{report.output}")
    table.add_row("version", f"{report.version} ({state})")
    table.add_row("listed", f"{report.listed}")
    table.add_row(
        "packed",
        f"{report.packed_new} new, {report.reused} reused, {report.samples_total} in this version",
    )
    reasons = ", ".join(f"{k} {v}" for k, v in report.rejects_by_reason.items()) or "none"
    table.add_row("rejected", f"{report.rejected} ({reasons})")
    table.add_row(
        "shards", f"{report.shards_written} written, {report.bytes_written / 2**20:.1f} MiB"
    )
    table.add_row("speed", f"{report.images_per_second:.0f} images/s, {report.seconds:.1f} s wall")
    out.print(table)
    for note in report.notes:
        out.print(f"note: {note}")


@app.command()
def run(
    config_path: ConfigArg,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="Override run.n_jobs.")] = None,
    backend: Annotated[
        str | None, typer.Option(help="Override run.backend (loky, threading, sequential).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan and stop; write nothing.")
    ] = False,
    rebuild: Annotated[
        bool, typer.Option(help="Pack everything again as a new version (after a config change).")
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="List files in the plan.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress, no summary.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Pack the images that pipeline.yaml describes into shards and a new manifest version.

    Example:  etl run pipeline.yaml --jobs 2
    """
    config = load_config(config_path, n_jobs=jobs, backend=backend)
    show = not (quiet or as_json)
    report = pipeline.run(
        config,
        dry_run=dry_run,
        rebuild=rebuild,
        progress=BarProgress(enabled=show),
        on_plan=(lambda plan: _print_plan(plan, verbose)) if (dry_run and not as_json) else None,
    )
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    elif not quiet:
        _print_report(report)


@app.command()
def validate(config_path: ConfigArg) -> None:
    """Check pipeline.yaml without running it: schema, types, values, paths.

    Example:  etl validate pipeline.yaml
    """
    config = load_config(config_path)
    pipeline.check_paths(config)
    if not config.source.path.exists():
        raise EtlError(f"source.path: {config.source.path} does not exist")
    out.print(
        f"{config_path}: ok ({config.source.kind} source {config.source.path}, "
        f"samples {config.sample_shape} {config.output.layout}, "
        f"{config.samples_per_shard} per shard, output {config.output.dir})"
    )


@app.command("sample-data")
def sample_data(
    directory: Annotated[Path, typer.Argument(help="Folder to create (must not exist).")],
    per_class: Annotated[int, typer.Option(min=1, help="Images per class.")] = 500,
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same bytes.")] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """Write a deterministic class-per-folder sample dataset (JPEG and PNG, some broken files).

    Example:  etl sample-data data/sample --per-class 500
    """
    from etl.sample_data import CLASSES, make_sample_data

    if directory.exists() and any(directory.iterdir()):
        raise EtlError(f"{directory}: exists and is not empty; choose a new folder")
    bar = BarProgress(enabled=not quiet)
    bar.start("sample data", per_class * len(CLASSES))
    try:
        report = make_sample_data(directory, per_class=per_class, seed=seed, progress=bar.advance)
    finally:
        bar.stop()
    if not quiet:
        out.print(
            f"{report.root}: {report.images} images in {len(report.per_class)} classes, "
            f"{report.broken} deliberately broken files"
        )


def main(argv: list[str] | None = None) -> None:
    """Console entry point. Click handles usage errors, --help and Ctrl-C (exit 130); our errors
    become one line on stderr and their exit code. Always ends in SystemExit."""
    try:
        app(args=argv, prog_name="etl")
    except EtlError as exc:
        err.print(f"error: {exc}", highlight=False, markup=False, soft_wrap=True)
        sys.exit(exc.exit_code)
