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
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from numpy.typing import NDArray

from etl.errors import ManifestError
from etl.format.coherence import CHECK_ROWS, RAGGED_COLUMNS, check_coherent
from etl.format.columns import positions_in
from etl.format.mapped import Mapped
from etl.format.record import RECORD_FILE, check_record

FORMAT_VERSION = 1
"""Bumped on any change a reader of an older version would misread; checked on every open."""
RAGGED_FORMAT_VERSION = 2
"""The format of samples that keep their aspect ratio (`etl.format.ragged`): each shard one
flat uint8 array, each sample's place and size in its manifest row. A reader of version 1
refuses it; fixed-size datasets stay version 1."""
FORMAT_VERSIONS = (FORMAT_VERSION, RAGGED_FORMAT_VERSION)

VERSIONS_DIR = "versions"
MANIFEST_FILE = "manifest.arrow"
SHARDS_FILE = "shards.arrow"
REJECTS_FILE = "rejects.arrow"
RECORDED_FILES = (MANIFEST_FILE, SHARDS_FILE, REJECTS_FILE)
RECORDS_SINCE = (0, 2)
"""The first tool version whose commits write commit.json; an older version's manifest is read
without one (audit notes it)."""
_VERSION_DIR = re.compile(r"^v(\d{6})$")
SAMPLES_SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("source_size", pa.int64(), nullable=False),
        pa.field("source_mtime_ns", pa.int64(), nullable=False),
        pa.field("source_ctime_ns", pa.int64()),
        pa.field("source_inode", pa.uint64()),
        pa.field("source_hash", pa.string(), nullable=False),
        pa.field("source_height", pa.int32(), nullable=False),
        pa.field("source_width", pa.int32(), nullable=False),
        pa.field("label", pa.int32(), nullable=False),
        pa.field("class_name", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("shard", pa.string(), nullable=False),
        pa.field("row", pa.int64(), nullable=False),
        pa.field("checksum", pa.string(), nullable=False),
        pa.field("sample_offset", pa.int64()),
        pa.field("sample_height", pa.int32()),
        pa.field("sample_width", pa.int32()),
    ]
)
"""NOTE: `sample_*` say where a sample that keeps its aspect ratio is (format version 2: byte
offset in its shard's data, stored height and width); null in a fixed-size dataset."""

SHARDS_SCHEMA = pa.schema(
    [
        pa.field("shard", pa.string(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("checksum", pa.string(), nullable=False),
        pa.field("blake3", pa.string(), nullable=False),
    ]
)

REJECTS_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("message", pa.string(), nullable=False),
        pa.field("source_size", pa.int64()),
        pa.field("source_mtime_ns", pa.int64()),
        pa.field("source_ctime_ns", pa.int64()),
        pa.field("source_inode", pa.uint64()),
        pa.field("source_hash", pa.string()),
    ]
)

ADDED_COLUMNS = frozenset({"source_ctime_ns", "source_inode", *RAGGED_COLUMNS})
"""Nullable columns added after format version 1 was defined (etl-memmap 0.2.0; `sample_*`
with format version 2): a manifest without them reads them as nulls (its files are hashed
once again on the next run)."""


SPLIT_ORDER = ("train", "val", "test")
"""Splits are listed in this order, then any others by name."""


def ordered_splits(splits: Sequence[str]) -> list[str]:
    known = [s for s in SPLIT_ORDER if s in splits]
    return known + sorted(set(splits) - set(known))


@dataclass(frozen=True)
class ManifestMeta:
    """Schema metadata of manifest.arrow (stored as `etl.<name>` keys, JSON values)."""

    version: int
    sample_shape: tuple[int, ...]
    layout: str
    classes: tuple[str, ...]
    checksum: str
    config_digest: str
    config: Mapping[str, Any]
    tool_version: str = ""
    """The etl-memmap release that committed it (stamped by `etl.format.commit`)."""
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    dtype: str = "uint8"
    format_version: int = FORMAT_VERSION
    columns: tuple[tuple[str, str], ...] = ()
    """The per-sample columns after SAMPLES_SCHEMA's, as (name, type as a config writes it):
    what `columns:` declared when it was committed. A reader that predates them reads the
    version without them (`_read_table` keeps the columns it knows)."""

    @property
    def column_fields(self) -> tuple[pa.Field, ...]:
        from etl.format.sample_columns import parse_type

        return tuple(pa.field(name, parse_type(text)) for name, text in self.columns)

    @property
    def samples_schema(self) -> pa.Schema:
        """The schema of this version's samples table: SAMPLES_SCHEMA, then its columns."""
        return samples_schema(self.column_fields)

    @property
    def file_schema(self) -> pa.Schema:
        """The schema its manifest.arrow is written with: `samples_schema`, less the columns
        of format version 2 in a version of fixed-size samples (format version 1 files stay as
        they were; they read back as nulls)."""
        schema = self.samples_schema
        if self.ragged:
            return schema
        return pa.schema([f for f in schema if f.name not in RAGGED_COLUMNS])

    @property
    def ragged(self) -> bool:
        """Whether each sample has its own height and width (format version 2)."""
        return self.format_version == RAGGED_FORMAT_VERSION

    def _checked_shape(self) -> ManifestMeta:
        """ValueError unless the sample shape is what the format version says: three sides
        (a layout's), height and width 0 in version 2 (each sample its own), none 0 in 1."""
        shape, ragged = self.sample_shape, self.format_version == RAGGED_FORMAT_VERSION
        if len(shape) != 3 or any(d < 0 for d in shape):
            raise ValueError(f"sample_shape {list(shape)} is not three sides")
        sides = shape[:2] if self.layout == "HWC" else shape[1:]
        channels = shape[2] if self.layout == "HWC" else shape[0]
        if channels <= 0 or (sides != (0, 0) if ragged else 0 in sides):
            raise ValueError(
                f"sample_shape {list(shape)} does not fit format version {self.format_version}"
            )
        return self

    def to_metadata(self) -> dict[bytes, bytes]:
        values: dict[str, Any] = {
            "format_version": self.format_version,
            "version": self.version,
            "sample_shape": list(self.sample_shape),
            "dtype": self.dtype,
            "layout": self.layout,
            "classes": list(self.classes),
            "checksum": self.checksum,
            "config_digest": self.config_digest,
            "config": dict(self.config),
            "tool_version": self.tool_version,
            "created": self.created,
        }
        if self.columns:
            values["columns"] = [list(c) for c in self.columns]
        return {f"etl.{k}".encode(): json.dumps(v).encode() for k, v in values.items()}

    @classmethod
    def from_metadata(cls, metadata: Mapping[bytes, bytes] | None, where: Path) -> ManifestMeta:
        raw = {
            k.decode(errors="replace"): v
            for k, v in (metadata or {}).items()
            if k.startswith(b"etl.")
        }
        try:
            values = {k[4:]: json.loads(v) for k, v in raw.items()}
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            raise ManifestError(f"{where}: schema metadata is not valid JSON ({exc})") from None
        fmt = values.get("format_version")
        if isinstance(fmt, bool) or fmt not in FORMAT_VERSIONS:
            known = " and ".join(map(str, FORMAT_VERSIONS))
            raise ManifestError(
                f"{where}: manifest format version {fmt!r}, this tool reads {known}; "
                "upgrade the tool or repack the dataset"
            )
        try:
            return cls(
                version=int(values["version"]),
                sample_shape=tuple(int(d) for d in values["sample_shape"]),
                layout=str(values["layout"]),
                classes=tuple(str(c) for c in values["classes"]),
                checksum=str(values["checksum"]),
                config_digest=str(values["config_digest"]),
                config=dict(values["config"]),
                tool_version=str(values["tool_version"]),
                created=str(values["created"]),
                dtype=str(values["dtype"]),
                format_version=int(fmt),
                columns=_declared_columns(values.get("columns", [])),
            )._checked_shape()
        except (KeyError, TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise ManifestError(f"{where}: schema metadata is incomplete ({exc!r})") from None


def sample_shape_of(config_shape: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """(sample_shape, format version) a manifest records for a config's `sample_shape`: a 0
    side (samples that keep their aspect ratio) is format version 2."""
    fmt = RAGGED_FORMAT_VERSION if 0 in config_shape else FORMAT_VERSION
    return tuple(config_shape), fmt


def _declared_columns(value: Any) -> tuple[tuple[str, str], ...]:
    """The `columns` metadata, checked: pairs of a valid name (not a SAMPLES_SCHEMA column, not
    repeated) and a type `parse_type` reads. ValueError otherwise."""
    from etl.format.sample_columns import NAME, parse_type

    if not isinstance(value, list):
        raise ValueError(f"columns is {type(value).__name__}, not a list")
    found: list[tuple[str, str]] = []
    for pair in value:
        if not (
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
        ):
            raise ValueError(f"column {pair!r} is not [name, type]")
        name, text = pair
        if not NAME.match(name) or name in SAMPLES_SCHEMA.names or name in dict(found):
            raise ValueError(f"column name {name!r} is not valid here")
        parse_type(text)
        found.append((name, text))
    return tuple(found)


def samples_schema(columns: Sequence[pa.Field] = ()) -> pa.Schema:
    """SAMPLES_SCHEMA followed by the per-sample columns of a config or a version."""
    if not columns:
        return SAMPLES_SCHEMA
    return pa.schema([*SAMPLES_SCHEMA, *(pa.field(f.name, f.type) for f in columns)])


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


def list_versions(root: Path) -> list[int]:
    """Committed versions, oldest first. Temp folders of interrupted commits are not versions."""
    versions_dir = root / VERSIONS_DIR
    if not versions_dir.is_dir():
        return []
    found = []
    for entry in versions_dir.iterdir():
        number = version_number(entry.name)
        if number is not None and (entry / MANIFEST_FILE).is_file():
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
    if not versions:
        raise ManifestError(f"{path}: no manifest version found (run 'etl run' first)")
    if version is None:
        return path, versions[-1]
    if version not in versions:
        raise ManifestError(f"{path}: no version {version}; versions are {versions}")
    return path, version


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
    return pa.Table.from_pylist(list(rows), schema=schema)
