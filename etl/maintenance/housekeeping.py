"""Removing what no version needs: leftovers of killed runs, sparse shards, retired versions.

Everything here runs under the dataset lock and in an order that keeps every step safe to kill:
new data is committed before anything is deleted, a version folder is renamed out of sight
before it is removed, and a shard is deleted only when no remaining version names it. A rerun
after a kill finishes the job.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.errors import ManifestError, ShardError
from etl.format.atomic import replacing
from etl.format.coherence import ENCODED_COLUMNS, RAGGED_COLUMNS
from etl.format.commit import clean_leftovers, commit_version, remove_version
from etl.format.flat import encoding_of, place_of, stored_bytes
from etl.format.lock import DatasetLock
from etl.format.manifest import (
    VERSIONS_DIR,
    Manifest,
    list_versions,
    read_manifest,
    resolve,
)
from etl.format.retirement import (
    GRACE,
    RETIRED_DIR,
    Retirement,
    record_name,
    retired_versions,
)
from etl.format.shards import (
    SHARDS_DIR,
    ShardInfo,
    ShardWriter,
    open_shard,
    shard_name,
    shard_version,
)


def referenced_shards(root: Path, versions: Iterable[int]) -> set[str]:
    names: set[str] = set()
    for number in versions:
        names.update(read_manifest(root, number).shards.column("shard").to_pylist())
    return names


@dataclass
class CompactReport:
    kept_versions: list[int]
    deleted_versions: list[int] = field(default_factory=list)
    rewritten_shards: list[str] = field(default_factory=list)
    new_version: int | None = None
    deleted_shards: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    dry_run: bool = False
    retired_versions: list[int] = field(default_factory=list)
    """Versions retired and within their grace period: unlisted, whole, their files kept
    (NOTE [ a grace period ])."""


def sparse_shards(manifest: Manifest, min_dead_fraction: float) -> list[str]:
    """Shards of this version whose dead rows (no sample of this version) are at least the
    given fraction of the file."""
    live = manifest.samples.group_by("shard").aggregate([("row", "count")])
    live_rows = dict(
        zip(live.column("shard").to_pylist(), live.column("row_count").to_pylist(), strict=True)
    )
    out = []
    for name, rows in zip(
        manifest.shards.column("shard").to_pylist(),
        manifest.shards.column("rows").to_pylist(),
        strict=True,
    ):
        dead = rows - live_rows.get(name, 0)
        if rows and dead / rows >= min_dead_fraction:
            out.append(name)
    return out


def retention(
    versions: list[int], keep_last: int, keep: Iterable[int], rewrites: bool
) -> tuple[int | None, set[int]]:
    """(the compacted version to write, None if nothing is rewritten; the versions to keep):
    the last `keep_last` versions, counting the compacted one, and every version of `keep`.
    ManifestError for a policy that would keep nothing or names unknown versions."""
    if keep_last < 1:
        raise ManifestError("--keep-last must be at least 1: the latest version is always kept")
    unknown = sorted(set(keep) - set(versions))
    if unknown:
        raise ManifestError(f"--keep names versions that do not exist: {unknown}")
    new_version = versions[-1] + 1 if rewrites else None
    timeline = [*versions, new_version] if new_version else versions
    return new_version, set(timeline[-keep_last:]) | set(keep)


def check_min_dead(min_dead_fraction: float) -> None:
    if not 0.0 < min_dead_fraction <= 1.0:
        raise ManifestError("--min-dead must be in (0, 1]")


def plan_compaction(
    where: Path | str,
    versions: list[int],
    latest: Manifest,
    keep_last: int,
    keep: Iterable[int],
    min_dead_fraction: float,
    dry_run: bool,
) -> CompactReport:
    """What compacting the dataset at `where` (its `versions`, the `latest` one's manifest)
    rewrites, keeps and retires; the shards to delete are for the caller to list."""
    sparse = sparse_shards(latest, min_dead_fraction)
    try:
        new_version, kept = retention(versions, keep_last, keep, bool(sparse))
    except ManifestError as exc:
        raise ManifestError(f"{where}: {exc}") from None
    return CompactReport(
        kept_versions=sorted(kept),
        deleted_versions=[v for v in versions if v not in kept],
        rewritten_shards=sparse,
        new_version=new_version,
        dry_run=dry_run,
    )


def still_named_by_rewrite(latest: Manifest, sparse: list[str]) -> set[str]:
    """The shards a compacted version of `latest` would name that exist already (a dry run
    writes none)."""
    return set(latest.shards.column("shard").to_pylist()) - set(sparse)


def rewrite(manifest: Manifest, sparse: list[str], version: int, writer: str = "") -> Manifest:
    """Copy the live rows of `sparse` shards into new shards (tagged `writer`, see
    `shard_name`) and commit them as `version`; verify each row on the way so corruption is
    never copied forward."""
    meta = manifest.meta
    samples = manifest.samples
    moving = samples.filter(pc.is_in(samples.column("shard"), value_set=pa.array(sparse)))
    moving = moving.sort_by([("shard", "ascending"), ("row", "ascending")])
    per_shard = int(pc.max(manifest.shards.column("rows")).as_py() or 1)
    rows_by_shard = dict(
        zip(
            manifest.shards.column("shard").to_pylist(),
            manifest.shards.column("rows").to_pylist(),
            strict=True,
        )
    )
    relocated: dict[str, tuple[str, int, int | None]] = {}
    new_shards: list[ShardInfo] = []
    kept = ["sample_id", "shard", "row", "checksum", *RAGGED_COLUMNS, *ENCODED_COLUMNS]
    records = moving.select([c for c in kept if c in moving.column_names]).to_pylist()
    for start in range(0, len(records), per_shard):
        chunk = records[start : start + per_shard]
        name = shard_name(version, start // per_shard, writer)
        with ShardWriter(manifest.root, name, len(chunk), meta.stored_shape, meta.checksum) as w:
            opened: dict[str, np.memmap] = {}
            for rec in chunk:
                source = opened.get(rec["shard"])
                if source is None:
                    source = open_shard(
                        manifest.root / rec["shard"], meta.stored_shape, rows_by_shard[rec["shard"]]
                    )
                    opened[rec["shard"]] = source
                place = place_of(rec) if meta.ragged else None
                try:
                    pixels = stored_bytes(
                        source, rec["row"], place, meta.sample_shape, meta.layout, encoding_of(rec)
                    )
                except ValueError as exc:
                    raise ShardError(f"{manifest.root / rec['shard']}: {exc}") from None
                row, checksum = w.append(np.asarray(pixels))
                if checksum != rec["checksum"]:
                    raise ShardError(
                        f"{manifest.root / rec['shard']}: row {rec['row']} does not match its "
                        "checksum; run 'etl audit --repair' before compacting"
                    )
                relocated[rec["sample_id"]] = (name, row, w.placed[row][0] if meta.ragged else None)
            info = w.finish()
        assert info is not None
        new_shards.append(info)
    rows = samples.to_pylist()
    for row in rows:
        if row["sample_id"] in relocated:
            row["shard"], row["row"], moved_to = relocated[row["sample_id"]]
            if moved_to is not None:
                row["sample_offset"] = moved_to
    new_samples = pa.Table.from_pylist(rows, schema=samples.schema)
    meta = replace(manifest.meta, version=version)
    commit_version(manifest.root, meta, new_samples, manifest.rejects, new_shards, manifest.shards)
    return read_manifest(manifest.root, version)


def retire(
    report: CompactReport, retired: dict[int, Retirement], grace: float
) -> tuple[list[Retirement], list[int]]:
    """The versions `report`'s policy retires, split by `grace` (NOTE [ a grace period ]):
    (records to write now, versions whose files go now: those retired earlier whose grace is
    over, and with `grace` 0 those retired now). Sets `report.deleted_versions` to the latter
    and `report.retired_versions` to the versions left waiting."""
    going = report.deleted_versions
    due = sorted(v for v, r in retired.items() if r.due())
    waiting = sorted(v for v, r in retired.items() if not r.due())
    records = [Retirement.now(v, grace) for v in going] if grace > 0 else []
    report.deleted_versions = sorted(set(due) | (set() if records else set(going)))
    report.retired_versions = sorted(set(waiting) | {r.version for r in records})
    return records, report.deleted_versions


def compact(
    path: Path,
    keep_last: int = 1,
    keep: Iterable[int] = (),
    min_dead_fraction: float = 0.5,
    dry_run: bool = False,
    grace: float = GRACE,
) -> CompactReport:
    """Rewrite the latest version's shards that are at least `min_dead_fraction` dead rows (as a
    new version with the same samples and bytes), then retire versions outside the retention
    policy (the last `keep_last` versions, counting a new compacted one, plus every version in
    `keep`): their files, and every shard no other version references, go once `grace`
    seconds have passed, at a later compaction (at once with 0)."""
    check_min_dead(min_dead_fraction)
    root, _ = resolve(path)
    with DatasetLock(root):
        versions = list_versions(root)
        latest = versions[-1]
        manifest = read_manifest(root, latest)
        report = plan_compaction(
            root, versions, manifest, keep_last, keep, min_dead_fraction, dry_run
        )
        records, removed = retire(report, retired_versions(root / VERSIONS_DIR), grace)
        new_version, sparse = report.new_version, report.rewritten_shards
        if not dry_run:
            clean_leftovers(root, latest)
        if new_version and not dry_run:
            rewrite(manifest, sparse, new_version)
        existing_kept = set(report.kept_versions) & set(list_versions(root))
        still_referenced = referenced_shards(root, existing_kept | set(report.retired_versions))
        if new_version and dry_run:
            still_referenced |= still_named_by_rewrite(manifest, sparse)
        if not dry_run:
            for record in records:
                (root / VERSIONS_DIR / RETIRED_DIR).mkdir(exist_ok=True)
                with replacing(root / VERSIONS_DIR / record_name(record.version)) as tmp:
                    tmp.write_bytes(record.to_bytes())
            for number in removed:
                remove_version(root, number)
        # Shards are listed from disk, so a shard orphaned by an earlier killed compaction
        # is collected too.
        for entry in sorted((root / SHARDS_DIR).glob("*.npy")):
            name = f"{SHARDS_DIR}/{entry.name}"
            if name not in still_referenced and shard_version(entry.name) is not None:
                report.deleted_shards.append(name)
                report.freed_bytes += entry.stat().st_size
                if not dry_run:
                    entry.unlink()
        return report
