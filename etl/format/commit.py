"""Making a new version: the one way run, repair and compaction publish what they wrote.

Order of durability: shards are on disk (fsynced) before `commit_version` is called; the version
folder is written under a temp name, fsynced and renamed into place, so a reader sees a whole
version or none. A writer killed midway leaves `.tmp-*` files and shards of an uncommitted
version, which `clean_leftovers` removes under the lock before the next write.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from etl.errors import ManifestError
from etl.format.manifest import (
    MANIFEST_FILE,
    RECORDED_FILES,
    REJECTS_FILE,
    REJECTS_SCHEMA,
    SAMPLES_SCHEMA,
    SHARDS_FILE,
    SHARDS_SCHEMA,
    VERSIONS_DIR,
    ManifestMeta,
    table_from_rows,
    version_dir,
    version_name,
)
from etl.format.record import write_record
from etl.format.shards import SHARDS_DIR, ShardInfo, fsync_dir, shard_version


def tool_version() -> str:
    """The etl-memmap release writing a version, as its metadata records it."""
    try:
        return package_version("etl-memmap")
    except PackageNotFoundError:
        return "0+unknown"


def commit_version(
    root: Path,
    meta: ManifestMeta,
    samples: pa.Table,
    rejects: pa.Table,
    new_shards: Sequence[ShardInfo],
    previous_shards: pa.Table | None,
) -> ManifestMeta:
    """Publish `samples` and `rejects` as version `meta.version` of `root`.

    Its shards.arrow lists the `new_shards` and every record of `previous_shards` that a sample
    still points to, so a shard no sample uses leaves the version. The metadata is stamped with
    this tool's version and the time of the commit. Returns the metadata committed.
    """
    meta = replace(
        meta, tool_version=tool_version(), created=datetime.now(UTC).isoformat(timespec="seconds")
    )
    referenced = set(samples.column("shard").unique().to_pylist())
    kept = [] if previous_shards is None else previous_shards.to_pylist()
    records = [r for r in kept if r["shard"] in referenced]
    records += [info.record() for info in new_shards]
    shards = table_from_rows(sorted(records, key=lambda r: r["shard"]), SHARDS_SCHEMA)
    commit(root, meta, samples, shards, rejects)
    return meta


def commit(
    root: Path,
    meta: ManifestMeta,
    samples: pa.Table,
    shards: pa.Table,
    rejects: pa.Table,
) -> Path:
    """Publish a new version atomically: write a temp folder, fsync, rename it into place.

    Shards must already be durable: data first, manifest last.
    """
    versions_dir = root / VERSIONS_DIR
    versions_dir.mkdir(parents=True, exist_ok=True)
    final = version_dir(root, meta.version)
    if final.exists():
        raise ManifestError(f"{final}: version {meta.version} exists already (another writer?)")
    temp = versions_dir / f".tmp-{version_name(meta.version)}-{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()
    try:
        metadata = meta.to_metadata()
        _write_table(temp / MANIFEST_FILE, samples.cast(SAMPLES_SCHEMA.with_metadata(metadata)))
        small_meta = {
            k: v for k, v in metadata.items() if k in (b"etl.version", b"etl.format_version")
        }
        _write_table(temp / SHARDS_FILE, shards.cast(SHARDS_SCHEMA.with_metadata(small_meta)))
        _write_table(temp / REJECTS_FILE, rejects.cast(REJECTS_SCHEMA.with_metadata(small_meta)))
        write_record(temp, meta.version, RECORDED_FILES)
        fsync_dir(temp)
        os.rename(temp, final)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    fsync_dir(versions_dir)
    return final


def _write_table(path: Path, table: pa.Table) -> None:
    with ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def clean_leftovers(root: Path, latest: int) -> list[Path]:
    """Remove temp files and folders, and shards of versions above `latest` (never committed).
    Returns what was removed. Call only under the lock: nothing here belongs to a live writer."""
    removed: list[Path] = []
    for folder in (root / SHARDS_DIR, root / VERSIONS_DIR):
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            written_for = shard_version(entry.name) if folder.name == SHARDS_DIR else None
            if entry.name.startswith(".tmp-") or (written_for or 0) > latest:
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
                removed.append(entry)
    return removed
