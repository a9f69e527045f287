"""Read-only views over a dataset's history: what each version holds and how two versions differ."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from etl.format.columns import bool_mask, fixed_width, positions_in, value_codes
from etl.format.manifest import Manifest, list_versions, read_manifest, resolve


@dataclass(frozen=True)
class VersionSummary:
    version: int
    created: str
    samples: int
    rejects: int
    shards: int
    shard_bytes: int
    config_digest: str


def summaries(root: Path) -> list[VersionSummary]:
    """One line per committed version, oldest first."""
    root, _ = resolve(root)
    out = []
    for number in list_versions(root):
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
    """sample_id, source and what differs: checksum (pixels), label or split, old and new."""


_COMPARED = ("checksum", "class_name", "split")
_CHANGED_COLUMNS = ["sample_id", "source"] + [
    f"{c}_{age}" for age in ("old", "new") for c in _COMPARED
]


def diff(root: Path, a: int, b: int) -> VersionDiff:
    """What changed between two versions, by source: pixels (checksum), class or split.

    One hash lookup of b's sources in a's, then integer work: classes and splits compare as
    codes, fixed-width checksums as bytes; only the rows that differ are gathered. Every
    table comes out in source order, as both manifests are (docs/FORMAT.md)."""
    old, new = read_manifest(root, a), read_manifest(root, b)
    old_pos = positions_in(new.samples.column("source"), old.samples.column("source"))
    matched = old_pos >= 0
    kept = np.zeros(old.samples.num_rows, dtype=bool)
    kept[old_pos[matched]] = True
    new_pos = np.flatnonzero(matched)
    old_pos = old_pos[matched]
    differs = _differ_by_name(old, old_pos, new, new_pos) | ~_same_strings(
        old.samples.column("checksum"), old_pos, new.samples.column("checksum"), new_pos
    )
    old_rows = old.samples.take(pa.array(old_pos[differs]))
    new_rows = new.samples.take(pa.array(new_pos[differs]))
    changed = pa.table(
        [new_rows.column("sample_id"), new_rows.column("source")]
        + [rows.column(c) for rows in (old_rows, new_rows) for c in _COMPARED],
        names=_CHANGED_COLUMNS,
    )
    return VersionDiff(
        a=a,
        b=b,
        added=new.samples.filter(pa.array(~matched)),
        removed=old.samples.filter(pa.array(~kept)),
        changed=changed,
    )


def _differ_by_name(
    old: Manifest, old_pos: NDArray[np.int64], new: Manifest, new_pos: NDArray[np.int64]
) -> NDArray[np.bool_]:
    """Which matched pairs differ in class name or split, compared as codes: each version's
    names are mapped onto the other's once, not compared row by row."""
    differs = np.zeros(len(new_pos), dtype=bool)
    for old_names, old_codes, new_names, new_codes in (
        (
            old.meta.classes,
            old.samples.column("label").to_numpy(),
            new.meta.classes,
            new.samples.column("label").to_numpy(),
        ),
        (*value_codes(old.samples.column("split")), *value_codes(new.samples.column("split"))),
    ):
        index = {name: i for i, name in enumerate(new_names)}
        as_new = np.array([index.get(name, -1) for name in old_names], dtype=np.int64)
        if len(as_new):
            differs |= as_new[old_codes[old_pos]] != new_codes[new_pos]
    return differs


def _same_strings(
    a: pa.ChunkedArray, a_pos: NDArray[np.int64], b: pa.ChunkedArray, b_pos: NDArray[np.int64]
) -> NDArray[np.bool_]:
    """a[a_pos] == b[b_pos] element-wise: as fixed-width bytes when every value of both has
    the same length (hex digests of one algorithm), else by Arrow's string comparison."""
    a_bytes, b_bytes = fixed_width(a), fixed_width(b)
    if a_bytes is not None and b_bytes is not None and a_bytes.dtype == b_bytes.dtype:
        return np.asarray(a_bytes[a_pos] == b_bytes[b_pos], dtype=bool)
    return bool_mask(pc.equal(a.take(pa.array(a_pos)), b.take(pa.array(b_pos))))
