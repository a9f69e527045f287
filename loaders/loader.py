"""DataLoader builders with defaults right for packed uint8 shards, and a resumable wrapper.

`make_loader` takes DataLoader's familiar options. What it decides for you:
- batches come from `PackedDataset.__getitems__` (one contiguous buffer) with a pass-through
  collate, never sample by sample;
- `pin_memory` defaults to on exactly when CUDA is present; with num_workers=0 batches are
  gathered straight into pinned memory and DataLoader does not pin (copy) them again;
- `shuffle` picks an order by name from `SHUFFLES` (True means "random", False "sequential");
  every order is distributed-aware and resumable (`PackedLoader.state_dict`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from loaders.dataset import Batch, PackedDataset, collate_batch
from loaders.samplers import (
    BlockShuffleSampler,
    ClassBalancedSampler,
    OrderSampler,
    ShuffleSampler,
)
from loaders.stream import PackedStream


@dataclass(frozen=True)
class OrderOptions:
    """What a named order may depend on, besides the dataset's labels and shards."""

    batch_size: int
    seed: int
    rank: int | None
    world_size: int | None
    drop_last: bool

    def common(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
        }


def _blocks(ds: PackedDataset, o: OrderOptions) -> OrderSampler:
    # NOTE: a window mixes window / block blocks from random places. Measured on the sample
    # data (class-sorted shards, 6 classes, batch 256), batches reach a full shuffle's class mix
    # once the window holds about a batch's worth of blocks: class_mix_distance 0.105 with a
    # 1024 window against 0.057 for a random order, 0.044 against 0.068 with 4096.
    block = 16
    return BlockShuffleSampler(ds.shard_idx, block, max(4096, block * o.batch_size), **o.common())


SHUFFLES: dict[str, Callable[[PackedDataset, OrderOptions], OrderSampler]] = {
    "sequential": lambda ds, o: ShuffleSampler(len(ds), False, **o.common()),
    "random": lambda ds, o: ShuffleSampler(len(ds), True, **o.common()),
    "blocks": _blocks,
    "balanced": lambda ds, o: ClassBalancedSampler(ds.labels, **o.common()),
}
"""Sample orders by name; see `loaders.orders` for what each one does."""

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
            stacklevel=3,
        )
    return False


class PackedLoader:
    """A DataLoader plus the count of samples it has delivered, for exact mid-epoch resume.

    NOTE [ resume position ]: with workers, DataLoader draws indices from the sampler ahead of
    the training loop (prefetch), so the sampler cannot know what was consumed. This wrapper
    counts the samples of the batches it has handed out; batches arrive in sampler order, so
    restarting the same order after that many samples yields exactly the remaining ones.
    """

    def __init__(self, dataloader: DataLoader[Any], sampler: OrderSampler | None = None) -> None:
        self.dataloader = dataloader
        self.sampler = sampler
        self._position = 0

    @property
    def dataset(self) -> Any:
        return self.dataloader.dataset

    def __len__(self) -> int:
        """Batches left in this epoch's iteration (all of them unless resuming)."""
        return len(self.dataloader)

    def __iter__(self) -> Iterator[Batch]:
        if self.sampler is None:
            yield from self.dataloader
            return
        self._position = self.sampler.state_dict()["position"]
        for batch in self.dataloader:
            self._position += len(batch[1])
            yield batch

    def set_epoch(self, epoch: int) -> None:
        """Select the order of `epoch` in the sampler (or the stream); call before each epoch."""
        self._position = 0
        target = self.sampler if self.sampler is not None else self.dataset
        if hasattr(target, "set_epoch"):
            target.set_epoch(epoch)

    def state_dict(self) -> dict[str, int]:
        """{seed, epoch, position, rank, world_size}: plain ints, no pickle needed."""
        sampler = self._resumable()
        return {**sampler.state_dict(), "position": self._position}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continue `state`'s epoch with exactly the samples not yet delivered when it was saved."""
        self._resumable().load_state_dict(state)
        self._position = int(state["position"])

    def _resumable(self) -> OrderSampler:
        if self.sampler is None:
            raise TypeError(
                "resuming needs one of the loaders samplers (make_loader's shuffle=, or an "
                "OrderSampler passed as sampler=); torch samplers and streams keep no position"
            )
        return self.sampler


def make_loader(
    dataset: PackedDataset,
    batch_size: int = 256,
    shuffle: bool | str = False,
    sampler: Sampler[int] | None = None,
    num_workers: int = 0,
    pin_memory: bool | None = None,
    drop_last: bool = False,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    worker_init_fn: Callable[[int], None] | None = None,
    timeout: float = 0.0,
    generator: torch.Generator | None = None,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    multiprocessing_context: Any = None,
) -> PackedLoader:
    """A DataLoader over `dataset`, batched by `__getitems__`, wrapped for resume.

    `shuffle` is a `SHUFFLES` name or a bool; `sampler` (any torch sampler of indices) replaces
    it. `drop_last` drops the short last batch and, across ranks, the tail that does not split
    evenly (otherwise ranks are padded by repetition, like DistributedSampler). Rank and world
    size come from torch.distributed when it is initialised, unless given. `seed` drives the
    sample order; `generator` only DataLoader's own randomness (worker base seeds).

    NOTE [ num_workers ]: 0 is the fastest for untransformed batches here (benchmarks/
    bench_loaders.py: ~220k samples/s in-process against ~50k with 2 workers on 2 cores). A
    worker's batch has to cross into the main process through a fresh shared-memory buffer,
    and faulting in its pages costs several times the gather itself (default_collate pays the
    same). Workers pay off when a per-sample `transform` does real CPU work.
    """
    if sampler is not None and shuffle:
        raise ValueError("pass either sampler= or shuffle=, not both (as with DataLoader)")
    if sampler is None:
        name = ("random" if shuffle else "sequential") if isinstance(shuffle, bool) else shuffle
        factory = SHUFFLES.get(name)
        if factory is None:
            raise ValueError(
                f"unknown shuffle {shuffle!r}; expected a bool or one of {list(SHUFFLES)}"
            )
        options = OrderOptions(batch_size, seed, rank, world_size, drop_last)
        sampler = factory(dataset, options)
    pin = resolve_pin_memory(pin_memory)
    loader = DataLoader(
        dataset.with_pinned_output(pin and num_workers == 0),
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_batch,
        pin_memory=pin and num_workers > 0,
        drop_last=drop_last,
        timeout=timeout,
        worker_init_fn=worker_init_fn,
        multiprocessing_context=multiprocessing_context,
        generator=generator,
        prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers,
    )
    return PackedLoader(loader, sampler if isinstance(sampler, OrderSampler) else None)


def stream_loader(
    stream: PackedStream,
    num_workers: int = 0,
    pin_memory: bool | None = None,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    worker_init_fn: Callable[[int], None] | None = None,
    timeout: float = 0.0,
    generator: torch.Generator | None = None,
    multiprocessing_context: Any = None,
) -> PackedLoader:
    """A DataLoader over a `PackedStream`; batch size, order and drop_last are the stream's."""
    pin = resolve_pin_memory(pin_memory)
    loader = DataLoader(
        stream.with_pinned_output(pin and num_workers == 0),
        batch_size=None,
        num_workers=num_workers,
        collate_fn=collate_batch,
        pin_memory=pin and num_workers > 0,
        timeout=timeout,
        worker_init_fn=worker_init_fn,
        multiprocessing_context=multiprocessing_context,
        generator=generator,
        prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers,
    )
    return PackedLoader(loader)
