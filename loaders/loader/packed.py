"""The loader: a `torch.utils.data.DataLoader` subclass with defaults right for packed uint8
shards, and exact, elastic resume.

`PackedLoader` is a DataLoader (every attribute means what torch says: `batch_size`, `sampler`,
`batch_sampler`, `drop_last`, `pin_memory`, ...), so Lightning, accelerate and anything typed
`DataLoader` take it as it is. What it decides for you:
- batches come from `PackedDataset.__getitems__` (one contiguous buffer) with a pass-through
  collate, never sample by sample;
- `pin_memory` defaults to on exactly when CUDA is present; with num_workers=0 batches are
  gathered straight into pinned memory instead of being copied there afterwards;
- with workers, batches travel through a shared-memory ring made for this loader (see
  `loaders.memory.ring.SharedRing`), not a fresh shared buffer each;
- `shuffle` picks an order by name from `loaders.loader.named_orders.SHUFFLES` (True means
  "random", False "sequential"); every order is distributed-aware (a `DistributedSampler`)
  and resumable (`state_dict`).

`loaders.loader.factories.make_loader` and `stream_loader` build one with this project's defaults
(batches of 256).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from etl.errors import EtlError
from etl.storage.cache import BoundedCache
from loaders.datasets.mixture import Mixture
from loaders.datasets.packed import PackedDataset, collate_batch
from loaders.datasets.stream import PackedStream, refuse_loader_options
from loaders.loader.named_orders import OrderOptions, loader_sampler, order_sampler_of, order_seed
from loaders.loader.workers import from_worker, stop_workers
from loaders.memory.batch_memory import BatchMemory, batch_memory, resolve_pin_memory
from loaders.memory.ring import SharedRing
from loaders.order.aspect_buckets import AspectBuckets
from loaders.order.history import RunHistory
from loaders.order.resume import State, check_global_batch, check_state
from loaders.order.samplers import MixtureSampler, OrderSampler


def _bounded_cache(dataset: object) -> BoundedCache | None:
    """The bounded cache a map-style dataset reads through, if any."""
    shards = getattr(getattr(dataset, "selection", None), "shards", None)
    return getattr(shards, "cache", None)


@dataclass
class Position:
    """How far the iteration in progress (or the last one) got: what a state is made of."""

    epoch: int
    """The epoch the iteration reads; a position of another epoch than the current is stale."""
    start: int
    """Map-style: where the epoch's segment starts in the global order (see
    `loaders.order.resume`)."""
    skip: int
    """Samples (map-style) or batches (stream) of this rank a loaded state skipped."""
    remaining: int
    """Samples (map-style) the iteration had to deliver when it began."""
    batches: int = 0
    """Batches handed out by this iteration."""
    held: int = 0
    """Of those, batches a wrapper (`DeviceLoader`) holds and has not handed to its user."""


class PackedLoader(DataLoader[Any]):
    """A DataLoader over a `PackedDataset` or `PackedStream`, resumable mid-epoch.

    The arguments are DataLoader's, with these differences: `shuffle` may also name an order
    of `SHUFFLES`; the order is a pure function of `seed` (default 0) and the epoch, or of one
    seed drawn from `generator` when given; `rank` and `world_size` (default: those of an
    initialised torch.distributed) give each rank its own equal part of every epoch;
    `pin_memory=None` pins exactly when CUDA is present; `collate_fn` left as None yields
    `Batch(images, labels)` (an `IndexedBatch` with `with_indices`) without a copy beyond the
    gather. A `PackedStream` brings its own batch size, order and seed.

    NOTE [ resume position ]: with workers, DataLoader draws indices from the sampler ahead of
    the training loop (prefetch), so the sampler cannot know what was consumed. The loader
    counts the batches it has handed out; batches arrive in sampler order (and a stream's in
    the workers' round-robin, see `loaders.datasets.stream`), so restarting the same order after
    that many yields exactly the remaining samples. A wrapper that pulls batches ahead of the loop
    (`DeviceLoader`) says how many it holds (`hold_back`), so the state of this loader and of
    the wrapper both count only what reached the training loop.

    NOTE [ trainers ]: the order samplers are `DistributedSampler`s, so Lightning injects no
    sampler of its own over them; `state_dict`/`load_state_dict` make the loader `_Stateful`
    for Lightning's checkpoints. accelerate's `prepare` would wrap the batch sampler once more
    and give each rank a part of its part (accelerate#4199): the loader is already split
    between ranks, so it says it is prepared (`_is_accelerate_prepared`) and stateful
    (`use_stateful_dataloader`), and `save_state`/`load_state` save and restore its position.
    """

    _is_accelerate_prepared = True
    use_stateful_dataloader = True

    def __init__(
        self,
        dataset: PackedDataset | PackedStream | Mixture,
        batch_size: int | None = 1,
        shuffle: bool | str | AspectBuckets | None = None,
        sampler: Sampler[int] | None = None,
        batch_sampler: Sampler[Any] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool | None = None,
        drop_last: bool = False,
        timeout: float = 0.0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        with_indices: bool = False,
        **dataloader_options: Any,
    ) -> None:
        if dataloader_options.get("in_order", True) is not True:
            raise ValueError("in_order=False would make the batch order, and so resume, random")
        pin = resolve_pin_memory(pin_memory)
        common: dict[str, Any] = {
            "num_workers": num_workers,
            "timeout": timeout,
            "worker_init_fn": worker_init_fn,
            "multiprocessing_context": multiprocessing_context,
            "prefetch_factor": prefetch_factor,
            "persistent_workers": persistent_workers,
            **dataloader_options,
        }
        self.order: OrderSampler | None = None
        """The loaders order sampler behind the batches (None: a stream, or a torch sampler)."""
        self._position: Position | None = None
        self.history = RunHistory()  # steps before this iteration, the iterations begun
        if isinstance(dataset, PackedStream):
            refuse_loader_options(batch_size, shuffle, sampler, batch_sampler, drop_last, generator)
            self._init_stream(dataset, pin, with_indices, common)
            return
        sampler = loader_sampler(
            dataset, batch_size, shuffle, sampler, batch_sampler, drop_last,
            lambda: OrderOptions(
                batch_size or 1, order_seed(seed, generator), rank, world_size, drop_last
            ),
        )  # fmt: skip
        self.order = order_sampler_of(sampler, batch_sampler)
        size = batch_size if batch_sampler is None else getattr(batch_sampler, "batch_size", None)
        if collate_fn is None:
            batch_bytes = None if size is None else size * math.prod(dataset.sample_shape)
            memory = batch_memory(
                pin, num_workers, prefetch_factor, batch_bytes, multiprocessing_context
            )
        else:
            # Another collate makes new tensors: gather into plain (or fresh shared) memory and
            # let DataLoader pin what the collate returns.
            memory = BatchMemory()
        batching: dict[str, Any] = (
            {"batch_sampler": batch_sampler}
            if batch_sampler is not None
            else {"batch_size": batch_size, "sampler": sampler, "drop_last": drop_last}
        )
        super().__init__(
            dataset.with_memory(memory, with_indices),
            **batching,
            collate_fn=collate_batch if collate_fn is None else collate_fn,
            # NOTE: without workers and with our collate the loader gathers into pinned
            # memory itself (`_in_process`); DataLoader's pinning only ever runs on batches
            # that workers or another collate made.
            pin_memory=pin,
            generator=generator,
            **common,
        )

    def _init_stream(
        self, stream: PackedStream, pin: bool, with_indices: bool, common: dict[str, Any]
    ) -> None:
        """A loader of a stream: its batches as the stream makes them, through a ring with
        workers (the stream brings its own batch size and order)."""
        size, workers = stream.batch_size, common["num_workers"]
        batch_bytes = None if size is None else size * math.prod(stream.selection.sample_shape)
        memory = batch_memory(
            pin, workers, common["prefetch_factor"], batch_bytes, common["multiprocessing_context"]
        )
        super().__init__(
            stream.with_memory(memory, workers, with_indices),
            batch_size=None,
            collate_fn=collate_batch,
            pin_memory=pin and workers > 0,
            **common,
        )

    def send_back_to_back(self) -> bool:
        """Have batches of samples of several sizes (that keep their aspect ratio, a `Mixture`
        of several shapes) come with their samples one after another, `images` 1-d with each
        sample's size in `SIZE_COLUMNS`, instead of padded to the largest: what `DeviceLoader`
        asks for (NOTE [ back to back ] in `loaders.batch.ragged`). Whether they will: not through
        another `collate_fn`, which gets samples; workers already running (persistent ones)
        keep sending padded batches, which `DeviceLoader` takes as well."""
        memory = getattr(self.dataset, "memory", None)
        if self.collate_fn is not collate_batch or not isinstance(memory, BatchMemory):
            return False
        memory.back_to_back = True
        return True

    def send_encoded(self) -> bool:
        """Have samples stored encoded come still encoded, back to back, with their sizes,
        stored bytes and codecs (`STORED_COLUMNS`), for `DeviceLoader(decode="device")` to
        decode there. Whether they will: as `send_back_to_back`, and not where the dataset
        crops in its workers (`with_crop`), which needs the pixels there."""
        memory = getattr(self.dataset, "memory", None)
        if getattr(self.dataset, "crop", None) is not None or not self.send_back_to_back():
            return False
        assert isinstance(memory, BatchMemory)
        memory.encoded = True
        return True

    @property
    def epoch(self) -> int:
        """The epoch `set_epoch` selected (what per-epoch augmentation is drawn from)."""
        target = self.order if self.order is not None else self.stream
        return int(getattr(target, "epoch", 0))

    @property
    def stream(self) -> PackedStream | None:
        dataset = self.dataset
        return dataset if isinstance(dataset, PackedStream) else None

    def __len__(self) -> int:
        """Batches of a whole epoch on this rank, as DataLoader's `len` (trainers count an
        epoch's steps by it and resume their own count); an epoch resumed from a state yields
        the batches not delivered before it was saved."""
        stream = self.stream
        if stream is not None:
            return len(stream)
        return super().__len__()

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._ended()
        position = self._position = self._begin()
        if position is not None and self.order is not None:  # NOTE [ a run's history ]
            sizes = (self.order, self._batch_size())
            self.history.began(position.epoch, position.start, position.skip, *sizes)
        stream = self.stream
        if position is not None and hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(position.epoch)  # its crops are drawn per epoch
        ring = self._pinned_ring()
        if ring is not None:
            ring.settle()  # the last epoch's slots, before this epoch's workers claim them
        batches: Iterator[Any] | None = None
        try:
            if self.num_workers == 0 and self.collate_fn is collate_batch:
                batches = self._in_process()
            else:
                batches = super().__iter__()
                if stream is not None:
                    stream.mark_started()  # the workers took the resume point
            self._fetch_ahead(position)  # after the workers are forked: a thread here
            for batch in batches:
                if position is not None:
                    position.batches += 1
                if ring is not None:
                    ring.settle()  # NOTE [ freed after the copy ] in loaders.memory.ring
                yield batch
            if ring is not None:
                ring.settle()
        except EtlError as exc:
            stop_workers(batches, self.persistent_workers)
            raise from_worker(exc) from None
        finally:
            cache = _bounded_cache(self.dataset)
            if cache is not None:
                cache.stop_ahead()

    def _pinned_ring(self) -> SharedRing | None:
        """The ring workers fill, page-locked for CUDA (once, before the first workers start)
        where batches are pinned: NOTE [ a ring pinned in place ] in `loaders.memory.pinning`."""
        memory = getattr(self.dataset, "memory", None)
        ring = memory.ring if isinstance(memory, BatchMemory) else None
        if ring is None or not self.pin_memory or self.num_workers == 0:
            return None
        return ring if ring.pin() else None

    def copies_on(self, device: torch.device) -> None:
        """Say on which device's current stream the batches' copies are queued (the default:
        the current device), so a pinned ring slot is freed after the copy there."""
        memory = getattr(self.dataset, "memory", None)
        if isinstance(memory, BatchMemory) and memory.ring is not None:
            memory.ring.copies_on = device

    def _fetch_ahead(self, position: Position | None) -> None:
        """For a dataset read through a bounded cache, have its shards downloaded in the
        order this iteration's batches will need them (NOTE [ bounded cache ])."""
        cache = _bounded_cache(self.dataset)
        if cache is None or position is None:
            return
        shard_idx = self.dataset.selection.shard_idx  # type: ignore[attr-defined]
        stream = self.stream
        if stream is not None:
            chunks: Iterator[Any] = stream.delivery(position.skip)
        elif self.order is not None:
            order = self.order.order()[position.skip :]
            size = self._batch_size()
            chunks = (order[i : i + size] for i in range(0, len(order), size))
        else:
            return
        cache.fetch_ahead((shard_idx[c].tolist() for c in chunks), lambda: position.batches)

    def _begin(self) -> Position | None:
        if self.order is not None:
            pending = self.order.state_dict()
            start, skip = int(pending["start"]), int(pending["position"])
            return Position(self.order.epoch, start, skip, self.order.left())
        stream = self.stream
        if stream is not None:
            return Position(stream.epoch, 0, stream.pending_batches() or 0, 0)
        return None

    def _in_process(self) -> Iterator[Any]:
        """What DataLoader yields with num_workers=0, without its per-batch bookkeeping.

        NOTE: measured with benchmarks/load/throughput.py (random batches of 256 x 12 KiB):
        DataLoader's single-process iterator costs ~0.1-0.2 ms a batch (a profiler range,
        the batch sampler, the fetcher), 10-20% of gathering the batch. Without workers it
        only calls the dataset and collate_fn, as this does; pinning is done by the gather.

        NOTE [ read the next batch ahead ]: before a batch is handed out, the dataset is asked
        to `prefetch` the next one (disk reads start, nothing waits), so a cold next batch is
        read while the training step runs on this one instead of after it. Workers need no
        such step: DataLoader already keeps `prefetch_factor` batches a worker under way.
        """
        collate = self.collate_fn
        dataset: Any = self.dataset
        if isinstance(dataset, IterableDataset):
            for item in dataset:
                yield collate(item)
            return
        assert self.batch_sampler is not None, "PackedLoader always batches"
        prefetch = getattr(dataset, "prefetch", None)
        batches = iter(self.batch_sampler)
        indices = next(batches, None)
        while indices is not None:
            batch = collate(dataset.__getitems__(indices))
            indices = next(batches, None)
            if indices is not None and prefetch is not None:
                prefetch(indices)  # NOTE [ read the next batch ahead ]
            yield batch

    def hold_back(self, batches: int) -> None:
        """Say that `batches` of those this loader handed out are held by a wrapper (such as
        `DeviceLoader`) and have not reached the training loop: `state_dict` leaves them out."""
        if self._position is not None:
            self._position.held = int(batches)

    def set_epoch(self, epoch: int) -> None:
        """Select the order of `epoch`; call before each epoch. After `load_state_dict`,
        `set_epoch` of the saved epoch keeps the resume point (either order works)."""
        target = self.order if self.order is not None else self.stream
        if target is not None:
            target.set_epoch(epoch)
        self._ended()

    def _ended(self) -> None:
        """Count what the last iteration delivered into the run's steps, and forget it."""
        if self._position is not None:
            self.history.ended(self._position.batches - self._position.held)
        self._position = None

    def state_dict(self) -> State:
        """Plain ints and strings: what the state belongs to (dataset version, a fingerprint
        of the selection, order, seed, batch size, drop_last; a stream's workers and world
        size) and where the epoch stands: the batches that reached the training loop."""
        identity = self._identity()
        position = self._position
        stream = self.stream
        if self.order is not None:
            state = {**identity, **self.order.state_dict()}
            delivered = 0 if position is None else position.batches - position.held
            state.update(self.history.fields(delivered, self))
            if position is not None and position.epoch == self.order.epoch:
                done = delivered * self._batch_size()
                state.update(
                    start=position.start, position=position.skip + min(done, position.remaining)
                )
            if isinstance(self.order, MixtureSampler):
                state.update(self.order.progress(state))
            return state
        assert stream is not None, "_identity refuses loaders that cannot resume"
        if position is not None and position.epoch == stream.epoch:
            batches = position.skip + position.batches - position.held
        else:
            batches = stream.pending_batches() or 0
        return {**identity, "epoch": stream.epoch, "batches": batches, "rank": stream.rank}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue `state`'s epoch with exactly the samples not yet delivered when it was
        saved. Refuses (ValueError naming the field) a state of another dataset version,
        selection, order, seed or batch size; a map-style state resumes with any world size
        (see NOTE [ elastic resume ] in `loaders.order.resume`) and the same global batch (batch
        size times world size), a stream's with its own world size."""
        identity = self._identity()
        if isinstance(state, Mapping) and "view" in state and "view" not in identity:
            identity["view"] = ""  # a state saved on a view is not one of no view
        stream = self.stream
        if self.order is not None:
            size = identity.pop("batch_size")
            check_state(state, identity, ("batch_size", "world_size"))
            check_global_batch(state, int(size), self.order.world_size)
            self.order.load_state_dict(state)
            self.history.load(state)
        else:
            assert stream is not None, "_identity refuses loaders that cannot resume"
            check_state(state, identity, ("epoch", "batches", "rank"))
            stream.resume(state["epoch"], state["batches"])
        self._position = None

    def _identity(self) -> dict[str, int | str]:
        if isinstance(self.dataset, Mixture) and self.order is not None:
            return {"batch_size": self._batch_size()}  # the members: MixtureSampler's state
        selection = getattr(self.dataset, "selection", None)
        stream = self.stream
        if selection is None or (self.order is None and stream is None):
            raise TypeError(
                "resuming needs one of the loaders samplers (shuffle=, or an OrderSampler "
                "passed as sampler=) or a PackedStream; torch samplers keep no position"
            )
        identity: dict[str, int | str] = {
            "dataset_version": selection.version,
            "selection": selection.fingerprint,
        }
        if selection.view:  # only then: a state saved before views existed still loads
            identity["view"] = selection.view
        if stream is not None:
            return {**identity, **stream.identity()}
        return {**identity, "batch_size": self._batch_size()}

    def _batch_size(self) -> int:
        return int(getattr(self.batch_sampler, "batch_size", None) or 1)
