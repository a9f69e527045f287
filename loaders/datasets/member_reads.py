"""A `Mixture`'s batch read member by member, where its members cannot share one reader: each
member's part of the batch (its shards and rows, and places where its shards are flat) read by
that member's reader into its rows of the batch, padded to the largest sample, or back to back.
And the checks that make members one mixture: one layout, one channel count, a sample for every
weight above 0."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np
from numpy.typing import NDArray

from etl.format.flat import channels_of, sides_of
from loaders.datasets.packed import PackedDataset
from loaders.order.mixture_orders import Schedule

Flat = tuple[NDArray[np.int64], NDArray[np.int64] | None]
"""A member's samples of flat shards: their places, and (stored encoded) their stored bytes
and codecs (`Selection.places`, `Selection.stored`)."""
Part = tuple[int, int, int, NDArray[np.int32], NDArray[np.int64], Flat | None]
"""One member's samples of a batch: (member, start, stop in the batch, shard_idx, rows, and
where its shards are flat, their places)."""


def check_members(members: Sequence[PackedDataset], schedule: Schedule) -> None:
    """ValueError unless every weight of `schedule` names a member, a member with a weight
    above 0 has samples, and members store one layout and channel count."""
    for step, vector in schedule:
        if len(vector) > len(members):
            raise ValueError(f"weights at step {step} name {len(vector)} members of {len(members)}")
        empty = [i for i, m in enumerate(members) if len(m) == 0 and vector[i] > 0]
        if empty:
            raise ValueError(f"member {empty[0]} has no sample but a weight above 0")
    layouts = {m.layout for m in members}
    channels = {channels_of(m.sample_shape, m.layout) for m in members}
    if len(layouts) > 1 or len(channels) > 1:
        raise ValueError(
            f"members store {sorted(layouts)} samples of {sorted(channels)} channels: a "
            "batch holds one layout and one channel count; pack them alike"
        )


def member_parts(
    members: Sequence[PackedDataset],
    offsets: NDArray[np.int64],
    labels_of: Sequence[NDArray[np.int64]],
    index: NDArray[np.int64],
    member: NDArray[np.int64],
) -> tuple[NDArray[np.int64], list[Part]]:
    """The mixture labels of a batch of mixture `index` grouped by `member` (ascending), and
    each member's part of it; `labels_of[m]` renumbers member m's labels."""
    bounds = np.searchsorted(member, np.arange(len(members) + 1))
    labels = np.empty(len(index), dtype=np.int64)
    parts: list[Part] = []
    for m, (start, stop) in enumerate(pairwise(bounds)):
        if start == stop:
            continue
        local = index[start:stop] - offsets[m]
        sel = members[m].selection
        labels[start:stop] = labels_of[m][sel.labels[local]]
        flat = None
        if sel.places is not None:
            flat = sel.places[local], None if sel.stored is None else sel.stored[local]
        parts.append((m, int(start), int(stop), sel.shard_idx[local], sel.rows[local], flat))
    return labels, parts


def part_sizes(
    members: Sequence[PackedDataset], parts: list[Part], member: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Each sample's own (heights, widths): its member's stored sides, or its own place's."""
    sides = [sides_of(m.sample_shape, m.layout) for m in members]
    heights = np.asarray([h for h, _ in sides], dtype=np.int64)[member]
    widths = np.asarray([w for _, w in sides], dtype=np.int64)[member]
    for _, start, stop, _, _, flat in parts:
        if flat is not None:
            heights[start:stop], widths[start:stop] = flat[0][:, 1], flat[0][:, 2]
    return heights, widths


def fill_rows(members: Sequence[PackedDataset], parts: list[Part], out: NDArray[np.uint8]) -> None:
    """Each member's samples of a batch into their rows of `out` (members of one shape)."""
    for m, start, stop, shard_idx, rows, flat in parts:
        reader, layout = members[m].reader, members[m].layout
        if flat is not None:  # stored encoded: decoded into its rows
            reader.gather_flat(shard_idx, rows, flat[0], layout, out[start:stop], flat[1])
        else:
            reader.gather(shard_idx, rows, out[start:stop])


def fill_padded(
    members: Sequence[PackedDataset], parts: list[Part], out: NDArray[np.uint8]
) -> None:
    """Each member's samples of a batch into their rows of `out`, padded to its shape."""
    for m, start, stop, shard_idx, rows, flat in parts:
        reader, layout = members[m].reader, members[m].layout
        if flat is not None:  # samples of flat shards: padded where they go
            reader.gather_flat(shard_idx, rows, flat[0], layout, out[start:stop], flat[1])
            continue
        own = np.empty((stop - start, *members[m].sample_shape), dtype=np.uint8)
        reader.gather(shard_idx, rows, own)
        padded = out[start:stop]
        padded.fill(0)
        padded[tuple(slice(0, d) for d in (stop - start, *own.shape[1:]))] = own


def fill_back_to_back(
    members: Sequence[PackedDataset],
    parts: list[Part],
    ends: NDArray[np.int64],
    out: NDArray[np.uint8],
) -> None:
    """Each member's samples of a batch into 1-d `out`, one after another, sample k's bytes
    ending at `ends[k + 1]`."""
    for m, start, stop, shard_idx, rows, flat in parts:
        reader, layout = members[m].reader, members[m].layout
        bytes_of = out[int(ends[start]) : int(ends[stop])]
        if flat is not None:
            reader.gather_flat(shard_idx, rows, flat[0], layout, bytes_of, flat[1])
        else:
            own = bytes_of.reshape(stop - start, *members[m].sample_shape)
            reader.gather(shard_idx, rows, own)
