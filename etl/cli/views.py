"""`etl view`: what a view file selects, before a training job reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.table import Table

from etl.cli.app import app, out
from etl.errors import redacted
from etl.explore import dataset as explore
from etl.explore.drawing import save_png
from etl.format.views import View


@app.command()
def view(
    path: Annotated[Path, typer.Argument(help="A view file (YAML: dataset, split, where, ...).")],
    sheet: Annotated[
        Path | None, typer.Option("--sheet", help="Also draw a contact sheet of its samples.")
    ] = None,
    count: Annotated[int, typer.Option("--count", "-n", min=1, help="Cells to draw.")] = 16,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the cells' random choice.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Show what a view selects: its dataset and version, every predicate of its chain, its
    fingerprint (what a resumed loader checks), and its samples per split and class.

    Example:  etl view views/train-captioned.yaml --sheet sheet.png
    """
    chosen = View.load(path)
    ds = explore.open_dataset(chosen.dataset, chosen.version, relative_to=chosen.folder)
    dataset = redacted(ds.location) if ds.url else str(Path(chosen.folder) / chosen.dataset)
    mask = chosen.mask(ds)
    selected = int(mask.sum())
    counts = {s: c for s, c in ds.counts(mask).items() if sum(c.values())}
    report: dict[str, object] = {
        "view": str(path),
        "dataset": dataset,
        "version": ds.version,
        "fingerprint": chosen.fingerprint(ds.version),
        "chain": chosen.chain(),
        "samples": selected,
        "of": len(ds),
        "counts": counts,
    }
    if sheet is not None:
        if not selected:
            raise typer.BadParameter("the view selects no sample: nothing to draw")
        rng = np.random.default_rng(seed)
        positions = np.sort(rng.choice(np.flatnonzero(mask), min(count, selected), replace=False))
        ids = ds.table.column("sample_id").take(positions).to_pylist()
        drawn = ds.contact_sheet(ids=ids, cell=96)
        save_png(drawn.image, sheet)
        report["sheet"] = str(sheet)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    out.print(f"view      {path}", highlight=False)
    out.print(f"dataset   {dataset} version {ds.version}", highlight=False)
    for depth, predicate in enumerate(chosen.chain()):
        said = ", ".join(f"{k} {v}" for k, v in predicate.items()) or "every sample"
        out.print(f"{'select' if depth == 0 else '  then':9} {said}", highlight=False)
    out.print(f"samples   {selected} of {len(ds)}", highlight=False)
    out.print(f"print     {report['fingerprint']} (what a resumed loader checks)", highlight=False)
    table = Table("class", *counts, "total")
    for name in ds.classes:
        row = [counts[split][name] for split in counts]
        if sum(row):
            table.add_row(name, *(str(n) for n in row), str(sum(row)))
    out.print(table, highlight=False)
    if sheet is not None:
        out.print(f"wrote {sheet}", highlight=False)
