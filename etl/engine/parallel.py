"""The only module that runs work in parallel (joblib): `parallel_map` over a run's backend
(loky processes, threads, in-process, or a Dask cluster through `engine`), the worker-count
policy, and the early start of workers. The run and the maintenance jobs (audit, repair) use it
alike. Workers write pixels straight into shard files; only small rows travel back.
"""

from __future__ import annotations

import os
import queue
import re
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from joblib import Parallel, delayed, parallel_config
from joblib.externals.loky.process_executor import TerminatedWorkerError
from joblib.parallel import LokyBackend

from etl.config import Backend, RunConfig
from etl.engine import cluster, interrupt
from etl.engine.fill import warm
from etl.errors import ExecutionError, WorkerDied, described

# NOTE [ worker start-up ]: every run waits for its worker processes to start (0.2 s for a
# bare loky worker here) and to import what their tasks need. That is most of the fixed cost
# of a small run, so a worker imports only what reading, decoding and writing need: the
# functions it runs live in etl.run.worker, the tasks in etl.run.tasks, and what it is sent
# with them is plain data made once here (PackSpec, SourceSpec, Recipe), never the config
# models; pyarrow, pydantic and PyYAML stay out (tests/run/test_worker_start.py).

T = TypeVar("T")
R = TypeVar("R")

PROCESSES = frozenset({"auto", "loky"})
"""Backends whose workers are loky processes on this machine ('auto' adds a head start)."""


@contextmanager
def parallel_map(
    fn: Callable[..., R],
    tasks: Sequence[T],
    run: RunConfig,
    *args: Any,
    starting: Starting | None = None,
) -> Iterator[Iterator[R]]:
    """fn(task, *args) over tasks on the configured joblib backend, results as they finish.
    With `starting` (a run's loky workers), tasks run on threads here until the workers have
    started, or all of them if the run never starts workers (NOTE [ head start ]).

    NOTE [ stop the workers on the way out ]: a context manager, so that leaving the loop over
    results early (a signal, an error in the loop body) closes joblib's generator right there,
    which stops the workers and waits for them. Left to garbage collection, the generator lived
    as long as the exception's traceback: workers went on writing temp shards after the run had
    removed what it left, and the files outlived the run.
    """
    if starting is not None and run.backend == "auto" and tasks and not starting.started:
        results = _head_start(fn, tasks, run, starting, args)
    else:
        if starting is not None:
            starting.wait()  # the pool is the workers' once they have started
        results = _parallel_results(fn, tasks, run, *args)
    try:
        yield _dead_workers_named(results)
    finally:
        _close(results)


def _dead_workers_named(results: Iterator[R]) -> Iterator[R]:
    """`results`, a worker process that died while they were awaited raised as `WorkerDied`
    with its exit codes, not as the pool's own error, whose text is loky's to change."""
    try:
        yield from results
    except TerminatedWorkerError as exc:
        died = _DIED.search(str(exc))
        raise WorkerDied(died.group(1) if died else "killed") from None


_DIED = re.compile(r"exit codes of the workers are \{(.*?)\}")
"""Where loky's TerminatedWorkerError says the dead workers' exit codes."""


def _close(results: Iterator[Any]) -> None:
    close = getattr(results, "close", None)
    if close is not None:
        with warnings.catch_warnings():
            # Cancelling what is left is the point here, not news for the user ("4 tasks
            # which were still being processed ... have been cancelled").
            warnings.filterwarnings("ignore", r".*have been cancelled", UserWarning)
            close()


HEAD_START_POLL = 0.02
"""Seconds between looks at whether the workers have started, while only threads work."""


def _head_start(
    fn: Callable[..., R],
    tasks: Sequence[T],
    run: RunConfig,
    starting: Starting,
    args: tuple[Any, ...],
) -> Iterator[R]:
    """NOTE [ head start ]: a worker process takes 0.5-0.8 s to start and import what packing
    needs, as long as packing 300 photos on 2 cores. Until the workers have started, threads
    here take tasks in order (decoding, resizing, hashing and writing release the GIL); once
    they have, every task no thread has taken goes to the workers, and the threads finish the
    ones they hold. A run too small to pay for workers (`worth_processes`) never starts them:
    the threads take every task. Results come in any order, as from the workers: each task
    writes only its own slots. Leaving early (an error in a task or the caller's loop, a
    signal) stops the threads after their current task and joins them, as the workers are
    stopped (NOTE [ stop the workers on the way out ])."""
    handout = _Handout(len(tasks), starting)
    crew = _HeadThreads(fn, tasks, args, handout, min(worker_count(run), len(tasks)))
    rest: Iterator[R] = iter(())
    try:
        crew.start()
        while crew.running and not handout.closed and not starting.started:
            yield from crew.take(HEAD_START_POLL)
        yield from crew.take(None)  # a thread's error, if that is why the handout closed
        given = handout.close()
        if given < len(tasks):
            rest = _parallel_results(fn, _Tail(tasks, given), run, *args)
        for result in rest:
            yield result
            yield from crew.take(None)
        while crew.running:
            yield from crew.take(HEAD_START_POLL)
    finally:
        handout.close()
        _close(rest)
        crew.join()


class _HeadThreads:
    """The head start's threads: each takes tasks from the handout until it closes, and puts
    its results (or its error, which closes the handout) on one queue the caller takes from."""

    def __init__(
        self,
        fn: Callable[..., R],
        tasks: Sequence[T],
        args: tuple[Any, ...],
        handout: _Handout,
        count: int,
    ) -> None:
        self._fn, self._tasks, self._args, self._handout = fn, tasks, args, handout
        self._finished: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"etl-head-{i}", daemon=True)
            for i in range(count)
        ]
        self.running = len(self._threads)
        """Threads that have not ended yet."""

    def _work(self) -> None:
        try:
            while (index := self._handout.take()) is not None:
                self._finished.put(("result", self._fn(self._tasks[index], *self._args)))
        except BaseException as exc:  # re-raised in the caller's thread
            self._finished.put(("error", exc))  # queued before the handout closes: see take
            self._handout.close()
        finally:
            self._finished.put(("end", None))

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self) -> None:
        for thread in self._threads:
            thread.join()

    def take(self, timeout: float | None) -> list[Any]:
        """The threads' results waiting (up to `timeout` for the first; None: no wait); a
        thread's error raised here."""
        found: list[Any] = []
        while self.running:
            try:
                kind, value = (
                    self._finished.get(timeout=timeout) if timeout else self._finished.get_nowait()
                )
            except queue.Empty:
                break
            timeout = None
            if kind == "error":
                raise value
            if kind == "end":
                self.running -= 1
            else:
                found.append(value)
        return found


class _Handout:
    """Which task the head-start threads take next; closed once the workers have started (or a
    thread failed, or the caller left), from when no thread takes another."""

    def __init__(self, tasks: int, starting: Starting) -> None:
        self._tasks, self._starting = tasks, starting
        self._next = 0
        self._lock = threading.Lock()
        self.closed = False

    def take(self) -> int | None:
        with self._lock:
            if self.closed or self._next >= self._tasks or self._starting.started:
                self.closed = True
                return None
            self._next += 1
            return self._next - 1

    def close(self) -> int:
        """Close; how many tasks the threads took (the first the workers get)."""
        with self._lock:
            self.closed = True
            return self._next


class _Tail(Sequence[T]):
    """tasks[start:] without making them: a task is made only when a worker is handed it."""

    def __init__(self, tasks: Sequence[T], start: int) -> None:
        self._tasks, self._start = tasks, start

    def __len__(self) -> int:
        return max(0, len(self._tasks) - self._start)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._tasks[self._start + index]


def _parallel_results(
    fn: Callable[..., R], tasks: Sequence[T], run: RunConfig, *args: Any
) -> Iterator[R]:
    if not tasks:
        return iter(())
    n_jobs = 1 if run.backend == "sequential" else run.n_jobs
    backend: Any = run.backend
    if run.backend in PROCESSES:
        backend = LokyBackend(initializer=interrupt.worker_setup, initargs=(os.getpid(),))
    elif run.backend == "dask":
        # NOTE: joblib registers its Dask backend only through parallel_config, which engine()
        # enters; backend=None picks it up from there.
        backend = None
    parallel = Parallel(
        n_jobs=-1 if run.backend == "dask" else n_jobs,
        backend=backend,
        return_as="generator_unordered",
        batch_size=1,
    )
    work = (delayed(fn)(task, *args) for task in tasks)
    if run.backend not in PROCESSES:
        return iter(parallel(work))
    with interrupt.starting_workers():  # the first tasks go out, and start loky's workers, here
        return iter(parallel(work))


@contextmanager
def engine(
    run: RunConfig, *, writable_root: Path | None = None, readable: Sequence[Path] = ()
) -> Iterator[None]:
    """What the backend needs for the length of a run. For 'dask': a client (a LocalCluster when
    run.address is not set) made the default for joblib's Dask backend; a check that every
    worker sees the same `writable_root` (and can write its shards/) and every `readable` path;
    and a lost cluster reported as one ExecutionError. Other backends need nothing."""
    if run.backend != "dask":
        yield
        return
    with cluster.dask_client(run) as client:
        cluster.check_shared_storage(client, writable_root, list(readable))
        try:
            with parallel_config(backend="dask"):
                yield
        except Exception as exc:
            if not cluster.is_cluster_failure(exc):
                raise
            where = run.address or "the local Dask cluster"
            raise ExecutionError(
                f"lost {where} during the run ({described(exc)}); nothing was "
                "committed and the previous version is intact: run again once it is back"
            ) from exc


def worker_count(run: RunConfig) -> int:
    """How many processes `run` packs with (joblib's convention: -1 is every core)."""
    cpus = os.cpu_count() or 1
    if run.backend == "sequential":
        return 1
    return run.n_jobs if run.n_jobs > 0 else max(1, cpus + 1 + run.n_jobs)


def choose_run(
    jobs: int | None, backend: Backend, address: str | None, worth_workers: bool
) -> RunConfig:
    """The RunConfig of a maintenance job (audit, repair). `jobs` None: every core when the
    caller judges the work `worth_workers` (a worker costs about a second to start here),
    else in this process; one job is always in-process."""
    if backend == "dask":
        return RunConfig(n_jobs=jobs or -1, backend="dask", address=address)
    if jobs is None:
        jobs = -1 if worth_workers else 1
    return RunConfig(n_jobs=jobs, backend=backend if jobs != 1 else "sequential")


class Starting:
    """A run's loky workers: not begun, starting on a thread from `begin` (nothing else may use
    the pool then, but `parallel_map` runs tasks on threads here: NOTE [ head start ]), then
    `started`."""

    def __init__(self, run: RunConfig) -> None:
        self._run = run
        self._thread: threading.Thread | None = None
        self._done = threading.Event()

    def begin(self) -> None:
        """Start the workers now (once; only loky has workers to start)."""
        if self._run.backend not in PROCESSES or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._start, name="etl-workers", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            _start_workers(self._run)
        finally:
            self._done.set()

    @property
    def started(self) -> bool:
        """Whether the pool is the workers' (or their start failed: the pool reports why)."""
        return self._thread is not None and self._done.is_set()

    def wait(self) -> None:
        """Until the start is over.

        NOTE: an Event, not `Thread.join`: a join that a signal interrupted (Ctrl-C while a
        phase waits here) marks the thread stopped in CPython 3.11 (gh-90882), so the join in
        `workers_starting`'s cleanup returned at once and the process exited under the start,
        whose pool loky then shut down: tracebacks of its callbacks on the terminal."""
        if self._thread is not None:
            self._done.wait()


PROCESS_WORTHY_ITEMS = 512
"""Items (files to hash or pack) per worker, up to 4 workers, from which a run starts worker
processes (`worth_processes`)."""


def worth_processes(run: RunConfig, items: int) -> bool:
    """Whether to start worker processes for `items` files: always, but with backend 'auto'
    only from PROCESS_WORTHY_ITEMS a worker; below, threads here do it all (NOTE [ head
    start ]). Starting a worker costs about 0.5 s of a core, as much as packing 150 photos,
    while threads lose to the GIL only a little at a few threads (on 2 cores, 300 photos pack
    1.4x faster on threads, 5,000 at the same rate, and the pack phase alone was 10% slower).
    The cap of 4 keeps many-core machines, where the GIL costs more, on processes from 2,048
    files up."""
    if run.backend != "auto":
        return True
    return items >= PROCESS_WORTHY_ITEMS * min(worker_count(run), 4)


@contextmanager
def workers_starting(run: RunConfig, wanted: bool = True) -> Iterator[Starting]:
    """For the length of the block, the run's workers (`Starting`), begun now if `wanted`, else
    when the block calls `begin`, or never; waited for at its end. Wrapped around a run's
    phases, so the start (NOTE [ worker start-up ]) overlaps what comes before packing."""
    starting = Starting(run)
    if wanted:
        starting.begin()
    try:
        yield starting
    finally:
        starting.wait()


def _start_workers(run: RunConfig) -> None:
    try:
        # a few tasks per worker, so that every worker runs one and imports what packing needs
        with parallel_map(warm, range(4 * worker_count(run)), run) as results:
            for _ in results:
                pass
    except Exception:
        pass  # an early start only: the pack phase starts them again and reports what fails
