"""`etl versions`, `etl diff` and `etl compact`: a dataset's history and its housekeeping."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from etl.cli.app import app, out
from etl.config import load_config
from etl.format.retirement import parse_grace
from etl.maintenance.housekeeping import compact as run_compact
from etl.maintenance.store_compact import compact_store
from etl.maintenance.versions import diff as version_diff
from etl.maintenance.versions import summaries
from etl.storage.location import StoreOptions, as_location

ReadArg = Annotated[
    str,
    typer.Argument(
        help="Dataset folder (output.dir), or its URL in object storage (s3://bucket/ds).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


@app.command()
def versions(directory: ReadArg, as_json: JsonOpt = False) -> None:
    """List a dataset's committed versions with counts, sizes and times.

    Example:  etl versions artifacts   (or s3://bucket/ds)
    """
    rows = summaries(as_location(directory))
    if as_json:
        print(json.dumps([vars(r) for r in rows], indent=2))
        return
    table = Table("version", "created (UTC)", "samples", "rejects", "shards", "MiB", "config")
    for r in rows:
        table.add_row(
            str(r.version),
            r.created,
            str(r.samples),
            str(r.rejects),
            str(r.shards),
            f"{r.shard_bytes / 2**20:.1f}",
            r.config_digest,
        )
    out.print(table)


@app.command()
def diff(
    directory: ReadArg,
    a: Annotated[int, typer.Argument(help="Older version.")],
    b: Annotated[int, typer.Argument(help="Newer version.")],
    limit: Annotated[int, typer.Option(help="Rows to list per kind (0: counts only).")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """Show samples added, removed and changed (pixels, class, split or a per-sample column)
    between two versions.

    Example:  etl diff artifacts 1 2
    """
    d = version_diff(as_location(directory), a, b)
    if as_json:
        print(
            json.dumps(
                {
                    "a": a,
                    "b": b,
                    "added": d.added.column("source").to_pylist(),
                    "removed": d.removed.column("source").to_pylist(),
                    "changed": d.changed.to_pylist(),
                    "columns_added": list(d.columns_added),
                    "columns_removed": list(d.columns_removed),
                },
                indent=2,
            )
        )
        return
    out.print(
        f"version {a} -> {b}: {d.added.num_rows} added, {d.removed.num_rows} removed, "
        f"{d.changed.num_rows} changed"
    )
    for sign, names in (("+", d.columns_added), ("-", d.columns_removed)):
        if names:
            out.print(f"  columns {sign} {', '.join(names)}", highlight=False)
    for label, table in (("+", d.added), ("-", d.removed)):
        for source in table.column("source").to_pylist()[:limit]:
            out.print(f"  {label} {source}", highlight=False)
    for row in d.changed.to_pylist()[:limit]:
        what = [
            f"{k} {row[k + '_old']} -> {row[k + '_new']}"
            for k in ("class_name", "split", "checksum")
            if row[k + "_old"] != row[k + "_new"]
        ]
        what += [f"{name} changed" for name in row["columns"]]
        out.print(f"  ~ {row['source']}: {'; '.join(what)}", highlight=False)


KeepLastOpt = Annotated[
    int, typer.Option(help="Keep the last K versions (a new compacted one counts).")
]
KeepOpt = Annotated[list[int] | None, typer.Option(help="Also keep this version (repeatable).")]
MinDeadOpt = Annotated[
    float, typer.Option(help="Rewrite a shard when at least this fraction is dead rows.")
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Say what would go; do nothing.")]
GraceOpt = Annotated[
    str,
    typer.Option(
        help="How long a retired version stays whole for jobs still reading it (24h, "
        "30m, 7d; 0 removes it at once): its files go at the first compaction after.",
    ),
]
StoreConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="pipeline.yaml whose output.storage_options and store_timeout reach the "
        "dataset's store (as its runs reach it).",
    ),
]


@app.command()
def compact(
    directory: ReadArg,
    keep_last: KeepLastOpt = 1,
    keep: KeepOpt = None,
    min_dead: MinDeadOpt = 0.5,
    dry_run: DryRunOpt = False,
    grace: GraceOpt = "24h",
    config_path: StoreConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Rewrite mostly-dead shards and delete versions and shards outside the retention policy.

    A kept version stays readable and byte-identical; a retired one stays whole, unlisted,
    for --grace, for jobs still reading it; in object storage the compacted version is
    published as a run's is. Example:
    etl compact artifacts --keep-last 2 --keep 5 --grace 48h   (or s3://bucket/ds)
    """
    try:
        seconds = parse_grace(grace)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--grace") from None
    where = as_location(directory)
    if isinstance(where, str):
        store = load_config(config_path).output.store() if config_path else StoreOptions()
        report = compact_store(
            where, keep_last, keep or (), min_dead, dry_run, store, grace=seconds
        )
    else:
        report = run_compact(where, keep_last, keep or (), min_dead, dry_run, seconds)
    if as_json:
        print(json.dumps(vars(report), indent=2))
        return
    verb = "would delete" if dry_run else "deleted"
    if report.new_version:
        out.print(
            f"{'would rewrite' if dry_run else 'rewrote'} {len(report.rewritten_shards)} sparse "
            f"shard(s) as version {report.new_version}"
        )
    out.print(f"kept versions {report.kept_versions}; {verb} versions {report.deleted_versions}")
    if report.retired_versions:
        out.print(
            f"retired versions {report.retired_versions}: unlisted, whole for jobs still "
            f"reading them; their files go at the first compaction {grace} after retiring"
        )
    out.print(f"{verb} {len(report.deleted_shards)} shard(s), {report.freed_bytes / 2**20:.1f} MiB")
