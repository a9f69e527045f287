"""A commit record as a store serves it: which files of a version it makes a reader fetch,
and where. It is read before anything it names is trusted, so it may name only plain files of
its own version, each with a size (what each download is capped at).

The hidden folder of a publishing attempt, `versions/.v000005-1f2e3d4c`, is named here too
(NOTE [ publishing to a store ] in `etl.storage.publish`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

from etl.errors import EtlError, ManifestError
from etl.format.coherence import SHARD_FILE, check_shard_name
from etl.format.manifest import SHARDS_FILE, load_table, version_name
from etl.format.record import FILES_AT, RECORD_FILE
from etl.format.shards import SHARDS_DIR

_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def read_record(path: Path, remote: str) -> Any:
    """The commit record downloaded to `path`, as JSON (checked in full when the version is
    opened; here only for the names of the files to fetch)."""
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:  # RecursionError: a record nested without end
        raise ManifestError(f"{remote}: unreadable commit record ({exc})") from None


def files_at(record: Any, version: int, where: str) -> str | None:
    """Where a record published to a store keeps its other files (`FILES_AT`): only the
    hidden folder of its own version's attempt, '.v000005-1f2e3d4c', or None (beside it)."""
    files_at = record.get(FILES_AT) if isinstance(record, dict) else None
    if files_at is None:
        return None
    if not isinstance(files_at, str) or not staging_name_of(files_at) == version:
        raise ManifestError(f"{where}/{RECORD_FILE}: {FILES_AT} is {files_at!r}, not its own")
    return files_at


def staging_name(version: int, writer: str) -> str:
    """The hidden folder beside `versions/vNNNNNN` that holds an attempt's files."""
    return f".{version_name(version)}-{writer}"


_STAGING = re.compile(r"^\.v(\d{6})-[0-9a-f]{8}$")


def staging_name_of(name: str) -> int | None:
    """The version a staging folder's name is for, None for any other name."""
    match = _STAGING.match(name)
    return int(match.group(1)) if match else None


def recorded_files(record: Any, where: str) -> dict[str, int]:
    """The file names a commit record lists, with the sizes it records: plain names only (a
    record naming '../x' or a path is refused before anything is downloaded), each with a
    size that is a whole number of bytes."""
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or not files:
        raise ManifestError(f"{where}/{RECORD_FILE}: lists no files")
    sizes = {}
    for name, entry in files.items():
        if not isinstance(name, str) or not _PLAIN_NAME.fullmatch(name) or name.startswith("."):
            raise ManifestError(f"{where}/{RECORD_FILE}: names {name!r}, not a plain file name")
        size = entry.get("bytes") if isinstance(entry, dict) else None
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ManifestError(f"{where}/{RECORD_FILE}: records no size for {name!r}")
        sizes[name] = size
    return sizes


def changed_shards(cached: Path, fetched: Path, root: Path) -> list[str]:
    """A version re-published in the store (`fetched`, its new files, against the copy
    `cached` in the mirror at `root`): the file names (in the mirror's `shards/`) of the cached
    shards whose checksum changed, for the caller to remove (a cached shard is trusted by its
    name: NOTE [ cache safety ]). Only plain shard names: a name a store wrote into a table
    is never a path here (NOTE [ names from a store ] in etl.storage.store)."""
    if not (cached / SHARDS_FILE).is_file():
        return []
    try:
        before, after = (_checksums(folder / SHARDS_FILE) for folder in (cached, fetched))
    except (EtlError, OSError, KeyError, TypeError):  # cannot tell which: none is trusted
        return [p.name for p in (root / SHARDS_DIR).glob("*.npy") if SHARD_FILE.fullmatch(p.name)]
    return [
        check_shard_name(name, cached)
        for name, checksum in before.items()
        if after.get(name) != checksum and _plain(name)
    ]


def check_shard_names(fetched: Path, where: str) -> None:
    """ManifestError unless every shard the fetched shards table names is 'shards/<plain
    name>.npy': checked before the copy replaces the mirror's."""
    if (fetched / SHARDS_FILE).is_file():
        for name in load_table(fetched / SHARDS_FILE).column("shard").to_pylist():
            check_shard_name(name, f"{where}/{SHARDS_FILE}")


def remove_shard_files(root: Path, files: list[str]) -> None:
    """Remove the mirror's shard files of these plain names: through the mirror's own
    `shards/` folder (opened without following a link), by file name, so whatever a name
    says nothing outside it is removed (a link there is removed, not what it points at)."""
    if not files:
        return
    try:
        folder = os.open(root / SHARDS_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    try:
        for file in files:
            if SHARD_FILE.fullmatch(file):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(file, dir_fd=folder)
    finally:
        os.close(folder)


def _plain(name: object) -> bool:
    try:
        check_shard_name(name, "")
    except ManifestError:
        return False
    return True


def _checksums(path: Path) -> dict[str, str]:
    """shard -> checksum of a version's shards table."""
    table = load_table(path)
    names, sums = table.column("shard").to_pylist(), table.column("checksum").to_pylist()
    return dict(zip(names, sums, strict=True))
