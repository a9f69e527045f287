"""How a batch of a selection is read: its shape, the call that fills it, and the columns it
carries: rows of the stored shape, or samples of flat shards (their own size, padded or back to
back; or stored encoded, decoded to one size)."""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from loaders.batch.forms import BackToBackBatch, EncodedBatch, PaddedBatch, SizedBatch
from loaders.batch.types import SIZE_COLUMNS, STORED_COLUMNS, ColumnBatch, Columns, Fill
from loaders.read.catalog import Selection
from loaders.read.flat_rows import Take, back_to_back_bytes, padded_shape, stored_lengths
from loaders.read.reader import ShardReader


class BatchRead(NamedTuple):
    """How one batch is read: what `BatchMemory.batch` takes."""

    shape: tuple[int, ...]
    fill: Fill
    columns: Columns | None
    form: type[ColumnBatch] = ColumnBatch
    """The batch's type where it has columns: one of `loaders.batch.forms`' when its samples
    have several sizes."""


def batch_reads(
    reader: ShardReader,
    sel: Selection,
    index: NDArray[np.int64],
    columns: Columns | None,
    form: type[SizedBatch] = PaddedBatch,
) -> BatchRead:
    """How the batch of `index` (checked) is read for `BatchMemory.batch`: rows of the stored
    shape, or samples that keep their aspect ratio padded to their largest sides
    (`PaddedBatch`; asked for another `form`, one after another in a 1-d `BackToBackBatch`),
    with each one's size in `SIZE_COLUMNS` beside `columns`. Asked for an `EncodedBatch`,
    samples stored encoded come as their stored bytes back to back, with `STORED_COLUMNS` too,
    for the device to decode."""
    shard_idx, rows = sel.shard_idx[index], sel.rows[index]
    if sel.places is None:
        return BatchRead(
            (len(index), *sel.sample_shape), partial(reader.gather, shard_idx, rows), columns
        )
    places = sel.places[index]
    stored = sel.stored[index] if sel.stored is not None else None
    if (
        form is EncodedBatch and stored is not None
    ):  # for the device to decode: stored bytes back to back
        ends = np.cumsum(stored[:, 0])
        take = partial(_put_stored, ends)
        sizes = {SIZE_COLUMNS[0]: places[:, 1].copy(), SIZE_COLUMNS[1]: places[:, 2].copy()}
        kept = {STORED_COLUMNS[0]: stored[:, 0].copy(), STORED_COLUMNS[1]: stored[:, 1].copy()}

        def fill(out: NDArray[np.uint8]) -> None:
            reader.gather_flat(shard_idx, rows, places, sel.layout, None, stored, take(out))

        nbytes = int(ends[-1]) if len(ends) else 0
        return BatchRead((nbytes,), fill, {**(columns or {}), **sizes, **kept}, EncodedBatch)
    read = partial(reader.gather_flat, shard_idx, rows, places, sel.layout, stored=stored)
    if not sel.own_sizes:  # stored encoded at one size: a batch as a fixed-size one
        return BatchRead((len(index), *sel.sample_shape), read, columns)
    made: type[ColumnBatch] = PaddedBatch
    if form is not PaddedBatch:
        made = BackToBackBatch
        shape: tuple[int, ...] = (back_to_back_bytes(places, sel.channels),)
    else:
        shape = padded_shape(len(index), places, sel.channels, sel.layout)
    sizes = {SIZE_COLUMNS[0]: places[:, 1].copy(), SIZE_COLUMNS[1]: places[:, 2].copy()}
    return BatchRead(shape, read, {**(columns or {}), **sizes}, made)


def _put_stored(ends: NDArray[np.int64], out: NDArray[np.uint8]) -> Take:
    """The `Take` that puts sample j's checked stored bytes at its place in a 1-d `out`."""

    def take(j: int, data: NDArray[np.uint8], height: int, width: int, codec: int) -> None:
        out[int(ends[j]) - data.size : int(ends[j])] = data

    return take


def own_size_sample(reader: ShardReader, sel: Selection, i: int) -> NDArray[np.uint8]:
    """Sample `i` of a selection whose samples keep their aspect ratio, at its own size in the
    stored layout (decoded where stored encoded)."""
    assert sel.places is not None
    _, height, width = sel.places[i].tolist()
    sides = (height, width, sel.channels) if sel.layout == "HWC" else (sel.channels, height, width)
    out = np.empty((1, *sides), np.uint8)
    stored = sel.stored[[i]] if sel.stored is not None else None
    reader.gather_flat(sel.shard_idx[[i]], sel.rows[[i]], sel.places[[i]], sel.layout, out, stored)
    return out[0]


def prefetch_reads(reader: ShardReader, sel: Selection, index: NDArray[np.int64]) -> None:
    """Have the kernel start the reads of the batch of `index` (in range), as `batch_reads`
    would make them: rows, or each flat sample's stored bytes at its place."""
    if sel.places is None:
        reader.prefetch(sel.shard_idx[index], sel.rows[index])
        return
    stored = sel.stored[index] if sel.stored is not None else None
    lengths = stored_lengths(sel.places[index], stored, sel.channels)
    reader.prefetch_places(sel.shard_idx[index], sel.places[index], lengths)
