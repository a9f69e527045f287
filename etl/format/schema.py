"""The manifest's Arrow schemas and the metadata every version file carries (`ManifestMeta`:
format version, sample shape and layout, classes, checksum algorithm, config): what a manifest
row and file hold, as docs/FORMAT.md states it; `etl.format.manifest` reads and finds them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from etl.errors import ManifestError
from etl.format.coherence import ENCODED_COLUMNS, RAGGED_COLUMNS

FORMAT_VERSION = 1
"""Bumped on any change a reader of an older version would misread; checked on every open."""
RAGGED_FORMAT_VERSION = 2
"""The format of samples that keep their aspect ratio (`etl.format.flat`): each shard one
flat uint8 array, each sample's place and size in its manifest row. A reader of version 1
refuses it; fixed-size datasets stay version 1."""
ENCODED_FORMAT_VERSION = 3
"""The format of samples stored encoded (`etl.format.codecs`: JPEG, zlib, or raw where encoding
would not pay), at a fixed size or each its own: flat shards as in version 2, each row also
naming its codec and stored bytes. Readers of versions 1 and 2 refuse it in one line instead of
reading encoded bytes as pixels; datasets stored raw stay version 1 or 2, byte for byte."""
FORMAT_VERSIONS = (FORMAT_VERSION, RAGGED_FORMAT_VERSION, ENCODED_FORMAT_VERSION)

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
        pa.field("sample_codec", pa.string()),
        pa.field("sample_bytes", pa.int64()),
    ]
)
"""NOTE: `sample_*` say where a sample of a flat shard is (format version 2 and 3: byte offset
in its shard's data, height and width; in version 3 also its codec and stored bytes); null in a
fixed-size dataset stored raw, whose manifest.arrow has none of them."""

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

ADDED_COLUMNS = frozenset({"source_ctime_ns", "source_inode", *RAGGED_COLUMNS, *ENCODED_COLUMNS})
"""Nullable columns added after format version 1 was defined (etl-memmap 0.2.0; `sample_*`
with format versions 2 and 3): a manifest without them reads them as nulls (its files are
hashed once again on the next run)."""


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
    codec: Mapping[str, Any] | None = None
    """Format version 3: the codec samples were stored with (`output.codec`, e.g. {"kind":
    "jpeg", "quality": 90, "min_ratio": 1.0}); each row says what it holds."""
    command: str = ""
    """The command line that committed it (`etl run pipeline.yaml --rebuild`), stamped by
    `etl.format.commit`; empty in versions committed before it was recorded."""

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
        dropped = {
            FORMAT_VERSION: (*RAGGED_COLUMNS, *ENCODED_COLUMNS),
            RAGGED_FORMAT_VERSION: ENCODED_COLUMNS,
        }.get(self.format_version, ())
        return pa.schema([f for f in schema if f.name not in dropped])

    @property
    def ragged(self) -> bool:
        """Whether each shard is one flat array and each row says where its sample is: samples
        that keep their aspect ratio (format version 2) or are stored encoded (3)."""
        return self.format_version in (RAGGED_FORMAT_VERSION, ENCODED_FORMAT_VERSION)

    @property
    def encoded(self) -> bool:
        """Whether rows name their codec and stored bytes (format version 3)."""
        return self.format_version == ENCODED_FORMAT_VERSION

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The shape its shard files are checked and written in (`etl.format.shards`): the
        sample shape, or (0,) where samples are stored encoded, each a run of bytes."""
        return (0,) if self.encoded else self.sample_shape

    @property
    def own_sizes(self) -> bool:
        """Whether each sample has its own height and width (0 sides in `sample_shape`)."""
        return 0 in self.sample_shape

    def _checked_shape(self) -> ManifestMeta:
        """ValueError unless the sample shape is what the format version says: three sides
        (a layout's), height and width 0 in version 2 (each sample its own), none 0 in 1,
        either in 3."""
        shape, fmt = self.sample_shape, self.format_version
        if len(shape) != 3 or any(d < 0 for d in shape):
            raise ValueError(f"sample_shape {list(shape)} is not three sides")
        sides = shape[:2] if self.layout == "HWC" else shape[1:]
        channels = shape[2] if self.layout == "HWC" else shape[0]
        ragged = fmt == RAGGED_FORMAT_VERSION or (fmt == ENCODED_FORMAT_VERSION and 0 in shape)
        if fmt == ENCODED_FORMAT_VERSION and not isinstance(self.codec, Mapping):
            raise ValueError("format version 3 without its codec")
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
        if self.codec is not None:
            values["codec"] = dict(self.codec)
        if self.command:
            values["command"] = self.command
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
                codec=values.get("codec"),
                command=str(values.get("command", "")),
            )._checked_shape()
        except (KeyError, TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise ManifestError(f"{where}: schema metadata is incomplete ({exc!r})") from None


def sample_shape_of(
    config_shape: tuple[int, ...], encoded: bool = False
) -> tuple[tuple[int, ...], int]:
    """(sample_shape, format version) a manifest records for a config's `sample_shape`: samples
    stored encoded are format version 3, else a 0 side (samples that keep their aspect ratio)
    is format version 2."""
    if encoded:
        return tuple(config_shape), ENCODED_FORMAT_VERSION
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
