"""Read-only views over a dataset's history: what each version holds and how two versions differ."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.format.manifest import Manifest, read_manifest, resolve
from etl.format.table_ops import ascending, bisect_right, bool_mask, positions_in, sorted_by
from etl.storage.location import StoreOptions, open_location


@dataclass(frozen=True)
class VersionSummary:
    version: int
    created: str
    samples: int
    rejects: int
    shards: int
    shard_bytes: int
    config_digest: str


def readable(
    dataset: Path | str, numbers: Sequence[int] | None = None, cache_dir: Path | None = None
) -> tuple[Path, list[int]]:
    """The local folder to read versions `numbers` (None: every committed one) of `dataset`
    from, and those numbers: the dataset's own folder, or for a dataset in object storage
    (`s3://...`) its mirror in `cache_dir`, with those versions fetched
    (`etl.storage.store`)."""
    location = open_location(dataset, StoreOptions(cache_dir))
    wanted = list(numbers) if numbers is not None else location.versions()
    if location.store is None:
        root, _ = resolve(location.root)
        return root, wanted
    return location.root, [location.store.fetch_version(n) for n in wanted]


def summaries(dataset: Path | str, cache_dir: Path | None = None) -> list[VersionSummary]:
    """One line per committed version, oldest first."""
    root, numbers = readable(dataset, None, cache_dir)
    out = []
    for number in numbers:
        m = read_manifest(root, number)
        out.append(
            VersionSummary(
                version=number,
                created=m.meta.created,
                samples=m.samples.num_rows,
                rejects=m.rejects.num_rows,
                shards=m.shards.num_rows,
                shard_bytes=int(pc.sum(m.shards.column("bytes")).as_py() or 0),
                config_digest=m.meta.config_digest,
            )
        )
    return out


@dataclass(frozen=True)
class VersionDiff:
    """Samples matched by source (one sample per source path; sample_id follows it)."""

    a: int
    b: int
    added: pa.Table
    """Rows of version b whose source is not in a."""
    removed: pa.Table
    """Rows of version a whose source is not in b."""
    changed: pa.Table
    """sample_id, source and what differs: checksum (pixels), label or split, old and new;
    'columns', the declared per-sample columns (of both versions) whose value differs."""
    columns_added: tuple[str, ...] = ()
    """Per-sample columns version b has and a has not (or has with another type)."""
    columns_removed: tuple[str, ...] = ()


_COMPARED = ("checksum", "class_name", "split")
_CHANGED_COLUMNS = ["sample_id", "source"] + [
    f"{c}_{age}" for age in ("old", "new") for c in _COMPARED
]


DIFF_ROWS = 1 << 16
"""Rows of each version compared at a time."""


def diff(dataset: Path | str, a: int, b: int, cache_dir: Path | None = None) -> VersionDiff:
    """What changed between two versions, by source: pixels (checksum), class or split.

    Both manifests are in source order (docs/FORMAT.md; one that is not is sorted first), so
    they are walked side by side, DIFF_ROWS of each at a time, with the pages read let go of
    after each step: 10M-row versions cost what their differences cost, not a hash table of
    every source. Every table comes out in source order. `dataset`: see `readable`."""
    root, _ = readable(dataset, (a, b), cache_dir)
    return diff_manifests(read_manifest(root, a), read_manifest(root, b))


def diff_manifests(old: Manifest, new: Manifest) -> VersionDiff:
    """`diff` of two versions already open (the report's, which has opened both)."""
    a, b = old.meta.version, new.meta.version
    before, after = _in_source_order(old), _in_source_order(new)
    old_columns, new_columns = set(old.meta.column_fields), set(new.meta.column_fields)
    common = [f.name for f in new.meta.column_fields if f in old_columns]
    added: list[pa.Table] = [after.slice(0, 0)]
    removed: list[pa.Table] = [before.slice(0, 0)]
    changed: list[pa.Table] = [_changed(before.slice(0, 0), after.slice(0, 0), common)]
    i = j = 0
    while i < after.num_rows or j < before.num_rows:
        later, earlier = after.slice(i, DIFF_ROWS), before.slice(j, DIFF_ROWS)
        if later.num_rows and earlier.num_rows:
            bound = min(_last_source(later), _last_source(earlier))
            later = later.slice(0, bisect_right(later.column("source"), bound))
            earlier = earlier.slice(0, bisect_right(earlier.column("source"), bound))
        i, j = i + later.num_rows, j + earlier.num_rows
        at = positions_in(later.column("source"), earlier.column("source"))
        matched = at >= 0
        kept = np.zeros(earlier.num_rows, dtype=bool)
        kept[at[matched]] = True
        added.append(later.filter(pa.array(~matched)))
        removed.append(earlier.filter(pa.array(~kept)))
        changed.append(_changed(earlier.take(pa.array(at[matched])), later.filter(matched), common))
        old.release_pages()
        new.release_pages()
    return VersionDiff(
        a=a,
        b=b,
        added=pa.concat_tables(added).combine_chunks(),
        removed=pa.concat_tables(removed).combine_chunks(),
        changed=pa.concat_tables(changed).combine_chunks(),
        columns_added=tuple(f.name for f in new.meta.column_fields if f not in old_columns),
        columns_removed=tuple(f.name for f in old.meta.column_fields if f not in new_columns),
    )


def _in_source_order(version: Manifest) -> pa.Table:
    """The version's samples in source order: as this tool writes them, sorted in memory only
    for a version written otherwise."""
    samples = version.samples
    if ascending(samples.column("source"), version.release_pages):
        return samples
    return sorted_by(samples, "source")


def _last_source(rows: pa.Table) -> str:
    return str(rows.column("source")[-1].as_py())


def _changed(old_rows: pa.Table, new_rows: pa.Table, columns: Sequence[str]) -> pa.Table:
    """The pairs (same source, in order) whose checksum, class name, split or one of the
    per-sample `columns` differ, as `VersionDiff.changed` rows."""
    differs = np.zeros(new_rows.num_rows, dtype=bool)
    for name in _COMPARED:
        same = pc.equal(
            pc.fill_null(old_rows.column(name), ""), pc.fill_null(new_rows.column(name), "")
        )
        differs |= ~bool_mask(same)
    by_column = [_differs(old_rows.column(c), new_rows.column(c)) for c in columns]
    for column_differs in by_column:
        differs |= column_differs
    old_rows, new_rows = old_rows.filter(differs), new_rows.filter(differs)
    which = [
        [name for name, d in zip(columns, row, strict=True) if d]
        for row in zip(*(d[differs] for d in by_column), strict=True)
    ] if by_column else [[] for _ in range(new_rows.num_rows)]  # fmt: skip
    return pa.table(
        [new_rows.column("sample_id"), new_rows.column("source")]
        + [rows.column(c) for rows in (old_rows, new_rows) for c in _COMPARED]
        + [pa.array(which, pa.list_(pa.string()))],
        names=[*_CHANGED_COLUMNS, "columns"],
    )


def _differs(old: pa.ChunkedArray, new: pa.ChunkedArray) -> np.ndarray:
    """Where two columns of one type hold different values (null equals null)."""
    if pa.types.is_nested(old.type):
        pairs = zip(old.to_pylist(), new.to_pylist(), strict=True)
        return np.array([a != b for a, b in pairs], dtype=bool)
    both_null = bool_mask(pc.and_(pc.is_null(old), pc.is_null(new)))
    return ~(bool_mask(pc.fill_null(pc.equal(old, new), False)) | both_null)
