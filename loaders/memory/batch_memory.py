"""The memory a batch is gathered into, chosen for where the batch goes next.

- In the main process, pageable: a few buffers, each lent to one batch at a time and taken back
  once nothing refers to that batch any more (`BufferPool`).
- In the main process, pinned (CUDA present, num_workers=0): torch's caching host allocator.
- In a DataLoader worker: a slot of a `SharedRing` that the main process mapped once, sent as a
  slot number; without a ring or a free slot, a fresh shared-memory buffer, as `default_collate`
  would use.

NOTE [ why reuse batch memory ]: measured with benchmarks/load/throughput.py (3 MiB batches, 2-core
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
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch.utils.data import get_worker_info

from loaders.batch.forms import PaddedBatch, SizedBatch
from loaders.batch.types import AnyBatch, ColumnBatch, Columns, Fill, make_batch
from loaders.memory.buffer_pool import BufferPool
from loaders.memory.ring import SharedRing, shared_bytes
from loaders.read.timing import MakingTimes


class BatchMemory:
    """Where the batches of one dataset are gathered (see the module docstring).

    `pin`: gather into pinned memory in the main process (make_loader sets it for num_workers=0
    with CUDA). `ring`: the slots its DataLoader workers fill (make_loader makes one per loader).
    """

    def __init__(self, pin: bool = False, ring: SharedRing | None = None) -> None:
        self.pin = pin
        self.ring = ring
        self.form: type[SizedBatch] = PaddedBatch
        """The form asked of batches of samples of several sizes (`loaders.batch.forms`):
        padded, back to back (`PackedLoader.send_back_to_back`), or still encoded where stored
        so (`PackedLoader.send_encoded`)."""
        self._pool = BufferPool()
        self.times = MakingTimes()
        """The time batches took to make in this process (`loaders.loader.stats`)."""
        self.gathered = 0
        """Batches asked for in this process (`gathering`; none where DataLoader workers
        gather them): how a loader's batch sampler tells a pass its loop asks for batch by
        batch from one that workers draw ahead (NOTE [ the run lives in the sampler ] in
        `loaders.order.run_batches`)."""

    @contextmanager
    def gathering(self) -> Iterator[None]:
        """A batch is asked of the dataset (`__getitems__`): counted and timed, with its stages
        (`loaders.read.timing`), in the main process; a worker's goes unseen."""
        if get_worker_info() is not None:
            yield
            return
        self.gathered += 1
        with self.times.making():
            yield

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = BufferPool()  # idle buffers are process-local and not worth sending
        state["times"] = MakingTimes()
        return state

    def batch(
        self,
        shape: tuple[int, ...],
        labels: NDArray[np.int64],
        fill: Fill,
        indices: NDArray[np.int64] | None = None,
        columns: Columns | None = None,
        form: type[ColumnBatch] = ColumnBatch,
    ) -> AnyBatch:
        """A batch of uint8 images of `shape` written by `fill`, with int64 `labels` (and
        the samples' dataset `indices`, which make it an IndexedBatch, and their `columns`,
        which make it a ColumnBatch of type `form`: `loaders.read.batch_plan.BatchRead`)."""
        nbytes = math.prod(shape)
        if get_worker_info() is not None:
            ring = self.ring
            slot = ring.claim(nbytes) if ring is not None else None
            if ring is not None and slot is not None:
                return ring.write(slot, shape, fill, labels, indices, columns, form)
            images = shared_bytes(nbytes).view(shape)
        elif self.pin:
            images = torch.empty(shape, dtype=torch.uint8, pin_memory=True)
        else:
            lent = self._pool.lend(shape)
            fill(lent)
            return make_batch(torch.from_numpy(lent), labels, indices, columns=columns, form=form)
        fill(images.numpy())
        return make_batch(images, labels, indices, pin=self.pin, columns=columns, form=form)

    def stacked(
        self,
        images: list[torch.Tensor],
        labels: NDArray[np.int64],
        indices: NDArray[np.int64] | None = None,
        columns: Columns | None = None,
    ) -> AnyBatch:
        """Samples made one by one (by a dataset's `transform`) as one batch. uint8 samples of
        one shape are stacked straight into this memory: a ring slot in a worker (pinned in
        place for CUDA: NOTE [ a ring pinned in place ] in `loaders.memory.pinning`), pinned
        memory in the main process. Others (floats, several shapes) are stacked anew, and
        pinned here without workers: what `pin_output` promises, a transform or not."""
        first = images[0]
        if first.dtype == torch.uint8 and all(i.shape == first.shape for i in images):

            def fill(out: NDArray[np.uint8]) -> None:
                torch.stack(images, out=torch.from_numpy(out))

            return self.batch((len(images), *first.shape), labels, fill, indices, columns)
        stacked = torch.stack(images)
        if self.pin and get_worker_info() is None:
            stacked = stacked.pin_memory()
        return make_batch(stacked, labels, indices, pin=self.pin, columns=columns)


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
    `DeviceLoader`'s batch prepared ahead, one to spare; pinned (`pin`), two more for batches
    dropped whose copies may still be queued (NOTE [ freed after the copy ] in
    `loaders.memory.ring`). Batches held beyond that only make workers fall back to a fresh shared
    buffer for a while. No ring without workers, or for single samples (`batch_bytes` None).
    """
    if num_workers == 0:
        return BatchMemory(pin=pin)
    if batch_bytes is None:
        return BatchMemory()
    context = multiprocessing_context
    if context is None or isinstance(context, str):
        context = multiprocessing.get_context(context)
    slots = num_workers * (prefetch_factor or 2) + (6 if pin else 4)
    return BatchMemory(ring=SharedRing(slots, batch_bytes, context))
