"""A stream's order: each (rank, worker) pair is a "slot"; an epoch's shards are laid end to end in
an order that is a pure function of (seed, epoch) and cut into one equal stretch per slot
(`deal_pieces`), so every selected sample is read exactly once per epoch across all slots and
every rank yields the same number of batches; a slot's samples come a group of `window` shards
at a time (`stream_order`). And the epoch a stream reads, with a loaded state's resume point,
shared with its workers (`SharedEpoch`). `loaders.datasets.stream` reads by them.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.typing import NDArray

from loaders.order.orders import Order, seeded_rng


def slot_share(n: int, n_slots: int, drop_last: bool = False) -> int:
    """Samples every slot yields in an epoch: n / n_slots, rounded up (padded) or down (dropped)."""
    if n_slots < 1:
        raise ValueError(f"n_slots must be >= 1, got {n_slots}")
    return n // n_slots if drop_last else -(-n // n_slots)


def deal_pieces(
    sizes: NDArray[np.integer],
    n_slots: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    drop_last: bool = False,
) -> list[NDArray[np.int64]]:
    """Deal samples to `n_slots` slots as pieces of shards: per slot, rows (shard, first, end).

    The shards are laid end to end (in a seeded random order when `shuffle`) and the sequence
    is cut into `n_slots` contiguous stretches whose lengths differ by at most one, so a slot
    reads consecutive shards whole, but for the first and last, which it may share with its
    neighbours. With `drop_last` the n % n_slots samples at the end are dealt to nobody, and
    every stretch has the same length.
    """
    if n_slots < 1:
        raise ValueError(f"n_slots must be >= 1, got {n_slots}")
    sizes = np.asarray(sizes, dtype=np.int64)
    ranked = seeded_rng(seed, epoch).permutation(len(sizes)) if shuffle else np.arange(len(sizes))
    ends = np.cumsum(sizes[ranked])
    starts = ends - sizes[ranked]
    n = int(ends[-1]) if len(ends) else 0
    share, extra = divmod(n, n_slots)
    pieces = []
    for slot in range(n_slots):
        lo = slot * share + (0 if drop_last else min(slot, extra))
        hi = lo + share + (0 if drop_last or slot >= extra else 1)
        touched = np.arange(np.searchsorted(ends, lo, "right"), np.searchsorted(starts, hi))
        first = np.maximum(lo - starts[touched], 0)
        end = np.minimum(hi, ends[touched]) - starts[touched]
        keep = end > first
        pieces.append(np.stack([ranked[touched], first, end], axis=1)[keep].astype(np.int64))
    return pieces


def stream_order(
    shard_idx: NDArray[np.integer],
    slot: int,
    n_slots: int,
    seed: int,
    epoch: int,
    window: int = 8,
    shuffle: bool = True,
    drop_last: bool = False,
) -> list[Order]:
    """The dataset indices one slot yields in an epoch, as one array per group of `window` shards.

    `shard_idx` is in (shard, row) order, as a `Selection` is. Within a group indices are
    shuffled (seeded by seed, epoch and slot) when `shuffle`, else in (shard, row) order. Every
    slot yields `slot_share` indices: a slot dealt one sample less repeats the first index of
    its last group (or of the dataset), as `partition` pads ranks.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    shard_idx = np.asarray(shard_idx)
    n_shards = int(shard_idx.max()) + 1 if len(shard_idx) else 0
    sizes = np.bincount(shard_idx, minlength=n_shards)
    first = np.cumsum(sizes) - sizes
    mine = deal_pieces(sizes, n_slots, seed, epoch, shuffle, drop_last)[slot]
    rng = np.random.default_rng([seed, epoch, n_slots, slot])
    groups = []
    for start in range(0, len(mine), window):
        pieces = mine[start : start + window]
        idx = np.concatenate([np.arange(first[s] + a, first[s] + b) for s, a, b in pieces])
        groups.append(rng.permutation(idx) if shuffle else idx)
    short = slot_share(len(shard_idx), n_slots, drop_last) - sum(len(g) for g in groups)
    if short:
        if groups:
            groups[-1] = np.concatenate([groups[-1], groups[-1][:short]])
        else:
            groups.append(np.zeros(short, dtype=np.int64))
    return groups


class SharedEpoch:
    """The epoch a stream reads and the resume point of a loaded state, in shared memory.

    NOTE [ epoch in shared memory ]: persistent workers keep their own copy of the stream, so
    a plain attribute set by `set_epoch` would never reach them. A tensor in shared memory is
    seen by forked and spawned workers alike. `_resume` holds (generation, batches): a loaded
    state's batches delivered, taken by each copy of the stream once per generation
    (`_taken` is that copy's own)."""

    def __init__(self) -> None:
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self._resume = torch.zeros(2, dtype=torch.int64).share_memory_()
        self._taken = 0
        self.calls = 0
        """How many times an epoch was chosen (`choose`, a loaded state): a loader advances
        the epoch by itself only where none was chosen since its last pass."""

    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def choose(self, epoch: int, length: int) -> None:
        """Read `epoch` next; a loaded state's epoch keeps its resume point (as
        `OrderSampler.set_epoch` does), another epoch while one waits mid-epoch (fewer than
        the epoch's `length` batches delivered) is refused."""
        if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self.calls += 1
        waiting = self.pending()
        if waiting and epoch != self.epoch:
            if waiting < length:
                raise ValueError(
                    f"a loaded state resumes epoch {self.epoch} after {waiting} batches; call "
                    f"set_epoch({self.epoch}) before iterating, or load no state to start "
                    f"epoch {epoch} afresh"
                )
            self._resume[1] = 0
        self._epoch.fill_(int(epoch))

    def advance(self) -> None:
        """The next epoch, the resume point dropped; not a choice of epoch."""
        self._resume[1] = 0
        self._epoch.fill_(self.epoch + 1)

    def resume(self, epoch: int, batches: int, length: int) -> None:
        """Have the next pass over `epoch` skip its first `batches` of `length`."""
        if not 0 <= batches <= length:
            raise ValueError(f"batches {batches} is outside 0..{length}")
        self._resume[1] = 0  # no longer waits mid-epoch: any epoch may be set
        self.choose(epoch, length)
        self._resume.copy_(torch.tensor([int(self._resume[0]) + 1, batches]))

    def pending(self) -> int | None:
        """The batches a loaded state will skip in the next pass, None if none waits."""
        generation, batches = self._resume.tolist()
        return batches if generation > self._taken else None

    def take(self) -> int | None:
        """`pending`, now taken by the pass that begins in this process (or its workers)."""
        batches = self.pending()
        self._taken = int(self._resume[0])
        return batches
