"""Samples that keep their aspect ratio (format version 2): where one lives and what shape it has.

A shard of such samples is one flat uint8 `.npy` array of their bytes, one after the other in
row order; the manifest row of a sample says where its bytes start (`sample_offset`, in the
array) and its stored `sample_height` and `sample_width` (docs/FORMAT.md). Fixed-size shards
are [rows, *sample_shape] arrays; these helpers read a sample of either kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

Place = tuple[int, int, int]
"""(byte offset in the shard's data, stored height, stored width) of one sample."""


def channels_of(sample_shape: tuple[int, ...], layout: str) -> int:
    """The channels of a sample shape in `layout`."""
    return int(sample_shape[2] if layout == "HWC" else sample_shape[0])


def place_of(row: Mapping[str, Any]) -> Place:
    """The place a manifest row (a dict of its columns) gives its sample."""
    return int(row["sample_offset"]), int(row["sample_height"]), int(row["sample_width"])


def shape_of(height: int, width: int, channels: int, layout: str) -> tuple[int, int, int]:
    """A sample's array shape in `layout`."""
    return (height, width, channels) if layout == "HWC" else (channels, height, width)


def sides_of(shape: tuple[int, ...], layout: str) -> tuple[int, int]:
    """(height, width) of a sample array of `shape` in `layout`."""
    return (int(shape[0]), int(shape[1])) if layout == "HWC" else (int(shape[1]), int(shape[2]))


def stored_sample(
    shard: NDArray[np.uint8],
    row: int,
    place: Place | None,
    sample_shape: tuple[int, ...],
    layout: str,
) -> NDArray[Any]:
    """Sample `row` of an opened shard (`etl.format.shards.open_shard`): its row, or where
    samples keep their aspect ratio (a `place`), its bytes in the flat array, shaped. A view;
    ValueError where the place runs past the end of the shard."""
    if place is None:
        return shard[row]
    offset, height, width = place
    shape = shape_of(height, width, channels_of(sample_shape, layout), layout)
    data = shard[offset : offset + int(np.prod(shape))]
    if offset < 0 or data.size != int(np.prod(shape)):
        raise ValueError(f"row {row} at byte {offset} runs past the end of its shard")
    return data.reshape(shape)
