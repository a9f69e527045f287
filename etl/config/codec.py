"""The `output.codec` section: how each sample's pixels are stored (raw rows, JPEG, or zlib).

    output: {dir: artifacts, codec: jpeg}                      # quality 90
    output: {codec: {kind: jpeg, quality: 95, min_ratio: 2}}   # raw where JPEG saves < 2x
    output: {codec: zlib}                                      # exact, ~1.3-2x smaller

Why these three (benchmarks/README.md, "Which codec for stored samples"): JPEG q90 stores a
tenth of a photo's raw bytes and decodes in under half a millisecond with libjpeg-turbo; zlib
over the raw rows is the fastest exact decode and needs nothing on a training node beyond the
Python standard library (WebP lossless is smaller, but would put Pillow with libwebp on every
training node, and decodes 1.3x slower).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from etl.config.fields import StrictModel

CODEC_KINDS = ("raw", "jpeg", "zlib")


class CodecConfig(StrictModel):
    kind: Literal["raw", "jpeg", "zlib"] = "raw"
    """'raw' (the default: uint8 rows, the fastest read), 'jpeg' (lossy, a tenth of the bytes
    of a photo), 'zlib' (lossless)."""
    quality: int = Field(default=90, ge=1, le=100)
    """JPEG quality (libjpeg's scale, 4:2:0 chroma): 90 by default, as FFCV's table."""
    min_ratio: float = Field(default=1.0, ge=1.0)
    """A sample is stored encoded only where that is at least this many times smaller than
    its raw bytes; otherwise it is stored raw (its manifest row says so). 1: raw only where
    the encoding would be larger."""
    original: bool = False
    """JPEG only: a JPEG source that needs no resize is stored as its own bytes (metadata
    stripped: `etl.format.codecs.jpeg_as_stored`) wherever those decode to exactly the pixels
    the run validated; any other source is encoded at `quality`. No generation loss."""

    @model_validator(mode="after")
    def _keys_of_the_kind(self) -> CodecConfig:
        for key in ("quality", "original"):
            if self.kind != "jpeg" and key in self.model_fields_set:
                raise ValueError(f"{key} is for kind jpeg, not {self.kind}")
        if self.kind == "raw" and "min_ratio" in self.model_fields_set:
            raise ValueError("min_ratio is for an encoding codec (jpeg, zlib), not raw")
        return self

    @property
    def encoded(self) -> bool:
        """Whether samples may be stored as other than raw rows (format version 3)."""
        return self.kind != "raw"

    def shaping(self) -> dict[str, Any]:
        """Its part of the output-shaping config (`PipelineConfig.output_shaping`)."""
        values: dict[str, Any] = {"kind": self.kind, "min_ratio": self.min_ratio}
        if self.kind == "jpeg":
            values["quality"] = self.quality
        if self.original:  # only when set: datasets packed before the key keep their digest
            values["original"] = True
        return values


def parse_codec(value: Any) -> Any:
    """`codec: jpeg` is `codec: {kind: jpeg}`."""
    return {"kind": value} if isinstance(value, str) else value
