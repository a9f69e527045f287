"""What a dataset's HTML report shows, gathered from one committed version: counts, rejects,
a sample grid, per-sample column summaries, storage, the versions' timeline and the diff
against the previous version (`gather`). `etl.report.page` renders it.

Bounded whatever the dataset's size: at most about 500 thumbnails (`GRID_BUDGET`, rejects'
and the diff's examples), class tables and charts cut at fixed lengths with a note saying so,
and per-class change counts for the last `TIMELINE_DIFFS` versions only. Deterministic: the
same version, seed and flags give the same data; nothing here reads a clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.errors import EtlError, redacted
from etl.explore.dataset import Dataset
from etl.progress import Progress
from etl.report.charts import BarChart, Histogram, histogram, stacked_bars
from etl.report.history import (
    DiffPictures,
    VersionEntry,
    diff_pictures,
    draw_changes,
    timeline,
)
from etl.report.thumbs import Thumb, sample_thumb, to_uri, value_counts

if TYPE_CHECKING:
    from etl.config import DecodeStage, SourceConfig  # NOTE: pydantic costs 0.25 s to import

GRID_BUDGET = 240
"""Thumbnails of the per-class sample grid, at most."""
PER_CLASS = 6
REJECT_EXAMPLES = 6
"""Examples shown per reject reason (with `REJECT_BUDGET` in all)."""
REJECT_BUDGET = 120
CHART_CLASSES = 60
TABLE_CLASSES = 1000
TOP_VALUES = 10
REJECT_REASONS = 60
"""Reject reasons charted and grouped, the most common first (like classes: a hostile source
can make every reject's reason its own)."""
TEXT_CHARS = 300
"""Characters of one value shown (a source, a message, a caption); the rest is marked cut."""


def cut(text: object, limit: int | None = None) -> str:
    """`text` as the page shows it: at most `limit` (`TEXT_CHARS`) characters, and a visible
    mark of how many more there were."""
    shown, limit = str(text), TEXT_CHARS if limit is None else limit
    if len(shown) <= limit:
        return shown
    return f"{shown[:limit]}... ({len(shown) - limit:,} more characters)"


@dataclass(frozen=True)
class RejectGroup:
    reason: str
    count: int
    examples: tuple[tuple[str, str, Thumb], ...]
    """(source, message, thumbnail) of up to REJECT_EXAMPLES rejects, drawn by the seed."""


@dataclass(frozen=True)
class ColumnSummary:
    name: str
    type: str
    values: int
    nulls: int
    histogram: Histogram | None = None
    stats: tuple[tuple[str, str], ...] = ()
    top: tuple[tuple[str, int], ...] = ()
    """The TOP_VALUES most frequent values and their counts (text, booleans)."""
    distinct: int | None = None


@dataclass(frozen=True)
class ReportData:
    title: str
    dataset: str
    version: int
    summary: dict[str, Any]
    """`Dataset.summary().to_dict()`: counts, shards, storage, config, ..."""
    command: str
    config_json: str
    class_rows: tuple[tuple[str, tuple[int, ...], int], ...]
    """(class, count per split, total), at most TABLE_CLASSES of them."""
    classes_chart: BarChart
    notes: dict[str, str]
    """Per section, what the report left out and why (a cut list, thumbnails not available)."""
    reject_chart: BarChart | None
    reject_groups: tuple[RejectGroup, ...]
    grid: tuple[tuple[str, tuple[Thumb, ...]], ...]
    columns: tuple[ColumnSummary, ...]
    timeline: tuple[VersionEntry, ...]
    diff: DiffPictures | None


def gather(
    ds: Dataset,
    seed: int = 0,
    source: SourceConfig | None = None,
    decode: DecodeStage | None = None,
    progress: Progress | None = None,
) -> ReportData:
    """The report of `ds`'s version. `source` (and the config's `decode`): where its rejects
    are read back for thumbnails; None shows them without."""
    progress = progress or Progress()
    meta = ds.manifest.meta
    notes: dict[str, str] = {}
    summary = ds.summary().to_dict()
    rows, chart = _class_counts(ds, notes)
    versions, last = timeline(ds)
    reasons = value_counts(ds.rejects.column("reason"))
    if len(reasons) > REJECT_REASONS:
        notes["reasons"] = (
            f"the report shows the {REJECT_REASONS} most common of {len(reasons):,} reasons"
        )
        reasons = reasons[:REJECT_REASONS]
    # drawn first, read after: the progress bar's total is what was drawn
    grid_picks = _grid_picks(ds, seed, notes)
    reject_picks = _reject_picks(ds, reasons, seed)
    changes = draw_changes(last, seed) if last is not None else None
    total = sum(len(p) for _, p in grid_picks) + sum(len(r) for _, _, r in reject_picks)
    progress.start("thumbnails", total + (changes.thumbnails if changes else 0))
    try:
        rejects = _rejects(ds, reject_picks, source, decode, notes, progress)
        grid = _grid(ds, grid_picks, progress)
        pictures = diff_pictures(ds, changes, progress) if changes is not None else None
    finally:
        progress.stop()
    return ReportData(
        title=f"{ds.name} v{ds.version}",
        dataset=redacted(str(ds.location)),
        version=ds.version,
        summary=summary,
        command=redacted(meta.command),
        config_json=json.dumps(dict(meta.config), indent=2, sort_keys=True),
        class_rows=rows,
        classes_chart=chart,
        notes=notes,
        reject_chart=_reject_chart(reasons),
        reject_groups=rejects,
        grid=grid,
        columns=tuple(
            _column(ds.table.column(f.name), f, text)
            for f, (_, text) in zip(meta.column_fields, meta.columns, strict=True)
        ),
        timeline=versions,
        diff=pictures,
    )


# --- counts -----------------------------------------------------------------------------------


def _class_counts(
    ds: Dataset, notes: dict[str, str]
) -> tuple[tuple[tuple[str, tuple[int, ...], int], ...], BarChart]:
    counts = ds.counts()
    splits = list(counts)
    rows = [(c, tuple(counts[s][c] for s in splits)) for c in ds.classes]
    table = tuple((c, n, sum(n)) for c, n in rows[:TABLE_CLASSES])
    if len(rows) > TABLE_CLASSES:
        notes["classes"] = f"the table lists the first {TABLE_CLASSES:,} of {len(rows):,} classes"
    charted = rows
    if len(rows) > CHART_CLASSES:
        by_size = sorted(rows, key=lambda r: (-sum(r[1]), r[0]))
        half = CHART_CLASSES // 2
        charted = by_size[:half] + by_size[-half:]
        notes["chart"] = (
            f"the chart shows the {half} largest and the {half} smallest of {len(rows):,} classes"
        )
    series = {s: [n[i] for _, n in charted] for i, s in enumerate(splits)}
    return table, stacked_bars([c for c, _ in charted], series)


def _reject_chart(reasons: list[tuple[str, int]]) -> BarChart | None:
    if not reasons:
        return None
    return stacked_bars([r for r, _ in reasons], {"rejects": [n for _, n in reasons]})


def _grid_picks(ds: Dataset, seed: int, notes: dict[str, str]) -> list[tuple[str, list[int]]]:
    """A few samples of each class, drawn by `seed`: up to PER_CLASS each, GRID_BUDGET in all
    (the first classes by label where there are more classes than that), as positions."""
    n_classes = len(ds.classes)
    shown = min(n_classes, GRID_BUDGET)
    per_class = max(1, min(PER_CLASS, GRID_BUDGET // max(shown, 1)))
    if shown < n_classes:
        notes["grid"] = f"the grid shows the first {shown:,} of {n_classes:,} classes"
    labels = ds.table.column("label").to_numpy()
    by_label = np.argsort(labels, kind="stable")  # a radix sort of int32: linear in rows
    starts = np.searchsorted(labels[by_label], np.arange(shown + 1))
    rng = np.random.default_rng(seed)
    picks = []
    for label in range(shown):
        members = by_label[starts[label] : starts[label + 1]]
        drawn = rng.choice(len(members), min(per_class, len(members)), replace=False)
        picks.append((ds.classes[label], sorted(int(members[i]) for i in drawn)))
    return picks


def _grid(
    ds: Dataset, picks: list[tuple[str, list[int]]], progress: Progress
) -> tuple[tuple[str, tuple[Thumb, ...]], ...]:
    """The grid's thumbnails, each captioned with its sample id, split and source."""
    splits, ids, sources = (ds.table.column(c) for c in ("split", "sample_id", "source"))
    grid = []
    for name, positions in picks:
        thumbs = []
        for p in positions:
            lines = (str(ids[p]), str(splits[p]), cut(sources[p]))
            thumbs.append(sample_thumb(ds, p, lines))
            progress.advance(1)
        grid.append((name, tuple(thumbs)))
    return tuple(grid)


def _reject_picks(
    ds: Dataset, reasons: list[tuple[str, int]], seed: int
) -> list[tuple[str, int, list[dict[str, Any]]]]:
    """Each reason, its count and up to REJECT_EXAMPLES of its rejects drawn by `seed`
    (REJECT_BUDGET in all)."""
    table = ds.rejects
    if table.num_rows == 0:
        return []
    column = table.column("reason").to_numpy(zero_copy_only=False).astype(str)
    names, inverse = np.unique(column, return_inverse=True)  # NOTE: one pass, not one a reason
    by_reason = np.argsort(inverse, kind="stable")
    starts = np.searchsorted(inverse[by_reason], np.arange(len(names) + 1))
    code = {str(name): k for k, name in enumerate(names.tolist())}
    rng = np.random.default_rng(seed)
    picks, budget = [], REJECT_BUDGET
    for reason, count in reasons:
        k = code[str(reason)]
        where = by_reason[starts[k] : starts[k + 1]]
        take = min(REJECT_EXAMPLES, budget, len(where))
        budget -= take
        picked = sorted(int(i) for i in rng.choice(where, take, replace=False))
        picks.append((reason, count, table.take(pa.array(picked, pa.int64())).to_pylist()))
    return picks


def _rejects(
    ds: Dataset,
    picks: list[tuple[str, int, list[dict[str, Any]]]],
    source: SourceConfig | None,
    decode: DecodeStage | None,
    notes: dict[str, str],
    progress: Progress,
) -> tuple[RejectGroup, ...]:
    """Each reason's group, with thumbnails where `source` is given and the file can be read
    and decoded."""
    if picks and source is None:
        notes["rejects"] = (
            "thumbnails not available: give the source (--config pipeline.yaml or --source DIR)"
        )
    groups = []
    for reason, count, rows in picks:
        thumbs = _reject_thumbs(ds, rows, source, decode)
        progress.advance(len(thumbs))
        examples = tuple(
            (cut(r["source"]), cut(r["message"]), t) for r, t in zip(rows, thumbs, strict=True)
        )
        groups.append(RejectGroup(cut(reason), count, examples))
    return tuple(groups)


def _reject_thumbs(
    ds: Dataset,
    rows: list[dict[str, Any]],
    source: SourceConfig | None,
    decode: DecodeStage | None,
) -> list[Thumb]:
    if source is None or not rows:
        return [Thumb(None, (), "not available", str(r["source"])) for r in rows]
    from etl.config import DecodeStage
    from etl.explore.reject_sheet import reject_cells

    try:
        cells = reject_cells(source, rows, decode or DecodeStage(), ds.manifest.meta.checksum)
    except (EtlError, OSError) as exc:  # the source is gone, or its store refuses
        return [Thumb(None, (), f"not available: {exc}", str(r["source"])) for r in rows]
    return [
        Thumb(to_uri(c.image), (), alt=str(r["source"]))
        if c.image is not None
        else Thumb(None, (), _no_picture(str(c.info.get("note", "")), r), str(r["source"]))
        for c, r in zip(cells, rows, strict=True)
    ]


def _no_picture(why: str, reject: dict[str, Any]) -> str:
    """Why a reject has no thumbnail, unless its message says it already (an unreadable file)."""
    said = why.split(": ", 1)[-1] in str(reject["message"])
    return "no picture: see the message" if said or not why else f"no picture: {why}"


# --- columns ----------------------------------------------------------------------------------


def _column(values: pa.ChunkedArray, field: pa.Field, type_text: str) -> ColumnSummary:
    """A per-sample column in numbers: a histogram of numbers (of lengths, for lists), the
    most frequent values of text and booleans."""
    kind, nulls = field.type, values.null_count
    base = {"name": field.name, "type": type_text, "values": len(values) - nulls}
    present = values.drop_null() if nulls else values
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        numbers = present.to_numpy()
        finite = numbers[np.isfinite(numbers)] if numbers.dtype.kind == "f" else numbers
        stats = (
            (
                ("min", _fmt(finite.min())),
                ("mean", _fmt(finite.mean())),
                ("max", _fmt(finite.max())),
            )
            if finite.size
            else ()
        )
        return ColumnSummary(**base, nulls=nulls, histogram=histogram(numbers), stats=stats)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        lengths = pc.list_value_length(present).to_numpy(zero_copy_only=False)
        return ColumnSummary(
            **base, nulls=nulls, histogram=histogram(lengths), stats=(("of", "lengths"),)
        )
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_boolean(kind):
        top = tuple((cut(value), n) for value, n in value_counts(present, TOP_VALUES))
        distinct = len(pc.unique(present)) if len(present) else 0
        return ColumnSummary(**base, nulls=nulls, top=top, distinct=distinct)
    return ColumnSummary(**base, nulls=nulls)


def _fmt(x: float) -> str:
    return f"{x:.6g}"


# --- versions ---------------------------------------------------------------------------------
