"""Arrow files read through a memory map whose pages this process can let go of.

A mapped table costs no heap, but every page a read touches stays in the process's resident
set until the map is closed, so one pass over a 2 GB manifest shows as 2 GB of RSS (clean
page cache, but counted, and what a container's limit sees). `Mapped.release` drops this
process's hold on them (madvise DONTNEED): the data stays in the page cache and the next read
faults it back in without I/O. A run reading files larger than memory in passes releases after
each pass, so its resident set follows one pass, not the file.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

RELEASE_BATCHES = 64
"""Record batches opened between two `release`s while a file is opened."""


class Mapped:
    """The table of the Arrow IPC file at `path`, memory-mapped read-only (zero copy)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as file:
            self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self.reader = ipc.open_file(pa.BufferReader(pa.py_buffer(self._map)))
        # NOTE: a batch at a time, let go of as it goes: reading a batch's metadata touches a
        # page of it, and the kernel maps a whole folio of the page cache per touch (hundreds
        # of KB on recent kernels): `read_all` had half of a 700 MB manifest resident.
        batches = []
        for i in range(self.reader.num_record_batches):
            batches.append(self.reader.get_batch(i))
            if i % RELEASE_BATCHES == RELEASE_BATCHES - 1:
                self.release()
        self.release()
        self.table: pa.Table = pa.Table.from_batches(batches, self.reader.schema)

    def release(self) -> None:
        """Let go of the pages read so far (safe: the map is read-only and file-backed)."""
        self._map.madvise(mmap.MADV_DONTNEED)

    def __reduce__(self) -> tuple[type[Mapped], tuple[Path]]:
        """Pickled as its path: a map is this process's own (a loky or Dask worker maps the
        file again)."""
        return Mapped, (self.path,)


RELEASE_ROWS = 1 << 16
"""Rows passed on between two releases by `releasing`: a few MB of pages resident."""


def releasing(
    pieces: Iterable[pa.Table], release: Callable[[], None], rows: int = RELEASE_ROWS
) -> Iterator[pa.Table]:
    """`pieces`, calling `release` (e.g. `Mapped.release`) every `rows` rows passed on and at
    the end: a pass over mapped tables holds a few MB of their pages, not the files."""
    since = 0
    for piece in pieces:
        yield piece
        since += piece.num_rows
        if since >= rows:
            release()
            since = 0
    release()
