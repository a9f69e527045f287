"""What every config model shares: strict frozen models, byte sizes, colours and locations."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
)

from etl.format.names import is_url

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


class StrictModel(BaseModel):
    """Unknown keys are errors; a loaded config never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_location(value: Any) -> Path | str:
    """A local path (a Path, relative ones resolved against the config's folder later), or an
    object-storage URL kept as text, without a trailing '/'."""
    if isinstance(value, Path):
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a path or a URL such as s3://bucket/prefix, got {value!r}")
    if is_url(value):
        return value.rstrip("/")
    return Path(value.removeprefix("file://"))


Location = Annotated[Path | str, PlainValidator(parse_location)]
"""`source.path` of a kind that reads objects too: a Path, or a URL (str)."""
