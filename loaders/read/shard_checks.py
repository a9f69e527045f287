"""Checks of the bytes a reader reads against what the manifest recorded: a whole shard's
checksum (`verify_shard`), one probe row when a shard is opened (`probe_shard`), and rows hashed
right after their copy (`take_checked`); the first two once per process per unchanged file."""

from __future__ import annotations

import mmap
import os
from functools import partial
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from etl.errors import ShardError
from etl.format.checksums import digest, file_digests
from etl.format.row_checksums import RowChecksums
from loaders.read.span import ShardSpan
from loaders.read.threads import run_each, spread

_PAGE = mmap.PAGESIZE

CHECK_BYTES = 512 << 10
"""Rows copied at a time when each is hashed after its copy (`take_checked`).

NOTE [ verify once ]: the default open checks each row the first time any process of the
loader reads it (`verify="once"`). Hashing a whole batch after copying it reads it back from
memory: 0.67x the samples/s of the copy alone (224x224x3 rows, batches of 256, page-cached,
2-core VM). Hashing each few rows while the copy left them in the CPU's cache: 0.83x. Half a
MB stays within a core's L2 cache on current x86 and ARM servers; after the first epoch a
batch costs its rows' flags only."""

_VERIFIED: set[tuple[str, int, int, int, str, str]] = set()
"""Shards whose checksum this process (or the parent it forked from) has checked.

NOTE [ verify once per process ]: keyed by (path, inode, size, mtime, algorithm, expected digest),
so a replaced file is checked again while a reopened or re-pickled reader is not. A forked worker
inherits the parent's entries, which stay true for the same unchanged file.
"""


def verify_shard(path: os.PathLike[str] | str, algorithm: str, expected: str) -> None:
    """Hash a whole shard file and compare with the manifest; at most once per process per file."""
    stat = os.stat(path)
    key = (os.fspath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, algorithm, expected)
    if key in _VERIFIED:
        return
    (actual,) = file_digests(path, (algorithm,))  # type: ignore[arg-type]
    if actual != expected:
        raise ShardError(
            f"{path}: {algorithm} checksum {actual} does not match the manifest's {expected}; "
            "the shard changed after packing (repack it, or audit the dataset)"
        )
    _VERIFIED.add(key)


_PROBED: set[tuple[str, int, int, int, int, str]] = set()
"""Shards whose probe row this process has checked, keyed as `_VERIFIED` is."""


def probe_shard(
    path: Path, offset: int, at: int, row_bytes: int, row: int, algorithm: str, expected: str
) -> None:
    """Check that row `row` of the shard at `path` (its `row_bytes` bytes `at` bytes into the
    data, which starts at `offset`) is the sample whose checksum the manifest records as
    `expected`; once per process per unchanged file.

    NOTE [ probe ]: a header and a size say a file has the right shape, not that it holds
    the right samples: a shard swapped with another of the same shape (a careless copy, a
    rename) passed both and was read as if it were the right one. One row's checksum, read
    at open, tells. It costs one row's read and hash per shard a process opens; `verify=True`
    hashes whole shards, which also catches a byte changed anywhere (and `etl audit` does).
    The row is read without readahead and dropped from the page cache after, so what the
    loader caches stays what it reads (the `readahead` and `drop_behind` tests count pages).
    """
    stat = os.stat(path)
    key = (os.fspath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, row, expected)
    if key in _PROBED:
        return
    start = offset + at
    with open(path, "rb", buffering=0) as f:
        fadvise = getattr(os, "posix_fadvise", None)
        if fadvise is not None:  # no readahead around the row
            fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
        data = os.pread(f.fileno(), row_bytes, start)
        if fadvise is not None:  # and the page cache as the loader's own reads leave it
            first = start - start % _PAGE
            fadvise(f.fileno(), first, start + row_bytes - first, os.POSIX_FADV_DONTNEED)
    actual = digest(data, algorithm)
    if actual != expected:
        raise ShardError(
            f"{path}: row {row} is not the sample the manifest stores there ({algorithm} "
            f"{actual}, the manifest's {expected}): the file was replaced or changed"
        )
    _PROBED.add(key)


def take_checked(
    span: ShardSpan,
    span_rows: NDArray[np.int64],
    sums: RowChecksums,
    seen: NDArray[np.bool_] | None,
    shard: NDArray[np.int64],
    row: NDArray[np.int64],
    out: NDArray[np.uint8],
    spread_out: bool = True,
) -> int | None:
    """`span.take` with each row to check (`verify="rows"` or "once") hashed right after
    its copy, a few hundred KB at a time while they are in the CPU's cache: 0.83x the
    unchecked copy where hashing the whole batch after it was 0.67x (NOTE [ verify
    once ]). The position of the first row that does not match, else None. `spread_out`:
    each of the loader's threads takes its share of the rows (`loaders.read.threads`)."""
    shares = spread(len(row), out.nbytes) if spread_out else [(0, len(row))]
    if len(shares) > 1:
        found: list[int | None] = [None] * len(shares)

        def share(k: int, a: int, b: int) -> None:
            found[k] = take_checked(
                span, span_rows[a:b], sums, seen, shard[a:b], row[a:b], out[a:b], False
            )

        run_each([partial(share, k, a, b) for k, (a, b) in enumerate(shares)])
        return next((a + f for (a, _), f in zip(shares, found, strict=True) if f is not None), None)
    at, todo = sums.unchecked(shard, row, seen)
    if not len(todo):
        span.take(span_rows, out)
        return None
    hashed = np.zeros(len(row), dtype=bool)
    hashed[todo] = True
    flat = out.reshape(len(row), -1)
    step = max(1, CHECK_BYTES // max(flat.shape[1], 1))
    for begin in range(0, len(row), step):
        end = begin + step
        span.take(span_rows[begin:end], flat[begin:end])
        for j in np.flatnonzero(hashed[begin:end]).tolist():
            if not sums.matches(int(at[begin + j]), flat[begin + j]):
                return begin + j
    if seen is not None:
        seen[at[todo]] = True
    return None
