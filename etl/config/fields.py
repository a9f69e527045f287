"""What every config model shares: strict frozen models, byte sizes, colours and locations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
)

from etl.format.sizes import parse_byte_size
from etl.storage.location import StoreUrl, as_location

__all__ = ["parse_byte_size"]  # here for the config models; lives in etl.format for the loaders

ByteSize = Annotated[int, BeforeValidator(parse_byte_size), Field(gt=0)]
Color = tuple[
    Annotated[int, Field(ge=0, le=255)],
    Annotated[int, Field(ge=0, le=255)],
    Annotated[int, Field(ge=0, le=255)],
]


class StrictModel(BaseModel):
    """Unknown keys are errors; a loaded config never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_location(value: Any) -> Path | StoreUrl:
    """A local path (a Path, relative ones resolved against the config's folder later), or an
    object-storage URL (`StoreUrl`, without a trailing '/'): `as_location`'s parse."""
    if isinstance(value, Path):
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a path or a URL such as s3://bucket/prefix, got {value!r}")
    return as_location(value)


Location = Annotated[Path | str, PlainValidator(parse_location)]
"""`source.path` of a kind that reads objects too, and `output.dir`: a Path, or a `StoreUrl`
(a str) for a location in object storage."""
