"""`etl run`, `etl validate` and `etl sample-data`: packing and its inputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from etl.cli.app import app, out
from etl.cli.progress import BarProgress
from etl.cli.report import check_report_path, describe
from etl.config import PipelineConfig, load_config
from etl.errors import EtlError, OutputError, described, redacted
from etl.run import pipeline
from etl.run.plan import Plan
from etl.sources.registry import check_exists

ConfigArg = Annotated[Path, typer.Argument(help="Path to pipeline.yaml.", show_default=False)]


def _print_plan(plan: Plan, verbose: bool) -> None:
    counts = ", ".join(f"{k} {v}" for k, v in sorted(plan.counts.items()))
    out.print(
        f"plan for version {plan.version}: {counts}; to pack {plan.to_pack} "
        f"in {len(plan.tasks)} shard(s)"
    )
    if verbose:
        for task in plan.tasks:
            for source in task.sources:
                out.print(f"  pack   {source}  -> {task.shard}")
        for batch in plan.rejects.to_batches(max_chunksize=1 << 12):
            for reject in batch.select(["source", "reason", "message"]).to_pylist():
                out.print(f"  reject {reject['source']}  ({reject['reason']}: {reject['message']})")


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


JobsOpt = Annotated[int | None, typer.Option("--jobs", "-j", help="Override run.n_jobs.")]
BackendOpt = Annotated[
    str | None,
    typer.Option(help="Override run.backend (auto, loky, threading, sequential, dask)."),
]
AddressOpt = Annotated[
    str | None,
    typer.Option(help="Dask scheduler, e.g. tcp://10.0.0.5:8786 (implies --backend dask)."),
]
DryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="Print the plan and stop; write nothing.")
]
RebuildOpt = Annotated[
    bool, typer.Option(help="Pack everything again as a new version (after a config change).")
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="List files in the plan.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress, no summary.")]
AsJsonOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print the summary as JSON, with the seconds each phase took "
        "(list, hash, plan, pack, commit, and upload for a bucket).",
    ),
]
ReportOpt = Annotated[
    Path | None,
    typer.Option(
        "--report",
        help="Also write the version's HTML report (etl report) to this file.",
        show_default=False,
    ),
]


@app.command()
def run(
    config_path: ConfigArg,
    jobs: JobsOpt = None,
    backend: BackendOpt = None,
    address: AddressOpt = None,
    dry_run: DryRunOpt = False,
    rebuild: RebuildOpt = False,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    as_json: AsJsonOpt = False,
    report_path: ReportOpt = None,
) -> None:
    """Pack the images that pipeline.yaml describes into shards and a new manifest version.

    Example:  etl run pipeline.yaml --jobs 2

    On a Dask cluster:  etl run pipeline.yaml --address tcp://10.0.0.5:8786

    Into a bucket: set output.dir to s3://bucket/datasets/photos in pipeline.yaml; the run packs
    in a local work folder under $ETL_CACHE and publishes the version to the bucket.
    """
    if address is not None and backend is None:
        backend = "dask"
    config = load_config(config_path, n_jobs=jobs, backend=backend, address=address)
    if report_path is not None:
        check_report_path(report_path)
    show = not (quiet or as_json)
    report = pipeline.run(
        config,
        dry_run=dry_run,
        rebuild=rebuild,
        progress=BarProgress(enabled=show),
        on_plan=(lambda plan: _print_plan(plan, verbose)) if (dry_run and not as_json) else None,
    )
    written = None
    if report_path is not None and report.version and not dry_run:
        written = _write_report(config, report.version, report_path, show)
    if as_json:
        extra = {"report": str(report_path)} if written else {}
        print(json.dumps({**report.to_dict(), **extra}, indent=2))
    elif not quiet:
        _print_report(report)
        if written:
            out.print(written, highlight=False, soft_wrap=True)


def _write_report(config: PipelineConfig, version: int, path: Path, show: bool) -> str:
    """`etl run --report`: the version's report, its rejects read back from the run's source;
    returns the line to print."""
    from etl.explore.dataset import open_dataset
    from etl.report.page import write_report

    ds = open_dataset(config.output.dir, version)
    data = write_report(
        ds, path, source=config.source, decode=config.decode, progress=BarProgress(show)
    )
    return describe(path, data)


@app.command()
def validate(config_path: ConfigArg) -> None:
    """Check pipeline.yaml without running it: schema, types, values, paths.

    Example:  etl validate pipeline.yaml
    """
    config = load_config(config_path)
    pipeline.check_paths(config)
    check_exists(config.source)
    out.print(
        f"{config_path}: ok ({config.source.kind} source {config.source.path}, "
        f"samples {config.sample_shape} {config.output.layout}, "
        f"{config.samples_per_shard} per shard, output {redacted(str(config.output.dir))})"
    )


@app.command("sample-data")
def sample_data(
    directory: Annotated[Path, typer.Argument(help="Folder to create (must not exist).")],
    per_class: Annotated[int, typer.Option(min=1, help="Images per class.")] = 500,
    seed: Annotated[
        int, typer.Option(min=0, help="Random seed; the same seed gives the same bytes.")
    ] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """Write a deterministic class-per-folder sample dataset (JPEG and PNG, some broken files).

    Example:  etl sample-data data/sample --per-class 500
    """
    from etl.start.sample_data import CLASSES, make_sample_data

    if directory.exists() and any(directory.iterdir()):
        raise EtlError(f"{directory}: exists and is not empty; choose a new folder")
    bar = BarProgress(enabled=not quiet)
    bar.start("sample data", per_class * len(CLASSES))
    try:
        report = make_sample_data(directory, per_class=per_class, seed=seed, progress=bar.advance)
    except OSError as exc:  # a folder that cannot be made or written there, a full disk
        raise OutputError(f"{directory}: cannot write the sample data ({described(exc)})") from None
    finally:
        bar.stop()
    if not quiet:
        out.print(
            f"{report.root}: {report.images} images in {len(report.per_class)} classes, "
            f"{report.broken} deliberately broken files"
        )
