"""The parts of a `PackedLoader`'s pass that are not DataLoader's: batches read in the main
process without DataLoader's per-batch bookkeeping (the next one read ahead), each batch
counted as it is handed out, and a bounded cache's shards fetched in the order the pass will
need them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch.utils.data import IterableDataset

from etl.storage.cache import BoundedCache
from loaders.datasets.stream import PackedStream
from loaders.loader.states import StreamPosition
from loaders.memory.ring import SharedRing
from loaders.order.run_batches import Pass, RunBatchSampler


def batches_in_process(
    dataset: Any, batch_sampler: Iterable[Any] | None, collate: Callable[[Any], Any]
) -> Iterator[Any]:
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
    if isinstance(dataset, IterableDataset):
        for item in dataset:
            yield collate(item)
        return
    assert batch_sampler is not None, "PackedLoader always batches"
    prefetch = getattr(dataset, "prefetch", None)
    batches = iter(batch_sampler)
    indices = next(batches, None)
    while indices is not None:
        batch = collate(dataset.__getitems__(indices))
        indices = next(batches, None)
        if indices is not None and prefetch is not None:
            prefetch(indices)  # NOTE [ read the next batch ahead ]
        yield batch


def counted(
    batches: Iterable[Any],
    run: RunBatchSampler | None,
    position: StreamPosition | None,
    ring: SharedRing | None,
) -> Iterator[Any]:
    """`batches`, each counted as handed out before it is (the run's `delivered`, a stream's
    `position`: what a state saved now resumes after), and the ring's slots of the batches
    dropped since the last settled (NOTE [ freed after the copy ] in loaders.memory.ring)."""
    for count, batch in enumerate(batches, 1):
        if run is not None:
            run.delivered(count)
        if position is not None:
            position.batches = count
        if ring is not None:
            ring.settle()
        yield batch
    if ring is not None:
        ring.settle()


def bounded_cache(dataset: object) -> BoundedCache | None:
    """The bounded cache a map-style dataset reads through, if any."""
    shards = getattr(getattr(dataset, "selection", None), "shards", None)
    return getattr(shards, "cache", None)


def fetch_ahead(
    dataset: Any, passing: Pass | None, position: StreamPosition | None, batch_size: int
) -> None:
    """For a dataset read through a bounded cache, have its shards downloaded in the order
    this pass's batches will need them (NOTE [ bounded cache ] in etl.storage.cache): a
    stream's from its `position`, a map-style pass's from its order."""
    cache = bounded_cache(dataset)
    if cache is None:
        return
    shard_idx = dataset.selection.shard_idx
    if isinstance(dataset, PackedStream) and position is not None:
        chunks: Iterator[Any] = dataset.delivery(position.skip)
        cache.fetch_ahead((shard_idx[c].tolist() for c in chunks), lambda: position.batches)
    elif passing is not None:
        order = passing.indices
        chunks = (order[i : i + batch_size] for i in range(0, len(order), batch_size))
        cache.fetch_ahead((shard_idx[c].tolist() for c in chunks), passing.delivered)
