"""The `stages:` section: one model per stage kind, and `Stage`, their tagged union."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from etl.config.fields import Color, StrictModel

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


LEGACY_REDUCING_GAP = 1.0
"""The rule of `draft: true` before the reduced decode became the default: never below the
output size. Datasets drafted then keep it (`PipelineConfig.resolved`)."""

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
    draft: bool | None = None
    """JPEG only: decode at 1/2, 1/4 or 1/8 scale in the DCT domain where that leaves at least
    twice the output size, then resample the rest of the way (`etl.format.codecs.dct_factor`,
    Pillow's `reducing_gap=2`): a fraction of a full decode for a large photo. Unset: what the
    dataset was packed with, and for a new dataset true; false: the exact full decode."""
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


def single_key_stage(value: Any) -> Any:
    """YAML writes a stage as `- resize: {size: [64, 64]}`; the model wants a 'kind' field."""
    if isinstance(value, Mapping) and len(value) == 1 and "kind" not in value:
        ((name, options),) = value.items()
        options = {} if options is None else options
        if isinstance(options, Mapping):
            return {"kind": name, **options}
    return value
