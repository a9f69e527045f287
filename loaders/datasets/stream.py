"""The iterable dataset: whole shards streamed in a seeded order, for data much larger than RAM.

Each (rank, worker) pair is a "slot", dealt an equal stretch of the epoch's shards in an order
that is a pure function of (seed, epoch) (`loaders.order.stream_orders`), so every selected
sample is read exactly once per epoch across all slots and every rank yields the same number of
batches. A slot takes `window` shards at a time, has the kernel read the next window's files
ahead (sequentially), and yields batches in a shuffled order of the current window; each shard
is unmapped once its window is done, so resident memory stays at about two windows.

NOTE [ stream resume ]: DataLoader asks its workers for batches round-robin from worker 0, and
every slot yields the same number of batches, so after B batches of an epoch worker w has
delivered B // k batches, one more if w < B % k (k workers). A resumed epoch starts again at
worker 0; worker w then plays the slot that would have delivered the next batch, slot
(w + B) % k of its rank, skipping what that slot delivered: the rest of the epoch comes in the
order of an uninterrupted one.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import IterableDataset, get_worker_info

from loaders.batch.forms import EncodedBatch
from loaders.batch.types import AnyBatch
from loaders.memory.batch_memory import BatchMemory
from loaders.order.orders import Order
from loaders.order.stream_orders import SharedEpoch, slot_share, stream_order
from loaders.order.world import rank_and_world
from loaders.read.batch_plan import batch_reads, own_size_sample
from loaders.read.catalog import Selection
from loaders.read.page_cache import advise_file
from loaders.read.reader import ShardReader
from loaders.read.row_checks import Verify, as_verified, checks_of


class PackedStream(IterableDataset[AnyBatch | tuple[torch.Tensor, int]]):
    """Batches (or single samples with `batch_size=None`) streamed shard by shard.

    Use with `stream_loader`, or `DataLoader(stream, batch_size=None, collate_fn=collate_batch)`.
    A batch mixes only the `window` shards its worker holds: with shards packed in hash order,
    as `etl run` packs them, that is close to random, but a worker's window is a small part of
    the dataset (`loaders.order.quality`); the map-style dataset with "blocks" mixes across all of
    it. Every (rank, worker) slot yields the same number of samples, `slot_share`: padded by
    repeating one sample of its own, or cut with `drop_last`, like `partition` does for ranks;
    so ranks yield equal numbers of batches, as DDP needs. The last batch of each worker may be
    short (dropped with `drop_last`).

    `verify` as `PackedDataset.open`'s: by default each row is checked against its sample's
    checksum the first time any worker reads it; a selection that checks rows already (that
    of a `PackedDataset.open`) keeps its checks, another has them made from its version's
    manifest; `verify=False` reads unchecked.
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
        verify: Verify = "once",
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
        checks = checks_of(verify)
        selection = as_verified(selection, checks)
        self.selection = selection
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = int(seed)
        self.window = window
        self.drop_last = drop_last
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.reader = ShardReader(selection.shards, verify_shards=checks == "shards")
        self.memory = BatchMemory()
        """Where batches are gathered (`stream_loader` sets pinning and the workers' ring)."""
        self.workers = 0
        """DataLoader workers reading this stream (`stream_loader` sets it): slots per rank."""
        self.with_indices = False
        """Whether batches carry each sample's index (an `IndexedBatch`)."""
        self.epochs = SharedEpoch()
        """The epoch read and a loaded state's resume point, seen by every worker."""

    @property
    def epoch(self) -> int:
        return self.epochs.epoch

    @property
    def epoch_calls(self) -> int:
        """How many times an epoch was chosen (`SharedEpoch.calls`)."""
        return self.epochs.calls

    def set_epoch(self, epoch: int) -> None:
        """Select the order of `epoch` (`SharedEpoch.choose`)."""
        self.epochs.choose(epoch, len(self))

    def advance(self) -> None:
        """Go on to the next epoch, as after a whole pass with no `set_epoch` (NOTE [ epochs
        advance by themselves ] in `loaders.order.run_batches`); not a choice of epoch."""
        self.epochs.advance()

    def __len__(self) -> int:
        """Batches (samples with batch_size=None) this rank yields in an epoch, all workers."""
        slots = max(self.workers, 1)
        share = slot_share(len(self.selection), self.world_size * slots, self.drop_last)
        size = self.batch_size or 1
        per_slot = share // size if self.drop_last else -(-share // size)
        return slots * per_slot

    def identity(self) -> dict[str, int | str]:
        """The fields a state must match to be loaded here (see `loaders.order.resume`)."""
        order = f"stream(n={len(self.selection)}, window={self.window}, shuffle={self.shuffle})"
        return {
            "order": order,
            "seed": self.seed,
            "drop_last": int(self.drop_last),
            "batch_size": self.batch_size or 0,
            "workers": self.workers,
            "world_size": self.world_size,
        }

    def resume(self, epoch: int, batches: int) -> None:
        """Make the next iteration of `epoch` skip the first `batches` batches this rank's
        loader delivered (see NOTE [ stream resume ])."""
        self.epochs.resume(epoch, batches, len(self))

    def pending_batches(self) -> int | None:
        """The batches a loaded state will skip in the next iteration, None if none waits."""
        return self.epochs.pending()

    def mark_started(self) -> None:
        """Note that an iteration began in worker processes, which took the resume point."""
        self.epochs.take()

    @property
    def pin_output(self) -> bool:
        """Whether batches are gathered into pinned memory (num_workers=0 with CUDA)."""
        return self.memory.pin

    def with_memory(
        self, memory: BatchMemory, workers: int = 0, with_indices: bool = False
    ) -> PackedStream:
        """A shallow copy that gathers its batches into `memory` (see `loaders.batch.types`), read
        by `workers` DataLoader workers, with each sample's index when `with_indices`."""
        twin = copy.copy(self)
        twin.memory = memory
        twin.workers = workers
        twin.with_indices = with_indices
        return twin

    def manifest_rows(self, indices: Any) -> pa.Table:
        """The manifest rows of indices of this stream (see `Selection.manifest_rows`)."""
        return self.selection.manifest_rows(indices)

    def slot(self, delivered: int = 0) -> tuple[int, int]:
        """(slot, n_slots) of the calling process: rank-major over DataLoader workers, the
        workers' roles turned by `delivered` batches (see NOTE [ stream resume ])."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.rank * workers + (worker + delivered) % workers, self.world_size * workers

    def groups(self, slot: int, n_slots: int) -> list[Order]:
        """The indices `slot` yields this epoch, a group of `window` shards at a time."""
        sel = self.selection
        return stream_order(
            sel.shard_idx,
            slot,
            n_slots,
            self.seed,
            self.epoch,
            self.window,
            self.shuffle,
            self.drop_last,
        )

    def _chunks(self, order: Order, slot: int, n_slots: int, delivered: int) -> Iterator[int]:
        """Where each batch `slot` still has to yield starts in its `order`, a loaded state's
        `delivered` batches skipped (NOTE [ stream resume ])."""
        step = self.batch_size or 1
        workers = n_slots // self.world_size
        role = slot % workers  # which of its rank's slots this worker plays
        skipped = delivered // workers + (1 if role < delivered % workers else 0)
        for start in range(skipped * step, len(order), step):
            if self.batch_size is not None and self.drop_last and start + step > len(order):
                return
            yield start

    def delivery(self, delivered: int = 0) -> Iterator[Order]:
        """The indices of each batch this rank's loader delivers this epoch after `delivered`,
        in the order it delivers them: its workers' batches round-robin from worker 0 (NOTE
        [ stream resume ]). What a bounded cache fetches ahead by."""
        workers = max(self.workers, 1)
        n_slots = self.world_size * workers
        per_worker = []
        for worker in range(workers):
            slot = self.rank * workers + (worker + delivered) % workers
            groups = self.groups(slot, n_slots)
            order = np.concatenate(groups) if groups else np.zeros(0, np.int64)
            per_worker.append(self._cut(order, self._chunks(order, slot, n_slots, delivered)))
        while per_worker:
            for batches in list(per_worker):
                chunk = next(batches, None)
                if chunk is None:
                    per_worker.remove(batches)
                else:
                    yield chunk

    def _cut(self, order: Order, starts: Iterator[int]) -> Iterator[Order]:
        step = self.batch_size or 1
        for start in starts:
            yield order[start : start + step]

    def __iter__(self) -> Iterator[AnyBatch | tuple[torch.Tensor, int]]:
        sel = self.selection
        delivered = self.epochs.take() or 0
        slot, n_slots = self.slot(delivered)
        groups = self.groups(slot, n_slots)
        if not groups:
            return
        order = np.concatenate(groups)
        # Position in `order` where each group ends, and the shards each group maps.
        ends = np.cumsum([len(g) for g in groups])
        shards = [np.unique(sel.shard_idx[g]).tolist() for g in groups]
        step = self.batch_size or 1
        current = -1
        for start in self._chunks(order, slot, n_slots, delivered):
            chunk = order[start : start + step]
            group = int(np.searchsorted(ends, start + len(chunk) - 1, side="right"))
            if group > current:
                current = group
                if group + 1 < len(groups):
                    self._prefetch(shards[group + 1])
            if self.batch_size is None:
                yield self._sample(int(chunk[0]))
            else:
                # samples that keep their aspect ratio: padded, their sizes beside (indexed)
                memory = self.memory
                given = (
                    self.with_indices or sel.values or sel.own_sizes
                    or memory.form is EncodedBatch
                )  # fmt: skip
                columns = sel.values.batch(chunk) if sel.values is not None else None
                with memory.times.making():
                    plan = batch_reads(self.reader, sel, chunk, columns, memory.form)
                    batch = memory.batch(
                        plan.shape, sel.labels[chunk].astype(np.int64), plan.fill,
                        chunk if given else None, plan.columns, plan.form,
                    )  # fmt: skip
                yield batch
            done = int(np.searchsorted(ends, start + len(chunk), side="right"))
            for finished in range(done):
                for shard in shards[finished]:
                    self.reader.close(shard)

    def _sample(self, index: int) -> tuple[torch.Tensor, int]:
        sel = self.selection
        if sel.places is not None:  # at its own size
            return torch.from_numpy(own_size_sample(self.reader, sel, index)), int(
                sel.labels[index]
            )
        image = self.reader.row(int(sel.shard_idx[index]), int(sel.rows[index]))
        return torch.from_numpy(image), int(sel.labels[index])

    def _prefetch(self, shards: list[int]) -> None:
        """Ask the kernel to read the next group's files ahead, while this group is consumed.

        NOTE: this is where the stream reads whole shards sequentially: WILLNEED starts
        asynchronous readahead of each file, so a cold group arrives in large sequential reads
        instead of page faults scattered by the shuffle. Cached files cost a syscall each.
        """
        for shard in shards:
            advise_file(self.selection.shards.path(shard), "WILLNEED")


def refuse_loader_options(
    batch_size: int | None,
    shuffle: Any,
    sampler: Any,
    batch_sampler: Any,
    drop_last: bool,
    generator: Any,
) -> None:
    """A stream's batch size, order, seed and drop_last are its own; say so for each."""
    given = {
        "sampler": sampler is not None,
        "batch_sampler": batch_sampler is not None,
        "shuffle": shuffle is not None and shuffle is not False,
        "drop_last": drop_last,
        "generator": generator is not None,
        "batch_size": batch_size not in (None, 1),
    }
    for name, is_given in given.items():
        if is_given:
            raise ValueError(
                f"a PackedStream brings its own batch size, order and seed: pass {name}= to "
                "PackedStream(...), not to the loader"
            )
