"""The parts of a `PackedLoader`'s pass that are not DataLoader's: batches read in the main
process without DataLoader's per-batch bookkeeping (the next one read ahead), each batch
counted as it is handed out, and a bounded cache's shards fetched in the order the pass will
need them."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from torch.utils.data import IterableDataset

from etl.storage.cache import BoundedCache
from loaders.datasets.stream import PackedStream
from loaders.loader.states import StreamPosition
from loaders.loader.stats import LoopTimes
from loaders.memory.ring import SharedRing
from loaders.order.run_batches import Pass, RunBatchSampler


def batches_in_process(
    dataset: Any, batch_sampler: Iterable[Any] | None, collate: Callable[[Any], Any], ahead: int
) -> Iterator[Any]:
    """What DataLoader yields with num_workers=0, without its per-batch bookkeeping, the next
    `ahead` batches gathered on a thread of their own while the loop works on this one.

    NOTE: measured with benchmarks/load/throughput.py (random batches of 256 x 12 KiB):
    DataLoader's single-process iterator costs ~0.1-0.2 ms a batch (a profiler range,
    the batch sampler, the fetcher), 10-20% of gathering the batch. Without workers it
    only calls the dataset and collate_fn, as this does; pinning is done by the gather.

    NOTE [ batches read ahead on a thread ]: one thread gathers the batches in order (each a
    pure function of its indices, so the same batches whichever thread made them), spreading
    each batch's copies and decodes over the loader's threads (`loaders.read.threads`), up to
    `ahead` batches before the loop asks: the training step and the next batch's reads
    overlap, as they do with workers, with no process, pickle or ring. The batch sampler is
    drawn here, in the loop's thread, `ahead` batches early, as DataLoader's workers draw it;
    the loader counts what it hands out (NOTE [ resume position ] in `loaders.loader.packed`).
    A failure is raised at the batch it belongs to. When the pass ends or is left, batches not
    begun are dropped and the one under way finishes before this returns, so nothing reads
    the dataset after it. `ahead=0`: each batch gathered when asked, the next one's disk
    reads started first (`prefetch`).
    """
    if isinstance(dataset, IterableDataset):
        for item in dataset:
            yield collate(item)
        return
    assert batch_sampler is not None, "PackedLoader always batches"
    if ahead > 0:
        yield from _read_ahead(dataset, batch_sampler, collate, ahead)
        return
    prefetch = getattr(dataset, "prefetch", None)
    batches = iter(batch_sampler)
    indices = next(batches, None)
    while indices is not None:
        batch = collate(dataset.__getitems__(indices))
        indices = next(batches, None)
        if indices is not None and prefetch is not None:
            prefetch(indices)  # the next batch's disk reads start, nothing waits
        yield batch


def _read_ahead(
    dataset: Any, batch_sampler: Iterable[Any], collate: Callable[[Any], Any], ahead: int
) -> Iterator[Any]:
    """NOTE [ batches read ahead on a thread ]."""

    def gather(indices: Any) -> Any:
        return collate(dataset.__getitems__(indices))

    pending: deque[Future[Any]] = deque()
    with ThreadPoolExecutor(1, thread_name_prefix=AHEAD_THREAD) as reader:
        try:
            for indices in batch_sampler:
                pending.append(reader.submit(gather, indices))
                if len(pending) > ahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()  # the one under way finishes as the pool is shut down


AHEAD_THREAD = "loaders-ahead"
"""The name of the thread that reads batches ahead (NOTE [ batches read ahead on a thread ])."""


def counted(
    batches: Iterable[Any],
    run: RunBatchSampler | None,
    position: StreamPosition | None,
    ring: SharedRing | None,
    loop: LoopTimes,
) -> Iterator[Any]:
    """`batches`, each counted as handed out before it is (the run's `delivered`, a stream's
    `position`: what a state saved now resumes after), and the ring's slots of the batches
    dropped since the last settled (NOTE [ freed after the copy ] in loaders.memory.ring); the
    loop's waits and steps timed (`loaders.loader.stats`)."""
    asked = loop.asked()
    try:
        for count, batch in enumerate(batches, 1):
            if run is not None:
                run.delivered(count)
            if position is not None:
                position.batches = count
            if ring is not None:
                ring.settle()
            loop.handed(asked)
            yield batch
            asked = loop.asked()
    finally:
        loop.paused()
    if ring is not None:
        ring.settle()


def reads_ahead(dataset: object, ahead: int) -> int:
    """Batches to read ahead of the loop for `dataset`: none where its shards come from a
    store (a bounded cache, ranged reads) of its own or of a mixture's member.

    NOTE: there the shards' downloads already run ahead on threads of their own (`fetch_ahead`,
    NOTE [ bounded cache ] in etl.storage.cache), and a batch read ahead would hold a pass left
    early (an error, a `break`) until a slow or hostile store let its download end."""
    members = getattr(dataset, "members", (dataset,))
    for member in members:
        shards = getattr(getattr(member, "selection", None), "shards", None)
        if getattr(shards, "cache", None) is not None or getattr(shards, "ranged", None):
            return 0
    return ahead


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
