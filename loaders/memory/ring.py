"""The shared-memory ring DataLoader workers gather batches into, read in place by the main
process; page-locked for CUDA there when batches go to a GPU (NOTE [ a ring pinned in place ]
in `loaders.memory.pinning`).
"""

from __future__ import annotations

import math
import os
import secrets
import threading
import warnings
import weakref
from collections import deque
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from loaders.batch.types import AnyBatch, Batch, ColumnBatch, Columns, Fill, make_batch
from loaders.memory.pinning import Registration, register
from loaders.read.span import prefault


def shared_bytes(nbytes: int) -> torch.Tensor:
    """A 1-d uint8 tensor in fresh shared memory, allocated there (no copy, no page touched)."""
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=torch.uint8).set_(storage)


_RINGS: weakref.WeakValueDictionary[str, SharedRing] = weakref.WeakValueDictionary()
"""The rings of this process by token, for `_receive` (a slot arrives as a token and a number)."""

_MAIN = -1
"""`SharedRing.owner` value of a slot whose batch the main process holds."""

_said_not_pinned = False


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

    NOTE [ freed after the copy ]: a ring page-locked for CUDA (`pin`) is read by non-blocking
    copies that may still be queued when the batch is dropped (`.to("cuda", non_blocking=True)`
    returns at once). So a dropped slot is freed only once a CUDA event recorded after that
    copy has completed: at each fetch (`settle`), one event is recorded on the current stream
    of the device the batches go to, after whatever copy the loop (or Lightning's, or
    accelerate's, batch transfer) queued there before dropping the batch, and the slots of
    events that completed are freed, polled with `query()`: nothing waits. `DeviceLoader`
    copies on a side stream that the current stream waits for before each batch is handed
    out, so the event orders after its copies too.
    """

    def __init__(self, slots: int, slot_bytes: int, context: Any) -> None:
        if slots < 1 or slot_bytes < 1:
            raise ValueError(f"a ring needs slots and slot_bytes >= 1, got {slots}, {slot_bytes}")
        self.token = secrets.token_hex(8)
        self.slot_bytes = slot_bytes
        self.data = shared_bytes(slots * slot_bytes).view(slots, slot_bytes)
        self.owner = torch.zeros(slots, dtype=torch.int64).share_memory_()
        self.lock = context.Lock()
        self._numpy: tuple[NDArray[np.uint8], NDArray[np.int64]] | None = None
        self.pinned: Registration | None = None
        """The ring's CUDA registration, in the process that reads the batches (`pin`)."""
        self.pin_tried = False
        self.copies_on: torch.device | None = None
        """The device whose current stream the batches' copies are queued on (None: the
        current device); `DeviceLoader` sets its own."""
        self._dropped: list[int] = []
        self._copying: deque[tuple[torch.cuda.Event, list[int]]] = deque()
        self._guard = threading.Lock()
        _RINGS[self.token] = self

    def __getstate__(self) -> dict[str, Any]:
        # The tensors and the lock travel; views, the registration and the release queue
        # belong to the process that reads the batches.
        local = ("_numpy", "pinned", "_dropped", "_copying", "_guard", "copies_on")
        return {k: v for k, v in self.__dict__.items() if k not in local}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._numpy, self.pinned, self.copies_on = None, None, None
        self._dropped, self._copying, self._guard = [], deque(), threading.Lock()

    def __len__(self) -> int:
        return len(self.owner)

    def arrays(self) -> tuple[NDArray[np.uint8], NDArray[np.int64]]:
        """numpy views of `data` and `owner`, made once per process (cheaper to index)."""
        if self._numpy is None:
            self._numpy = (self.data.numpy(), self.owner.numpy())
        return self._numpy

    def pin(self) -> bool:
        """Page-lock the ring for CUDA in this process (the one that reads the batches), once
        for the ring's lifetime: every epoch's workers, fresh or persistent, fill the same
        pinned slots. Unregistered when the ring is collected (with its loader). Where CUDA
        refuses, says why once and keeps today's path."""
        global _said_not_pinned
        if not self.pin_tried:
            self.pin_tried = True
            outcome = register(self.data)
            if isinstance(outcome, Registration):
                self.pinned = outcome
                weakref.finalize(self, _unpin, outcome, self._copying).atexit = False
            elif not _said_not_pinned:
                _said_not_pinned = True
                warnings.warn(
                    f"the loader's shared-memory ring is not page-locked ({outcome}): batches "
                    "from workers are copied into pinned memory by DataLoader's pin thread",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return self.pinned is not None

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
        form: type[ColumnBatch] = ColumnBatch,
    ) -> Batch:
        """Fill a claimed slot; the batch pickles as the slot number, not the bytes (and
        arrives as an IndexedBatch when `indices` are given, a `form` with `columns`, which
        travel with the slot number)."""
        data, owner = self.arrays()
        try:
            images = data[slot, : math.prod(shape)].reshape(shape)
            prefault(images)  # NOTE [ prefault the ring ] in loaders.read.span
            fill(images)
        except BaseException:
            owner[slot] = 0
            raise
        batch = _RingBatch(torch.from_numpy(images), torch.from_numpy(labels))
        batch.slot = (self.token, slot, os.getpid(), shape, labels, indices, columns, form)
        return batch

    def settle(self) -> None:
        """At a fetch, in the process that reads the batches: record one CUDA event after the
        copies of the batches dropped since the last fetch, and free the slots of every event
        that has completed (NOTE [ freed after the copy ]). Nothing for a ring not pinned."""
        if self.pinned is None:
            return
        with self._guard:
            dropped, self._dropped = self._dropped, []
        if dropped:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.copies_on))
            self._copying.append((event, dropped))
        owner = self.arrays()[1]
        while self._copying and self._copying[0][0].query():
            for slot in self._copying.popleft()[1]:
                owner[slot] = 0

    def _drop(self, slot: int, receiver: int) -> None:
        """A received batch is no longer referenced: its slot is free, or (pinned) free once
        the copies queued before now have run."""
        if os.getpid() != receiver:
            return
        if self.pinned is None:
            self.arrays()[1][slot] = 0
            return
        with self._guard:
            self._dropped.append(slot)


def _unpin(registration: Registration, copying: deque[tuple[torch.cuda.Event, Any]]) -> None:
    """Unregister a collected ring, after the copies still reading it (a blocking wait, once,
    when the loader goes away)."""
    for event, _ in copying:
        event.synchronize()
    registration.close()


class _RingBatch(Batch):
    """A Batch in a ring slot, in a worker; unpickled in the main process as a plain Batch."""

    slot: tuple[
        str, int, int, tuple[int, ...], NDArray[np.int64], NDArray[np.int64] | None,
        Columns | None, type[ColumnBatch],
    ]  # fmt: skip

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
    form: type[ColumnBatch] = ColumnBatch,
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
    weakref.finalize(view, ring._drop, slot, os.getpid()).atexit = False
    return make_batch(torch.from_numpy(view), labels, indices, columns=columns, form=form)


def _alive(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
