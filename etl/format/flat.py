"""Samples of flat shards (format version 2: each its own size; 3: stored encoded): where one
lives and what shape it has.

A flat shard is one uint8 `.npy` array of its samples' bytes, one after the other in row order;
the manifest row of a sample says where its bytes start (`sample_offset`, in the array), its
`sample_height` and `sample_width`, and in version 3 its `sample_codec` and `sample_bytes`
(docs/FORMAT.md). Fixed-size shards are [rows, *sample_shape] arrays; these helpers read a
sample of any kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from etl.format.codecs import REDUCING_GAP, dct_factor, decode, decode_jpeg

Place = tuple[int, int, int]
"""(byte offset in the shard's data, stored height, stored width) of one sample."""
Encoding = tuple[int, str]
"""(stored bytes, codec) of a sample stored encoded (format version 3, `etl.format.codecs`)."""


def channels_of(sample_shape: tuple[int, ...], layout: str) -> int:
    """The channels of a sample shape in `layout`."""
    return int(sample_shape[2] if layout == "HWC" else sample_shape[0])


def place_of(row: Mapping[str, Any]) -> Place:
    """The place a manifest row (a dict of its columns) gives its sample."""
    return int(row["sample_offset"]), int(row["sample_height"]), int(row["sample_width"])


def encoding_of(row: Mapping[str, Any]) -> Encoding | None:
    """How a manifest row's sample is stored, where its version says (format version 3)."""
    if row.get("sample_codec") is None:
        return None
    return int(row["sample_bytes"]), str(row["sample_codec"])


def shape_of(height: int, width: int, channels: int, layout: str) -> tuple[int, int, int]:
    """A sample's array shape in `layout`."""
    return (height, width, channels) if layout == "HWC" else (channels, height, width)


def sides_of(shape: tuple[int, ...], layout: str) -> tuple[int, int]:
    """(height, width) of a sample array of `shape` in `layout`."""
    return (int(shape[0]), int(shape[1])) if layout == "HWC" else (int(shape[1]), int(shape[2]))


def stored_bytes(
    shard: NDArray[np.uint8],
    row: int,
    place: Place | None,
    sample_shape: tuple[int, ...],
    layout: str,
    encoding: Encoding | None = None,
) -> NDArray[Any]:
    """What sample `row` of an opened shard (`etl.format.shards.open_shard`) stores: its row,
    or in a flat shard (a `place`) its bytes, shaped as its pixels, or where it is stored
    encoded (an `encoding`), its encoded bytes, flat. A view (what a checksum covers, and what
    compaction and repair copy); ValueError where the place runs past the end of the shard."""
    if place is None:
        return shard[row]
    offset, height, width = place
    shape = shape_of(height, width, channels_of(sample_shape, layout), layout)
    size = int(np.prod(shape)) if encoding is None else encoding[0]
    data = shard[offset : offset + size]
    if offset < 0 or data.size != size:
        raise ValueError(f"row {row} at byte {offset} runs past the end of its shard")
    return data if encoding is not None else data.reshape(shape)


def stored_sample(
    shard: NDArray[np.uint8],
    row: int,
    place: Place | None,
    sample_shape: tuple[int, ...],
    layout: str,
    encoding: Encoding | None = None,
    longest: int | None = None,
) -> NDArray[Any]:
    """The pixels of sample `row` of an opened shard: `stored_bytes`, decoded where it is
    stored encoded. ValueError where the place runs past the end of the shard or the bytes do
    not decode to the sample its row describes (`etl.format.codecs.DecodeFailure`).
    `longest`: a preview whose longer side is shown at about that many pixels, so a JPEG is
    decoded at the smallest DCT scale that keeps twice that (a thumbnail of a 16k photo never
    allocates the photo); its pixels are then the reduced decode's."""
    data = stored_bytes(shard, row, place, sample_shape, layout, encoding)
    if encoding is None or place is None:
        return data
    _, height, width = place
    shape = shape_of(height, width, channels_of(sample_shape, layout), layout)
    if longest is not None and encoding[1] == "jpeg":
        scale = longest / max(height, width, 1)
        needed = (max(1, round(height * scale)), max(1, round(width * scale)))
        factor = dct_factor((height, width), needed, REDUCING_GAP)
        return decode_jpeg(data, shape, factor=factor)
    return decode(data, encoding[1], shape)
