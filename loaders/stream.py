"""The iterable dataset: whole shards streamed in a seeded order, for data much larger than RAM.

Each (rank, worker) pair is a "slot"; an epoch's shards are dealt to slots by a pure function of
(seed, epoch), balanced by sample count, so every selected sample is read exactly once per epoch
across all slots. A slot takes `window` shards at a time, has the kernel read the next window's
files ahead (sequentially), and yields batches in a shuffled order of the current window; each
shard is unmapped once its window is done, so resident memory stays at about two windows.
"""

from __future__ import annotations

import copy
import heapq
import os
from collections.abc import Iterator
from functools import partial

import numpy as np
import torch
from numpy.typing import NDArray
from torch.utils.data import IterableDataset, get_worker_info

from loaders.batches import Batch, BatchMemory
from loaders.catalog import Selection
from loaders.dist import rank_and_world
from loaders.orders import Order, seeded_rng
from loaders.reader import ShardReader


def assign_shards(
    sizes: NDArray[np.integer], n_slots: int, seed: int, epoch: int, shuffle: bool = True
) -> list[NDArray[np.int64]]:
    """Deal shards to `n_slots` slots: a list of shard numbers per slot, every shard once.

    Largest shards first to the least loaded slot (ties: lowest slot), in a seeded random order
    of shards when `shuffle`; slot totals then differ by at most one shard. A slot may get no
    shard when there are fewer shards than slots.
    """
    if n_slots < 1:
        raise ValueError(f"n_slots must be >= 1, got {n_slots}")
    sizes = np.asarray(sizes, dtype=np.int64)
    ranked = seeded_rng(seed, epoch).permutation(len(sizes)) if shuffle else np.arange(len(sizes))
    by_size = ranked[np.argsort(-sizes[ranked], kind="stable")]
    loads = [(0, slot) for slot in range(n_slots)]
    dealt: list[list[int]] = [[] for _ in range(n_slots)]
    for shard in by_size.tolist():
        load, slot = heapq.heappop(loads)
        dealt[slot].append(shard)
        heapq.heappush(loads, (load + int(sizes[shard]), slot))
    position = np.empty(len(sizes), dtype=np.int64)
    position[ranked] = np.arange(len(sizes))
    return [np.asarray(sorted(d, key=lambda s: position[s]), dtype=np.int64) for d in dealt]


def stream_order(
    shard_idx: NDArray[np.integer],
    slot: int,
    n_slots: int,
    seed: int,
    epoch: int,
    window: int = 8,
    shuffle: bool = True,
) -> list[Order]:
    """The dataset indices one slot yields in an epoch, as one array per group of `window` shards.

    `shard_idx` is in (shard, row) order, as a `Selection` is. Within a group indices are
    shuffled (seeded by seed, epoch and slot) when `shuffle`, else in (shard, row) order.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    shard_idx = np.asarray(shard_idx)
    n_shards = int(shard_idx.max()) + 1 if len(shard_idx) else 0
    sizes = np.bincount(shard_idx, minlength=n_shards)
    first = np.cumsum(sizes) - sizes
    mine = assign_shards(sizes, n_slots, seed, epoch, shuffle)[slot]
    rng = np.random.default_rng([seed, epoch, n_slots, slot])
    groups = []
    for start in range(0, len(mine), window):
        shards = mine[start : start + window]
        idx = np.concatenate([np.arange(first[s], first[s] + sizes[s]) for s in shards])
        groups.append(rng.permutation(idx) if shuffle else idx)
    return groups


class PackedStream(IterableDataset[Batch | tuple[torch.Tensor, int]]):
    """Batches (or single samples with `batch_size=None`) streamed shard by shard.

    Use with `DataLoader(stream, batch_size=None, collate_fn=collate_batch)` or `stream_loader`.
    A batch mixes only the `window` shards its worker holds: with shards packed class by
    class, as `etl run` packs them, batches of a worker that got few shards are far from the
    dataset's class mix (`loaders.quality`); the map-style dataset with "blocks" is not.
    Every (rank, worker) reads its own shards; the last batch of each worker may be short
    (dropped with `drop_last`). Ranks get whole shards, so their sample counts differ by up to
    about one shard: for DDP with collectives every step, prefer `PackedDataset` with a sampler,
    whose ranks have equal lengths.
    """

    def __init__(
        self,
        selection: Selection,
        batch_size: int | None = 256,
        shuffle: bool = True,
        seed: int = 0,
        window: int = 8,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        verify: bool = False,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
        self.selection = selection
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = int(seed)
        self.window = window
        self.drop_last = drop_last
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.reader = ShardReader(selection.shards, verify=verify)
        self.memory = BatchMemory()
        """Where batches are gathered (`stream_loader` sets pinning and the workers' ring)."""
        # NOTE [ epoch in shared memory ]: persistent workers keep their own copy of this
        # object, so a plain attribute set by set_epoch() would never reach them. A tensor in
        # shared memory is seen by forked and spawned workers alike.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._epoch.fill_(int(epoch))

    @property
    def pin_output(self) -> bool:
        """Whether batches are gathered into pinned memory (num_workers=0 with CUDA)."""
        return self.memory.pin

    def with_memory(self, memory: BatchMemory) -> PackedStream:
        """A shallow copy that gathers its batches into `memory` (see `loaders.batches`)."""
        twin = copy.copy(self)
        twin.memory = memory
        return twin

    def slot(self) -> tuple[int, int]:
        """(slot, n_slots) of the calling process: rank-major over DataLoader workers."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.rank * workers + worker, self.world_size * workers

    def groups(self) -> list[Order]:
        slot, n_slots = self.slot()
        sel = self.selection
        return stream_order(
            sel.shard_idx, slot, n_slots, self.seed, self.epoch, self.window, self.shuffle
        )

    def __iter__(self) -> Iterator[Batch | tuple[torch.Tensor, int]]:
        sel = self.selection
        groups = self.groups()
        if not groups:
            return
        order = np.concatenate(groups)
        # Position in `order` where each group ends, and the shards each group maps.
        ends = np.cumsum([len(g) for g in groups])
        shards = [np.unique(sel.shard_idx[g]).tolist() for g in groups]
        step = self.batch_size or 1
        current = -1
        for start in range(0, len(order), step):
            chunk = order[start : start + step]
            if self.batch_size is not None and self.drop_last and len(chunk) < step:
                break
            group = int(np.searchsorted(ends, start + len(chunk) - 1, side="right"))
            if group > current:
                current = group
                if group + 1 < len(groups):
                    self._prefetch(shards[group + 1])
            if self.batch_size is None:
                yield self._sample(int(chunk[0]))
            else:
                yield self.memory.batch(
                    (len(chunk), *sel.sample_shape),
                    sel.labels[chunk].astype(np.int64),
                    partial(self.reader.gather, sel.shard_idx[chunk], sel.rows[chunk]),
                )
            done = int(np.searchsorted(ends, start + len(chunk), side="right"))
            for finished in range(done):
                for shard in shards[finished]:
                    self.reader.close(shard)

    def _sample(self, index: int) -> tuple[torch.Tensor, int]:
        sel = self.selection
        image = self.reader.row(int(sel.shard_idx[index]), int(sel.rows[index]))
        return torch.from_numpy(image), int(sel.labels[index])

    def _prefetch(self, shards: list[int]) -> None:
        """Ask the kernel to read the next group's files ahead, while this group is consumed.

        NOTE: this is where the stream reads whole shards sequentially: WILLNEED starts
        asynchronous readahead of each file, so a cold group arrives in large sequential reads
        instead of page faults scattered by the shuffle. Cached files cost a syscall each.
        """
        for shard in shards:
            try:
                fd = os.open(self.selection.shards.path(shard), os.O_RDONLY)
            except OSError:
                continue  # opening for real will raise ShardError with the path
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
