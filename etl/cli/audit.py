"""`etl audit`: verify a packed dataset against its manifest, and optionally repair it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, ClassVar, cast

import typer
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from etl.cli.app import app, out
from etl.cli.progress import BarProgress
from etl.config import BACKENDS, Backend, PipelineConfig, load_config
from etl.format.shards import SHARDS_DIR
from etl.maintenance import audit as audit_lib
from etl.maintenance import checkup
from etl.maintenance import repair as repair_lib
from etl.storage.location import StoreOptions, as_location

ROWS_PER_PROBLEM = 8
"""Locations shown per distinct problem; --json and --report list them all."""


DatasetArg = Annotated[
    str,
    typer.Argument(
        help="Dataset folder (output.dir), a version folder, a manifest.arrow, or the "
        "dataset's URL in object storage (s3://bucket/ds: audited as the store serves it).",
        show_default=False,
    ),
]

VersionOpt = Annotated[
    int | None, typer.Option("--version", min=1, help="Audit this version, not the latest.")
]

FastOpt = Annotated[
    bool,
    typer.Option("--fast", help="Whole-file shard checksums only, not sample by sample."),
]

DeepOpt = Annotated[
    bool,
    typer.Option("--deep", help="Also each shard's BLAKE3 digest: tamper evidence, twice the CPU."),
]

SampleRateOpt = Annotated[
    float | None,
    typer.Option("--sample-rate", help="Check only this random fraction (0..1] of the samples."),
]

SeedOpt = Annotated[
    int | None,
    typer.Option(help="Seed of --sample-rate's draw (default: a random one, printed)."),
]

SourceOpt = Annotated[
    Path | None,
    typer.Option(
        "--source", help="Source root: re-hash the sources of the checked samples under it."
    ),
]

ConfigPathOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="pipeline.yaml: its source.path is the source root (unless --source), its "
        "stages re-pack samples for --repair. A source of records (lmdb, python, "
        "webdataset, parquet) is listed again and compared by content hash. A dataset in a "
        "store is reached with its output.storage_options and store_timeout.",
    ),
]

RepairOpt = Annotated[
    bool,
    typer.Option(
        "--repair",
        help="Re-pack damaged samples from unchanged sources as a new version (needs "
        "--config), then audit that version.",
    ),
]

JobsOpt = Annotated[
    int | None,
    typer.Option(
        "--jobs", "-j", help="Workers, -1 all cores (default: all cores above 2 GiB, else 1)."
    ),
]

BackendOpt = Annotated[
    str | None, typer.Option(help="joblib backend: loky, threading, sequential or dask.")
]

AddressOpt = Annotated[
    str | None,
    typer.Option(help="Dask scheduler, e.g. tcp://10.0.0.5:8786 (implies --backend dask)."),
]

ReportPathOpt = Annotated[
    Path | None,
    typer.Option(
        "--report", help="Write the full report here: JSON, or Arrow if it ends in .arrow."
    ),
]

AsJsonOpt = Annotated[bool, typer.Option("--json", help="Print the report as JSON.")]

QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress, no summary.")]


class AuditBar(BarProgress):
    """BarProgress, with bytes and bytes/s for the 'verify' phase."""

    LABELS: ClassVar[dict[str, str]] = {
        "download": "fetching shards",
        "verify": "verifying shards",
        "sources": "hashing sources",
        "repair": "re-packing samples",
    }
    BYTE_PHASES: ClassVar[frozenset[str]] = frozenset({"verify"})


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _check_flags(
    fast: bool,
    deep: bool,
    sample_rate: float | None,
    repair: bool,
    config_path: Path | None,
    report_path: Path | None,
) -> None:
    """A usage error for flags that do not go together."""
    if sample_rate is not None and not 0.0 < sample_rate <= 1.0:
        raise typer.BadParameter(f"{sample_rate} is not in (0, 1]", param_hint="--sample-rate")
    if fast + deep + (sample_rate is not None) > 1:
        raise typer.BadParameter("choose one of --fast, --deep and --sample-rate")
    if repair and config_path is None:
        raise typer.BadParameter(
            "--repair needs --config pipeline.yaml: its stages re-pack the samples",
            param_hint="--repair",
        )
    if repair and sample_rate is not None:
        raise typer.BadParameter("--repair needs a whole audit, not --sample-rate")
    if report_path is not None and not report_path.parent.is_dir():
        raise typer.BadParameter(f"{report_path.parent} is not a folder", param_hint="--report")


def _print_report(report: audit_lib.AuditReport, title: str | None = None) -> None:
    if title:
        out.print(title)
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("dataset", str(report.root))
    table.add_row(
        "version",
        f"{report.version} (latest {report.latest}), format {report.format_version}, "
        f"checksum {report.checksum or '?'}",
    )
    checked = {
        "full": f"{report.shards_hashed} shard file(s) ({report.checksum}), "
        f"{report.samples_verified}/{report.samples_total} samples",
        "deep": f"{report.shards_hashed} shard file(s) ({report.checksum} + blake3), "
        f"{report.samples_verified}/{report.samples_total} samples",
        "fast": f"{report.shards_hashed} shard file(s) ({report.checksum}), "
        f"{report.samples_verified} samples of failed shards",
        "sample": f"{report.samples_verified}/{report.samples_total} samples (rate "
        f"{report.sample_rate}, seed {report.seed}), shard sizes and headers",
    }[report.mode]
    table.add_row("checked", f"{report.mode}: {checked}")
    table.add_row(
        "read",
        f"{_mib(report.bytes_hashed)} of shards in {report.verify_seconds:.2f} s "
        f"({_mib(report.bytes_per_second)}/s); {report.seconds:.2f} s in all",
    )
    if report.source_root is not None:
        table.add_row("sources", f"{report.sources_checked} re-hashed under {report.source_root}")
    counts = report.counts()
    errors = ", ".join(f"{k} {n}" for k, n in counts.items() if audit_lib.FINDINGS[k][0] == "error")
    notes = ", ".join(f"{k} {n}" for k, n in counts.items() if audit_lib.FINDINGS[k][0] == "note")
    result = f"{len(report.errors)} problem(s): {errors}" if errors else "clean"
    if not errors:
        result += ": every checked byte is what the manifest says"
    table.add_row("result", result + (f"; notes: {notes}" if notes else ""))
    out.print(table)
    for (kind, message), group in _grouped(report.ordered()).items():
        out.print(Text.assemble((kind, "bold"), f" ({len(group)}): {message}"))
        located = [f for f in group if f.shard or f.source]
        if located:
            rows = Table(show_header=False, box=None, pad_edge=False, padding=(0, 2, 0, 0))
            for name in ("shard:row", "sample", "source"):
                rows.add_column(name, no_wrap=name != "source", overflow="fold")
            for f in located[:ROWS_PER_PROBLEM]:
                where = (f.shard or "").removeprefix(f"{SHARDS_DIR}/")
                rows.add_row(where if f.row is None else f"{where}:{f.row}", f.sample_id, f.source)
            out.print(Padding(rows, (0, 0, 0, 4)))
            if len(located) > ROWS_PER_PROBLEM:
                more = len(located) - ROWS_PER_PROBLEM
                out.print(f"    ... and {more} more (--json or --report lists all)")
    for note in report.notes:
        out.print(f"note: {note}", highlight=False)


def _grouped(findings: list[audit_lib.Finding]) -> dict[tuple[str, str], list[audit_lib.Finding]]:
    """Findings by (kind, message), in order: one heading per distinct problem."""
    groups: dict[tuple[str, str], list[audit_lib.Finding]] = {}
    for f in findings:
        groups.setdefault((f.kind, f.message), []).append(f)
    return groups


def _print_repair(fixed: repair_lib.RepairReport) -> None:
    hows = ", ".join(
        f"{sum(r['how'] == how for r in fixed.repaired)} {how}"
        for how in repair_lib.HOW
        if any(r["how"] == how for r in fixed.repaired)
    )
    if fixed.committed:
        out.print(
            f"repair    version {fixed.version} committed: {len(fixed.repaired)} sample(s) "
            f"stored again ({hows}) in {len(fixed.shards_written)} new shard(s), "
            f"{_mib(fixed.bytes_written)}"
        )
    for f in fixed.failed:
        out.print(
            f"cannot repair {f['source']} ({f['shard']} row {f['row']}): {f['reason']}",
            highlight=False,
        )
    for note in fixed.notes:
        out.print(f"note: {note}", highlight=False)


def _audit_options(
    config: PipelineConfig | None,
    source: Path | None,
    version: int | None,
    fast: bool,
    deep: bool,
    sample_rate: float | None,
    seed: int | None,
    jobs: int | None,
    backend: str | None,
    address: str | None,
) -> audit_lib.AuditOptions:
    """What `etl audit` checks, and how: the flags, and the sources of `--config` or
    `--source` whose bytes the samples are checked against."""
    if address is not None and backend is None:
        backend = "dask"
    if backend is not None and backend not in BACKENDS:
        raise typer.BadParameter(f"{backend!r}; expected one of {', '.join(BACKENDS)}")
    source_root, records = checkup.sources_to_check(config, source)
    return audit_lib.AuditOptions(
        version=version,
        fast=fast,
        deep=deep,
        sample_rate=sample_rate,
        seed=seed,
        source_root=source_root,
        source_options=config.source.storage_options if config is not None else {},
        store=config.output.store() if config is not None else StoreOptions(),
        records=records,
        jobs=jobs,
        backend=cast(Backend, backend or "loky"),  # checked against BACKENDS above
        address=address,
    )


def _repaired(
    report: audit_lib.AuditReport,
    options: audit_lib.AuditOptions,
    config: PipelineConfig,
    bar: AuditBar,
    show: bool,
) -> checkup.Checkup:
    """`--repair`: the damage repaired as a new version, audited again, each step shown."""
    records = options.records
    moved = options.source_root or (records.path if records else None)
    result = checkup.repair_and_recheck(report, options, config, moved, bar)
    if show and result.repair is None:
        out.print("repair    nothing to repair: no damaged sample or shard")
    if show and result.repair is not None:
        _print_repair(result.repair)
    if show and result.after is not None:
        _print_report(result.after, title=f"\naudit of repaired version {result.after.version}:")
    return result


@app.command()
def audit(
    dataset: DatasetArg,
    version: VersionOpt = None,
    fast: FastOpt = False,
    deep: DeepOpt = False,
    sample_rate: SampleRateOpt = None,
    seed: SeedOpt = None,
    source: SourceOpt = None,
    config_path: ConfigPathOpt = None,
    repair: RepairOpt = False,
    jobs: JobsOpt = None,
    backend: BackendOpt = None,
    address: AddressOpt = None,
    report_path: ReportPathOpt = None,
    as_json: AsJsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Verify every shard and sample of a dataset against its manifest. Exit 0 clean, 1 a
    problem found, 2 a usage error or a folder that is not a readable dataset.

    Example:  etl audit artifacts --source data/sample --report audit.json

    In a bucket:  etl audit s3://bucket/ds (what the store serves now)
    """
    _check_flags(fast, deep, sample_rate, repair, config_path, report_path)
    config = load_config(config_path) if config_path else None
    options = _audit_options(
        config, source, version, fast, deep, sample_rate, seed, jobs, backend, address
    )
    show = not (quiet or as_json)
    bar = AuditBar(enabled=show)
    report = audit_lib.audit(as_location(dataset), options, bar)
    if show:
        _print_report(report)
    result = checkup.Checkup(report)
    if repair:
        assert config is not None
        result = _repaired(report, options, config, bar, show)
    if report_path is not None:
        result.write(report_path)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    raise typer.Exit(result.final.exit_code)
