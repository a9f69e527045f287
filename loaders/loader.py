"""DataLoader builders with defaults right for packed uint8 shards, and a resumable wrapper.

`make_loader` takes DataLoader's familiar options. What it decides for you:
- batches come from `PackedDataset.__getitems__` (one contiguous buffer) with a pass-through
  collate, never sample by sample;
- `pin_memory` defaults to on exactly when CUDA is present; with num_workers=0 batches are
  gathered straight into pinned memory and DataLoader does not pin (copy) them again;
- with workers, batches travel through a shared-memory ring made for this loader (see
  `loaders.batches.SharedRing`), not a fresh shared buffer each;
- `shuffle` picks an order by name from `SHUFFLES` (True means "random", False "sequential");
  every order is distributed-aware and resumable (`PackedLoader.state_dict`).
"""

from __future__ import annotations

import math
import multiprocessing
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from etl.errors import EtlError
from loaders.batches import Batch, BatchMemory, SharedRing
from loaders.dataset import PackedDataset, collate_batch
from loaders.samplers import (
    BlockShuffleSampler,
    ClassBalancedSampler,
    OrderBatches,
    OrderSampler,
    ShuffleSampler,
)
from loaders.stream import PackedStream


def _from_worker(exc: EtlError) -> EtlError:
    """An error raised in a DataLoader worker, as it was raised there: DataLoader re-raises it
    in this process as the same type, its message replaced by "Caught ... Original Traceback"
    and the worker's whole traceback. Our messages are one line: the traceback's last."""
    text = str(exc)
    if not text.startswith("Caught "):
        return exc
    last = text.rstrip().splitlines()[-1]
    return type(exc)(last.partition(f"{type(exc).__name__}: ")[2] or last)


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
        batches = self._in_process() if self.dataloader.num_workers == 0 else self.dataloader
        try:
            if self.sampler is None:
                yield from batches
                return
            self._position = self.sampler.state_dict()["position"]
            for batch in batches:
                self._position += len(batch[1])
                yield batch
        except EtlError as exc:
            raise _from_worker(exc) from None

    def _in_process(self) -> Iterator[Any]:
        """What DataLoader yields with num_workers=0, without its per-batch bookkeeping.

        NOTE: measured with benchmarks/bench_loaders.py (random batches of 256 x 12 KiB):
        DataLoader's single-process iterator costs ~0.1-0.2 ms a batch (a profiler range,
        the batch sampler, the fetcher), 10-20% of gathering the batch. Without workers it
        only calls the dataset and collate_fn, as this does; pinning is done by the gather.
        """
        loader = self.dataloader
        collate = loader.collate_fn
        if isinstance(loader.dataset, IterableDataset):
            for item in loader.dataset:
                yield collate(item)
            return
        assert loader.batch_sampler is not None, "make_loader always batches"
        for indices in loader.batch_sampler:
            yield collate(loader.dataset.__getitems__(indices))  # type: ignore[attr-defined]

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

    NOTE [ num_workers ]: measured with benchmarks/bench_loaders.py (random batches of 256,
    2-core VM). 12 KiB samples, 0 workers: ~1.0 ms of main-process CPU per batch, ~80% of it
    in memmove itself (`loaders.span`). 2 workers: ~0.5 ms of main-process CPU per batch (a
    ring slot arrives as a number, see `loaders.batches`) plus ~1.5 ms of workers' CPU, so on
    two cores they deliver ~0.75-0.8x of 0 workers. With 147 KiB (224x224x3) samples the
    per-batch costs are small next to the copy and 2 workers deliver ~1.5x. Workers also pay
    off by keeping the training process's share small, and for a per-sample `transform`.
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
    batch_bytes = batch_size * math.prod(dataset.sample_shape)
    memory = batch_memory(pin, num_workers, prefetch_factor, batch_bytes, multiprocessing_context)
    batching: dict[str, Any] = (
        {"batch_sampler": OrderBatches(sampler, batch_size, drop_last)}
        if isinstance(sampler, OrderSampler)
        else {"batch_size": batch_size, "sampler": sampler, "drop_last": drop_last}
    )
    loader = DataLoader(
        dataset.with_memory(memory),
        **batching,
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
    size = stream.batch_size
    batch_bytes = None if size is None else size * math.prod(stream.selection.sample_shape)
    memory = batch_memory(pin, num_workers, prefetch_factor, batch_bytes, multiprocessing_context)
    loader = DataLoader(
        stream.with_memory(memory),
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
