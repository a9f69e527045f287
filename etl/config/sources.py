"""The `source:` section: one model per source kind, chosen by `kind`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from etl.config.fields import ByteSize, Location, StrictModel
from etl.storage.location import StoreUrl
from etl.storage.transport import with_allowed

DEFAULT_INCLUDE = ("*.jpg", "*.jpeg", "*.png", "*.bmp", "*.gif", "*.tif", "*.tiff", "*.webp")


class _SourceBase(StrictModel):
    path: Path
    classes: tuple[str, ...] | None = None
    """Fixes the class -> label order; otherwise classes are sorted by name."""
    split: dict[str, Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        default_factory=lambda: {"val": 0.1}
    )
    """Fractions by a hash of the sample's source path; the remainder is 'train'."""
    max_file_bytes: ByteSize = 512 << 20
    """A file (or LMDB value) larger than this is rejected `file_too_large` before it is read:
    a worker holds at most this many bytes of one source in memory."""
    io_timeout: Annotated[float, Field(gt=0)] | None = 60.0
    """Seconds one file's read (or hash) may take; a read that stalls longer (a hung network
    mount) is rejected `io_timeout` and the run goes on. None waits forever."""
    storage_options: dict[str, Any] = Field(default_factory=dict, repr=False)
    """For a `path` in object storage: options for the store's fsspec driver (for S3:
    endpoint_url, profile, key and secret, client_kwargs), over what the environment says.
    Never written to the manifest, a report or a message."""

    @field_validator("split")
    @classmethod
    def _split_fractions(cls, split: dict[str, float]) -> dict[str, float]:
        if "train" in split:
            raise ValueError("'train' is the remainder; list only the other splits")
        if sum(split.values()) > 1.0 + 1e-9:
            raise ValueError(f"split fractions add up to {sum(split.values()):g} > 1")
        return split

    allow_protocols: tuple[str, ...] = ()
    """Protocols besides a store's (s3, gs, gcs, az, abfs, abfss) that `path`, or a listing's
    locators, may name, e.g. [http]: nothing else is reached (NOTE [ no request nobody asked
    for ] in etl.storage.transport)."""

    @model_validator(mode="after")
    def _options_need_a_store(self) -> _SourceBase:
        if self.storage_options and not isinstance(self.path, StoreUrl):
            raise ValueError(
                "storage_options are for a source.path in object storage (s3://..., gs://...), "
                f"not the local path {str(self.path)!r}"
            )
        if self.allow_protocols:  # NOTE: they travel with the driver's options, to every read
            reach = with_allowed(self.storage_options, self.allow_protocols)
            object.__setattr__(self, "storage_options", reach)
        return self

    @field_validator("classes")
    @classmethod
    def _unique_classes(cls, classes: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if classes is not None:
            dupes = sorted({c for c in classes if classes.count(c) > 1})
            if dupes:
                raise ValueError(f"classes listed twice: {dupes}")
            if not classes:
                raise ValueError("classes is empty; omit it to use the sorted folder names")
        return classes


class FolderSource(_SourceBase):
    """One sub-folder per class under `path`: a local folder, or a prefix in object storage
    (`s3://bucket/photos`; endpoint and credentials from the environment)."""

    kind: Literal["folder"] = "folder"
    path: Location  # type: ignore[assignment]
    include: tuple[str, ...] = DEFAULT_INCLUDE
    """fnmatch patterns on the path relative to the root, case-insensitive; '*' also matches '/'."""
    exclude: tuple[str, ...] = ()


class ListingSource(_SourceBase):
    """A CSV or Parquet file with columns path, label and optionally split: a local file, or
    an object in a bucket (`s3://bucket/train.csv`), its paths relative to its prefix."""

    kind: Literal["listing"] = "listing"
    path: Location  # type: ignore[assignment]
    path_column: str = "path"
    label_column: str = "label"
    split_column: str = "split"


class LmdbSource(_SourceBase):
    """An LMDB environment (`path`: its folder, or the data file itself), one key per sample,
    encoded image bytes (or .npy bytes) as values. Opened read-only and without a lock: do not
    write to it during a run (a value that changes is rejected as `changed`)."""

    kind: Literal["lmdb"] = "lmdb"
    keys_entry: str | None = None
    """A key whose value lists the sample keys (a JSON list of strings, or one key per line);
    without it, every key of the environment is a sample (a cursor scan)."""
    meta_keys: tuple[str, ...] = ()
    """Keys that are not samples, skipped by the cursor scan, e.g. ['__len__', '__keys__']."""
    labels: Path | None = None
    """A .csv/.tsv/.parquet file with columns key, label and optionally split."""
    label_field: str | int | None = None
    """The label's field in a pickled dict (a str) or tuple (an int); needs allow_pickle."""
    image_field: str | int = "image"
    """The encoded image's (or uint8 array's) field in a pickled dict or tuple."""
    allow_pickle: bool = False
    """Unpickle values (and the keys entry) that are Python pickles. Unpickling runs code:
    allow it only for an environment you trust as much as your own code."""

    @model_validator(mode="after")
    def _one_label_source(self) -> LmdbSource:
        if (self.labels is None) == (self.label_field is None):
            raise ValueError(
                "set labels (a key,label CSV/Parquet file) or label_field (a field of pickled "
                "values), exactly one"
            )
        if self.label_field is not None and not self.allow_pickle:
            raise ValueError(
                "label_field reads pickled records: set allow_pickle: true if you trust this "
                "environment (unpickling runs code)"
            )
        return self


class PythonSource(_SourceBase):
    """`function: "pkg.module:records"`, called as fn(**options), returns an iterable of records
    (id, encoded bytes or a uint8 array, label, optional split): see examples/python_source.py."""

    kind: Literal["python"] = "python"
    path: Path = Path(".")
    """A folder put first on sys.path while `function` is imported; default: the config's."""
    function: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    options: dict[str, Any] = Field(default_factory=dict)


FilePatterns = tuple[str, ...] | dict[str, tuple[str, ...]]
"""Glob patterns, or split name -> glob patterns."""


class _ContainerSource(_SourceBase):
    """Images stored inside files (tar shards, tables) under the folder `path`, or under a
    prefix in object storage (`s3://bucket/shards`)."""

    path: Location = Path(".")  # type: ignore[assignment]
    """The folder (or prefix) `files` are matched in; `source` names a file by its path
    relative to it. Default: the config's folder."""
    files: FilePatterns
    """Glob patterns relative to `path` ('**' crosses folders; dot-files are never matched);
    or split name -> patterns, when files hold splits (a Hub dataset's train-*.parquet and
    test-*.parquet): their records get that split."""

    @field_validator("files")
    @classmethod
    def _some_files(cls, files: FilePatterns) -> FilePatterns:
        groups = files.values() if isinstance(files, dict) else [files]
        if not files or not all(groups):
            raise ValueError("list at least one file or glob pattern")
        for pattern in (p for group in groups for p in group):
            if not pattern.strip() or Path(pattern).is_absolute() or ".." in Path(pattern).parts:
                raise ValueError(f"{pattern!r}: a pattern relative to source.path, without '..'")
        return files


IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")


class WebDatasetSource(_ContainerSource):
    """WebDataset tar shards: members grouped into samples by key (the name up to the first
    dot of its last part); the image is the first extension of `image_extensions` present."""

    kind: Literal["webdataset"] = "webdataset"
    files: FilePatterns = ("*.tar",)
    image_extensions: tuple[str, ...] = IMAGE_EXTENSIONS
    """Extensions (after the key's first dot, any case) holding the image, in preference order."""
    label_member: str = "cls"
    """The member extension holding the label: text, a class name or an integer."""
    label_field: str | None = None
    """When set, `label_member` is JSON (e.g. 'json') and the label is this field of it."""

    @field_validator("image_extensions")
    @classmethod
    def _lowercase(cls, extensions: tuple[str, ...]) -> tuple[str, ...]:
        if not extensions:
            raise ValueError("list at least one image extension")
        return tuple(e.lower().lstrip(".") for e in extensions)


class ParquetSource(_ContainerSource):
    """Tables of encoded images: Parquet files, or Arrow IPC files or streams (`.arrow`,
    `.feather`), the layouts of image datasets on the Hugging Face Hub."""

    kind: Literal["parquet"] = "parquet"
    files: FilePatterns = ("*.parquet",)
    image_column: str = "image"
    """Encoded image bytes, or a struct {bytes, path} as the Hub's Image feature stores it."""
    label_column: str = "label"
    """Integers (which index `classes`, else the file's ClassLabel names) or class names."""
    id_column: str | None = None
    """A column of unique row ids for `source`; without it, the row number in the file."""
    split_column: str | None = None


SourceConfig = (
    FolderSource | ListingSource | LmdbSource | PythonSource | WebDatasetSource | ParquetSource
)
"""Any source model: a new kind adds its model here (and its unit to etl/sources/registry.py)."""
Source = Annotated[SourceConfig, Field(discriminator="kind")]
SOURCE_KINDS: tuple[str, ...] = tuple(
    model.model_fields["kind"].default for model in get_args(SourceConfig)
)
