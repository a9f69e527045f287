"""`etl init`, `etl inspect` and `etl show`: start a config, and look at what a run produced."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from etl.cli.app import app, out
from etl.config import PipelineConfig, SourceConfig, load_config
from etl.errors import EtlError
from etl.explore import dataset as explore
from etl.explore.drawing import Sheet, save_png
from etl.start import scaffold, survey
from etl.storage.location import as_location

DirArg = Annotated[
    str,
    typer.Argument(
        help="Dataset folder (output.dir), a version folder, a manifest.arrow, or the dataset's "
        "URL in object storage (s3://bucket/ds: read through the local cache).",
        show_default=False,
    ),
]
VersionOpt = Annotated[
    int | None, typer.Option("--version", help="Pinned version (default: the latest).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


CountOpt = Annotated[int, typer.Option("--count", "-n", min=1, help="Cells to draw.")]

SeedOpt = Annotated[int, typer.Option(min=0, help="Seed of the random choice.")]

ClassesOpt = Annotated[
    list[str] | None,
    typer.Option("--class", help="Only this class (repeat, or a,b,c).", show_default=False),
]

SplitsOpt = Annotated[
    list[str] | None,
    typer.Option("--split", help="Only this split (repeat, or a,b).", show_default=False),
]

IdsOpt = Annotated[
    str | None,
    typer.Option(help="Exactly these sample ids, comma-separated, in this order."),
]

RejectsOpt = Annotated[
    bool,
    typer.Option(
        "--rejects", help="Show rejected files with their reason (needs --source or --config)."
    ),
]

ReasonsOpt = Annotated[
    list[str] | None,
    typer.Option("--reason", help="With --rejects: only this reason (repeat, or a,b)."),
]

SourceOpt = Annotated[
    Path | None,
    typer.Option("--source", help="With --rejects: the source root the rejects are under."),
]

ConfigPathOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="With --rejects: pipeline.yaml; its source root and decode stage are used.",
    ),
]

WhereOpt = Annotated[
    str | None,
    typer.Option(help='Only samples for which this SQL condition holds, e.g. "score > 0.5".'),
]

ShownOpt = Annotated[
    list[str] | None,
    typer.Option("--with", help="Write this per-sample column under each cell (repeat)."),
]

OutPathOpt = Annotated[Path, typer.Option("--out", "-o", help="PNG file to write.")]

ColumnsOpt = Annotated[
    int | None, typer.Option(min=1, help="Cells per row (default: a square-ish grid).")
]

CellOpt = Annotated[
    int,
    typer.Option(min=16, help="Cell size in px; smaller samples grow by whole factors."),
]

AsJsonOpt = Annotated[
    bool, typer.Option("--json", help="Print what each cell shows and where, as JSON.")
]


def _split_commas(values: list[str] | None) -> list[str] | None:
    """`--class a --class b` and `--class a,b` both give [a, b]."""
    if not values:
        return None
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


@app.command()
def init(
    source_dir: Annotated[
        Path, typer.Argument(help="Folder with one sub-folder of images per class.")
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Where to write the config.")
    ] = Path("pipeline.yaml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    sample: Annotated[
        int, typer.Option(min=1, help="Images whose header is read to suggest a size.")
    ] = 200,
) -> None:
    """Write a commented pipeline.yaml for a class-per-folder tree: the classes found, a size
    suggested from the images, every other key at its default. `etl run` accepts it as is.

    Example:  etl init data/sample && etl run pipeline.yaml
    """
    found = survey.survey(source_dir, sample=sample)
    scaffold.write(output, scaffold.render(found, output), force=force)
    size = found.size
    out.print(
        f"wrote {output}: {found.images} images in {len(found.classes)} classes, "
        f"size [{size}, {size}]"
        + (f" (median shorter side {found.median_shorter:g} px)" if found.median_shorter else ""),
        highlight=False,
        soft_wrap=True,
    )
    out.print(f"next: etl validate {output} && etl run {output}", highlight=False)


@app.command()
def inspect(
    directory: DirArg,
    version: VersionOpt = None,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Also write a PNG bar chart of the classes per split."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Summarise a packed dataset: samples per split and class, shards and bytes, versions,
    rejects by reason, checksum algorithm and the output-shaping config.

    Example:  etl inspect artifacts --plot balance.png

    In a bucket:  etl inspect s3://bucket/ds (read through the local cache)
    """
    ds = explore.open_dataset(as_location(directory), version)
    summary = ds.summary()
    if plot is not None:
        save_png(ds.class_balance().image, plot)
    if as_json:
        print(json.dumps({**summary.to_dict(), "plot": str(plot) if plot else None}, indent=2))
        return
    _print_summary(summary)
    if plot is not None:
        out.print(f"wrote {plot}", highlight=False)


def _storage_line(storage: dict[str, Any], samples: int) -> str:
    """`codec jpeg q90: 304 jpeg, 2 raw; 1,823 bytes a sample, 14.8% of raw`."""
    codec = storage.get("codec", {})
    name = str(codec.get("kind", "raw"))
    if "quality" in codec:
        name += f" q{codec['quality']}"
    counts = ", ".join(f"{n:,} {k}" for k, n in storage.get("samples", {}).items())
    per = storage.get("bytes", 0) / max(samples, 1)
    share = storage.get("bytes", 0) / max(storage.get("raw_bytes", 0), 1)
    return f"codec {name}: {counts}; {per:,.0f} bytes a sample, {share:.1%} of raw"


def _print_summary(s: explore.Summary) -> None:
    facts = Table(show_header=False, box=None, pad_edge=False)
    facts.add_column(style="bold")
    facts.add_column(overflow="fold")
    facts.add_row("dataset", s.root)
    facts.add_row(
        "version",
        f"{s.version} (committed: {', '.join(str(v) for v in s.versions)}), created {s.created}"
        f" by etl {s.tool_version}, format {s.format_version}",
    )
    facts.add_row(
        "samples",
        f"{s.samples}: " + ", ".join(f"{k} {sum(v.values())}" for k, v in s.counts.items()),
    )
    shape = "x".join(str(d) if d else "?" for d in s.sample_shape)
    if 0 in s.sample_shape:
        shape += " (each sample its own size: aspect kept)"
    facts.add_row("format", f"{shape} {s.layout} {s.dtype}, checksum {s.checksum}")
    facts.add_row("shards", f"{s.shards}, {s.shard_bytes / 2**20:.1f} MiB")
    facts.add_row("stored", _storage_line(s.storage, s.samples))
    reasons = ", ".join(f"{k} {v}" for k, v in s.rejects_by_reason.items()) or "none"
    facts.add_row("rejects", f"{s.rejects} ({reasons})")
    if s.columns:
        facts.add_row(
            "columns",
            ", ".join(f"{k} {c['type']} ({c['values']} values)" for k, c in s.columns.items()),
        )
    facts.add_row("config", f"digest {s.config_digest}")
    # NOTE: written as in pipeline.yaml, so a line can be pasted back into a config
    for stage in s.config.get("stages", []):
        options = {k: v for k, v in stage.items() if k != "kind"}
        facts.add_row("", f"- {stage.get('kind')}: {scaffold.yaml_value(options)}")
    facts.add_row("", f"split: {scaffold.yaml_value(s.config.get('split', {}))}")
    facts.add_row("", f"source kind: {s.config.get('source_kind')}")
    samples = s.config.get("samples", {})
    if "codec" in samples:  # stored encoded: `output.codec` as pipeline.yaml writes it
        facts.add_row("", f"output codec: {scaffold.yaml_value(samples['codec'])}")
    if "decode" in samples:  # the reduced JPEG decode (resize draft), and its rule
        gap = samples["decode"].get("reducing_gap")
        facts.add_row("", f"decode: JPEG at 1/2-1/8 scale where it keeps {gap}x the output")
    out.print(facts, highlight=False)

    table = Table("class")
    for name in (*s.splits, "total"):
        table.add_column(name, justify="right")
    for i, cls in enumerate(s.classes):
        row = [s.counts[split][cls] for split in s.splits]
        table.add_row(f"{i} {cls}", *(str(n) for n in row), str(sum(row)))
    totals = [sum(s.counts[split].values()) for split in s.splits]
    table.add_row("total", *(str(n) for n in totals), str(sum(totals)), style="bold")
    out.print(table, highlight=False)


def _check_show_flags(
    rejects: bool, for_samples: Mapping[str, object], for_rejects: Mapping[str, object]
) -> None:
    """A usage error for `etl show` flags that do not go together: the flags of a sheet of
    samples (`for_samples`, by name) and those of a sheet of rejects (`for_rejects`)."""
    given = {name for name, value in {**for_samples, **for_rejects}.items() if value}
    if "--ids" in given and {"--class", "--split"} & given:
        raise typer.BadParameter("--ids names the samples; drop --class and --split")
    if rejects and given & set(for_samples):
        raise typer.BadParameter(
            "--rejects takes --reason, not --ids, --class, --split, --where or --with"
        )
    if "--ids" in given and "--where" in given:
        raise typer.BadParameter("--ids names the samples; drop --where")
    if not rejects and given & set(for_rejects):
        raise typer.BadParameter("--reason, --source and --config go with --rejects")
    if rejects and not {"--source", "--config"} & given:
        raise typer.BadParameter("--rejects needs --source DIR or --config pipeline.yaml")


def _sheet_source(config: PipelineConfig | None, moved_to: Path | None) -> SourceConfig:
    """The source a reject sheet reads: the config's (of any kind), at `moved_to` when given;
    without a config, the folder `moved_to` that the sources' paths are relative to."""
    from etl.config import FolderSource
    from etl.sources.locate import location
    from etl.sources.registry import kind_of

    if config is None or (moved_to is not None and kind_of(config.source).by_path):
        assert moved_to is not None  # the caller asks for --source or --config
        source: SourceConfig = FolderSource(path=moved_to)
    elif moved_to is None:
        source = config.source
    else:
        source = config.source.model_copy(update={"path": moved_to})
    where = location(source)
    if kind_of(source).by_path and isinstance(where, Path) and not where.is_dir():
        raise EtlError(f"source root {location(source)} is not a folder (--source or source.path)")
    return source


def _reject_sheet(
    ds: explore.Dataset,
    config_path: Path | None,
    moved_to: Path | None,
    count: int,
    seed: int,
    reasons: list[str] | None,
    columns: int | None,
    cell: int,
) -> Sheet:
    """`etl show --rejects`: the sheet of rejected files, read from the config's source (or
    `--source`), decoded as the config decodes them."""
    config = load_config(config_path) if config_path else None
    return ds.reject_sheet(
        _sheet_source(config, moved_to),
        decode=config.decode if config else None,
        n=count,
        seed=seed,
        reasons=reasons,
        columns=columns,
        cell=cell,
    )


def _say_written(
    sheet: Sheet, out_path: Path, what: str, version: int, seed: int | None, as_json: bool
) -> None:
    """What `etl show` wrote: a line, or the sheet's boxes as JSON (`--json`)."""
    if as_json:
        payload = {"out": str(out_path), "version": version, "kind": what, **sheet.to_dict()}
        print(json.dumps(payload, indent=2))
        return
    width, height = sheet.image.size
    out.print(
        f"wrote {out_path} ({width}x{height} px): {len(sheet.boxes)} {what} of version "
        f"{version}" + ("" if seed is None else f", seed {seed}"),
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def show(
    directory: DirArg,
    count: CountOpt = 16,
    seed: SeedOpt = 0,
    classes: ClassesOpt = None,
    splits: SplitsOpt = None,
    ids: IdsOpt = None,
    rejects: RejectsOpt = False,
    reasons: ReasonsOpt = None,
    source: SourceOpt = None,
    config_path: ConfigPathOpt = None,
    where: WhereOpt = None,
    shown: ShownOpt = None,
    version: VersionOpt = None,
    out_path: OutPathOpt = Path("contact-sheet.png"),
    columns: ColumnsOpt = None,
    cell: CellOpt = 128,
    as_json: AsJsonOpt = False,
) -> None:
    """Write a PNG contact sheet of samples, each labelled with its class and sample id; or,
    with --rejects, of rejected files with their reason.

    Example:  etl show artifacts -n 32 --class circle --out circles.png

    By a column:  etl show artifacts --where "score > 0.5" --with caption

    Rejects:  etl show artifacts --rejects --config pipeline.yaml
    """
    wanted_classes, wanted_splits = _split_commas(classes), _split_commas(splits)
    wanted_ids, wanted_reasons = _split_commas([ids] if ids else None), _split_commas(reasons)
    for_samples = {"--ids": wanted_ids, "--class": wanted_classes, "--split": wanted_splits}
    for_rejects = {"--reason": wanted_reasons, "--source": source, "--config": config_path}
    _check_show_flags(rejects, {**for_samples, "--where": where, "--with": shown}, for_rejects)
    ds = explore.open_dataset(as_location(directory), version)
    if rejects:
        sheet = _reject_sheet(ds, config_path, source, count, seed, wanted_reasons, columns, cell)
        what = "rejects"
    else:
        sheet = ds.contact_sheet(
            n=count,
            seed=seed,
            split=wanted_splits,
            classes=wanted_classes,
            ids=wanted_ids,
            columns=columns,
            cell=cell,
            where=where,
            shown=_split_commas(shown) or (),
        )
        what = "samples"
    save_png(sheet.image, out_path)
    _say_written(sheet, out_path, what, ds.version, None if wanted_ids else seed, as_json)
