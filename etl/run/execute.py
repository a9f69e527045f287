"""The only module that runs work in parallel (joblib). Workers read, hash, decode and write
pixels straight into shard files; only small metadata rows travel back to the parent, so its
memory does not grow with the dataset and the same design runs on a cluster.

A bad image is not a failure: it comes back as a reject with its reason. Anything else a worker
raises (a full disk, a bug) stops the run, re-raised with the shard and file it was working on.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from joblib import Parallel, delayed, parallel_config
from joblib.parallel import LokyBackend

from etl.config import Backend, CallStage, PipelineConfig, RunConfig, SourceConfig
from etl.errors import ExecutionError
from etl.format.checksums import digest
from etl.format.shards import SHARDS_DIR, ShardInfo, ShardWriter, fsync_dir
from etl.images.rejects import Reject
from etl.images.stages import load_function, process_image
from etl.run import cluster, interrupt
from etl.run.tasks import Chunks, PackTask, Texts
from etl.sources import readers
from etl.sources.entries import FileColumns, SourceReject

if TYPE_CHECKING:
    import pyarrow as pa
    from numpy.typing import NDArray

# NOTE [ worker start-up ]: every run waits for its worker processes to start (0.2 s for a
# bare loky worker here) and to import this module with all it imports (0.2 s more). That is
# most of the fixed cost of a small run, so nothing a worker imports pulls in pyarrow: the
# tasks it unpickles live in etl.run.tasks, shard naming in etl.format.shards, and
# the source kinds (etl.sources.registry) import pyarrow inside the functions that read tables.

HASH_CHUNK = 256
"""Files per hashing task: large enough to amortise dispatch, small enough to balance load."""

T = TypeVar("T")
R = TypeVar("R")


class WorkerError(RuntimeError):
    """An unexpected failure inside a worker, with the file it was working on."""


@dataclass(frozen=True)
class PackResult:
    """What became of one task's sources, as columns: the parent joins them to the rows it
    planned (`PackTask.start`), so no per-image object travels back or waits here.

    NOTE: a dict per sample cost ~1 KB in the parent for every image of the shards in flight
    (87k of them in a shard of 32x32 images)."""

    shard: ShardInfo | None
    """None when every source was rejected: no file was published."""
    start: int
    rows: NDArray[np.int64]
    """Per source, its row in the shard, or -1 where it became a reject."""
    heights: NDArray[np.int64]
    widths: NDArray[np.int64]
    """Per source, the decoded image's size (0 for a reject)."""
    checksums: Texts
    """Per stored source, in order, the checksum of its row."""
    rejects: tuple[tuple[int, str, str], ...]
    """(index in the task, reason, message) of each source that became a reject."""

    @property
    def items(self) -> int:
        return len(self.rows)


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


@contextmanager
def workers_starting(run: RunConfig, reads_every_record: bool) -> Iterator[None]:
    """For the length of the block, start the loky workers on a thread, and wait for them at
    its end. Wrapped around the listing of a source that reads every record (lmdb, python,
    webdataset, parquet): that takes long enough to hide the start (NOTE [ worker start-up ]),
    which a folder run hides behind its hash phase instead. Other backends start nothing."""
    if run.backend != "loky" or not reads_every_record:
        yield
        return
    thread = threading.Thread(target=_start_workers, args=(run,), name="etl-workers", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def _start_workers(run: RunConfig) -> None:
    try:
        # a few tasks per worker, so that every worker unpickles one and imports this module
        with parallel_map(_started, range(4 * max(1, run.n_jobs)), run) as results:
            for _ in results:
                pass
    except Exception:
        pass  # an early start only: the pack phase starts them again and reports what fails


def _started(_: int) -> None:
    """Worker: nothing; importing this module to run it is the point."""


# --- hashing ----------------------------------------------------------------------------------


def _hash_chunk(
    chunk: tuple[int, Sequence[tuple[str, str]]], algorithm: str, source_config: SourceConfig
) -> tuple[int, list[tuple[str, str | None, str, str]]]:
    """For a chunk (its start, its (source, locator)s): its start, and (source, digest or None,
    reject reason, message) for each file."""
    start, files = chunk
    out: list[tuple[str, str | None, str, str]] = []
    digests = readers.digest_many(source_config, (path for _, path in files), algorithm)
    for (source, _), value in zip(files, digests, strict=True):
        if isinstance(value, OSError):
            out.append((source, None, *_read_failure(value)))
        else:
            out.append((source, value, "", ""))
    return start, out


def _read_failure(exc: OSError) -> tuple[str, str]:
    """(reject reason, message) of a source that could not be read."""
    if isinstance(exc, readers.Refused):
        return exc.reason, str(exc)
    return "io_error", f"cannot read: {exc.strerror or exc}"


def hash_sources(
    files: FileColumns,
    algorithm: str,
    run: RunConfig,
    on_progress: Callable[[int], None] = lambda n: None,
    *,
    source_config: SourceConfig,
) -> tuple[pa.Array, list[SourceReject]]:
    """Content hashes of `files` of `source_config`, one per file in their order (null where
    it could not be read); unreadable files become rejects (io_error, or the reason
    `readers.Refused` gives).

    Chunks of (source, path) are made as workers take them and their hashes kept as Arrow
    arrays placed by position, so hashing 10M files holds no Python object per file in this
    process, and no second copy of the sources."""
    import pyarrow as pa  # NOTE: here: workers import this module and never need pyarrow

    table = files.table.select(["source", "path"])

    def chunk(start: int, stop: int) -> tuple[int, list[tuple[str, str]]]:
        columns = table.slice(start, stop - start).to_pydict()
        paths = (os.fsdecode(path) for path in columns["path"])
        return start, list(zip(columns["source"], paths, strict=True))

    chunks: Chunks[tuple[int, list[tuple[str, str]]]] = Chunks(len(table), HASH_CHUNK, chunk)
    found: dict[int, pa.Array] = {}
    failures: list[tuple[str, str, str]] = []
    with parallel_map(_hash_chunk, chunks, run, algorithm, source_config) as chunk_results:
        for start, results in chunk_results:
            found[start] = pa.array([value for _, value, _, _ in results], pa.string())
            failures += [
                (s, reason, message) for s, value, reason, message in results if value is None
            ]
            on_progress(len(results))
    hashes = pa.chunked_array([found[start] for start in sorted(found)], pa.string())
    return hashes.combine_chunks(), _hash_rejects(files, failures)


def _hash_rejects(files: FileColumns, failures: list[tuple[str, str, str]]) -> list[SourceReject]:
    """Rejects of the files that could not be hashed, with their listed stat."""
    if not failures:
        return []
    import pyarrow as pa
    import pyarrow.compute as pc

    failed = pa.array([source for source, _, _ in failures], pa.string())
    rows = FileColumns(files.table.filter(pc.is_in(files.table.column("source"), value_set=failed)))
    stat = {f.source: f for f in rows}
    return [
        SourceReject(
            source,
            reason,
            message,
            stat[source].size,
            stat[source].mtime_ns,
            None,
            stat[source].ctime_ns,
            stat[source].inode,
        )
        for source, reason, message in failures
    ]


# --- packing ---------------------------------------------------------------------------------


def stage_functions(config: PipelineConfig) -> dict[str, Callable[..., Any]]:
    """The user functions of `config`'s call stages, imported once per worker task."""
    return {
        stage.function: load_function(stage.function)
        for stage in config.stages
        if isinstance(stage, CallStage)
    }


@dataclass(frozen=True, slots=True)
class Stored:
    """A source stored in a shard: its row, the row's checksum, the source's size in pixels."""

    row: int
    checksum: str
    height: int
    width: int


def fill_shard(
    writer: ShardWriter,
    config: PipelineConfig,
    sources: Sequence[tuple[str, str, str]],
    changed: str,
) -> Iterator[Stored | Reject]:
    """The one way a shard is filled, for run and repair: each (source, locator, content hash)
    is read through `readers`, checked against its hash (else a `changed` reject with the
    message `changed`), run through the stages and appended to `writer`. Yields, in order, what
    became of each. A read failure is a reject; a failure to write the shard (an OSError) is
    raised as it is; anything else is raised as a WorkerError naming the source."""
    functions = stage_functions(config)
    outcomes = readers.read_many(config.source, (locator for _, locator, _ in sources))
    for (source, _, content_hash), data in zip(sources, outcomes, strict=True):
        try:
            outcome = _store(data, content_hash, writer, config, functions, changed)
        except OSError:
            raise  # the shard's write: a read failure is a reject in _store
        except Exception as exc:
            raise WorkerError(
                f"while packing {source} into {writer.name}: {type(exc).__name__}: {exc}"
            ) from exc
        yield outcome


def _store(
    data: bytes | OSError,
    content_hash: str,
    writer: ShardWriter,
    config: PipelineConfig,
    functions: dict[str, Callable[..., Any]],
    changed: str,
) -> Stored | Reject:
    if isinstance(data, OSError):
        return Reject(*_read_failure(data))
    if digest(data, config.output.checksum) != content_hash:
        return Reject("changed", changed)
    try:
        array, (height, width) = process_image(data, config, functions)
    except Reject as exc:
        return exc
    row, checksum = writer.append(array)
    return Stored(row, checksum, height, width)


def pack_shard(
    task: PackTask, config: PipelineConfig, root: str, durable: bool = True
) -> PackResult:
    """Worker: fill one shard with `task`'s sources, in order. Runs in a joblib worker process.
    `durable=False` leaves the fsync to the caller (see `pack`)."""
    n = len(task)
    rows = np.full(n, -1, dtype=np.int64)
    heights, widths = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    checksums: list[str] = []
    rejects: list[tuple[int, str, str]] = []
    writer = ShardWriter(
        Path(root), task.shard, n, config.sample_shape, config.output.checksum, durable
    )
    with writer:
        sources = list(zip(task.sources, task.locators, task.hashes, strict=True))
        outcomes = fill_shard(writer, config, sources, CHANGED_DURING_RUN)
        for i, outcome in enumerate(outcomes):
            if isinstance(outcome, Reject):
                rejects.append((i, outcome.reason, outcome.message))
            else:
                rows[i], heights[i], widths[i] = outcome.row, outcome.height, outcome.width
                checksums.append(outcome.checksum)
        info = writer.finish()
    return PackResult(info, task.start, rows, heights, widths, Texts.of(checksums), tuple(rejects))


CHANGED_DURING_RUN = "file changed while the run was in progress; run again"


def pack(
    tasks: Sequence[PackTask],
    config: PipelineConfig,
    root: Path,
    on_progress: Callable[[int], None] = lambda n: None,
) -> Generator[PackResult, None, None]:
    """Run `pack_shard` over every task; yields results as shards finish. Every shard is on
    disk (fsynced, and the rename of it) once the last result has been taken.

    NOTE [ who fsyncs ]: an fsync waits for the disk (~6 ms per 9.6 MB shard here, 0.2 ms a
    224x224 image, 3-4% of packing it), and a worker waiting on it packs nothing. On one machine
    a thread here fsyncs each shard as its result arrives, while the workers go on packing. On a
    Dask cluster only the worker that wrote a shard can flush it, so workers fsync there.
    """
    in_workers = config.run.backend == "dask"
    with (
        parallel_map(pack_shard, tasks, config.run, config, str(root), in_workers) as results,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="fsync") as syncer,
    ):
        pending: list[Future[None]] = []
        for result in results:
            if not in_workers and result.shard is not None:
                pending.append(syncer.submit(fsync_dir, root / result.shard.name))
            on_progress(result.items)
            yield result
        for done in pending:
            done.result()
        if pending:
            fsync_dir(root / SHARDS_DIR)
