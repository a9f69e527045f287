"""The pageable buffers batches are gathered into in one process, each lent to one batch at a
time and reused once nothing refers to that batch any more."""

from __future__ import annotations

import math
import weakref

import numpy as np
import torch
from numpy.typing import NDArray


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
