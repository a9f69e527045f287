"""Reading a source file safely: never blocking on a FIFO or a device, never reading more than
`source.max_file_bytes`, refusing what is no regular file with its reject reason (`Refused`)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from etl.format.checksums import new_hasher
from etl.sources.entries import FileStat
from etl.sources.listed_rejects import SourceReject


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


def stat_file(source: str, path: str, max_bytes: int) -> FileStat | SourceReject:
    """The stat of the regular file at `path` (links followed), or why it is none."""
    try:
        st = os.stat(path)
    except OSError as exc:
        reason = "missing" if isinstance(exc, FileNotFoundError) else "io_error"
        return SourceReject(source, reason, f"cannot stat: {exc.strerror}")
    kind = not_a_file(st)
    if kind is not None:
        return SourceReject(source, "not_a_file", f"{kind}, not a regular file (never opened)")
    found = FileStat(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if st.st_size > max_bytes:
        return found.reject(source, "file_too_large", too_large(st.st_size, max_bytes))
    return found
