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

NOTE [ our batch sampler ]: a map-style loader over one of our orders batches through a
`RunBatchSampler` of that order (`batch_size`, `drop_last`), where DataLoader would make a
`BatchSampler` of it: DataLoader has no keyword for its class and refuses `batch_sampler`
beside `batch_size`, `sampler` and `drop_last`, so it is put in place once DataLoader is
made, and every attribute still reads as DataLoader's would.

NOTE [ trainers ]: the order samplers are `DistributedSampler`s, so Lightning injects no
sampler of its own over them; `state_dict`/`load_state_dict` make the loader `_Stateful`
for Lightning's checkpoints. accelerate's `prepare` would wrap the batch sampler once more
and give each rank a part of its part (accelerate#4199): the loader is already split
between ranks, so it says it is prepared (`_is_accelerate_prepared`) and stateful
(`use_stateful_dataloader`), and `save_state`/`load_state` save and restore its position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from etl.errors import EtlError
from loaders.batch.forms import BackToBackBatch, EncodedBatch
from loaders.datasets.mixture import Mixture
from loaders.datasets.packed import PackedDataset, passes_batches
from loaders.datasets.stream import PackedStream, refuse_loader_options
from loaders.loader.gathering import (
    ask_form,
    collate_of,
    copies_on,
    memory_of,
    pinned_ring,
    stream_parts,
)
from loaders.loader.iteration import (
    batches_in_process,
    bounded_cache,
    counted,
    fetch_ahead,
    reads_ahead,
)
from loaders.loader.named_orders import OrderOptions, map_batching, order_seed
from loaders.loader.readers import held_ahead, refuse_indices_for_keras
from loaders.loader.states import StreamPosition, begin_stream, load_state, state_of
from loaders.loader.stats import LoopTimes, log_epoch, making_times, summary
from loaders.loader.workers import (
    check_options,
    from_worker,
    stop_workers,
    worker_options,
)
from loaders.memory.batch_memory import resolve_pin_memory
from loaders.order.aspect_buckets import AspectBuckets
from loaders.order.history import RunHistory
from loaders.order.resume import State
from loaders.order.run_batches import RunBatchSampler
from loaders.order.samplers import OrderSampler


class PackedLoader(DataLoader[Any]):
    """A DataLoader over a `PackedDataset` or `PackedStream`, resumable mid-epoch.

    The arguments are DataLoader's, with these differences: `shuffle` may also name an order
    of `SHUFFLES`; the order is a pure function of `seed` (default 0) and the epoch, or of one
    seed drawn from `generator` when given; `rank` and `world_size` (default: those of an
    initialised torch.distributed) give each rank its own equal part of every epoch;
    `pin_memory=None` pins exactly when CUDA is present; `collate_fn` left as None yields
    `Batch(images, labels)` (an `IndexedBatch` with `with_indices`) without a copy beyond the
    gather; `num_workers` are the loader's threads unless the work needs processes or
    `workers_as="processes"` says so (`loaders.loader.workers`), and those are persistent
    unless told. A `PackedStream` brings its own batch size, order, seed and processes.

    NOTE [ resume position ]: with workers, DataLoader draws indices from the sampler ahead of
    the training loop (prefetch), so the sampler cannot know what was consumed. The loader
    counts the batches it has handed out and tells its batch sampler, which keeps the run's
    state (NOTE [ the run lives in the sampler ] in `loaders.order.run_batches`); batches
    arrive in sampler order (and a stream's in the workers' round-robin, see
    `loaders.datasets.stream`), so restarting the same order after that many yields exactly
    the remaining samples. A wrapper that pulls batches ahead of the loop (`DeviceLoader`) says
    how many it holds (`hold_back`), so the state of this loader and of the wrapper both count
    only what reached the training loop.

    """

    _is_accelerate_prepared = True
    use_stateful_dataloader = True
    ahead = 0
    """Batches read ahead on the loader's thread (NOTE [ batches read ahead on a thread ] in
    `loaders.loader.iteration`); 0 where processes or DataLoader make them."""
    to_skip = 0
    """Batches a state loaded `for_skipping` expects the trainer to skip."""
    _loop = LoopTimes()
    log_stats = False
    """Log one line at the end of each pass: how long the loop waited, the slowest stage."""
    _position: StreamPosition | None = None
    """A stream's iteration in progress, or the last one (None: none since `set_epoch`)."""

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
        persistent_workers: bool | None = None,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        with_indices: bool = False,
        as_inputs: bool = False,
        workers_as: str | None = None,
        log_stats: bool = False,
        **dataloader_options: Any,
    ) -> None:
        streamed = isinstance(dataset, PackedStream) and num_workers > 0
        check_options(dataloader_options, workers_as, streamed)
        pin, self.log_stats = resolve_pin_memory(pin_memory), log_stats
        common: dict[str, Any] = dict(
            num_workers=num_workers, timeout=timeout, worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context, prefetch_factor=prefetch_factor,
            persistent_workers=bool(persistent_workers), **dataloader_options,
        )  # fmt: skip
        if isinstance(dataset, PackedStream):
            refuse_loader_options(batch_size, shuffle, sampler, batch_sampler, drop_last, generator)
            streamed_dataset, options = stream_parts(dataset, pin, with_indices, common)
            super().__init__(streamed_dataset, **options)
            return
        # NOTE [ num_workers out of habit ] in loaders.loader.workers
        self.ahead = worker_options(
            dataset, common, collate_fn, as_inputs, persistent_workers, workers_as
        )
        batching, order = map_batching(
            dataset, batch_size, shuffle, sampler, batch_sampler, drop_last,
            lambda: OrderOptions(batch_size or 1, order_seed(seed, generator), rank, world_size,
                                 drop_last),
        )  # fmt: skip
        size = batch_size if batch_sampler is None else getattr(batch_sampler, "batch_size", None)
        collate = collate_of(dataset, collate_fn, as_inputs, with_indices)
        memory = memory_of(collate, pin, size, dataset.sample_shape, common)
        # NOTE: ours in process gathers into pinned memory; DataLoader pins what others make
        super().__init__(
            dataset.with_memory(memory, with_indices), **batching, collate_fn=collate,
            pin_memory=pin, generator=generator, **common,
        )  # fmt: skip
        if order is not None:  # NOTE [ our batch sampler ]
            runs = RunBatchSampler(order, int(batch_size or 1), drop_last, memory)
            object.__setattr__(self, "batch_sampler", runs)

    def send_back_to_back(self) -> bool:
        """Have batches of samples of several sizes (that keep their aspect ratio, a `Mixture`
        of several shapes) come as a `BackToBackBatch`, `images` 1-d, instead of padded to the
        largest: what `DeviceLoader` asks for (NOTE [ back to back ] in `loaders.batch.ragged`).
        Whether they will: `loaders.loader.gathering.ask_form`; a padded batch from workers
        already running is taken by `DeviceLoader` as well."""
        return ask_form(self.dataset, self.collate_fn, BackToBackBatch)

    def send_encoded(self) -> bool:
        """Have samples stored encoded come still encoded, as an `EncodedBatch`, for
        `DeviceLoader(decode="device")` to decode there. Whether they will: `ask_form`."""
        return ask_form(self.dataset, self.collate_fn, EncodedBatch)

    @property
    def run(self) -> RunBatchSampler | None:
        """The batch sampler that keeps the run's state (None: a stream, or a sampler of your
        own)."""
        runs = self.batch_sampler
        return runs if isinstance(runs, RunBatchSampler) else None

    @property
    def order(self) -> OrderSampler | None:
        """The loaders order sampler behind the batches (None: a stream, or a torch sampler)."""
        run = self.run
        return None if run is None else run.order

    @property
    def history(self) -> RunHistory:
        """The run's history (`loaders.order.history`), which the batch sampler carries."""
        run = self.run
        return RunHistory() if run is None else run.history

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
        if getattr(self.dataset, "with_indices", False):
            refuse_indices_for_keras()  # NOTE [ Keras reads a third field as sample_weight ]
        ahead = held_ahead()  # NOTE [ wrappers that read ahead ]
        run, stream = self.run, self.stream
        passing = run.begin() if run is not None else None
        if run is not None:
            run.delivered(0)  # this loader counts what it hands out
        position = self._position = begin_stream(self.stream, self._position)
        self.hold_back(ahead)
        if passing is not None and hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(passing.epoch)  # its crops are drawn per epoch
        ring = pinned_ring(self.dataset, self.pin_memory, self.num_workers)
        if ring is not None:
            ring.settle()  # the last epoch's slots, before this epoch's workers claim them
        self._loop = LoopTimes()
        making_times(self.dataset).reset()
        batches: Iterator[Any] | None = None
        try:
            if self.num_workers == 0 and passes_batches(self.collate_fn):
                early = reads_ahead(self.dataset, self.ahead)
                batches = batches_in_process(
                    self.dataset, self.batch_sampler, self.collate_fn, early
                )
            else:
                batches = super().__iter__()
                if stream is not None:
                    stream.mark_started()  # the workers took the resume point
            fetch_ahead(self.dataset, passing, position, self._batch_size())  # a thread, now
            yield from counted(batches, run, position, ring, self._loop)
            if ahead:
                self.hold_back(0)  # the wrapper has handed on the last batch
            if self.log_stats:
                log_epoch(self.stats())
        except EtlError as exc:
            stop_workers(self, batches)
            raise from_worker(exc) from None
        finally:
            cache = bounded_cache(self.dataset)
            if cache is not None:
                cache.stop_ahead()

    def stats(self) -> dict[str, Any]:
        """Where the time of the pass in progress (or the last one) went: how long the loop
        waited for data and worked between batches, and how making batches here split into
        stages; plain numbers for a logger (`loaders.loader.stats`)."""
        return summary(self._loop, making_times(self.dataset))

    def copies_on(self, device: torch.device) -> None:
        """Say on which device's current stream the batches' copies are queued (the default:
        the current device), so a pinned ring slot is freed after the copy there."""
        copies_on(self.dataset, device)

    def hold_back(self, batches: int) -> None:
        """Say that `batches` of those this loader handed out are held by a wrapper (such as
        `DeviceLoader`) and have not reached the training loop: `state_dict` leaves them out."""
        run = self.run
        if run is not None:
            run.hold_back(batches)
        elif self._position is not None:
            self._position.held = int(batches)

    def set_epoch(self, epoch: int) -> None:
        """Select the order of `epoch`; call before each epoch. After `load_state_dict`,
        `set_epoch` of the saved epoch keeps the resume point (either order works). Without
        it, an epoch whose batches all reached the loop is followed by the next one (NOTE
        [ epochs advance by themselves ] in `loaders.order.run_batches`)."""
        target = self.order if self.order is not None else self.stream
        if target is not None:
            target.set_epoch(epoch)
        self._position = None

    def state_dict(self) -> State:
        """Plain ints and strings: what the state belongs to (dataset version, a fingerprint
        of the selection, order, seed, batch size, drop_last; a stream's workers and world
        size) and where the epoch stands: the batches that reached the training loop."""
        return state_of(self)

    def load_state_dict(self, state: Mapping[str, Any], for_skipping: bool = False) -> None:
        """Continue `state`'s epoch with exactly the samples not yet delivered when it was
        saved. Refuses (ValueError naming the field) a state of another dataset version,
        selection, order, seed or batch size; a map-style state resumes with any world size
        (see NOTE [ elastic resume ] in `loaders.order.resume`) and the same global batch (batch
        size times world size), a stream's with its own world size. `for_skipping`: for a
        trainer that skips the batches already read itself, by drawing them again (NOTE
        [ skipping trainers ] in `loaders.order.run_batches`)."""
        self.to_skip = 0
        load_state(self, state, for_skipping)
        self._position = None

    def _batch_size(self) -> int:
        return int(getattr(self.batch_sampler, "batch_size", None) or 1)
