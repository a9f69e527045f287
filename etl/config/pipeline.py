"""The output and run sections, and `PipelineConfig`: the one model of a run."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, Field, PrivateAttr, field_validator, model_validator

from etl.config.codec import CodecConfig, parse_codec
from etl.config.columns import Columns, check_column_names
from etl.config.fields import ByteSize, Location, StrictModel
from etl.config.sources import Source
from etl.config.stages import (
    KEEP_ASPECT_KEYS,
    LEGACY_REDUCING_GAP,
    CallStage,
    DecodeStage,
    ResizeStage,
    Stage,
    ValidateStage,
    single_key_stage,
)
from etl.errors import ConfigError
from etl.format.codecs import REDUCING_GAP
from etl.storage.location import StoreOptions, StoreUrl
from etl.storage.transport import STORE_TIMEOUT, unconditional

if TYPE_CHECKING:
    from etl.format.sample_columns import SampleColumn

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
    codec: Annotated[CodecConfig, BeforeValidator(parse_codec)] = Field(default_factory=CodecConfig)
    """How samples are stored (`etl.config.codec`): raw rows by default, or JPEG or zlib."""

    @model_validator(mode="after")
    def _one_shard_rule(self) -> OutputConfig:
        if self.shard_size is not None and self.samples_per_shard is not None:
            raise ValueError("set shard_size or samples_per_shard, not both")
        if self.codec.kind == "jpeg" and self.layout != "HWC":
            raise ValueError("codec jpeg stores HWC pixels (as a JPEG does); use layout: HWC")
        given = self.storage_options or self.store_timeout != STORE_TIMEOUT
        in_store = isinstance(self.dir, StoreUrl)
        refused = unconditional(str(self.dir)) if in_store else None
        if refused is not None:
            raise ValueError(refused)
        if given and not in_store:
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


def _shaping(stage: Stage) -> dict[str, Any]:
    """A stage's part of the output-shaping config (an unset draft: true, as for a new dataset)."""
    dumped = stage.model_dump(mode="json", exclude=_not_output_shaping(stage))
    if isinstance(stage, ResizeStage) and dumped.get("draft") is None:
        dumped["draft"] = True
    return dumped


def _not_output_shaping(stage: Stage) -> set[str] | None:
    if isinstance(stage, ResizeStage):
        return set() if stage.mode == "keep_aspect" else set(KEEP_ASPECT_KEYS)
    return _NOT_OUTPUT_SHAPING.get(stage.kind)


class PipelineConfig(StrictModel):
    source: Source
    stages: tuple[Annotated[Stage, BeforeValidator(single_key_stage)], ...]
    output: OutputConfig = Field(default_factory=OutputConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    columns: Columns = Field(default_factory=dict)
    """Per-sample columns the source carries into the manifest (etl.config.columns)."""
    _reducing_gap: float = PrivateAttr(default=REDUCING_GAP)
    """The reduced decode's gap (`resolved`): 2, or 1 for a dataset drafted before it."""

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

    def resolved(self, recorded: Mapping[str, Any] | None) -> PipelineConfig:
        """This config with its decode decided: `resize.draft` as pipeline.yaml sets it, else
        as `recorded` (the output-shaping config of the version a run builds on) was packed,
        else true; and the reduced decode's rule as the version recorded it (a dataset drafted
        before the rule kept twice the output kept its own: never below it). A rerun then
        never mixes two decodes in one version, nor forces a rebuild nobody asked for."""
        draft, gap = self.resize.draft, REDUCING_GAP
        if recorded is not None:
            stages = recorded.get("stages") or []
            found: Mapping[str, Any] = next((s for s in stages if s.get("kind") == "resize"), {})
            was = bool(found.get("draft", False))
            decode = (recorded.get("samples") or {}).get("decode") or {}
            draft = was if draft is None else draft
            if draft and was:
                gap = float(decode.get("reducing_gap", LEGACY_REDUCING_GAP))
        stages = tuple(
            s.model_copy(update={"draft": bool(draft) if draft is not None else True})
            if isinstance(s, ResizeStage)
            else s
            for s in self.stages
        )
        config = self.model_copy(update={"stages": stages})
        config._reducing_gap = gap
        return config

    @property
    def reducing_gap(self) -> float:
        """How much larger than the output a reduced JPEG decode stays (`resolved`)."""
        return self._reducing_gap

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
        `etl.format.flat`)."""
        return self.resize.mode == "keep_aspect"

    @property
    def flat(self) -> bool:
        """Whether each shard is one flat array of its samples' stored bytes, each manifest
        row saying where its sample is: samples that keep their aspect ratio (format version
        2), or samples stored encoded (format version 3, `etl.format.codecs`)."""
        return self.ragged or self.output.codec.encoded

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        """Shape of one stored sample in the configured layout; 0 for the height and width of
        samples that keep their aspect ratio (each row of the manifest says its own)."""
        height, width = self.resize.size or (0, 0)
        if self.output.layout == "HWC":
            return (height, width, self.channels)
        return (self.channels, height, width)

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The shape a shard writer takes each sample in: `sample_shape`, or for samples stored
        encoded, (0,): each a flat run of bytes of its own length."""
        return (0,) if self.output.codec.encoded else self.sample_shape

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
        """Everything that changes stored bytes, labels or splits; `run` is not part of it.
        An unset `draft` counts as what `resolved` makes it for a new dataset."""
        codec = self.output.codec
        samples: dict[str, Any] = {"codec": codec.shaping()} if codec.encoded else {}
        if self.resize.draft is not False and self.reducing_gap != LEGACY_REDUCING_GAP:
            samples["decode"] = {"reducing_gap": self.reducing_gap}
        return {
            "stages": [_shaping(stage) for stage in self.stages],
            "layout": self.output.layout,
            "checksum": self.output.checksum,
            "split": dict(sorted(self.source.split.items())),
            "source_kind": self.source.kind,
            # NOTE: only where samples are stored other than raw, or decoded by the reduced
            # rule, so a dataset packed before either existed keeps its digest byte for byte.
            **({"samples": samples} if samples else {}),
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
