"""The report's pictures: 96 px JPEG data URIs of stored samples and of rejected sources, or
a note saying why there is none; and counting an Arrow column's values, which the report's
sections share."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from PIL import Image

from etl.errors import EtlError
from etl.explore.dataset import Dataset
from etl.explore.drawing import thumbnail

THUMB = 96
"""Thumbnail side in px."""


@dataclass(frozen=True)
class Thumb:
    """One picture of the report: a JPEG data URI, or None and `note` saying why there is none."""

    uri: str | None
    lines: tuple[str, ...]
    note: str = ""
    alt: str = ""
    """The picture's text for screen readers (its caption lines where empty)."""


def to_uri(image: Image.Image) -> str:
    """A 96 px JPEG data URI of `image` (deterministic: same pixels, same bytes)."""
    small = thumbnail(image.convert("RGB") if image.mode not in ("RGB", "L") else image, THUMB)
    buffer = io.BytesIO()
    small.save(buffer, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def sample_thumb(ds: Dataset, position: int, lines: tuple[str, ...]) -> Thumb:
    """A stored sample's thumbnail, or a note where its shard cannot be read."""
    try:
        return Thumb(to_uri(ds.image(position, longest=THUMB)), lines)
    except (EtlError, OSError, ValueError) as exc:
        return Thumb(None, lines, f"not available: {exc}")


def value_counts(column: pa.ChunkedArray, top: int | None = None) -> list[tuple[str, int]]:
    """Values and their counts, most frequent first (ties by value): one pass in Arrow."""
    if len(column) == 0:
        return []
    found = pc.value_counts(column)
    pairs = [
        (str(v), int(n))
        for v, n in zip(
            found.field("values").to_pylist(), found.field("counts").to_pylist(), strict=True
        )
        if v is not None
    ]
    pairs.sort(key=lambda p: (-p[1], p[0]))
    return pairs[:top] if top is not None else pairs
