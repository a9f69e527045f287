"""The `columns:` section: per-sample columns a source carries into the manifest (a caption,
boxes, any attribute), each with its type and where the source holds it.

    columns:
      caption: string                       # the source's 'caption'
      boxes: list<list<float32>>
      quality: {type: float32, from: score, required: true}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field, field_validator

from etl.config.fields import StrictModel


class ColumnConfig(StrictModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    type: str
    """list<T>, struct<name: T, ...> or one of etl.format.sample_columns.SIMPLE_TYPES."""
    from_: str | None = Field(default=None, alias="from", min_length=1)
    """The source's name for it (a listing's column, a record's key, a WebDataset sample's
    JSON key or '.ext' member); the column's own name by default."""
    required: bool = False
    """A sample without a value is a reject ('bad_column'); otherwise it is stored as null."""

    @field_validator("type")
    @classmethod
    def _known_type(cls, text: str) -> str:
        from etl.format.sample_columns import parse_type, type_name  # imports pyarrow

        return type_name(parse_type(text))


def _short_form(value: Any) -> Any:
    """`caption: string` stands for `caption: {type: string}`."""
    return {"type": value} if isinstance(value, str) else value


Columns = Mapping[str, Annotated[ColumnConfig, BeforeValidator(_short_form)]]


def check_column_names(columns: Mapping[str, ColumnConfig]) -> None:
    """ValueError for a name that is not an identifier or that the manifest uses itself."""
    from etl.format.sample_columns import NAME
    from etl.format.schema import SAMPLES_SCHEMA

    for name in columns:
        if not NAME.match(name):
            raise ValueError(
                f"columns.{name}: a column name is letters, digits and '_', not starting "
                "with a digit (64 at most)"
            )
        if name in SAMPLES_SCHEMA.names:
            raise ValueError(
                f"columns.{name}: the manifest has a column {name!r} already; "
                f"use another name and from: {name}"
            )
