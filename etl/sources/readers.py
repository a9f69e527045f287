"""How a worker gets a source's bytes from its locator (`SourceFile.path`), by source kind.

`etl.sources.listing` lists what exists and writes locators; this module reads them back, in a
worker process or a Dask worker. It also owns what both sides must agree on: the spool file of
a Python source, and how a file is read safely (`read_regular_file`).

    folder, listing   locator = a file path                  -> the file's bytes
    lmdb              locator = the key as `source` spells it -> the value (or its image field)
                      (see NOTE [names] in etl/names.py; read by etl.sources.record_values)
    python, parquet   locator = "<offset>+<length>@<spool>"   -> that slice of the spool file
    webdataset        locator = "<offset>+<length>@<tar>"     -> the member, read in place
                      (a compressed tar's members are spooled)

Reader errors are OSError: the executor turns them into `io_error` rejects, or into the reason a
`Refused` carries (`not_a_file`, `file_too_large`).
"""

from __future__ import annotations

import os
import queue
import stat
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from etl.config import FolderSource, ListingSource, SourceConfig
from etl.errors import ConfigError
from etl.format.checksums import digest, new_hasher
from etl.format.shards import SHARDS_DIR
from etl.sources.record_values import close_lmdb, read_lmdb

T = TypeVar("T")

# --- the spool of a Python source -------------------------------------------------------------

SPOOL_PREFIX = ".tmp-spool-"
"""NOTE [spool]: a Python source's records exist only while its function runs, in the parent;
tar shards and tables are read there in one pass, record by record (a tar has no index to find
one record by). Those a run must pack go into one file, `<output>/shards/.tmp-spool-<pid>.bin`,
and workers pread their slice. It lives in the output folder because every worker (also on a
Dask cluster) sees it; the pipeline deletes it at the end of a run, and a killed run's spool is
removed by the next run's `clean_leftovers` like any other `.tmp-*` file under shards/."""


def spool_path(root: Path) -> Path:
    """This process's spool file in the dataset at `root`."""
    return root / SHARDS_DIR / f"{SPOOL_PREFIX}{os.getpid()}.bin"


@contextmanager
def released(spool: Path | None) -> Iterator[None]:
    """For the length of a run: afterwards, even after an error, delete the spool and close the
    LMDB environments this process opened (so the caller may open them for writing)."""
    try:
        yield
    finally:
        if spool is not None:
            spool.unlink(missing_ok=True)
        close_lmdb()


NOT_SPOOLED = "not-spooled"
"""Locator of a record whose content was already stored when it was listed: never read."""


class SpoolWriter:
    """Appends records to a spool file and hands back their locators. Closed before the pack
    phase starts, so workers (also over NFS, by close-to-open consistency) see every byte."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "wb")  # noqa: SIM115 -- closed by close()
        self._offset = 0

    def append(self, data: bytes | memoryview) -> str:
        self._file.write(data)
        locator = f"{self._offset}+{len(data)}@{self.path}"
        self._offset += len(data)
        return locator

    def close(self) -> None:
        self._file.close()


def _read_slice(config: SourceConfig, locator: str) -> bytes:
    """`length` bytes at `offset` of a file (the spool, or an uncompressed tar)."""
    span, at, spool = locator.partition("@")
    if not at:
        raise OSError(f"record {locator!r} was not spooled: its content was stored already")
    offset, length = (int(n) for n in span.split("+"))
    fd = os.open(spool, os.O_RDONLY)
    try:
        data = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    if len(data) != length:
        raise OSError(f"spool {spool} ends at {offset + len(data)}, before {offset + length}")
    return data


# --- the registry -------------------------------------------------------------------------------


class Refused(OSError):
    """A source refused before or while it is read, with its reject reason (`not_a_file`,
    `file_too_large`). An OSError, so every caller that handles unreadable sources handles it."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, str(self)))  # crosses process boundaries intact


HASH_CHUNK_BYTES = 4 << 20
"""Bytes hashed at a time by `file_digest`: no source is ever held whole to be hashed."""


FILE_KINDS = frozenset({"folder", "listing"})
"""Source kinds whose locators are file paths."""
SPOOLED_KINDS = frozenset({"python", "parquet"})
"""Source kinds whose records reach the workers only through the spool (NOTE [spool]); a
webdataset source's members are read in place from an uncompressed tar."""

SAFE_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
"""NOTE [safe open]: O_NONBLOCK so that opening a FIFO (or a device) that slipped past the
listing's stat never blocks waiting for a writer; fstat then refuses anything but a regular
file before a byte is read. On regular files O_NONBLOCK changes nothing."""

FILE_TYPES = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a folder",
}
"""What `stat` (links followed) can find where a file should be, in words."""


def not_a_file(st: os.stat_result) -> str | None:
    """Why `st` is not a regular file ("a FIFO", ...), or None when it is one."""
    if stat.S_ISREG(st.st_mode):
        return None
    return FILE_TYPES.get(stat.S_IFMT(st.st_mode), "not a regular file")


def too_large(size: int, max_bytes: int) -> str:
    return f"{size} bytes is above source.max_file_bytes ({max_bytes})"


@contextmanager
def _regular_file(path: str, max_bytes: int) -> Iterator[tuple[int, int]]:
    """(fd, size) of the regular file at `path`, no larger than `max_bytes`; else `Refused`."""
    fd = os.open(path, SAFE_OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        kind = not_a_file(st)
        if kind is not None:
            raise Refused("not_a_file", f"{path} is {kind}, not a regular file")
        if st.st_size > max_bytes:
            raise Refused("file_too_large", too_large(st.st_size, max_bytes))
        yield fd, st.st_size
    finally:
        os.close(fd)


def read_regular_file(path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path`: never blocks on a FIFO, never reads more than
    `max_bytes` (a file that grows past it while read is refused too)."""
    chunks: list[bytes] = []
    total = 0
    with _regular_file(path, max_bytes) as (fd, size):
        want = size + 1  # one read for the whole file, then one that finds its end
        while total <= max_bytes and (chunk := os.read(fd, min(want, max_bytes + 1 - total))):
            chunks.append(chunk)
            total += len(chunk)
            want = HASH_CHUNK_BYTES
    if total > max_bytes:
        raise Refused("file_too_large", too_large(total, max_bytes))
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def file_digest(path: str, algorithm: str, max_bytes: int) -> str:
    """Content hash of the regular file at `path`, streamed in HASH_CHUNK_BYTES pieces."""
    hasher = new_hasher(algorithm)
    total = 0
    with _regular_file(path, max_bytes) as (fd, size):
        # NOTE: sized to the file (+1 finds its end in the same read): a zeroed 4 MiB buffer a
        # file cost more than reading and hashing a 100 KB photo
        buffer = bytearray(min(HASH_CHUNK_BYTES, size + 1, max_bytes + 1))
        while n := os.readv(fd, [buffer]):
            total += n
            if total > max_bytes:
                raise Refused("file_too_large", too_large(total, max_bytes))
            hasher.update(memoryview(buffer)[:n])
    return hasher.hexdigest()


READ_AHEAD = 2
"""Files a reader thread may have read beyond the one its caller is waiting for."""


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

    def _jobs(self) -> queue.SimpleQueue[_Job]:
        """This thread's reader queue, with a live thread serving it."""
        jobs: queue.SimpleQueue[_Job] | None = getattr(self._local, "jobs", None)
        if jobs is None or self._local.pid != os.getpid():  # a forked child has no threads
            jobs = self._local.jobs = queue.SimpleQueue()
            self._local.pid = os.getpid()
            threading.Thread(target=_serve, args=(jobs,), name="etl-read", daemon=True).start()
        return jobs

    def outcomes(
        self, reads: Iterable[tuple[Callable[[], T], str]], seconds: float | None
    ) -> Iterator[T | OSError]:
        """For each (read, path), in order: what read() returned, or the OSError it raised
        (`Refused('io_timeout')` after `seconds`; None: no limit, read here). Anything else a
        read raises is raised."""
        if seconds is None:
            yield from _outcomes(read for read, _ in reads)
            return
        todo = iter(reads)
        pending: deque[_Job] = deque()
        try:
            while True:
                while len(pending) <= READ_AHEAD and (item := next(todo, None)) is not None:
                    pending.append(_Job(*item))
                    self._jobs().put(pending[-1])
                if not pending:
                    return
                job = pending.popleft()
                if not job.done.wait(seconds):
                    # that thread is stuck: what was queued behind it moves to a new one
                    self._local.jobs = None
                    for waiting in pending:
                        waiting.cancelled = True
                    pending = deque(_Job(j.read, j.path) for j in pending)
                    for waiting in pending:
                        self._jobs().put(waiting)
                    yield Refused(
                        "io_timeout",
                        f"{job.path}: no answer in {seconds:g} s (source.io_timeout): a hung or "
                        "very slow mount?",
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


def _outcomes(reads: Iterable[Callable[[], T]]) -> Iterator[T | OSError]:
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


def _read_file(config: SourceConfig, locator: str) -> bytes:
    limit = config.io_timeout
    return with_time_limit(
        lambda: read_regular_file(locator, config.max_file_bytes), limit, locator
    )


READERS: dict[str, Callable[[Any, str], bytes]] = {
    "folder": _read_file,
    "listing": _read_file,
    "lmdb": read_lmdb,
    "python": _read_slice,
    "webdataset": _read_slice,
    "parquet": _read_slice,
}
"""Source kind -> reader(source config, locator) -> the bytes the decoder sees."""


def read(config: SourceConfig, locator: str) -> bytes:
    """The bytes of one source; OSError (with the locator in the message) if it cannot be read."""
    return _reader(config)(config, locator)


def _reader(config: SourceConfig) -> Callable[[Any, str], bytes]:
    try:
        return READERS[config.kind]
    except KeyError:
        raise ValueError(f"no reader for source kind {config.kind!r}; add it to READERS") from None


def read_many(config: SourceConfig, locators: Iterable[str]) -> Iterator[bytes | OSError]:
    """`read` of each locator, in order: its bytes, or the OSError it raised. Files are read
    ahead of the caller (NOTE [ read ahead ])."""
    if config.kind in FILE_KINDS:
        return _file_outcomes(config, locators, read_regular_file)
    reader = _reader(config)
    return _outcomes(partial(reader, config, locator) for locator in locators)


def digest_many(
    config: SourceConfig, locators: Iterable[str], algorithm: str
) -> Iterator[str | OSError]:
    """The content hash of each source, as `digest(read(...))` gives it, in order, or the
    OSError its read raised; files are streamed and read ahead (NOTE [ read ahead ])."""
    if config.kind in FILE_KINDS:

        def hash_file(path: str, max_bytes: int) -> str:
            return file_digest(path, algorithm, max_bytes)

        return _file_outcomes(config, locators, hash_file)
    return (
        data if isinstance(data, OSError) else digest(data, algorithm)
        for data in read_many(config, locators)
    )


def _file_outcomes(
    config: SourceConfig, locators: Iterable[str], read: Callable[[str, int], T]
) -> Iterator[T | OSError]:
    """read(path, max_file_bytes) of each file locator, read ahead with the time limit."""
    limit = config.max_file_bytes
    reads = ((partial(read, locator, limit), locator) for locator in locators)
    return _TIMED.outcomes(reads, config.io_timeout)


def source_root_of(source: SourceConfig) -> Path:
    """The folder a manifest's `source` paths are relative to: source.path for a folder source,
    the listing's folder for a listing. Other kinds have no files to re-hash: ConfigError."""
    if isinstance(source, FolderSource):
        return source.path
    if isinstance(source, ListingSource):
        return source.path.parent
    raise ConfigError(
        f"source.kind {source.kind!r}: its samples are records, not files under a "
        "folder; only folder and listing sources are read back by path"
    )
