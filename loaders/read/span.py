"""One read-only array over the rows of many shard files, so a batch is one numpy call.

Each shard file is mapped (`mmap` with `MAP_FIXED`) into its own slot of one reserved stretch
of address space, placed so that its rows fall on a stride common to all shards: row `r` of
shard `s` is row `first[s] + r` of a single [rows, sample_bytes] array, and a random batch
across shards is `np.take(..., mode="clip")`, numpy's C loop of one memcpy per row, in the
order asked.

NOTE [ why a span ]: measured with benchmarks/load/throughput.py (12 KiB samples, page cache,
random batches of 256, 2-core VM, share of a single-thread np.copyto of a large buffer): a
Python loop of one slice copy per row ~39-55% (Python's ~0.9 us per row costs as much as the
copy), np.take per shard ~65-73% but in (shard, row) order, so restoring the order asked needs a
second pass; np.take over a span 77-82%, with no compiled code of ours.

NOTE [ span layout ]: a file maps from offset 0 at a page-aligned address, so shard `s`'s rows
start `offset` bytes (the .npy header) after its slot's first page. With the array starting at
`offset` past a page boundary, that needs `first[s] * row_bytes` to be a multiple of the page
size, and every shard to have the same header length (this tool's writer always uses
`etl.format.shards.HEADER_BYTES`). Slots never share a page, so mapping one never replaces another's
last page. Gaps between slots are readable anonymous zero pages (reserved with MAP_NORESERVE:
no memory is committed), so a stray read gives zeros, not a crash; `take` is only given rows
that exist.

Linux and macOS only (`SUPPORTED`); elsewhere `loaders.read.reader` copies row by row.
"""

from __future__ import annotations

import ctypes
import errno
import math
import mmap
import os
import sys
import weakref
from functools import partial

import numpy as np
from numpy.typing import NDArray

from loaders.read.threads import run_each, spread

SUPPORTED = sys.platform in ("linux", "darwin") and hasattr(mmap, "MAP_ANONYMOUS")

_MAP_FIXED = 0x10  # the same value on Linux and macOS; the mmap module does not export it
_MAP_FAILED = ctypes.c_void_p(-1).value
_PAGE = mmap.PAGESIZE
_WILLNEED = getattr(mmap, "MADV_WILLNEED", 3)  # 3 on Linux and macOS
_RANDOM = getattr(mmap, "MADV_RANDOM", 1)  # 1 on Linux and macOS


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.restype = ctypes.c_int
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mincore.restype = ctypes.c_int
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


_LIBC = _libc() if SUPPORTED else None

_POPULATE_WRITE = 23
"""MADV_POPULATE_WRITE (Linux 5.14): map every page of a range, writable, in one call."""


def prefault(array: NDArray[np.uint8]) -> None:
    """Map the pages of `array` (shared memory about to be filled) writable in one call,
    instead of one page fault per 4 KiB as the copy reaches them. Advice only: a kernel or
    system without MADV_POPULATE_WRITE ignores it, and the copy faults the pages in as before.

    NOTE [ prefault the ring ]: a DataLoader worker started for an epoch (workers not
    persistent, DataLoader's default) maps the shared ring afresh, and the first copy into
    each 37 MiB slot of a 224x224x3 batch took ~9,400 page faults. Measured with
    benchmarks/load/workers.py (5,000 samples, 2 workers, 2-core VM): the workers' system
    time per epoch fell from 0.23 to 0.13 s and the epoch from ~185 to ~135 ms with it.
    """
    if _LIBC is None or sys.platform != "linux" or array.nbytes == 0:
        return
    start = array.ctypes.data
    aligned = start - start % _PAGE
    _LIBC.madvise(aligned, start + array.nbytes - aligned, _POPULATE_WRITE)


def _map(address: int | None, length: int, flags: int, fd: int = -1) -> int:
    assert _LIBC is not None
    if not 0 < length < 1 << 63:
        # NOTE: ctypes would pass such a length modulo 2**64: a small mapping that the rows
        # are then laid out over (a shards table read with verify_manifest=False claiming
        # 2**58 rows, found by the fuzz tests). No address space is that large anyway.
        raise OSError(errno.ENOMEM, f"mmap of {length} bytes: no address space is that large")
    result = _LIBC.mmap(address, length, mmap.PROT_READ, flags, fd, 0)
    if result is None or result == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {length} bytes failed: {os.strerror(err)}")
    return int(result)


def _anonymous(address: int | None, length: int) -> int:
    """Readable zero pages, committing no memory; at `address` exactly when it is given."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    return _map(address, length, flags | (_MAP_FIXED if address is not None else 0))


def _unmap(address: int, length: int) -> None:
    assert _LIBC is not None
    _LIBC.munmap(address, length)


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def layout(rows: NDArray[np.int64], row_bytes: int, offset: int) -> NDArray[np.int64]:
    """First span row of every shard, then the span's total rows (a pure function).

    Shard `s` may start at span row `f` when `f * row_bytes` is a multiple of the page size and
    its slot begins at or after the end of the page holding the previous shard's last byte.
    """
    step = _PAGE // math.gcd(row_bytes, _PAGE)
    firsts = np.zeros(len(rows) + 1, dtype=np.int64)
    cursor = 0
    for s, n in enumerate(rows.tolist()):
        firsts[s] = cursor
        used = _round_up(cursor * row_bytes + offset + n * row_bytes, _PAGE)
        cursor = _round_up(_round_up(used, row_bytes) // row_bytes, step)
    firsts[-1] = cursor
    return firsts


def runs(rows: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The first and last row of each run of consecutive rows in `rows` (any order, repeats
    allowed), ascending: [3, 1, 2, 7] -> ([1, 7], [3, 7]). A pure function."""
    unique = np.unique(rows)
    if not len(unique):
        return unique, unique
    cut = np.flatnonzero(np.diff(unique) != 1) + 1
    return unique[np.r_[0, cut]], unique[np.r_[cut - 1, len(unique) - 1]]


def no_readahead(array: NDArray[np.uint8]) -> None:
    """Have the kernel read none of `array`'s mapping around a page fault (MADV_RANDOM): only
    what is asked for comes in, as a `ShardSpan` made `exact` does. Nothing without libc."""
    if _LIBC is None or array.nbytes == 0:
        return
    start = array.ctypes.data
    aligned = start - start % _PAGE
    _LIBC.madvise(aligned, start + array.nbytes - aligned, _RANDOM)


def resident(addresses: NDArray[np.int64]) -> bool:
    """Whether the page holding each of `addresses` (in this process's mappings) is in memory
    (`mincore`); True where it cannot be asked (no libc), so nothing is advised."""
    if _LIBC is None:
        return True
    state = ctypes.c_ubyte()
    for start in addresses.tolist():
        if _LIBC.mincore(start - start % _PAGE, 1, ctypes.byref(state)) or not state.value & 1:
            return False
    return True


class ShardSpan:
    """The rows of every shard as one read-only [rows, row_bytes] array; shards mapped lazily.

    Private to one process and to its `ShardReader`: the array is never handed out (after
    `close` its memory is gone), only copied from by `take`. Not thread-safe: np.take lets go
    of the GIL, so `unmap` or `close` during another thread's `take` would pull its memory away
    (`ShardReader` holds a lock around all of them). A forked child inherits the mappings,
    which stay valid there.
    """

    def __init__(
        self, rows: NDArray[np.int64], row_bytes: int, offset: int, exact: bool = False
    ) -> None:
        if not SUPPORTED:
            raise OSError("a shard span needs mmap with MAP_FIXED (Linux or macOS)")
        if not 0 <= offset < _PAGE:
            raise ValueError(f"a span needs a header shorter than a page, got {offset} bytes")
        self.row_bytes = row_bytes
        self.offset = offset
        self.exact = exact
        """Map with MADV_RANDOM: a fault reads its own page and the kernel reads nothing
        ahead, so the page cache holds only what `advise` asked for and what was read."""
        self.rows = np.asarray(rows, dtype=np.int64)
        bounds = layout(self.rows, row_bytes, offset)
        self.first = bounds[:-1]
        self.mapped = np.zeros(len(self.rows), dtype=bool)
        self._length = _PAGE + int(bounds[-1]) * row_bytes + _PAGE
        self._base = _anonymous(None, self._length)
        self._close = weakref.finalize(self, _unmap, self._base, self._length)
        # Shard 0's slot starts one page into the reservation, its rows `offset` bytes later.
        start = ctypes.cast(self._base + _PAGE + offset, ctypes.POINTER(ctypes.c_uint8))
        self._array: NDArray[np.uint8] | None = np.ctypeslib.as_array(
            start, shape=(int(bounds[-1]), row_bytes)
        )

    def _slot(self, shard: int) -> tuple[int, int]:
        """(address, length) of shard `shard`'s mapping, header included."""
        address = self._base + _PAGE + int(self.first[shard]) * self.row_bytes
        return address, self.offset + int(self.rows[shard]) * self.row_bytes

    def map(self, shard: int, path: os.PathLike[str] | str) -> None:
        """Map the file of shard `shard` (already checked: header length and size) into its slot."""
        address, length = self._slot(shard)
        fd = os.open(path, os.O_RDONLY)
        try:
            _map(address, length, mmap.MAP_SHARED | _MAP_FIXED, fd)
        finally:
            os.close(fd)
        if self.exact:
            assert _LIBC is not None
            _LIBC.madvise(address, length, _RANDOM)
        self.mapped[shard] = True

    def unmap(self, shard: int) -> None:
        """Give shard `shard`'s pages back (they leave this process's RSS; the page cache keeps
        them) and leave zero pages in its slot."""
        if self.mapped[shard]:
            address, length = self._slot(shard)
            _anonymous(address, length)
            self.mapped[shard] = False

    def resident(self, span_rows: NDArray[np.int64], probes: int = 4) -> bool:
        """Whether the first page of each of up to `probes` rows spread over `span_rows` is in
        memory (`mincore`): a few system calls that tell a page-cached batch from a cold one."""
        assert _LIBC is not None and self._array is not None, "span used after close"
        picked = span_rows[:: -(-len(span_rows) // probes) or 1]
        origin = self._array.ctypes.data  # span row 0
        return resident(origin + picked * self.row_bytes)

    def advise(self, span_rows: NDArray[np.int64]) -> None:
        """Ask the kernel to start reading `span_rows` from disk now (MADV_WILLNEED), all of
        them at once, so a cold batch is read with many requests in flight rather than one
        page fault at a time. One call per run of consecutive rows; rows of unmapped shards
        (zero pages) cost nothing. Advice only: errors are ignored, nothing is waited for."""
        assert _LIBC is not None and self._array is not None, "span used after close"
        firsts, lasts = runs(span_rows)
        origin = self._array.ctypes.data  # span row 0
        starts = origin + firsts * self.row_bytes
        ends = origin + (lasts + 1) * self.row_bytes
        aligned = starts - starts % _PAGE
        for start, length in zip(aligned.tolist(), (ends - aligned).tolist(), strict=True):
            _LIBC.madvise(start, length, _WILLNEED)

    def take(self, span_rows: NDArray[np.int64], out: NDArray[np.uint8]) -> None:
        """Copy span rows `span_rows` into the C-contiguous `out`, in order; their shards must
        be mapped and every row must exist (the caller checks: numpy clips, it does not)."""
        assert self._array is not None, "span used after close"
        np.take(self._array, span_rows, axis=0, out=out.reshape(len(span_rows), -1), mode="clip")

    def close(self) -> None:
        """Unmap everything now (also done when the span is garbage collected)."""
        self._array = None
        self.mapped[:] = False
        self._close()


def take_spread(span: ShardSpan, span_rows: NDArray[np.int64], out: NDArray[np.uint8]) -> None:
    """`span.take`, each of the loader's threads copying its share of the rows into its part
    of `out` (`loaders.read.threads.spread`)."""
    shares = spread(len(span_rows), out.nbytes)  # one share runs in this thread
    run_each([partial(span.take, span_rows[a:b], out[a:b]) for a, b in shares])


def copy_rows(
    flat: dict[int, memoryview],
    shard: NDArray[np.int64],
    row: NDArray[np.int64],
    out: NDArray[np.uint8],
    size: int,
) -> None:
    """Rows (shard[j], row[j]) of `size` bytes from each shard's flat map into out[j], without
    a span: one slice copy per row, or per run of rows consecutive both in a shard and in
    `out` (NOTE [ why a span ] for what that costs)."""
    n, shards = len(row), shard.tolist()
    dest = out.reshape(-1).data
    cut = np.flatnonzero((shard[1:] != shard[:-1]) | (row[1:] != row[:-1] + 1)) + 1
    if len(cut) == n - 1:  # random order: one copy per row
        offset = 0
        for s, start in zip(shards, (row * size).tolist(), strict=True):
            dest[offset : offset + size] = flat[s][start : start + size]
            offset += size
    else:
        first = np.concatenate([[0], cut])
        lengths = np.diff(np.append(first, n)) * size
        for s, start, offset, length in zip(
            shard[first].tolist(),
            (row[first] * size).tolist(),
            (first * size).tolist(),
            lengths.tolist(),
            strict=True,
        ):
            dest[offset : offset + length] = flat[s][start : start + length]
