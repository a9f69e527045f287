"""Making a new version: the one way run, repair and compaction publish what they wrote.

Order of durability: shards are on disk (fsynced) before `commit_version` is called; the version
folder is written under a temp name, fsynced and renamed into place, so a reader sees a whole
version or none. A writer killed midway leaves `.tmp-*` files and shards of an uncommitted
version, which `clean_leftovers` removes under the lock before the next write.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from typing import TypeAlias

import pyarrow as pa
import pyarrow.ipc as ipc

from etl.errors import ManifestError, redacted
from etl.format.manifest import (
    MANIFEST_FILE,
    RECORDED_FILES,
    REJECTS_FILE,
    SHARDS_FILE,
    VERSIONS_DIR,
    list_versions,
    load_table,
    table_from_rows,
    version_dir,
    version_name,
)
from etl.format.record import write_record
from etl.format.retirement import record_name, retired_versions
from etl.format.schema import REJECTS_SCHEMA, SHARDS_SCHEMA, ManifestMeta
from etl.format.shards import SHARDS_DIR, ShardInfo, fsync_dir, shard_version
from etl.format.table_ops import rebatched


def tool_version() -> str:
    """The etl-memmap release writing a version, as its metadata records it."""
    try:
        return package_version("etl-memmap")
    except PackageNotFoundError:
        return "0+unknown"


INVOKED_AS: list[str] | None = None
"""The command this process runs, set by the `etl` command line (`etl.cli.main`): the command
a version committed by it records, whether it came from a shell or `main([...])`."""


def command_line() -> str:
    """This process's command line as a shell would take it back (`etl run pipeline.yaml`):
    what a version's metadata says made it. INVOKED_AS where the `etl` command set it, else
    `sys.argv`; the program is named by its file name alone, and `python -m pkg` as such, so
    no home folder or virtual environment's path is recorded, and no secret it was given
    (`etl.errors.redacted`: a URL's user info and tokens, a `--secret`'s value)."""
    return redacted(_command_line())


def _command_line() -> str:
    args = list(INVOKED_AS or sys.argv)
    if not args:
        return ""
    program = Path(args[0]).name
    if program == "__main__.py":
        program = f"python -m {Path(args[0]).parent.name}"
        return " ".join([program, shlex.join(args[1:])]).strip()
    return shlex.join([program, *args[1:]])


Rows: TypeAlias = "pa.Table | Iterable[pa.Table | pa.RecordBatch]"
"""A table's rows: the table, or its pieces in order (written as they come, never all held)."""


def commit_version(
    root: Path,
    meta: ManifestMeta,
    samples: Rows,
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
        meta,
        tool_version=tool_version(),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        command=command_line(),
    )

    def shards_used(referenced: set[str]) -> pa.Table:
        kept = [] if previous_shards is None else previous_shards.to_pylist()
        records = [r for r in kept if r["shard"] in referenced]
        records += [info.record() for info in new_shards]
        return table_from_rows(sorted(records, key=lambda r: r["shard"]), SHARDS_SCHEMA)

    _publish(root, meta, samples, shards_used, rejects)
    return meta


def commit(
    root: Path,
    meta: ManifestMeta,
    samples: Rows,
    shards: pa.Table,
    rejects: pa.Table,
) -> Path:
    """Publish a new version atomically: write a temp folder, fsync, rename it into place.

    Shards must already be durable: data first, manifest last.
    """
    return _publish(root, meta, samples, lambda _: shards, rejects)


def _publish(
    root: Path,
    meta: ManifestMeta,
    samples: Rows,
    shards_for: Callable[[set[str]], pa.Table],
    rejects: pa.Table,
) -> Path:
    """`commit`, with the shards table made from the names of the shards the samples use
    (known once every piece of `samples` is written)."""
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
        used: set[str] = set()
        _write_rows(
            temp / MANIFEST_FILE,
            meta.file_schema.with_metadata(metadata),
            samples,
            lambda piece: used.update(piece.column("shard").unique().to_pylist()),
        )
        small_meta = {
            k: v for k, v in metadata.items() if k in (b"etl.version", b"etl.format_version")
        }
        _write_rows(temp / SHARDS_FILE, SHARDS_SCHEMA.with_metadata(small_meta), shards_for(used))
        _write_rows(temp / REJECTS_FILE, REJECTS_SCHEMA.with_metadata(small_meta), rejects)
        write_record(temp, meta.version, RECORDED_FILES)
        fsync_dir(temp)
        os.rename(temp, final)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    fsync_dir(versions_dir)
    return final


def _write_rows(
    path: Path,
    schema: pa.Schema,
    rows: Rows,
    written: Callable[[pa.Table], object] = lambda piece: None,
) -> None:
    """Write `rows` as the Arrow file at `path` (fsynced), in record batches of
    FILE_BATCH_ROWS (`rebatched`); `written` is called with each batch as it was written."""
    pieces = [rows] if isinstance(rows, pa.Table) else rows
    tables = (p if isinstance(p, pa.Table) else pa.Table.from_batches([p]) for p in pieces)
    with ipc.new_file(str(path), schema) as writer:
        for batch in rebatched(table.select(schema.names).cast(schema) for table in tables):
            writer.write_table(batch)
            written(batch)
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


def remove_version(root: Path, number: int) -> None:
    """Remove version `number`'s folder (renamed away first: a reader never sees half of it),
    then its retirement record if it has one. Its shards are the caller's to judge."""
    folder = version_dir(root, number)
    if folder.is_dir():
        doomed = folder.with_name(f".tmp-deleted-{folder.name}")
        folder.rename(doomed)
        shutil.rmtree(doomed)
    (root / VERSIONS_DIR / record_name(number)).unlink(missing_ok=True)


def remove_due_retirements(root: Path) -> list[int]:
    """NOTE [ a grace period ]: the retired versions of the dataset at `root` whose grace is
    over, removed (each folder, then its record), then every shard that no remaining version,
    listed or still waiting, names and that was written for a version no later than the
    latest. Returns the versions removed. Call only under the lock (a run or a compaction)."""
    retired = retired_versions(root / VERSIONS_DIR)
    due = sorted(number for number, record in retired.items() if record.due())
    for number in due:
        remove_version(root, number)
    if not due:
        return due
    remaining = list_versions(root, retired=True)
    named: set[str] = set()
    try:
        for number in remaining:
            shards = load_table(version_dir(root, number) / SHARDS_FILE)
            named.update(shards.column("shard").to_pylist())
    except (ManifestError, KeyError):
        return due  # a shards table cannot be read: no shard goes on a guess (the audit names it)
    latest = max(remaining, default=0)
    for entry in sorted((root / SHARDS_DIR).glob("*.npy")):
        written_for = shard_version(entry.name)
        unnamed = f"{SHARDS_DIR}/{entry.name}" not in named
        if written_for is not None and written_for <= latest and unnamed:
            entry.unlink(missing_ok=True)
    return due
