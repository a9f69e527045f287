"""Read-only views over a dataset's history: what each version holds and how two versions differ."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from etl.format.manifest import list_versions, read_manifest, resolve


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
    """Samples keyed by sample_id (one per source path)."""

    a: int
    b: int
    added: pa.Table
    """Rows of version b whose sample_id is not in a."""
    removed: pa.Table
    """Rows of version a whose sample_id is not in b."""
    changed: pa.Table
    """sample_id, source and what differs: checksum (pixels), label or split, old and new."""


_COMPARED = ("checksum", "class_name", "split")


def diff(root: Path, a: int, b: int) -> VersionDiff:
    """What changed between two versions, by sample id: pixels (checksum), class or split."""
    old = read_manifest(root, a).samples
    new = read_manifest(root, b).samples
    old_ids = old.column("sample_id")
    new_ids = new.column("sample_id")
    added = new.filter(pc.invert(pc.is_in(new_ids, value_set=old_ids)))
    removed = old.filter(pc.invert(pc.is_in(old_ids, value_set=new_ids)))
    keep = ["sample_id", "source", *_COMPARED]
    joined = old.select(keep).join(
        new.select(keep),
        keys=["sample_id", "source"],
        join_type="inner",
        left_suffix="_old",
        right_suffix="_new",
    )
    differs = None
    for column in _COMPARED:
        mask = pc.not_equal(joined.column(f"{column}_old"), joined.column(f"{column}_new"))
        differs = mask if differs is None else pc.or_(differs, mask)
    changed = joined.filter(differs) if differs is not None else joined.slice(0, 0)
    return VersionDiff(
        a=a,
        b=b,
        added=added.sort_by("source"),
        removed=removed.sort_by("source"),
        changed=changed.sort_by("source"),
    )
