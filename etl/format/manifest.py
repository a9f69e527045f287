"""The manifest: Arrow IPC files that say which sample lives where, one folder per version.

Layout of a dataset directory (see docs/FORMAT.md):

    shards/v000001-00000.npy ...        immutable pixel shards
    versions/v000001/manifest.arrow     one row per packed sample
    versions/v000001/shards.arrow       one row per shard this version references
    versions/v000001/rejects.arrow      one row per source file that was not packed
    versions/v000001/commit.json        size and BLAKE3 of the three files above (etl.format.record)

The latest version is the highest-numbered folder; `etl.format.commit` writes one. This module
imports neither PIL nor joblib: the loaders read datasets through it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from numpy.typing import NDArray

from etl.errors import ManifestError
from etl.format.coherence import CHECK_ROWS, check_coherent
from etl.format.mapped import Mapped
from etl.format.record import RECORD_FILE, check_record
from etl.format.retirement import retired_versions
from etl.format.schema import (
    ADDED_COLUMNS,
    FORMAT_VERSIONS,
    REJECTS_SCHEMA,
    SHARDS_SCHEMA,
    ManifestMeta,
)
from etl.format.table_ops import positions_in

VERSIONS_DIR = "versions"
MANIFEST_FILE = "manifest.arrow"
SHARDS_FILE = "shards.arrow"
REJECTS_FILE = "rejects.arrow"
RECORDED_FILES = (MANIFEST_FILE, SHARDS_FILE, REJECTS_FILE)
RECORDS_SINCE = (0, 2)
"""The first tool version whose commits write commit.json; an older version's manifest is read
without one (audit notes it)."""
_VERSION_DIR = re.compile(r"^v(\d{6})$")


@dataclass(frozen=True)
class Manifest:
    """One committed version of a dataset: metadata plus three Arrow tables."""

    root: Path
    meta: ManifestMeta
    samples: pa.Table
    shards: pa.Table
    rejects: pa.Table
    maps: tuple[Mapped, ...] = field(default=(), repr=False, compare=False)
    """The maps `samples` and `rejects` were read through, when read from disk."""

    @property
    def version(self) -> int:
        return self.meta.version

    def release_pages(self) -> None:
        """Let go of the manifest pages read so far (`Mapped.release`): a pass over a version
        larger than memory calls this as it goes."""
        for mapped in self.maps:
            mapped.release()

    @property
    def path(self) -> Path:
        return version_dir(self.root, self.meta.version) / MANIFEST_FILE

    def shard_path(self, name: str) -> Path:
        return self.root / name

    @cached_property
    def shard_index(self) -> NDArray[np.int32]:
        """Each sample's position in `shards` (-1 for a shard not listed there), found once for
        every selection (a slice at a time, its pages let go of: see `CHECK_ROWS`)."""
        column, names = self.samples.column("shard"), self.shards.column("shard")
        index = np.empty(len(column), dtype=np.int32)
        for start in range(0, len(column), CHECK_ROWS):
            index[start : start + CHECK_ROWS] = positions_in(column.slice(start, CHECK_ROWS), names)
            self.release_pages()
        return index


def version_name(version: int) -> str:
    """A version's folder name: 'v000003'."""
    return f"v{version:06d}"


def version_number(folder_name: str) -> int | None:
    """The version a folder name stands for ('v000003' -> 3), None for any other name."""
    match = _VERSION_DIR.match(folder_name)
    return int(match.group(1)) if match else None


def version_dir(root: Path, version: int) -> Path:
    return root / VERSIONS_DIR / version_name(version)


def list_versions(root: Path, retired: bool = False) -> list[int]:
    """Committed versions, oldest first. Temp folders of interrupted commits are not versions,
    nor are versions a compaction retired (NOTE [ a grace period ]) unless `retired`."""
    versions_dir = root / VERSIONS_DIR
    if not versions_dir.is_dir():
        return []
    hidden = set() if retired else set(retired_versions(versions_dir))
    found = []
    for entry in versions_dir.iterdir():
        number = version_number(entry.name)
        if number is not None and number not in hidden and (entry / MANIFEST_FILE).is_file():
            found.append(number)
    return sorted(found)


def load_table(path: Path) -> pa.Table:
    """Read an Arrow IPC file and validate every buffer (offsets, UTF-8) before any value is
    looked at: the audit's strict read, for which a damaged file is a finding, not a crash."""
    try:
        with ipc.open_file(path) as reader:
            table = reader.read_all()
        table.validate(full=True)
    except FileNotFoundError:
        raise ManifestError(f"{path}: missing") from None
    except Exception as exc:  # NOTE [ damaged Arrow files ]
        raise ManifestError(f"{path}: not a valid Arrow IPC file ({_named(exc)})") from None
    return table


def _named(exc: Exception) -> str:
    """What went wrong reading a file, on one line.

    NOTE [ damaged Arrow files ]: pyarrow turns a damaged IPC file into ArrowInvalid mostly,
    but not only: a schema's field name that is no longer UTF-8 raised UnicodeDecodeError
    from `validate` itself (found by tests/format/test_format_fuzz.py). Only the file's bytes are
    read in these few calls, so every exception there is the file's damage: caught as a
    class, named, and turned into the file's ManifestError.
    """
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def refuse_other_format(manifest_path: Path) -> None:
    """Another format version is not damage: this tool cannot judge it (exit 2). Metadata that
    cannot be read at all is left to the caller's reader."""
    try:
        with ipc.open_file(manifest_path) as reader:
            metadata = reader.schema.metadata or {}
        found = json.loads(metadata[b"etl.format_version"])
    except (OSError, pa.ArrowException, KeyError, ValueError):
        return
    if isinstance(found, int) and found not in FORMAT_VERSIONS:
        raise ManifestError(
            f"{manifest_path}: manifest format version {found}, this tool reads "
            f"{' and '.join(map(str, FORMAT_VERSIONS))}; audit it with a matching etl-memmap"
        )


def _read_table(
    path: Path,
    schema: pa.Schema | Callable[[Mapping[bytes, bytes]], pa.Schema],
    validate: bool = False,
) -> tuple[pa.Table, Mapping[bytes, bytes], Mapped]:
    """The table of an Arrow IPC file, memory-mapped, its schema metadata and its map. The
    table has `schema`'s columns (or those `schema` makes of the file's metadata).

    `validate` checks every buffer (offsets, lengths, UTF-8) before any value is used: for a
    file that no commit record vouches for, as a damaged IPC file can point a reader's
    buffers anywhere (pyarrow then reads out of bounds: a SIGSEGV, not an exception).

    Mapped, not read: a column's pages are read from the page cache only when a value of it is
    used, so opening a 10M-row manifest to select by split and class touches those columns
    alone (the buffers keep the mapping alive). Versions are immutable, so nothing rewrites a
    mapped file in place."""
    try:
        mapped = Mapped(path)
        table, metadata = mapped.table, mapped.reader.schema.metadata or {}
        if validate:
            table.validate(full=True)
            mapped.release()
    except FileNotFoundError:
        raise ManifestError(f"{path}: missing") from None
    except Exception as exc:  # NOTE [ damaged Arrow files ]; ValueError: an empty file
        raise ManifestError(f"{path}: not a readable Arrow IPC file ({_named(exc)})") from None
    if not isinstance(schema, pa.Schema):
        schema = schema(metadata)
    missing = [f.name for f in schema if f.name not in table.schema.names]
    required = [name for name in missing if name not in ADDED_COLUMNS]
    if required:
        raise ManifestError(f"{path}: missing columns {required}")
    columns = []
    for f in schema:
        if f.name in missing:
            columns.append(pa.nulls(table.num_rows, f.type))
            continue
        column = table.column(f.name)
        try:
            columns.append(column if column.type == f.type else column.cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
            raise ManifestError(
                f"{path}: column {f.name!r} is {column.type}, the format says {f.type}"
            ) from None
        if not f.nullable and column.null_count:
            first = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise ManifestError(f"{path}: column {f.name!r} is empty (null) at row {first}")
    if table.schema.remove_metadata().equals(schema):
        # NOTE: not rebuilt: `from_arrays` validates each chunk, a page touched per chunk
        # and column, and a page brings in a whole folio (`Mapped`): +500 MB for 4M rows
        return table.replace_schema_metadata(schema.metadata), metadata, mapped
    table = pa.Table.from_arrays(columns, schema=schema)  # a version from before ADDED_COLUMNS
    mapped.release()
    return table, metadata, mapped


def resolve(path: Path, version: int | None = None) -> tuple[Path, int]:
    """Accept a dataset dir, a version dir or a manifest.arrow file -> (dataset root, version)."""
    if version is not None:
        if isinstance(version, bool) or not isinstance(version, int | np.integer):
            raise TypeError(f"version must be an int (e.g. version=1), got {version!r}")
        version = int(version)
    path = Path(path)
    if path.is_file() and path.name == MANIFEST_FILE:
        path = path.parent
    pinned = version_number(path.name)
    if pinned is not None and path.parent.name == VERSIONS_DIR:
        if version is not None and version != pinned:
            raise ManifestError(f"{path}: is version {pinned}, but version {version} was asked")
        return path.parent.parent, pinned
    if not path.is_dir():
        raise ManifestError(f"{path}: no such dataset directory or manifest file")
    versions = list_versions(path)
    if version is not None and version in list_versions(path, retired=True):
        return path, version  # a retired one too, while its files stay (NOTE [ a grace period ])
    if not versions:
        raise ManifestError(f"{path}: no manifest version found (run 'etl run' first)")
    if version is None:
        return path, versions[-1]
    raise ManifestError(f"{path}: no version {version}; versions are {versions}")


def record_problems(folder: Path, version: int) -> list[str]:
    """What `commit.json` says changed in a version folder (see `etl.format.record`); nothing for a
    version committed before records existed."""
    if not (folder / RECORD_FILE).exists() and _written_before_records(folder / MANIFEST_FILE):
        return []
    return check_record(folder, version, RECORDED_FILES)


def _written_before_records(manifest_path: Path) -> bool:
    try:
        with ipc.open_file(manifest_path) as reader:
            found = json.loads((reader.schema.metadata or {})[b"etl.tool_version"])
        release = tuple(int(part) for part in found.split(".")[:2])
    except (OSError, pa.ArrowException, KeyError, ValueError, AttributeError):
        return False
    return release < RECORDS_SINCE


def read_manifest(path: Path | str, version: int | None = None, verify: bool = True) -> Manifest:
    """Open a committed version (the latest unless `version` is given) and check it is coherent.

    `verify` (default) first checks the version's files against its commit record, so a byte
    changed since the commit is refused before any value is trusted; False skips that check
    (reading a damaged dataset on purpose; `etl audit` says what changed).
    """
    root, number = resolve(Path(path), version)
    folder = version_dir(root, number)
    manifest_path = folder / MANIFEST_FILE
    vouched = verify and (folder / RECORD_FILE).exists()
    if verify and (problems := record_problems(folder, number)):
        raise ManifestError(
            f"{root / problems[0]}; run 'etl audit {root}' to see every damaged file "
            "(in Python, verify_manifest=False reads the version anyway)"
        )
    # NOTE: files the commit record vouches for were written by this tool and are unchanged;
    # any other (read on purpose while damaged, or from before records) is validated whole.
    samples, metadata, samples_map = _read_table(
        manifest_path,
        lambda found: ManifestMeta.from_metadata(found, manifest_path).samples_schema,
        not vouched,
    )
    meta = ManifestMeta.from_metadata(metadata, manifest_path)
    if meta.version != number:
        raise ManifestError(
            f"{manifest_path}: says version {meta.version}, lives in {version_name(number)}"
        )
    shards, _, _ = _read_table(folder / SHARDS_FILE, SHARDS_SCHEMA, not vouched)
    rejects, _, rejects_map = _read_table(folder / REJECTS_FILE, REJECTS_SCHEMA, not vouched)
    manifest = Manifest(
        root=root,
        meta=meta,
        samples=samples,
        shards=shards,
        rejects=rejects,
        maps=(samples_map, rejects_map),
    )
    check_coherent(manifest_path, manifest)
    return manifest


def table_from_rows(rows: Sequence[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows (dicts) as a table of `schema`; a nullable column added to the format after the
    rows' writer knew it (ADDED_COLUMNS: format versions 2 and 3's) may be absent: null."""
    table = pa.Table.from_pylist(list(rows), schema=_present(rows, schema))
    for index, column in enumerate(schema):
        if column.name not in table.column_names:
            table = table.add_column(index, column, pa.nulls(table.num_rows, column.type))
    return table


def _present(rows: Sequence[Mapping[str, Any]], schema: pa.Schema) -> pa.Schema:
    """`schema` without the ADDED_COLUMNS that no row has (as a key)."""
    absent = {
        name for name in ADDED_COLUMNS if name in schema.names and not any(name in r for r in rows)
    }
    return pa.schema([f for f in schema if f.name not in absent])
