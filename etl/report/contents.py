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

from etl.errors import EtlError
from etl.explore.dataset import Dataset
from etl.maintenance.versions import VersionDiff
from etl.progress import Progress
from etl.report.charts import BarChart, Histogram, histogram, stacked_bars
from etl.report.history import (
    DIFF_EXAMPLES,
    DiffPictures,
    VersionEntry,
    diff_pictures,
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
    progress.start("thumbnails", _planned(ds, last))
    try:
        rejects = _rejects(ds, seed, source, decode, notes, progress)
        grid = _grid(ds, seed, notes, progress)
        pictures = diff_pictures(ds, last, seed, progress) if last is not None else None
    finally:
        progress.stop()
    return ReportData(
        title=f"{ds.name} v{ds.version}",
        dataset=ds.location,
        version=ds.version,
        summary=summary,
        command=meta.command,
        config_json=json.dumps(dict(meta.config), indent=2, sort_keys=True),
        class_rows=rows,
        classes_chart=chart,
        notes=notes,
        reject_chart=_reject_chart(ds),
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


def _reject_chart(ds: Dataset) -> BarChart | None:
    reasons = value_counts(ds.rejects.column("reason"))
    if not reasons:
        return None
    return stacked_bars([r for r, _ in reasons], {"rejects": [n for _, n in reasons]})


def _planned(ds: Dataset, last: VersionDiff | None) -> int:
    """The thumbnails `gather` reads, for its progress bar."""
    shown = min(len(ds.classes), GRID_BUDGET)
    per_class = max(1, min(PER_CLASS, GRID_BUDGET // max(shown, 1)))
    sizes = np.bincount(ds.table.column("label").to_numpy(), minlength=shown)[:shown]
    total = int(np.minimum(sizes, per_class).sum())
    budget = REJECT_BUDGET
    for _, n in value_counts(ds.rejects.column("reason")):
        take = min(REJECT_EXAMPLES, budget, n)
        budget -= take
        total += take
    if last is not None:
        total += sum(
            k * min(DIFF_EXAMPLES, t.num_rows)
            for k, t in ((1, last.added), (1, last.removed), (2, last.changed))
        )
    return total


def _grid(
    ds: Dataset, seed: int, notes: dict[str, str], progress: Progress
) -> tuple[tuple[str, tuple[Thumb, ...]], ...]:
    """A few samples of each class, drawn by `seed`: up to PER_CLASS each, GRID_BUDGET in all
    (the first classes by label where there are more classes than that)."""
    n_classes = len(ds.classes)
    shown = min(n_classes, GRID_BUDGET)
    per_class = max(1, min(PER_CLASS, GRID_BUDGET // max(shown, 1)))
    if shown < n_classes:
        notes["grid"] = f"the grid shows the first {shown:,} of {n_classes:,} classes"
    labels = ds.table.column("label").to_numpy()
    by_label = np.argsort(labels, kind="stable")  # a radix sort of int32: linear in rows
    starts = np.searchsorted(labels[by_label], np.arange(shown + 1))
    rng = np.random.default_rng(seed)
    splits, ids, sources = (ds.table.column(c) for c in ("split", "sample_id", "source"))
    grid = []
    for label in range(shown):
        members = by_label[starts[label] : starts[label + 1]]
        drawn = rng.choice(len(members), min(per_class, len(members)), replace=False)
        picked = sorted(int(members[i]) for i in drawn)
        thumbs = []
        for p in picked:
            lines = (str(ids[p]), str(splits[p]), str(sources[p]))
            thumbs.append(sample_thumb(ds, p, lines))
            progress.advance(1)
        grid.append((ds.classes[label], tuple(thumbs)))
    return tuple(grid)


def _rejects(
    ds: Dataset,
    seed: int,
    source: SourceConfig | None,
    decode: DecodeStage | None,
    notes: dict[str, str],
    progress: Progress,
) -> tuple[RejectGroup, ...]:
    """Each reason's count and up to REJECT_EXAMPLES examples drawn by `seed`, with their
    thumbnails where `source` is given and the file can be read and decoded."""
    table = ds.rejects
    if table.num_rows == 0:
        return ()
    if source is None:
        notes["rejects"] = (
            "thumbnails not available: give the source (--config pipeline.yaml or --source DIR)"
        )
    reasons = table.column("reason").to_numpy(zero_copy_only=False)
    rng = np.random.default_rng(seed)
    groups, budget = [], REJECT_BUDGET
    for reason, count in value_counts(table.column("reason")):
        where = np.flatnonzero(reasons == reason)
        take = min(REJECT_EXAMPLES, budget, len(where))
        budget -= take
        picked = sorted(int(i) for i in rng.choice(where, take, replace=False))
        rows = table.take(pa.array(picked, pa.int64()))
        thumbs = _reject_thumbs(ds, rows.to_pylist(), source, decode)
        progress.advance(len(thumbs))
        examples = tuple(
            (str(r["source"]), str(r["message"]), t)
            for r, t in zip(rows.to_pylist(), thumbs, strict=True)
        )
        groups.append(RejectGroup(reason, count, examples))
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
        top = tuple(value_counts(present, TOP_VALUES))
        distinct = len(pc.unique(present)) if len(present) else 0
        return ColumnSummary(**base, nulls=nulls, top=top, distinct=distinct)
    return ColumnSummary(**base, nulls=nulls)


def _fmt(x: float) -> str:
    return f"{x:.6g}"


# --- versions ---------------------------------------------------------------------------------
