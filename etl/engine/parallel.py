"""The only module that runs work in parallel (joblib): `parallel_map` over a run's backend
(loky processes, threads, in-process, or a Dask cluster through `engine`), the worker-count
policy, and the early start of workers. The run and the maintenance jobs (audit, repair) use it
alike. Workers write pixels straight into shard files; only small rows travel back.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from joblib import Parallel, delayed, parallel_config
from joblib.parallel import LokyBackend

from etl.config import Backend, RunConfig
from etl.engine import cluster, interrupt
from etl.errors import ExecutionError

# NOTE [ worker start-up ]: every run waits for its worker processes to start (0.2 s for a
# bare loky worker here) and to import what their tasks need (0.2 s more). That is
# most of the fixed cost of a small run, so nothing a worker imports pulls in pyarrow: the
# tasks it unpickles live in etl.run.tasks, shard naming in etl.format.shards, and
# the source kinds (etl.sources.registry) import pyarrow inside the functions that read tables.

T = TypeVar("T")
R = TypeVar("R")


class WorkerError(RuntimeError):
    """An unexpected failure inside a worker, with the file it was working on."""


@contextmanager
def parallel_map(
    fn: Callable[..., R],
    tasks: Sequence[T],
    run: RunConfig,
    *args: Any,
) -> Iterator[Iterator[R]]:
    """fn(task, *args) over tasks on the configured joblib backend, results as they finish.

    NOTE [ stop the workers on the way out ]: a context manager, so that leaving the loop over
    results early (a signal, an error in the loop body) closes joblib's generator right there,
    which stops the workers and waits for them. Left to garbage collection, the generator lived
    as long as the exception's traceback: workers went on writing temp shards after the run had
    removed what it left, and the files outlived the run.
    """
    results = _parallel_results(fn, tasks, run, *args)
    try:
        yield results
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            with warnings.catch_warnings():
                # Cancelling what is left is the point here, not news for the user ("4 tasks
                # which were still being processed ... have been cancelled").
                warnings.filterwarnings("ignore", r".*have been cancelled", UserWarning)
                close()


def _parallel_results(
    fn: Callable[..., R], tasks: Sequence[T], run: RunConfig, *args: Any
) -> Iterator[R]:
    if not tasks:
        return iter(())
    n_jobs = 1 if run.backend == "sequential" else run.n_jobs
    backend: Any = run.backend
    if run.backend == "loky":
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
    return iter(parallel(delayed(fn)(task, *args) for task in tasks))


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
                f"lost {where} during the run ({type(exc).__name__}: {exc}); nothing was "
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
    """Loky workers starting on a thread (`workers_starting`): nothing else may use the pool
    until `wait` returns."""

    def __init__(self, thread: threading.Thread | None) -> None:
        self._thread = thread

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()


@contextmanager
def workers_starting(run: RunConfig, wanted: bool = True) -> Iterator[Starting]:
    """For the length of the block, start the loky workers on a thread, and wait for them at
    its end. Wrapped around a run's listing and planning, so the start (NOTE [ worker start-up ])
    overlaps them; work inside the block runs in this process until `Starting.wait`. Other
    backends, and `wanted=False`, start nothing."""
    if run.backend != "loky" or not wanted:
        yield Starting(None)
        return
    thread = threading.Thread(target=_start_workers, args=(run,), name="etl-workers", daemon=True)
    thread.start()
    try:
        yield Starting(thread)
    finally:
        thread.join()


def _start_workers(run: RunConfig) -> None:
    try:
        # a few tasks per worker, so that every worker runs one and imports what packing needs
        with parallel_map(_started, range(4 * max(1, run.n_jobs)), run) as results:
            for _ in results:
                pass
    except Exception:
        pass  # an early start only: the pack phase starts them again and reports what fails


def _started(_: int) -> None:
    """Worker: import what filling a shard needs (decoders, stages, readers); that import,
    done now while the parent lists, is the point."""
    import etl.engine.fill  # noqa: F401
