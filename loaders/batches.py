"""The batch type, and the memory a batch is gathered into: chosen for where the batch goes next.

- In the main process, pageable: a few buffers, each lent to one batch at a time and taken back
  once nothing refers to that batch any more (`BufferPool`).
- In the main process, pinned (CUDA present, num_workers=0): torch's caching host allocator.
- In a DataLoader worker: a slot of a `SharedRing` that the main process mapped once, sent as a
  slot number; without a ring or a free slot, a fresh shared-memory buffer, as `default_collate`
  would use.

NOTE [ why reuse batch memory ]: measured with benchmarks/bench_loaders.py (3 MiB batches, 2-core
VM). A fresh 3 MiB buffer per batch comes from the heap top, which glibc gives back to the kernel
on free, so every batch faulted its pages in again (~70 faults, ~0.2 ms of system time per batch
in the main process). A worker's fresh shared-memory batch cost far more: the main process
fetches each tensor's file descriptor from the worker's resource-sharer thread (a socket
connection with an authentication handshake), which waits for the worker's GIL while it gathers
the next batch: 3-4 ms per tensor, two tensors per batch, ~1.5-2 ms of main-process CPU and
~5-6 ms of workers' CPU per batch, so 2 workers delivered ~0.25x of 0 workers. Through the ring:
~0.45 ms and ~1.45 ms, labels sent inline with the slot number.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import secrets
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, overload

import numpy as np
import torch
from numpy.typing import NDArray
from torch.utils.data import get_worker_info

from loaders.span import prefault

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


def _shared_bytes(nbytes: int) -> torch.Tensor:
    """A 1-d uint8 tensor in fresh shared memory, allocated there (no copy, no page touched)."""
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=torch.uint8).set_(storage)


_RINGS: weakref.WeakValueDictionary[str, SharedRing] = weakref.WeakValueDictionary()
"""The rings of this process by token, for `_receive` (a slot arrives as a token and a number)."""

_MAIN = -1
"""`SharedRing.owner` value of a slot whose batch the main process holds."""


class SharedRing:
    """Batch-sized slots of shared memory, filled by DataLoader workers, read in place by the
    main process, which maps them once (they are created there, before the workers start).

    `owner[slot]` says who holds a slot: 0 nobody, a worker's pid while it fills it and the
    batch is on its way, -1 (`_MAIN`) once the main process received it. Workers claim free
    slots under `lock`; the main process frees a slot when its batch is no longer referenced.

    NOTE [ ring safety ]: a slot is reused only after the main process dropped every reference
    to the batch in it (a finalizer on the numpy view the batch tensor wraps), so batches a
    training loop keeps (`list(loader)`) stay intact; workers then find no free slot and fall
    back to a fresh shared buffer per batch. A slot still held by a dead worker (an iterator
    abandoned mid-epoch shuts its workers down before their last batches are read) is taken
    back. The finalizer only acts in the process that received the batch: a process forked
    later inherits the finalizer but must not free the slot. Each loader gets its own ring.
    """

    def __init__(self, slots: int, slot_bytes: int, context: Any) -> None:
        if slots < 1 or slot_bytes < 1:
            raise ValueError(f"a ring needs slots and slot_bytes >= 1, got {slots}, {slot_bytes}")
        self.token = secrets.token_hex(8)
        self.slot_bytes = slot_bytes
        self.data = _shared_bytes(slots * slot_bytes).view(slots, slot_bytes)
        self.owner = torch.zeros(slots, dtype=torch.int64).share_memory_()
        self.lock = context.Lock()
        self._numpy: tuple[NDArray[np.uint8], NDArray[np.int64]] | None = None
        _RINGS[self.token] = self

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_numpy": None}  # the tensors travel, not views of them

    def __len__(self) -> int:
        return len(self.owner)

    def arrays(self) -> tuple[NDArray[np.uint8], NDArray[np.int64]]:
        """numpy views of `data` and `owner`, made once per process (cheaper to index)."""
        if self._numpy is None:
            self._numpy = (self.data.numpy(), self.owner.numpy())
        return self._numpy

    def claim(self, nbytes: int) -> int | None:
        """A free slot for this worker, or None when all are taken (or `nbytes` is too big)."""
        if nbytes > self.slot_bytes or not self.lock.acquire(timeout=1.0):
            return None
        try:
            owner = self.arrays()[1]
            free = np.flatnonzero(owner == 0).tolist()
            if not free:
                free = [s for s in np.flatnonzero(owner > 0).tolist() if not _alive(owner[s])]
            if not free:
                return None
            owner[free[0]] = os.getpid()
            return int(free[0])
        finally:
            self.lock.release()

    def write(
        self,
        slot: int,
        shape: tuple[int, ...],
        fill: Fill,
        labels: NDArray[np.int64],
        indices: NDArray[np.int64] | None = None,
        columns: Columns | None = None,
    ) -> Batch:
        """Fill a claimed slot; the batch pickles as the slot number, not the bytes (and
        arrives as an IndexedBatch when `indices` are given, a ColumnBatch with `columns`,
        which travel with the slot number)."""
        data, owner = self.arrays()
        try:
            images = data[slot, : math.prod(shape)].reshape(shape)
            prefault(images)  # NOTE [ prefault the ring ] in loaders.span
            fill(images)
        except BaseException:
            owner[slot] = 0
            raise
        batch = _RingBatch(torch.from_numpy(images), torch.from_numpy(labels))
        batch.slot = (self.token, slot, os.getpid(), shape, labels, indices, columns)
        return batch

    def _free(self, slot: int, receiver: int) -> None:
        if os.getpid() == receiver:
            self.arrays()[1][slot] = 0


class _RingBatch(Batch):
    """A Batch in a ring slot, in a worker; unpickled in the main process as a plain Batch."""

    slot: tuple[
        str, int, int, tuple[int, ...], NDArray[np.int64], NDArray[np.int64] | None, Columns | None
    ]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_receive, self.slot)


def _receive(
    token: str,
    slot: int,
    worker: int,
    shape: tuple[int, ...],
    labels: NDArray[np.int64],
    indices: NDArray[np.int64] | None,
    columns: Columns | None = None,
) -> AnyBatch:
    """The main process's side of a ring slot: a Batch viewing it, freeing it when dropped."""
    ring = _RINGS.get(token)
    if ring is None:
        raise RuntimeError(
            "a batch arrived in a shared-memory slot of a ring this process does not have; "
            "datasets given a ring by make_loader must be read by that loader's workers only"
        )
    data, owner = ring.arrays()
    if owner[slot] != worker:
        raise RuntimeError(f"ring slot {slot} changed hands before its batch was read")
    owner[slot] = _MAIN
    view = data[slot, : math.prod(shape)].reshape(shape)  # the object the batch tensor wraps
    weakref.finalize(view, ring._free, slot, os.getpid()).atexit = False
    return make_batch(torch.from_numpy(view), labels, indices, columns=columns)


def _alive(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class BatchMemory:
    """Where the batches of one dataset are gathered (see the module docstring).

    `pin`: gather into pinned memory in the main process (make_loader sets it for num_workers=0
    with CUDA). `ring`: the slots its DataLoader workers fill (make_loader makes one per loader).
    """

    def __init__(self, pin: bool = False, ring: SharedRing | None = None) -> None:
        self.pin = pin
        self.ring = ring
        self.back_to_back = False
        """Whether a batch of samples of several sizes comes with its samples one after another
        (1-d images) rather than padded: set by `PackedLoader.send_back_to_back`."""
        self._pool = BufferPool()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = BufferPool()  # idle buffers are process-local and not worth sending
        return state

    def batch(
        self,
        shape: tuple[int, ...],
        labels: NDArray[np.int64],
        fill: Fill,
        indices: NDArray[np.int64] | None = None,
        columns: Columns | None = None,
    ) -> AnyBatch:
        """A batch of uint8 images of `shape` written by `fill`, with int64 `labels` (and
        the samples' dataset `indices`, which make it an IndexedBatch, and their `columns`,
        which make it a ColumnBatch)."""
        nbytes = math.prod(shape)
        if get_worker_info() is not None:
            ring = self.ring
            slot = ring.claim(nbytes) if ring is not None else None
            if ring is not None and slot is not None:
                return ring.write(slot, shape, fill, labels, indices, columns)
            images = _shared_bytes(nbytes).view(shape)
        elif self.pin:
            images = torch.empty(shape, dtype=torch.uint8, pin_memory=True)
        else:
            lent = self._pool.lend(shape)
            fill(lent)
            return make_batch(torch.from_numpy(lent), labels, indices, columns=columns)
        fill(images.numpy())
        return make_batch(images, labels, indices, pin=self.pin, columns=columns)


_said_no_cuda = False


def resolve_pin_memory(pin_memory: bool | None) -> bool:
    """Pin when asked, or by default when CUDA is present; without CUDA say so once and don't."""
    global _said_no_cuda
    if pin_memory is False:
        return False
    if torch.cuda.is_available():
        return True
    if not _said_no_cuda:
        _said_no_cuda = True
        warnings.warn(
            "CUDA is not available: pin_memory is off and batches stay in pageable CPU memory",
            RuntimeWarning,
            stacklevel=4,
        )
    return False


def batch_memory(
    pin: bool,
    num_workers: int,
    prefetch_factor: int | None,
    batch_bytes: int | None,
    multiprocessing_context: Any,
) -> BatchMemory:
    """Where a loader's batches are gathered: pinned in-process, or a ring for its workers.

    The ring has a slot for every batch that can be in flight (DataLoader keeps
    `prefetch_factor` tasks per worker, and a worker claims a slot for the next task while the
    loop still holds the batch before the one just handed out) plus two more: one for
    `DeviceLoader`'s batch prepared ahead, one to spare. Batches held beyond that only make
    workers fall back to a fresh shared buffer for a while. No ring without workers, or for
    single samples (`batch_bytes` None).
    """
    if num_workers == 0:
        return BatchMemory(pin=pin)
    if batch_bytes is None:
        return BatchMemory()
    context = multiprocessing_context
    if context is None or isinstance(context, str):
        context = multiprocessing.get_context(context)
    slots = num_workers * (prefetch_factor or 2) + 4
    return BatchMemory(ring=SharedRing(slots, batch_bytes, context))
