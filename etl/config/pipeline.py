"""The stages, output and run sections, and `PipelineConfig`: the one model of a run."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import (
    BeforeValidator,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from etl.config.columns import Columns, check_column_names
from etl.config.fields import ByteSize, Color, Location, StrictModel
from etl.config.sources import Source
from etl.errors import ConfigError
from etl.storage.location import StoreOptions, is_url
from etl.storage.transport import STORE_TIMEOUT, unconditional

if TYPE_CHECKING:
    from etl.format.sample_columns import SampleColumn

DEFAULT_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF")
"""Pillow's names for the common photo formats. JPEG includes MPO (a JPEG with extra pictures,
from phones), which Pillow opens through its JPEG plugin."""
EXTERNAL_PROGRAM_FORMATS = ("EPS",)
"""Pillow formats whose decoding runs another program (EPS: Ghostscript)."""


class DecodeStage(StrictModel):
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


Side = Annotated[int, Field(gt=0, le=16384)]
KEEP_ASPECT_KEYS = frozenset({"shorter", "longer", "upscale"})
"""The keys of mode 'keep_aspect' alone: left out of the other modes' digest, so a dataset
packed before the mode existed keeps its digest (and its incremental reruns)."""


class ResizeStage(StrictModel):
    kind: Literal["resize"] = "resize"
    size: tuple[Side, Side] | None = None
    """Output [height, width] in pixels (every mode but 'keep_aspect')."""
    mode: Literal["center_crop", "pad", "stretch", "keep_aspect"] = "center_crop"
    filter: Literal["nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"] = "bilinear"
    fill: Color = (0, 0, 0)
    """Letterbox colour for mode 'pad'."""
    draft: bool = False
    """JPEG only: let libjpeg decode at 1/2, 1/4 or 1/8 scale (never below the output size)."""
    shorter: Side | None = None
    """Mode 'keep_aspect': the shorter side of every stored sample, e.g. 256 ..."""
    longer: Side | None = None
    """... unless its longer side would then pass this cap (e.g. 512): then the longer side is
    the cap and the shorter one follows the aspect ratio."""
    upscale: bool = False
    """Mode 'keep_aspect': enlarge a source whose shorter side is below `shorter` (default: it
    is stored at its own size, its longer side still capped)."""

    @model_validator(mode="after")
    def _sizes_of_the_mode(self) -> ResizeStage:
        if self.mode == "keep_aspect":
            if self.size is not None:
                raise ValueError(
                    "mode keep_aspect stores each image at its own aspect ratio: give shorter "
                    "and longer (e.g. shorter: 256, longer: 512), not size"
                )
            if self.shorter is None or self.longer is None:
                raise ValueError(
                    "mode keep_aspect needs shorter and longer (e.g. shorter: 256, longer: 512)"
                )
            if self.longer < self.shorter:
                raise ValueError(f"longer ({self.longer}) is below shorter ({self.shorter})")
            return self
        given = sorted(k for k in KEEP_ASPECT_KEYS if k in self.model_fields_set)
        if given:
            raise ValueError(f"{', '.join(given)}: only for mode keep_aspect")
        if self.size is None:
            raise ValueError(f"mode {self.mode} needs size: [height, width]")
        return self

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """The stored (height, width) of a (height, width) image: `size`, or for 'keep_aspect'
        the shorter side scaled to `shorter` (no larger unless `upscale`), then the longer side
        capped at `longer`; each side rounded to the nearest pixel (half to even), at least 1.
        Exact arithmetic: the side that was aimed at is exactly `shorter` or `longer`."""
        if self.mode != "keep_aspect":
            assert self.size is not None
            return self.size
        assert self.shorter is not None and self.longer is not None
        scale = Fraction(self.shorter, min(height, width))
        if not self.upscale:
            scale = min(scale, Fraction(1))
        if max(height, width) * scale > self.longer:
            scale = Fraction(self.longer, max(height, width))
        return max(1, round(height * scale)), max(1, round(width * scale))

    @property
    def largest_pixels(self) -> int:
        """Per channel, the most pixels a stored sample can have: height x width for a fixed
        size, shorter x longer for 'keep_aspect' (its shorter side is at most `shorter`, its
        longer at most `longer`)."""
        if self.mode != "keep_aspect":
            assert self.size is not None
            return self.size[0] * self.size[1]
        assert self.shorter is not None and self.longer is not None
        return self.shorter * self.longer


class ValidateStage(StrictModel):
    kind: Literal["validate"] = "validate"
    min_size: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] | None = None
    """Smallest accepted source [height, width], after EXIF orientation."""
    max_aspect: float | None = Field(default=None, ge=1.0)
    """Largest accepted max(w/h, h/w) of the source."""
    duplicates: Literal["allow", "keep_first", "reject_all"] = "keep_first"
    """Exact duplicates by content hash; 'first' is the first in sorted source order."""


class CallStage(StrictModel):
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
MAX_SAMPLES_PER_SHARD = 1 << 16
"""The most samples a shard sized by bytes holds. NOTE [ samples per shard ]: set when a shard
was one task whose results reached the parent in one piece (with 8x8 images 256 MiB is 1.4M
samples, and at 10M such files the parent peaked at 3.2 GB). Tasks are batches now (#43); the
cap stays because it decides which shards a dataset has, and changing it would repack every
dataset sized by bytes. An explicit samples_per_shard is taken as given."""


class OutputConfig(StrictModel):
    dir: Location = Path("artifacts")
    """The dataset folder, or its URL in object storage (s3://bucket/prefix, any fsspec
    protocol): a run packs in a local work folder and publishes there (etl.run.to_store)."""
    storage_options: dict[str, Any] = Field(default_factory=dict, repr=False)
    """For a `dir` in object storage: options for the store's fsspec driver, as
    `source.storage_options`. Never written to the manifest, a report or a message."""
    store_timeout: float = Field(default=STORE_TIMEOUT, gt=0)
    """For a `dir` in object storage: seconds one call to the store may take before the run
    says which call and stops (a hung store is an error, not a hung run)."""
    shard_size: ByteSize | None = None
    """Target bytes of pixels per shard, e.g. '256MiB', and at most MAX_SAMPLES_PER_SHARD
    samples. Default when neither is set: SHARD_BYTES (256MiB)."""
    samples_per_shard: int | None = Field(default=None, gt=0)
    layout: Literal["HWC", "CHW"] = "HWC"
    checksum: Literal["xxh3_64", "xxh3_128", "blake3", "sha256"] = "xxh3_64"

    @model_validator(mode="after")
    def _one_shard_rule(self) -> OutputConfig:
        if self.shard_size is not None and self.samples_per_shard is not None:
            raise ValueError("set shard_size or samples_per_shard, not both")
        given = self.storage_options or self.store_timeout != STORE_TIMEOUT
        refused = unconditional(str(self.dir)) if is_url(str(self.dir)) else None
        if refused is not None:
            raise ValueError(refused)
        if given and not is_url(str(self.dir)):
            raise ValueError(
                "storage_options and store_timeout are for an output.dir in object storage "
                "(s3://..., gs://...), "
                f"not the local path {str(self.dir)!r}"
            )
        return self

    def store(self) -> StoreOptions:
        """How `dir` in object storage is reached: the one source of a run's, a compaction's
        and a repair's storage options."""
        return StoreOptions(storage_options=self.storage_options, timeout=self.store_timeout)


Backend = Literal["auto", "loky", "threading", "sequential", "dask"]
"""Where work runs: loky processes with threads here while they start (and for small runs),
joblib's loky processes, threads, in-process, or a Dask cluster."""
BACKENDS: tuple[str, ...] = get_args(Backend)


class RunConfig(StrictModel):
    n_jobs: int = -1
    """joblib's convention: -1 is every core."""
    backend: Backend = "auto"
    """'auto' (the default): loky processes, with threads in the `etl` process packing while
    they start, and doing all of a run too small to pay for starting them (NOTE [ head start ]
    in etl.engine.parallel); 'loky': processes only; 'threading'; 'sequential' (debugging); or
    'dask' (a dask.distributed cluster at `address`, else a LocalCluster of n_jobs processes)."""
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


def _not_output_shaping(stage: Stage) -> set[str] | None:
    if isinstance(stage, ResizeStage):
        return set() if stage.mode == "keep_aspect" else set(KEEP_ASPECT_KEYS)
    return _NOT_OUTPUT_SHAPING.get(stage.kind)


class PipelineConfig(StrictModel):
    source: Source
    stages: tuple[Annotated[Stage, BeforeValidator(_single_key_stage)], ...]
    output: OutputConfig = Field(default_factory=OutputConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    columns: Columns = Field(default_factory=dict)
    """Per-sample columns the source carries into the manifest (etl.config.columns)."""

    @field_validator("columns")
    @classmethod
    def _column_names(cls, columns: Columns) -> Columns:
        check_column_names(columns)
        return columns

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
    def runs_user_code(self) -> bool:
        """Whether packing calls the user's functions (a `call` stage): those run only in
        worker processes, where a crash or a runaway allocation stops one worker and the run
        says so in one line, never in the `etl` process itself."""
        return any(isinstance(s, CallStage) for s in self.stages)

    @property
    def ragged(self) -> bool:
        """Whether samples keep their aspect ratio, each its own size (format version 2:
        `etl.format.ragged`)."""
        return self.resize.mode == "keep_aspect"

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        """Shape of one stored sample in the configured layout; 0 for the height and width of
        samples that keep their aspect ratio (each row of the manifest says its own)."""
        height, width = self.resize.size or (0, 0)
        if self.output.layout == "HWC":
            return (height, width, self.channels)
        return (self.channels, height, width)

    @property
    def sample_bytes(self) -> int:
        """Bytes of one stored sample; for samples that keep their aspect ratio, a 4:3 photo's
        (what shard_size and the tasks are sized by: each shard holds what it holds)."""
        if self.ragged:
            assert self.resize.shorter is not None and self.resize.longer is not None
            shorter = self.resize.shorter
            return shorter * min(self.resize.longer, shorter * 4 // 3) * self.channels
        return self.resize.largest_pixels * self.channels

    @property
    def slot_bytes(self) -> int:
        """The most bytes one stored sample can take: a slot of the temp file a run's tasks
        fill (`etl.format.parts`)."""
        return self.resize.largest_pixels * self.channels

    @property
    def sample_columns(self) -> tuple[SampleColumn, ...]:
        """The declared columns, in the config's order, as the sources and the run use them."""
        from etl.format.sample_columns import SampleColumn, parse_type

        return tuple(
            SampleColumn(name, parse_type(c.type), c.from_ or name, c.required)
            for name, c in self.columns.items()
        )

    @property
    def samples_per_shard(self) -> int:
        if self.output.samples_per_shard is not None:
            return self.output.samples_per_shard
        target = self.output.shard_size if self.output.shard_size is not None else SHARD_BYTES
        return min(max(1, target // self.sample_bytes), MAX_SAMPLES_PER_SHARD)

    def output_shaping(self) -> dict[str, Any]:
        """Everything that changes stored bytes, labels or splits; `run` is not part of it."""
        return {
            "stages": [
                stage.model_dump(mode="json", exclude=_not_output_shaping(stage))
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
