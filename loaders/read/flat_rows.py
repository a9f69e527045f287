"""Samples of a flat shard (their own size, format version 2; stored encoded, 3) copied out of
its bytes into a batch: padded to the batch's largest sides, or back to back in a 1-d batch
(what `DeviceLoader` asks for, see `loaders.batch.ragged`), each row checked as it is copied, and an
encoded one decoded after its check (`etl.format.codecs`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
from numpy.typing import NDArray

from etl.errors import ShardError
from etl.format.codecs import RAW, DecodeFailure, decode
from etl.format.flat import shape_of
from etl.format.row_checksums import mismatch
from loaders.read.catalog import ShardSet
from loaders.read.span import resident
from loaders.read.threads import SPREAD_BYTES, run_each, spread

Put = Callable[[int, NDArray[np.uint8], int, int], None]
"""put(j, data, height, width): sample j's flat bytes into its place in the batch."""


def batch_writer(out: NDArray[np.uint8], places: NDArray[np.int64], layout: str) -> tuple[Put, int]:
    """(put, channels) for the batch `out` of samples at `places` (offset, height, width): a
    padded batch [B, H, W, C] (or [B, C, H, W]), or a 1-d one that takes them back to back,
    with as many channels as its bytes hold."""
    pixels = places[:, 1] * places[:, 2]
    if out.ndim == 1:
        channels = out.size // max(int(pixels.sum()), 1)
        if channels * int(pixels.sum()) != out.size:
            raise ValueError(f"{out.size} bytes do not hold samples of {pixels.sum()} pixels")
        return partial(put_back_to_back, out, np.cumsum(pixels * channels).tolist()), channels
    hwc = layout == "HWC"
    channels = out.shape[3] if hwc else out.shape[1]
    return partial(put_padded, out, channels=channels, hwc=hwc), channels


def stored_lengths(
    places: NDArray[np.int64], stored: NDArray[np.int64] | None, channels: int
) -> NDArray[np.int64]:
    """Bytes each sample at `places` takes in its shard: its `stored` bytes where samples are
    stored encoded (`Selection.stored`), else its pixels'."""
    if stored is not None:
        return stored[:, 0]
    return places[:, 1] * places[:, 2] * channels


Take = Callable[[int, NDArray[np.uint8], int, int, int], None]
"""take(j, data, height, width, codec): what becomes of sample j's stored bytes once checked
(`codec`: its index in `etl.format.codecs.CODECS`)."""


def decode_failure(shard_set: ShardSet, shard: int, row: int, exc: Exception) -> ShardError:
    """The error for a row whose checked bytes do not decode: it names the shard and row (and
    the repair), never a crash in the decoder or a wrong-sized sample."""
    failure = ShardError(f"{shard_set.path(shard)}: row {row} does not decode ({exc})")
    return shard_set.unreadable(shard, failure)


def pixels_taker(
    put: Put,
    shard_set: ShardSet,
    shard: NDArray[np.int64],
    row: NDArray[np.int64],
    channels: int,
    layout: str,
    out: NDArray[np.uint8] | None = None,
) -> Take:
    """The `Take` that puts each sample's pixels into a batch with `put`: raw bytes as they
    are, encoded ones decoded to the sample's (height, width) first, straight into `out[j]`
    (the batch `put` writes) where the sample fills that slot."""

    def take(j: int, data: NDArray[np.uint8], height: int, width: int, codec: int) -> None:
        if codec == RAW:
            put(j, data, height, width)
            return
        shape = shape_of(height, width, channels, layout)
        slot = out[j] if out is not None and out.ndim == 4 and out.shape[1:] == shape else None
        whole = slot is not None
        try:  # NOTE: straight into a slot it fills (a fixed-size batch): 15% of a 224 sample
            pixels = decode(data, codec, shape, slot)
        except DecodeFailure as exc:
            raise decode_failure(shard_set, int(shard[j]), int(row[j]), exc) from None
        if not whole:
            put(j, pixels.reshape(-1), height, width)

    return take


def copy_flat(
    arrays: dict[int, NDArray[np.uint8]],
    shard_set: ShardSet,
    shard: NDArray[np.int64],
    row: NDArray[np.int64],
    places: NDArray[np.int64],
    take: Take,
    channels: int,
    stored: NDArray[np.int64] | None = None,
) -> None:
    """Hand each sample (shard[j], row[j]) at places[j], its bytes sliced out of its shard's
    flat array in `arrays` (`stored`: each one's bytes and codec), to `take`; a row the loader
    checks is hashed first, and a mismatch or a sample past its shard's end is a ShardError
    naming it."""
    sums, seen = shard_set.row_sums, shard_set.seen()
    hashed = np.zeros(len(row), dtype=bool)  # rows checked as they are copied
    at = np.zeros(len(row), dtype=np.int64)
    if sums is not None:
        at, todo = sums.unchecked(shard, row, seen)
        hashed[todo] = True
    lengths = stored_lengths(places, stored, channels).tolist()
    codecs = stored[:, 1].tolist() if stored is not None else [RAW] * len(row)
    shards, where = shard.tolist(), places.tolist()

    def hand_over(first: int, stop: int) -> None:
        for j in range(first, stop):
            s, (offset, height, width), size = shards[j], where[j], lengths[j]
            data = arrays[s][offset : offset + size]
            if len(data) != size:
                raise shard_set.unreadable(s, ShardError(f"row {row[j]} runs past its end"))
            if sums is not None and hashed[j] and not sums.matches(int(at[j]), data):
                raise shard_set.unreadable(s, mismatch(shard_set.path(s), int(row[j])))
            take(j, data, height, width, codecs[j])

    # NOTE [ samples handed over on threads ]: each thread checks and hands over a share of
    # the batch, in order within it; the first failure in batch order is the one raised.
    # Decoding a JPEG is the work (~0.25 ms a 224 sample), so encoded batches always spread;
    # raw ones by their bytes (`spread`).
    encoded = any(codec != RAW for codec in codecs)
    nbytes = sum(lengths) * (SPREAD_BYTES if encoded else 1)
    run_each([partial(hand_over, a, b) for a, b in spread(len(row), nbytes)])
    if seen is not None and hashed.any():
        seen[at[hashed]] = True


def places_resident(
    arrays: dict[int, NDArray[np.uint8]], shard: NDArray[np.int64], places: NDArray[np.int64]
) -> bool:
    """Whether the first page of up to 4 samples spread over a batch of samples of their
    own size is in memory: the probe a reader makes of fixed-size rows, so a DataLoader
    worker's cold batch is read ahead all at once, a cached one costs 4 `mincore` calls."""
    picked = np.arange(0, len(shard), -(-len(shard) // 4) or 1)
    bases = {s: arrays[s].ctypes.data for s in np.unique(shard[picked]).tolist()}
    starts = [bases[s] + offset for s, offset in zip(
        shard[picked].tolist(), places[picked, 0].tolist(), strict=True
    )]  # fmt: skip
    return resident(np.asarray(starts, dtype=np.int64))


def put_padded(
    out: NDArray[np.uint8],
    j: int,
    data: NDArray[np.uint8],
    height: int,
    width: int,
    *,
    channels: int,
    hwc: bool,
) -> None:
    """Sample `data` (flat, `height` x `width` x `channels` in the stored layout) into the
    top-left corner of out[j], the rest of out[j] zeros.

    NOTE: only the padding is zeroed, not the whole batch: a batch padded to 512x512 is mostly
    its samples, and filling it first wrote it twice."""
    if hwc:
        out[j, :height, :width] = data.reshape(height, width, channels)
        out[j, height:] = 0
        out[j, :height, width:] = 0
    else:
        out[j, :, :height, :width] = data.reshape(channels, height, width)
        out[j, :, height:] = 0
        out[j, :, :height, width:] = 0


def put_back_to_back(
    out: NDArray[np.uint8], ends: list[int], j: int, data: NDArray[np.uint8], *_: int
) -> None:
    """Sample `data` (flat) into 1-d `out` as the j-th of samples back to back ending at `ends`."""
    out[ends[j] - data.size : ends[j]] = data


def back_to_back_bytes(places: NDArray[np.int64], channels: int) -> int:
    """Bytes of samples at `places` (offset, height, width) stored one after another."""
    return int((places[:, 1] * places[:, 2]).sum()) * channels


def padded_shape(
    count: int, places: NDArray[np.int64], channels: int, layout: str
) -> tuple[int, ...]:
    """The shape of a batch of `count` samples that keep their aspect ratio, padded to the
    largest height and width among their `places` (offset, height, width)."""
    height, width = (int(places[:, k].max(initial=1)) for k in (1, 2))
    return (count, *shape_of(height, width, channels, layout))
