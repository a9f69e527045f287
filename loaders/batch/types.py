"""The batch types every loader here yields, and the pageable buffers batches are gathered
into in one process (`BufferPool`). Where a batch's memory comes from is `loaders.memory`'s
choice.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, overload

import numpy as np
import torch
from numpy.typing import NDArray

Fill = Callable[[NDArray[np.uint8]], None]
"""Writes a batch into the C-contiguous uint8 array it is given (shaped like the batch)."""


class Batch(NamedTuple):
    """A batch as every loader here yields it: `images, labels = batch` works."""

    images: torch.Tensor
    """uint8 [B, *sample_shape] in the stored layout (HWC or CHW), unless a transform changed it."""
    labels: torch.Tensor
    """int64 [B]."""


class IndexedBatch(NamedTuple):
    """A batch with the dataset index of each sample (`make_loader(..., with_indices=True)`):
    `images, labels, indices = batch`; `dataset.manifest_rows(indices)` names the samples."""

    images: torch.Tensor
    labels: torch.Tensor
    indices: torch.Tensor
    """int64 [B]: indices into the dataset the loader reads."""


class ColumnBatch(NamedTuple):
    """A batch with per-sample columns (a dataset opened with `columns=[...]`):
    `images, labels, indices, columns = batch`."""

    images: torch.Tensor
    labels: torch.Tensor
    indices: torch.Tensor
    columns: dict[str, torch.Tensor | list[Any]]
    """Per column, a tensor [B, ...] when its values all have one shape (numbers, lists of one
    length), else a list of B Python values (text, structs, ragged lists, nulls): see
    `etl.format.values`."""


AnyBatch = Batch | IndexedBatch | ColumnBatch

SIZE_COLUMNS = ("sample.height", "sample.width")
"""The columns of a padded batch (samples of several sizes, a `Mixture` of several shapes)
that say each sample's own size; names no declared per-sample column can have.
`DeviceLoader` hands them to the augmentation, which crops from each sample's own image."""

STORED_COLUMNS = ("sample.bytes", "sample.codec")
"""The columns of a batch of samples still encoded, back to back (`PackedLoader.send_encoded`):
each one's stored bytes and codec (`etl.format.codecs.CODECS`), beside `SIZE_COLUMNS`; the
device decodes them (`loaders.device_decode`)."""

Columns = dict[str, NDArray[Any] | list[Any]]
"""A batch's per-sample column values as `SampleValues.batch` gives them."""


def make_batch(
    images: torch.Tensor,
    labels: NDArray[np.int64],
    indices: NDArray[np.int64] | None,
    pin: bool = False,
    columns: Columns | None = None,
) -> AnyBatch:
    """A Batch, or an IndexedBatch when `indices` are given, or a ColumnBatch with `columns`
    (and indices); with `pin`, its labels (and column tensors) in pinned memory like its images
    (a pageable label copy would wait for the image copy before it: see `DeviceLoader`).
    Indices stay pageable: they are read on the CPU."""
    label_tensor = torch.from_numpy(labels)
    if pin:
        label_tensor = label_tensor.pin_memory()
    if columns is not None:
        assert indices is not None, "a batch with columns carries its indices"
        tensors = {name: _column_tensor(value, pin) for name, value in columns.items()}
        return ColumnBatch(images, label_tensor, torch.from_numpy(indices), tensors)
    if indices is None:
        return Batch(images, label_tensor)
    return IndexedBatch(images, label_tensor, torch.from_numpy(indices))


def _column_tensor(value: NDArray[Any] | list[Any], pin: bool) -> torch.Tensor | list[Any]:
    if isinstance(value, list):
        return value
    tensor = torch.from_numpy(np.ascontiguousarray(value))
    return tensor.pin_memory() if pin else tensor


class Samples(Sequence[tuple[Any, ...]]):
    """A gathered batch as `Dataset.__getitems__` must return it: a sequence of samples.

    `samples[i]` is `(image, label)` (with its index for an IndexedBatch), a view of the batch,
    so DataLoader's default collate (or any collate_fn) works on it; `collate_batch` hands on
    the batch itself, without a copy.
    """

    def __init__(self, batch: AnyBatch) -> None:
        self.batch = batch

    def __len__(self) -> int:
        return len(self.batch.labels)

    @overload
    def __getitem__(self, i: int) -> tuple[Any, ...]: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[tuple[Any, ...]]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        batch = self.batch
        if isinstance(batch, ColumnBatch):
            columns = {name: value[i] for name, value in batch.columns.items()}
            return (batch.images[i], int(batch.labels[i]), int(batch.indices[i]), columns)
        images, labels, *rest = batch
        return (images[i], int(labels[i]), *(int(r[i]) for r in rest))


class BufferPool:
    """Pageable uint8 buffers for one process, each lent to one batch at a time.

    A lent buffer comes back when the last reference to the batch's memory goes away (a
    finalizer on the numpy view the batch tensor is made from: every tensor view, `.numpy()`
    array or DLPack capsule of the batch keeps that view alive), so a batch the caller keeps is
    never overwritten. At most `keep` idle buffers are kept.
    """

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._idle: list[NDArray[np.uint8]] = []

    def lend(self, shape: tuple[int, ...]) -> NDArray[np.uint8]:
        """An uninitialised uint8 array of `shape` that nothing else refers to.

        NOTE: wrap exactly the array returned (torch.from_numpy keeps that object alive): a
        numpy view of it (`.reshape`) refers to the buffer directly, not to it, so keeping only
        such a view would let the buffer be lent again while still in use.
        """
        nbytes = math.prod(shape)
        buffer = None
        # NOTE: the smallest idle buffer that fits, the others kept: batches padded to their
        # largest sample (samples that keep their aspect ratio) vary in size, and dropping a
        # buffer too small for one batch made the next a fresh allocation, faulted in again.
        idle = list(self._idle)
        fits = sorted((b.nbytes, i) for i, b in enumerate(idle) if b.nbytes >= nbytes)
        for _, i in fits:
            taken = [j for j, b in enumerate(self._idle) if b is idle[i]]  # by identity
            if taken:  # another thread may have taken it since
                buffer = self._idle.pop(taken[0])
                break
        if buffer is None:
            # NOTE: torch aligns to 64 bytes, np.empty here to 16: copies into it ran ~4% slower.
            buffer = torch.empty(nbytes, dtype=torch.uint8).numpy()
        view = buffer[:nbytes].reshape(shape)
        weakref.finalize(view, self._give_back, buffer).atexit = False
        return view

    def _give_back(self, buffer: NDArray[np.uint8]) -> None:
        if len(self._idle) < self.keep:
            self._idle.append(buffer)
