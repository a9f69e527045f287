"""The loader's threads: the work of a batch gathered in the training process (a JPEG's decode,
a crop's resize, a large batch's row copies) spread over a pool of threads, since all release
the GIL (on a 2-core VM with 2 threads: simplejpeg's decode 1.92-1.97x, numpy's row copies
from a page-cached map 1.40x).

One pool per process, of `torch.get_num_threads()` threads, made on first use (and again in a
forked child, whose copy of the parent's pool has no threads). Inside a DataLoader worker there
is none: the workers are the parallelism there, and torch gives each one thread. Each call
writes only its own sample's slot of the batch, so a batch is the same whichever thread made
which sample.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

import torch
from torch.utils.data import get_worker_info

_PREFIX = "loaders-sample"
_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def sample_threads() -> int:
    """Threads this process spreads a batch's per-sample work over (1: none). One on the pool's
    own threads too: work they hand on would wait for themselves."""
    if get_worker_info() is not None or threading.current_thread().name.startswith(_PREFIX):
        return 1
    return max(1, torch.get_num_threads())


def _shared_pool(threads: int) -> ThreadPoolExecutor:
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid() or _pool._max_workers != threads:
            if _pool is not None and _pool_pid == os.getpid():
                _pool.shutdown(wait=False)  # torch's thread count changed: its threads go
            _pool = ThreadPoolExecutor(threads, thread_name_prefix=_PREFIX)
            _pool_pid = os.getpid()
        return _pool


SPREAD_BYTES = 1 << 20
"""Bytes of a batch's copy below which a thread's share is not worth handing over."""


def spread(count: int, nbytes: int) -> list[tuple[int, int]]:
    """[start, stop) of each thread's share of `count` rows of `nbytes` in all: one share
    where the threads are one or the copy is small."""
    parts = max(1, min(sample_threads(), nbytes // SPREAD_BYTES, count))
    bounds = [count * k // parts for k in range(parts + 1)]
    return list(pairwise(bounds))


def run_each(calls: Sequence[Callable[[], None]]) -> None:
    """Run every call, on this thread and the pool's where this process has one (all on this
    thread otherwise), and return once all have finished; the first failure in call order is
    raised then, so nothing is still writing into the batch when the caller sees it.

    NOTE [ calls drained, not submitted ]: this thread and `threads - 1` of the pool's each
    take the next call not yet taken until none is left, so a batch of 256 crops costs two
    hand-overs instead of 256 futures, each a lock, a wake-up and a turn of the GIL (JPEG crops
    on 2 threads: see benchmarks/README.md, "Threads by default").
    """
    threads = min(sample_threads(), len(calls))
    if threads < 2:
        for call in calls:
            call()
        return
    taken = itertools.count()  # NOTE: next() on it is atomic under the GIL (and free-threaded)
    failures: dict[int, BaseException] = {}

    def drain() -> None:
        while (i := next(taken)) < len(calls):
            try:
                calls[i]()
            except BaseException as exc:  # every call still runs: the batch is whole or raised
                failures[i] = exc

    pool = _shared_pool(sample_threads())
    helpers = [pool.submit(drain) for _ in range(threads - 1)]
    drain()
    for helper in helpers:
        helper.result()
    if failures:
        raise failures[min(failures)]
