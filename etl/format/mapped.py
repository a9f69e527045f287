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
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc


class Mapped:
    """The table of the Arrow IPC file at `path`, memory-mapped read-only (zero copy)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as file:
            self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self.reader = ipc.open_file(pa.BufferReader(pa.py_buffer(self._map)))
        self.table: pa.Table = self.reader.read_all()

    def release(self) -> None:
        """Let go of the pages read so far (safe: the map is read-only and file-backed)."""
        self._map.madvise(mmap.MADV_DONTNEED)

    def __reduce__(self) -> tuple[type[Mapped], tuple[Path]]:
        """Pickled as its path: a map is this process's own (a loky or Dask worker maps the
        file again)."""
        return Mapped, (self.path,)
