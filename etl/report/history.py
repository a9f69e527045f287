"""A dataset's history for the report: every version up to the report's, with what the last
few changed per class, and thumbnails of the samples the report's version added, changed and
removed (`timeline`, `diff_pictures`). Bounded: per-class counts for the last `TIMELINE_DIFFS`
versions, `DIFF_EXAMPLES` thumbnails of each kind, drawn by the seed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.explore.dataset import Dataset
from etl.maintenance.versions import VersionDiff, diff_manifests
from etl.progress import Progress
from etl.report.thumbs import Thumb, sample_thumb, value_counts

DIFF_EXAMPLES = 24
"""Added, changed and removed samples shown with thumbnails, of each kind."""
TIMELINE_DIFFS = 5
"""Versions whose per-class changes are counted (the latest up to the report's)."""


@dataclass(frozen=True)
class Change:
    """What one version changed against the one before it, in all and per class."""

    previous: int
    added: int
    removed: int
    changed: int
    per_class: tuple[tuple[str, int, int, int], ...]
    """(class, added, removed, changed) of each class with any change."""


@dataclass(frozen=True)
class VersionEntry:
    version: int
    created: str
    samples: int
    rejects: int
    config_digest: str
    command: str
    change: Change | None


@dataclass(frozen=True)
class DiffPictures:
    previous: int
    added: tuple[Thumb, ...]
    changed: tuple[tuple[Thumb, Thumb], ...]
    """(before, after) of samples whose pixels, class, split or columns changed."""
    removed: tuple[Thumb, ...]


def timeline(ds: Dataset) -> tuple[tuple[VersionEntry, ...], VersionDiff | None]:
    """Every committed version up to the report's, oldest first, the last TIMELINE_DIFFS with
    what each changed against the one before, per class; and the report version's diff
    against its previous one (None for a first version)."""
    numbers = [n for n in ds.versions if n <= ds.version]
    detailed = set(numbers[1:][-TIMELINE_DIFFS:])
    entries, last = [], None
    for i, number in enumerate(numbers):
        version = ds.at_version(number)
        meta = version.manifest.meta
        change = None
        if number in detailed:
            last = diff_manifests(ds.at_version(numbers[i - 1]).manifest, version.manifest)
            change = _change(last)
        entries.append(
            VersionEntry(
                number,
                meta.created,
                len(version),
                version.rejects.num_rows,
                meta.config_digest,
                meta.command,
                change,
            )
        )
    return tuple(entries), last if numbers and numbers[-1] in detailed else None


def _change(d: VersionDiff) -> Change:
    added = dict(value_counts(d.added.column("class_name")))
    removed = dict(value_counts(d.removed.column("class_name")))
    changed = dict(value_counts(d.changed.column("class_name_new")))
    classes = sorted(set(added) | set(removed) | set(changed))
    per_class = tuple((c, added.get(c, 0), removed.get(c, 0), changed.get(c, 0)) for c in classes)
    return Change(d.a, d.added.num_rows, d.removed.num_rows, d.changed.num_rows, per_class)


@dataclass(frozen=True)
class DrawnChanges:
    """The rows of a diff the report draws pictures of: up to DIFF_EXAMPLES of each kind."""

    diff: VersionDiff
    added: pa.Table
    removed: pa.Table
    changed: pa.Table

    @property
    def thumbnails(self) -> int:
        """Pictures they make: one each, two (before, after) for a changed sample."""
        return self.added.num_rows + self.removed.num_rows + 2 * self.changed.num_rows


def draw_changes(d: VersionDiff, seed: int) -> DrawnChanges:
    """Up to DIFF_EXAMPLES samples added, removed and changed, drawn by `seed`."""
    rng = np.random.default_rng(seed)

    def drawn(table: pa.Table) -> pa.Table:
        picked = rng.choice(table.num_rows, min(DIFF_EXAMPLES, table.num_rows), replace=False)
        return table.take(pa.array(sorted(int(i) for i in picked), pa.int64()))

    added, removed, changed = drawn(d.added), drawn(d.removed), drawn(d.changed)
    return DrawnChanges(d, added, removed, changed)


def diff_pictures(ds: Dataset, drawn: DrawnChanges, progress: Progress) -> DiffPictures:
    """Thumbnails of the samples `draw_changes` drew: added, changed (before and after) and
    removed since the previous version; a removed or earlier sample whose shard is gone
    (compacted away) says so."""
    before = ds.at_version(drawn.diff.a)

    def thumbs(
        version: Dataset, sources: list[str], captions: list[tuple[str, ...]]
    ) -> list[Thumb]:
        at = _positions_of(version, sources)
        found = []
        for source, lines in zip(sources, captions, strict=True):
            p = at.get(source)
            found.append(sample_thumb(version, p, lines) if p is not None else Thumb(None, lines))
            progress.advance(1)
        return found

    added, removed, changed = drawn.added, drawn.removed, drawn.changed
    old_new = [((r["source"],), (r["source"], *_what_changed(r))) for r in changed.to_pylist()]
    sources = changed.column("source").to_pylist()
    return DiffPictures(
        drawn.diff.a,
        tuple(thumbs(ds, added.column("source").to_pylist(), _captions(added))),
        tuple(
            zip(
                thumbs(before, sources, [o for o, _ in old_new]),
                thumbs(ds, sources, [n for _, n in old_new]),
                strict=True,
            )
        ),
        tuple(thumbs(before, removed.column("source").to_pylist(), _captions(removed))),
    )


def _positions_of(version: Dataset, sources: list[str]) -> dict[str, int]:
    """The rows of `version` holding each of a few `sources`: one pass over its source column
    against a hash set of the few (not a hash table of every source of a 10M-row version)."""
    column = version.table.column("source")
    hit = pc.index_in(column, value_set=pa.array(sources, pa.string()))
    rows = pc.indices_nonzero(pc.is_valid(hit))
    which = pc.take(hit, rows).to_pylist()
    return {sources[w]: int(r) for w, r in zip(which, rows.to_pylist(), strict=True)}


def _captions(rows: pa.Table) -> list[tuple[str, ...]]:
    return [
        (str(s), f"{c} ({p})")
        for s, c, p in zip(
            rows.column("source").to_pylist(),
            rows.column("class_name").to_pylist(),
            rows.column("split").to_pylist(),
            strict=True,
        )
    ]


def _what_changed(row: dict[str, Any]) -> tuple[str, ...]:
    what = [
        f"{k}: {row[k + '_old']} -> {row[k + '_new']}"
        for k in ("class_name", "split")
        if row[k + "_old"] != row[k + "_new"]
    ]
    if row["checksum_old"] != row["checksum_new"]:
        what.append("pixels")
    what += [f"{name} changed" for name in row["columns"]]
    return tuple(what)
