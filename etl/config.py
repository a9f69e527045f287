"""The pipeline.yaml schema: frozen pydantic models, and the only place YAML is read.

Every other module receives a `PipelineConfig` and never looks at the file again. Errors name
the key path and the YAML line (`pipeline.yaml:12: stages[1].resize.size: ...`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from etl.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20
"""A pipeline.yaml larger than 1 MiB is refused: it is a config, not data."""

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
}


def parse_byte_size(value: Any) -> int:
    """'256MiB' -> 268435456; plain integers are bytes."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size like '256MiB', got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)
        if match and match.group(2).lower() in _SIZE_UNITS:
            return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])
    raise ValueError(f"expected a size like '256MiB' or '64MB', got {value!r}")


ByteSize = Annotated[int, BeforeValidator(parse_byte_size), Field(gt=0)]
Color = tuple[
    Annotated[int, Field(ge=0, le=255)],
    Annotated[int, Field(ge=0, le=255)],
    Annotated[int, Field(ge=0, le=255)],
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- source ---------------------------------------------------------------------------------

DEFAULT_INCLUDE = ("*.jpg", "*.jpeg", "*.png", "*.bmp", "*.gif", "*.tif", "*.tiff", "*.webp")


class _SourceBase(_Model):
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

    @field_validator("split")
    @classmethod
    def _split_fractions(cls, split: dict[str, float]) -> dict[str, float]:
        if "train" in split:
            raise ValueError("'train' is the remainder; list only the other splits")
        if sum(split.values()) > 1.0 + 1e-9:
            raise ValueError(f"split fractions add up to {sum(split.values()):g} > 1")
        return split

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
    """One sub-folder per class under `path`."""

    kind: Literal["folder"] = "folder"
    include: tuple[str, ...] = DEFAULT_INCLUDE
    """fnmatch patterns on the path relative to the root, case-insensitive; '*' also matches '/'."""
    exclude: tuple[str, ...] = ()


class ListingSource(_SourceBase):
    """A CSV or Parquet file with columns path, label and optionally split."""

    kind: Literal["listing"] = "listing"
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
    """Images stored inside files (tar shards, tables) under the folder `path`."""

    path: Path = Path(".")
    """The folder `files` are matched in; `source` names a file by its path relative to it.
    Default: the config's folder."""
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


Source = Annotated[
    FolderSource | ListingSource | LmdbSource | PythonSource | WebDatasetSource | ParquetSource,
    Field(discriminator="kind"),
]
SourceConfig = (
    FolderSource | ListingSource | LmdbSource | PythonSource | WebDatasetSource | ParquetSource
)
"""Any source model, for code that dispatches on `kind`."""
SOURCE_KINDS: tuple[str, ...] = tuple(
    model.model_fields["kind"].default
    for model in (
        FolderSource,
        ListingSource,
        LmdbSource,
        PythonSource,
        WebDatasetSource,
        ParquetSource,
    )
)


# --- stages ---------------------------------------------------------------------------------


DEFAULT_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF")
"""Pillow's names for the common photo formats. JPEG includes MPO (a JPEG with extra pictures,
from phones), which Pillow opens through its JPEG plugin."""
EXTERNAL_PROGRAM_FORMATS = ("EPS",)
"""Pillow formats whose decoding runs another program (EPS: Ghostscript)."""


class DecodeStage(_Model):
    kind: Literal["decode"] = "decode"
    mode: Literal["RGB", "L"] = "RGB"
    background: Color = (255, 255, 255)
    """Alpha is composited onto this colour (white by default, as a viewer shows it)."""
    max_pixels: int = Field(default=89_478_485, gt=0)
    """Decompression-bomb guard: width x height above this is rejected before decoding."""
    multi_frame: Literal["first", "reject"] = "first"
    formats: tuple[str, ...] = DEFAULT_FORMATS
    """Pillow formats decoded (its format names, e.g. JPEG, PNG); any other file is rejected
    `format_not_allowed`, including text formats Pillow happens to parse (XBM, text PNM)."""
    allow_external_programs: bool = False
    """Formats whose Pillow plugin runs another program on the file (EPS runs Ghostscript) are
    refused in `formats` unless this is true. Unsafe on files you did not make yourself."""

    @field_validator("formats")
    @classmethod
    def _known_formats(cls, formats: tuple[str, ...]) -> tuple[str, ...]:
        upper = tuple(f.upper() for f in formats)
        if not upper:
            raise ValueError("formats is empty; list at least one, e.g. [JPEG, PNG]")
        from PIL import Image  # only when a config names formats: `import etl` stays cheap

        Image.init()
        unknown = sorted(set(upper) - set(Image.OPEN))
        if unknown:
            raise ValueError(f"unknown formats {unknown}; Pillow opens {sorted(Image.OPEN)}")
        return upper

    @model_validator(mode="after")
    def _no_external_programs(self) -> DecodeStage:
        risky = sorted(set(self.formats) & set(EXTERNAL_PROGRAM_FORMATS))
        if risky and not self.allow_external_programs:
            raise ValueError(
                f"formats {risky} make Pillow run an external program on the file; set "
                "allow_external_programs: true only for files you trust"
            )
        return self


class ResizeStage(_Model):
    kind: Literal["resize"] = "resize"
    size: tuple[Annotated[int, Field(gt=0, le=16384)], Annotated[int, Field(gt=0, le=16384)]]
    """Output [height, width] in pixels."""
    mode: Literal["center_crop", "pad", "stretch"] = "center_crop"
    filter: Literal["nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"] = "bilinear"
    fill: Color = (0, 0, 0)
    """Letterbox colour for mode 'pad'."""
    draft: bool = False
    """JPEG only: let libjpeg decode at 1/2, 1/4 or 1/8 scale (never below the output size)."""


class ValidateStage(_Model):
    kind: Literal["validate"] = "validate"
    min_size: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] | None = None
    """Smallest accepted source [height, width], after EXIF orientation."""
    max_aspect: float | None = Field(default=None, ge=1.0)
    """Largest accepted max(w/h, h/w) of the source."""
    duplicates: Literal["allow", "keep_first", "reject_all"] = "keep_first"
    """Exact duplicates by content hash; 'first' is the first in sorted source order."""


class CallStage(_Model):
    """A user function `module:function`, called as fn(array, **options) -> array (HWC uint8)."""

    kind: Literal["call"] = "call"
    function: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    options: dict[str, Any] = Field(default_factory=dict)


def _stage_tag(value: Any) -> str | None:
    if isinstance(value, Mapping):
        return str(value.get("kind")) if "kind" in value else None
    return getattr(value, "kind", None)


Stage = Annotated[
    Annotated[DecodeStage, Tag("decode")]
    | Annotated[ResizeStage, Tag("resize")]
    | Annotated[ValidateStage, Tag("validate")]
    | Annotated[CallStage, Tag("call")],
    Discriminator(
        _stage_tag,
        custom_error_type="unknown_stage",
        custom_error_message="unknown stage; expected one of decode, resize, validate, call",
    ),
]


def _single_key_stage(value: Any) -> Any:
    """YAML writes a stage as `- resize: {size: [64, 64]}`; the model wants a 'kind' field."""
    if isinstance(value, Mapping) and len(value) == 1 and "kind" not in value:
        ((name, options),) = value.items()
        options = {} if options is None else options
        if isinstance(options, Mapping):
            return {"kind": name, **options}
    return value


# --- output and run -------------------------------------------------------------------------


SHARD_BYTES = 256 << 20
"""Bytes of pixels per shard when neither output.shard_size nor samples_per_shard is set."""


class OutputConfig(_Model):
    dir: Path = Path("artifacts")
    shard_size: ByteSize | None = None
    """Target bytes of pixels per shard, e.g. '256MiB'. Default when neither is set:
    SHARD_BYTES (256MiB)."""
    samples_per_shard: int | None = Field(default=None, gt=0)
    layout: Literal["HWC", "CHW"] = "HWC"
    checksum: Literal["xxh3_64", "xxh3_128", "blake3", "sha256"] = "xxh3_64"

    @model_validator(mode="after")
    def _one_shard_rule(self) -> OutputConfig:
        if self.shard_size is not None and self.samples_per_shard is not None:
            raise ValueError("set shard_size or samples_per_shard, not both")
        return self


Backend = Literal["loky", "threading", "sequential", "dask"]
"""Where work runs: joblib's loky processes, threads, in-process, or a Dask cluster."""
BACKENDS: tuple[str, ...] = get_args(Backend)


class RunConfig(_Model):
    n_jobs: int = -1
    """joblib's convention: -1 is every core."""
    backend: Backend = "loky"
    """joblib backend: 'loky' (processes, the default), 'threading', 'sequential' (debugging),
    or 'dask' (a dask.distributed cluster at `address`, else a LocalCluster of n_jobs processes)."""
    address: str | None = Field(default=None, pattern=r"^(tcp|tls|inproc|ucx)://\S+$")
    """Dask scheduler address, e.g. tcp://10.0.0.5:8786; only with backend 'dask'."""

    @field_validator("n_jobs")
    @classmethod
    def _nonzero(cls, n_jobs: int) -> int:
        if n_jobs == 0:
            raise ValueError("n_jobs must be a positive count or negative (-1 = all cores)")
        return n_jobs

    @model_validator(mode="after")
    def _address_needs_dask(self) -> RunConfig:
        if self.address is not None and self.backend != "dask":
            raise ValueError(f"address is set but backend is {self.backend!r}; use backend: dask")
        return self


_NOT_OUTPUT_SHAPING: dict[str, set[str]] = {"decode": {"formats", "allow_external_programs"}}
"""NOTE: stage keys that decide which files are accepted, never a stored byte: left out of the
digest (so changing them needs no --rebuild, and datasets packed before they existed keep
their digest). Their rejects are not remembered by content (see
etl.images.rejects.CONTENT_REJECTS)."""


class PipelineConfig(_Model):
    source: Source
    stages: tuple[Annotated[Stage, BeforeValidator(_single_key_stage)], ...]
    output: OutputConfig = Field(default_factory=OutputConfig)
    run: RunConfig = Field(default_factory=RunConfig)

    @model_validator(mode="after")
    def _stage_order(self) -> PipelineConfig:
        kinds = [stage.kind for stage in self.stages]
        if not kinds or kinds[0] != "decode":
            raise ValueError("the first stage must be 'decode'")
        for kind in ("decode", "resize", "validate"):
            if kinds.count(kind) > 1:
                raise ValueError(f"stage '{kind}' appears {kinds.count(kind)} times; use it once")
        if "resize" not in kinds:
            raise ValueError("a 'resize' stage is required: shards hold fixed-size samples")
        return self

    # --- derived values: computed here so every module agrees ---------------------------------

    @property
    def decode(self) -> DecodeStage:
        return next(s for s in self.stages if isinstance(s, DecodeStage))

    @property
    def resize(self) -> ResizeStage:
        return next(s for s in self.stages if isinstance(s, ResizeStage))

    @property
    def validate_stage(self) -> ValidateStage:
        found = [s for s in self.stages if isinstance(s, ValidateStage)]
        return found[0] if found else ValidateStage(duplicates="allow")

    @property
    def channels(self) -> int:
        return 3 if self.decode.mode == "RGB" else 1

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        """Shape of one stored sample in the configured layout."""
        height, width = self.resize.size
        if self.output.layout == "HWC":
            return (height, width, self.channels)
        return (self.channels, height, width)

    @property
    def sample_bytes(self) -> int:
        h, w, c = (*self.resize.size, self.channels)
        return h * w * c

    @property
    def samples_per_shard(self) -> int:
        if self.output.samples_per_shard is not None:
            return self.output.samples_per_shard
        target = self.output.shard_size if self.output.shard_size is not None else SHARD_BYTES
        return max(1, target // self.sample_bytes)

    def output_shaping(self) -> dict[str, Any]:
        """Everything that changes stored bytes, labels or splits; `run` is not part of it."""
        return {
            "stages": [
                stage.model_dump(mode="json", exclude=_NOT_OUTPUT_SHAPING.get(stage.kind))
                for stage in self.stages
            ],
            "layout": self.output.layout,
            "checksum": self.output.checksum,
            "split": dict(sorted(self.source.split.items())),
            "source_kind": self.source.kind,
        }

    def digest(self) -> str:
        """Short, stable digest of `output_shaping()`; stored in every manifest."""
        canonical = json.dumps(self.output_shaping(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def check_same_output(
        self, recorded: Mapping[str, Any], recorded_digest: str, where: str, fix: str
    ) -> None:
        """ConfigError unless this config shapes output as the one `recorded` in a manifest:
        building on a version packed otherwise would mix two kinds of sample in one dataset."""
        if recorded_digest == self.digest():
            return
        keys = changed_keys(recorded, self.output_shaping())
        raise ConfigError(
            f"{where} was packed with other output settings "
            f"(changed: {', '.join(keys) or 'config digest'}); {fix}"
        )


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two output-shaping dicts."""
    keys: list[str] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            keys += changed_keys(a, b, name + ".")
        elif a != b:
            keys.append(name)
    return keys


# --- YAML loading ---------------------------------------------------------------------------


MAX_DEPTH = 64
"""Deeper YAML nesting is refused (a config needs 5 levels): no RecursionError, ever."""


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors/aliases (no object construction, no billion-laughs),
    nesting deeper than MAX_DEPTH, and a key that appears twice in one mapping."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if self.check_event(yaml.AliasEvent):
            raise ConfigError(
                f"{self.name}:{event.start_mark.line + 1}: YAML aliases (*name) are not allowed"
            )
        if self._depth >= MAX_DEPTH:
            raise ConfigError(
                f"{self.name}:{event.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels"
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_mapping_node(self, anchor: Any) -> Any:
        node = super().compose_mapping_node(anchor)
        first: dict[Any, int] = {}
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode):
                continue
            line = key.start_mark.line + 1
            if key.value in first:
                raise ConfigError(
                    f"{self.name}:{line}: key {key.value!r} appears twice in one mapping "
                    f"(lines {first[key.value]} and {line}); keep one"
                )
            first[key.value] = line
        return node


def _line_index(node: yaml.Node, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], int]:
    """Map every key path (as pydantic reports it) to its 1-based YAML line."""
    lines = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            lines[(*path, key)] = key_node.start_mark.line + 1
            for sub, line in _line_index(value_node, (*path, key)).items():
                lines.setdefault(sub, line)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(_line_index(item, (*path, i)))
    return lines


def _yaml_path(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """pydantic puts the union tag in `loc`: (source, folder, path) is YAML's (source, path).
    A stage's tag is also its single YAML key, so (stages, 1, resize, size) needs no change."""
    if len(loc) >= 2 and loc[0] == "source" and loc[1] in SOURCE_KINDS:
        return (loc[0], *loc[2:])
    return loc


def _format_loc(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _lookup_line(lines: dict[tuple[Any, ...], int], loc: tuple[Any, ...]) -> int:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return 1


def load_config(path: Path | str, **overrides: Any) -> PipelineConfig:
    """Read, validate and resolve pipeline.yaml. Relative paths are relative to the file's folder.

    `overrides` replace `run` fields (the CLI's --jobs/--backend/--address) when not None.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; is this a config?")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        loader = _NoAliasLoader(text)
        loader.name = str(path)
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error(path, exc)) from None
    if root is None:
        raise ConfigError(f"{path}: the file is empty")
    data = _construct(root, path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: expected a mapping with keys source, stages, output, run")
    lines = _line_index(root)
    run = dict(data.get("run") or {})
    run.update({k: v for k, v in overrides.items() if v is not None})
    if run:
        data["run"] = run
    try:
        config = PipelineConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = _yaml_path(tuple(err["loc"]))
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        raise ConfigError(
            f"{path}:{_lookup_line(lines, loc)}: {_format_loc(loc)}: {msg}{more}"
        ) from None
    return _resolve_paths(config, path.parent)


def _construct(root: yaml.Node, path: Path) -> Any:
    loader = _NoAliasLoader("")
    loader.name = str(path)
    try:
        return loader.construct_document(root)
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error(path, exc)) from None
    finally:
        loader.dispose()


def _yaml_error(path: Path, exc: yaml.YAMLError) -> str:
    """One line naming the file and line; PyYAML's own text adds a snippet and a caret."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return f"{path}: invalid YAML: {' '.join(str(exc).split())}"
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark is not None else 1
    problem = " ".join(str(exc.problem or exc.context or "").split())
    if "constructor for the tag" in problem:
        problem += " (YAML tags are not allowed)"
    return f"{path}:{line}: invalid YAML: {problem}"


def _resolve_paths(config: PipelineConfig, base: Path) -> PipelineConfig:
    def resolve(p: Path) -> Path:
        return (p if p.is_absolute() else base / p).resolve()

    # every Path of a source (path, an LMDB source's labels) is relative to the config file
    paths = {k: resolve(v) for k, v in config.source if isinstance(v, Path)}
    source = config.source.model_copy(update=paths)
    output = config.output.model_copy(update={"dir": resolve(config.output.dir)})
    return config.model_copy(update={"source": source, "output": output})
