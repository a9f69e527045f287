"""`etl report`: one self-contained HTML page of a dataset version, for a browser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from etl.cli.app import app, out
from etl.cli.progress import BarProgress
from etl.config import load_config
from etl.errors import EtlError
from etl.storage.location import as_location

if TYPE_CHECKING:
    from etl.report.contents import ReportData

ReportPathOpt = Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")]


def check_report_path(path: Path) -> None:
    """A usage error unless `path` is an .html file in an existing folder."""
    if path.suffix.lower() not in (".html", ".htm"):
        raise typer.BadParameter(f"{path}: the report is an HTML page; end the name in .html")
    if not path.parent.is_dir():
        raise EtlError(f"{path.parent}: no such folder for {path.name}")
    if path.is_dir():
        raise EtlError(f"{path}: is a folder; name the HTML file to write")


def describe(path: Path, data: ReportData) -> str:
    """The line a command prints after writing a report."""
    size = path.stat().st_size
    return f"wrote {path} ({size / 1024:,.0f} KiB): report of version {data.version}"


@app.command()
def report(
    directory: Annotated[
        str,
        typer.Argument(
            help="Dataset folder (output.dir), or its URL in object storage (s3://bucket/ds).",
            show_default=False,
        ),
    ],
    version: Annotated[
        int | None, typer.Option("--version", help="Pinned version (default: the latest).")
    ] = None,
    out_path: ReportPathOpt = Path("report.html"),
    seed: Annotated[int, typer.Option(min=0, help="Seed of the samples and rejects shown.")] = 0,
    config_path: Annotated[
        Path | None,
        typer.Option(
            "--config", help="pipeline.yaml: rejects are read back from its source for thumbnails."
        ),
    ] = None,
    source: Annotated[
        Path | None,
        typer.Option(
            "--source", help="The folder the rejects' sources are under (for thumbnails)."
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print what was written as JSON.")
    ] = False,
) -> None:
    """Write one self-contained HTML report of a dataset version: counts per split and class,
    rejects by reason with thumbnails, a sample grid per class, per-sample column summaries,
    storage, the versions' timeline and the changes since the previous version. No server and
    no network: it opens from disk or a CI artifact.

    Example:  etl report artifacts -o report.html --config pipeline.yaml
    """
    # NOTE: imported here, not above: `etl run` imports this module for --report's checks
    from etl.cli.inspect import _sheet_source
    from etl.explore import dataset as explore
    from etl.report.page import write_report

    check_report_path(out_path)
    config = load_config(config_path) if config_path else None

    rejects_from = _sheet_source(config, source) if (config or source) else None
    ds = explore.open_dataset(as_location(directory), version)
    data = write_report(
        ds,
        out_path,
        seed=seed,
        source=rejects_from,
        decode=config.decode if config else None,
        progress=BarProgress(enabled=not (quiet or as_json)),
    )
    if as_json:
        size = out_path.stat().st_size
        print(json.dumps({"out": str(out_path), "version": data.version, "bytes": size}))
    elif not quiet:
        out.print(describe(out_path, data), highlight=False, soft_wrap=True)
