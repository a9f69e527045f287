"""File reads with a time limit, read ahead of their caller on a helper thread: a read stuck
on a hung mount becomes an `io_timeout` reject instead of a hung run."""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any, TypeVar

from etl.errors import SourceError
from etl.sources.in_store import read_located
from etl.sources.safe_files import Refused
from etl.storage.location import StoreUrl, as_location

T = TypeVar("T")

READ_AHEAD = 2
"""Files a reader thread may have read beyond the one its caller is waiting for."""
OBJECTS_IN_FLIGHT = 8
"""Objects a hashing worker reads from a store at once (`file_outcomes(in_flight=...)`): a GET
waits on the store, not the CPU, and one at a time a worker got 0.4-0.6x of the endpoint's
concurrent GET rate (benchmarks/README.md, `pack.from_store`)."""


class _Job:
    """One read handed to a reader thread, and its outcome."""

    def __init__(self, read: Callable[[], Any], path: str) -> None:
        self.read = read
        self.path = path
        self.done = threading.Event()
        self.cancelled = False
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        if self.cancelled:  # its caller moved on (timed out before it, or stopped reading)
            return
        try:
            self.value = self.read()
        except BaseException as exc:  # handed back to the waiting thread as it is
            self.error = exc
        self.done.set()


class _TimedReads:
    """Runs file reads on a helper thread and waits at most a time limit for each.

    NOTE: a read stuck in the kernel (a hard NFS mount whose server is gone) cannot be
    interrupted, not even by a signal; only the thread waiting for it can give up. Each calling
    thread has one daemon reader thread (threads of the 'threading' backend read in parallel);
    a stuck one is left behind and the next read starts another. Daemon, so a stuck read never
    holds the process at exit (ThreadPoolExecutor joins its threads there).

    NOTE [ read ahead ]: handing one read to the thread and waiting for it cost 0.075 ms a
    file, twice an image (hash, then pack): 8% of packing a 224x224 photo. `outcomes` keeps up
    to READ_AHEAD reads queued ahead of the caller, so the thread reads the next files while
    the caller decodes this one, and the caller mostly finds its file read already. The limit
    still holds for every file: the thread starts a file no later than the caller starts to
    wait for it, and the caller waits at most the limit.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def _jobs(self, threads: int) -> queue.SimpleQueue[_Job]:
        """This thread's reader queue for `threads` readers, with live threads serving it."""
        queues = getattr(self._local, "queues", None)
        if queues is None or self._local.pid != os.getpid():  # a forked child has no threads
            queues = self._local.queues = {}
            self._local.pid = os.getpid()
        jobs: queue.SimpleQueue[_Job] | None = queues.get(threads)
        if jobs is None:
            jobs = queues[threads] = queue.SimpleQueue()
            for _ in range(threads):
                threading.Thread(target=_serve, args=(jobs,), name="etl-read", daemon=True).start()
        return jobs

    def outcomes(
        self,
        reads: Iterable[tuple[Callable[[], T], str]],
        seconds: float | None,
        threads: int = 1,
    ) -> Iterator[T | OSError]:
        """For each (read, path), in order: what read() returned, or the OSError it raised
        (`Refused('io_timeout')` after `seconds`; None: no limit, read here). Anything else a
        read raises is raised. `threads` reads run at once (objects in a store), and as many
        more are queued ahead."""
        if seconds is None:
            yield from outcomes(read for read, _ in reads)
            return
        todo = iter(reads)
        pending: deque[_Job] = deque()
        ahead = max(READ_AHEAD, 2 * threads - 1)
        try:
            while True:
                while len(pending) <= ahead and (item := next(todo, None)) is not None:
                    pending.append(_Job(*item))
                    self._jobs(threads).put(pending[-1])
                if not pending:
                    return
                job = pending.popleft()
                if not job.done.wait(seconds):
                    # a reader is stuck: what was queued behind it moves to new readers
                    self._local.queues.pop(threads, None)
                    for waiting in pending:
                        waiting.cancelled = True
                    pending = deque(_Job(j.read, j.path) for j in pending)
                    for waiting in pending:
                        self._jobs(threads).put(waiting)
                    in_store = isinstance(as_location(job.path), StoreUrl)
                    what = "store (or one that throttles)" if in_store else "mount"
                    yield Refused(
                        "io_timeout",
                        f"{job.path}: no answer in {seconds:g} s (source.io_timeout): a hung or "
                        f"very slow {what}?",
                    )
                elif job.error is None:
                    yield job.value
                elif isinstance(job.error, OSError):
                    yield job.error
                else:
                    raise job.error
        finally:
            for waiting in pending:
                waiting.cancelled = True


def outcomes(reads: Iterable[Callable[[], T]]) -> Iterator[T | OSError]:
    for read in reads:
        try:
            yield read()
        except OSError as exc:
            yield exc


def _serve(jobs: queue.SimpleQueue[_Job]) -> None:
    while True:
        jobs.get().run()


_TIMED = _TimedReads()


def with_time_limit(read: Callable[[], T], seconds: float | None, path: str) -> T:
    """read(), or `Refused('io_timeout')` after `seconds` (None: no limit)."""
    for outcome in _TIMED.outcomes([(read, path)], seconds):
        if isinstance(outcome, OSError):
            raise outcome
        return outcome
    raise AssertionError("one read, one outcome")


def check_in_store(config: Any, probe: Callable[[str, Any], bool], missing: str) -> None:
    """The check of a `source.path` in object storage: probe(url, storage_options) within
    `source.io_timeout`; SourceError naming the URL when the store does not answer, and
    "source.path: URL `missing`" when the probe says no."""
    url, options = config.path, config.storage_options
    try:
        found = with_time_limit(lambda: probe(url, options), config.io_timeout, url)
    except OSError as exc:
        raise SourceError(f"source.path: cannot reach {url} ({exc})") from None
    if not found:
        raise SourceError(f"source.path: {url} {missing}")


def read_file(config: Any, locator: str) -> bytes:
    """The bytes of the file at `locator` (a path or an object's URL), within
    `source.io_timeout` and `source.max_file_bytes`: the read of every kind of files."""
    limit, max_bytes, options = config.io_timeout, config.max_file_bytes, config.storage_options
    return with_time_limit(lambda: read_located(locator, max_bytes, options), limit, locator)


def file_outcomes(
    config: Any, locators: Iterable[str], read: Callable[[str, int], T], in_flight: int = 1
) -> Iterator[T | OSError]:
    """read(path, source.max_file_bytes) of each file locator, read ahead with the time limit,
    `in_flight` at once (reads that stream, not hold, what they read: a worker holds at most
    that many files' bytes at a time otherwise)."""
    limit = config.max_file_bytes
    reads = ((partial(read, locator, limit), locator) for locator in locators)
    return _TIMED.outcomes(reads, config.io_timeout, in_flight)
