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
from loaders.batches import BatchMemory, SharedRing
from loaders.dataset import PackedDataset, collate_batch
from loaders.resume import State, check_state
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


@dataclass
class Progress:
    """How far the iteration in progress (or the last one) got: what a state is made of."""

    start: int
    """Map-style: where the epoch's segment starts in the global order (see `loaders.resume`)."""
    skip: int
    """Samples (map-style) or batches (stream) of this rank a loaded state skipped."""
    remaining: int
    """Samples (map-style) the iteration had to deliver when it began."""
    batches: int = 0
    """Batches handed out by this iteration."""


class PackedLoader:
    """A DataLoader plus how far its epoch got, for exact mid-epoch resume.

    NOTE [ resume position ]: with workers, DataLoader draws indices from the sampler ahead of
    the training loop (prefetch), so the sampler cannot know what was consumed. This wrapper
    counts the batches it has handed out; batches arrive in sampler order (and a stream's in
    the workers' round-robin, see `loaders.stream`), so restarting the same order after that
    many yields exactly the remaining samples. A wrapper that pulls batches ahead of the loop
    (`DeviceLoader`) asks for the state without the batches it holds (`held_back`).
    """

    def __init__(self, dataloader: DataLoader[Any], sampler: OrderSampler | None = None) -> None:
        self.dataloader = dataloader
        self.sampler = sampler
        self._progress: Progress | None = None

    @property
    def dataset(self) -> Any:
        return self.dataloader.dataset

    @property
    def epoch(self) -> int:
        """The epoch `set_epoch` selected (what per-epoch augmentation is drawn from)."""
        target = self.sampler if self.sampler is not None else self.stream
        return int(getattr(target, "epoch", 0))

    @property
    def stream(self) -> PackedStream | None:
        dataset = self.dataloader.dataset
        return dataset if isinstance(dataset, PackedStream) else None

    def __len__(self) -> int:
        """Batches left in this epoch's iteration (all of them unless resuming)."""
        stream = self.stream
        if stream is not None:
            return len(stream) - (stream.pending_batches() or 0)
        return len(self.dataloader)

    def __iter__(self) -> Iterator[Any]:
        progress = self._progress = self._begin()
        stream = self.stream
        try:
            if self.dataloader.num_workers == 0 and self.dataloader.collate_fn is collate_batch:
                batches = self._in_process()
            else:
                batches = iter(self.dataloader)
                if stream is not None:
                    stream.mark_started()  # the workers took the resume point
            for batch in batches:
                if progress is not None:
                    progress.batches += 1
                yield batch
        except EtlError as exc:
            raise _from_worker(exc) from None

    def _begin(self) -> Progress | None:
        if self.sampler is not None:
            pending = self.sampler.state_dict()
            return Progress(int(pending["start"]), int(pending["position"]), len(self.sampler))
        stream = self.stream
        if stream is not None:
            return Progress(0, stream.pending_batches() or 0, 0)
        return None

    def _in_process(self) -> Iterator[Any]:
        """What DataLoader yields with num_workers=0, without its per-batch bookkeeping.

        NOTE: measured with benchmarks/bench_loaders.py (random batches of 256 x 12 KiB):
        DataLoader's single-process iterator costs ~0.1-0.2 ms a batch (a profiler range,
        the batch sampler, the fetcher), 10-20% of gathering the batch. Without workers it
        only calls the dataset and collate_fn, as this does; pinning is done by the gather.

        NOTE [ read the next batch ahead ]: before a batch is handed out, the dataset is asked
        to `prefetch` the next one (disk reads start, nothing waits), so a cold next batch is
        read while the training step runs on this one instead of after it. Workers need no
        such step: DataLoader already keeps `prefetch_factor` batches a worker under way.
        """
        loader = self.dataloader
        collate = loader.collate_fn
        if isinstance(loader.dataset, IterableDataset):
            for item in loader.dataset:
                yield collate(item)
            return
        assert loader.batch_sampler is not None, "make_loader always batches"
        dataset: Any = loader.dataset
        prefetch = getattr(dataset, "prefetch", None)
        batches = iter(loader.batch_sampler)
        indices = next(batches, None)
        while indices is not None:
            batch = collate(dataset.__getitems__(indices))
            indices = next(batches, None)
            if indices is not None and prefetch is not None:
                prefetch(indices)  # NOTE [ read the next batch ahead ]
            yield batch

    def set_epoch(self, epoch: int) -> None:
        """Select the order of `epoch`; call before each epoch. After `load_state_dict`,
        `set_epoch` of the saved epoch keeps the resume point (either order works)."""
        target = self.sampler if self.sampler is not None else self.stream
        if target is not None:
            target.set_epoch(epoch)
        self._progress = None

    def state_dict(self, held_back: int = 0) -> State:
        """Plain ints and strings: what the state belongs to (dataset version, a fingerprint
        of the selection, order, seed, batch size, drop_last; a stream's workers and world
        size) and where the epoch stands. `held_back`: batches handed out but not consumed."""
        identity = self._identity()
        progress = self._progress
        stream = self.stream
        if self.sampler is not None:
            state = {**identity, **self.sampler.state_dict()}
            if progress is not None:
                size = self._batch_size()
                done = min((progress.batches - held_back) * size, progress.remaining)
                state.update(start=progress.start, position=progress.skip + done)
            return state
        assert stream is not None, "_identity refuses loaders that cannot resume"
        batches = (
            progress.skip + progress.batches - held_back
            if progress is not None
            else stream.pending_batches() or 0
        )
        return {**identity, "epoch": stream.epoch, "batches": batches, "rank": stream.rank}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue `state`'s epoch with exactly the samples not yet delivered when it was
        saved. Refuses (ValueError naming the field) a state of another dataset version,
        selection, order, seed or batch size; a map-style state resumes with any world size
        (see NOTE [ elastic resume ] in `loaders.resume`) and the same global batch (batch
        size times world size), a stream's with its own world size."""
        identity = self._identity()
        stream = self.stream
        if self.sampler is not None:
            size = identity.pop("batch_size")
            check_state(state, identity, ("batch_size", "world_size"))
            _check_global_batch(state, int(size), self.sampler.world_size)
            self.sampler.load_state_dict(state)
        else:
            assert stream is not None, "_identity refuses loaders that cannot resume"
            check_state(state, identity, ("epoch", "batches", "rank"))
            stream.resume(state["epoch"], state["batches"])
        self._progress = None

    def _identity(self) -> dict[str, int | str]:
        selection = getattr(self.dataset, "selection", None)
        stream = self.stream
        if selection is None or (self.sampler is None and stream is None):
            raise TypeError(
                "resuming needs one of the loaders samplers (make_loader's shuffle=, or an "
                "OrderSampler passed as sampler=) or a PackedStream; torch samplers keep no "
                "position"
            )
        identity: dict[str, int | str] = {
            "dataset_version": selection.version,
            "selection": selection.fingerprint,
        }
        if stream is not None:
            return {**identity, **stream.identity()}
        return {**identity, "batch_size": self._batch_size()}

    def _batch_size(self) -> int:
        return int(getattr(self.dataloader.batch_sampler, "batch_size", 1))


def _check_global_batch(state: Mapping[str, Any], batch_size: int, world_size: int) -> None:
    """Refuse a state of another global batch: with the same world size, another batch size;
    with another, a per-rank batch size that does not keep batch size x world size."""
    saved, ranks = state["batch_size"], state["world_size"]
    if saved * ranks != batch_size * world_size:
        raise ValueError(
            f"loader state is for batch_size {saved} on {ranks} rank(s) (a global batch of "
            f"{saved * ranks}), this loader has {batch_size} on {world_size} "
            f"({batch_size * world_size}): use batch_size={saved * ranks // world_size} per rank"
        )


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
    collate_fn: Callable[[Any], Any] | None = None,
    pin_memory: bool | None = None,
    drop_last: bool = False,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    worker_init_fn: Callable[[int], None] | None = None,
    timeout: float = 0.0,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    multiprocessing_context: Any = None,
    with_indices: bool = False,
) -> PackedLoader:
    """A DataLoader over `dataset`, batched by `__getitems__`, wrapped for resume.

    `shuffle` is a `SHUFFLES` name or a bool; `sampler` (any torch sampler of indices) replaces
    it. `drop_last` drops the short last batch and, across ranks, the tail that does not split
    evenly (otherwise ranks are padded by repetition, like DistributedSampler). Rank and world
    size come from torch.distributed when it is initialised, unless given.

    The order is a pure function of `seed` (default 0: every run sees the same orders) and the
    epoch; `torch.manual_seed` does not change it. `generator`, as with DataLoader, makes it
    random instead: the seed is drawn from it once, here (pass one or the other). `collate_fn`
    has DataLoader's meaning: it gets the batch's samples, `(image, label)` tuples (with the
    index when `with_indices`), and its result is what the loader yields; without it batches
    are `Batch(images, labels)` made with no copy beyond the gather (an `IndexedBatch` with
    `with_indices`, whose indices `dataset.manifest_rows` maps to sample ids and sources).

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
        options = OrderOptions(batch_size, order_seed(seed, generator), rank, world_size, drop_last)
        sampler = factory(dataset, options)
    pin = resolve_pin_memory(pin_memory)
    if collate_fn is None:
        batch_bytes = batch_size * math.prod(dataset.sample_shape)
        memory = batch_memory(
            pin, num_workers, prefetch_factor, batch_bytes, multiprocessing_context
        )
    else:
        # Another collate makes new tensors: gather into plain (or fresh shared) memory and
        # let DataLoader pin what the collate returns.
        memory = BatchMemory()
    batching: dict[str, Any] = (
        {"batch_sampler": OrderBatches(sampler, batch_size, drop_last)}
        if isinstance(sampler, OrderSampler)
        else {"batch_size": batch_size, "sampler": sampler, "drop_last": drop_last}
    )
    loader = DataLoader(
        dataset.with_memory(memory, with_indices),
        **batching,
        num_workers=num_workers,
        collate_fn=collate_batch if collate_fn is None else collate_fn,
        pin_memory=pin and (num_workers > 0 or collate_fn is not None),
        timeout=timeout,
        worker_init_fn=worker_init_fn,
        multiprocessing_context=multiprocessing_context,
        generator=generator,
        prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers,
    )
    return PackedLoader(loader, sampler if isinstance(sampler, OrderSampler) else None)


def order_seed(seed: int | None, generator: torch.Generator | None) -> int:
    """The seed of a loader's order: `seed`, else one drawn from `generator`, else 0."""
    if generator is None:
        return 0 if seed is None else int(seed)
    if seed is not None:
        raise ValueError(
            "pass seed= or generator=, not both: the sample order comes from one of them"
        )
    return int(torch.randint(0, 2**62, (), generator=generator))


def stream_loader(
    stream: PackedStream,
    num_workers: int = 0,
    pin_memory: bool | None = None,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    worker_init_fn: Callable[[int], None] | None = None,
    timeout: float = 0.0,
    multiprocessing_context: Any = None,
    with_indices: bool = False,
    generator: torch.Generator | None = None,
) -> PackedLoader:
    """A DataLoader over a `PackedStream`; batch size, order, seed and drop_last are the
    stream's. `len()` is the batches this rank yields (equal on every rank); the state
    resumes with the same number of workers and ranks."""
    if generator is not None:
        raise ValueError(
            "a stream's order comes from PackedStream(seed=...); generator= would not change it"
        )
    pin = resolve_pin_memory(pin_memory)
    size = stream.batch_size
    batch_bytes = None if size is None else size * math.prod(stream.selection.sample_shape)
    memory = batch_memory(pin, num_workers, prefetch_factor, batch_bytes, multiprocessing_context)
    loader = DataLoader(
        stream.with_memory(memory, num_workers, with_indices),
        batch_size=None,
        num_workers=num_workers,
        collate_fn=collate_batch,
        pin_memory=pin and num_workers > 0,
        timeout=timeout,
        worker_init_fn=worker_init_fn,
        multiprocessing_context=multiprocessing_context,
        prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers,
    )
    return PackedLoader(loader)
