"""Shard access inside one process: memmaps opened lazily, checked on open, copied row by row.

Every shard is opened with `etl.shards.open_shard`, which refuses a file whose header or size
does not match the shards table (`ShardError`, naming the path). Nothing here is shared between
processes: a pickled reader carries only the shard table and reopens what it needs.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from numpy.typing import NDArray

from etl.checksums import file_digests
from etl.errors import ShardError
from etl.shards import open_shard
from loaders.catalog import ShardSet

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


class ShardReader:
    """Lazily opened, read-only views of the shards of a `ShardSet`, one set per process.

    `release_every` (bytes, default None: never) drops every mapping after that much has been
    read, so the process's RSS stays bounded even when an epoch touches far more: by a few times
    `release_every` for random reads, as the kernel maps 64 KiB around each page it faults in.

    NOTE [ RSS of memmaps ]: pages read through a mapping count in the reader's RSS (as
    file-backed, shared memory) until it is unmapped, although they are page cache that every
    worker shares and the kernel can reclaim. Tools that police RSS see a loader that "grows"
    to the dataset size; releasing costs one `open_shard` per shard per release (~0.2 ms here).
    """

    def __init__(
        self, shards: ShardSet, verify: bool = False, release_every: int | None = None
    ) -> None:
        if release_every is not None and release_every <= 0:
            raise ValueError(f"release_every must be a positive byte count, got {release_every}")
        self.shards = shards
        self.verify = verify
        self.release_every = release_every
        self.sample_bytes = int(np.prod(shards.sample_shape))
        self._arrays: dict[int, NDArray[np.uint8]] = {}
        self._flat: dict[int, memoryview] = {}
        self._read_since_release = 0

    def __getstate__(self) -> dict[str, Any]:
        # NOTE: open memmaps stay behind; each worker reopens (and re-checks) what it reads.
        state = self.__dict__.copy()
        state["_arrays"], state["_flat"] = {}, {}
        return state

    def array(self, shard: int) -> NDArray[np.uint8]:
        """Shard `shard` as a read-only [rows, *sample_shape] array backed by the page cache."""
        found = self._arrays.get(shard)
        if found is None:
            found = self._open(shard)
        return found

    def _open(self, shard: int) -> NDArray[np.uint8]:
        path = self.shards.path(shard)
        if self.verify:
            verify_shard(path, self.shards.algorithm, self.shards.checksums[shard])
        mapped = open_shard(path, self.shards.sample_shape, int(self.shards.rows[shard]))
        # NOTE: a plain ndarray view of the memmap: indexing an np.memmap subclass runs Python
        # code (__array_finalize__) on every row, which costs more than copying the row.
        array: NDArray[np.uint8] = np.asarray(mapped)
        self._arrays[shard] = array
        self._flat[shard] = array.reshape(-1).data
        return array

    def row(self, shard: int, row: int) -> NDArray[np.uint8]:
        """A copy of one sample."""
        sample = np.array(self.array(shard)[row])
        self._count(sample.nbytes)
        return sample

    def _count(self, nbytes: int) -> None:
        self._read_since_release += nbytes
        if self.release_every is not None and self._read_since_release >= self.release_every:
            self.release()

    def release(self) -> None:
        """Unmap every shard; the next read reopens (and re-checks) what it needs."""
        self._arrays.clear()
        self._flat.clear()
        self._read_since_release = 0

    def close(self, shard: int) -> None:
        """Drop one shard's mapping (its pages leave this process's RSS; the page cache keeps
        them). The stream calls this after each shard so resident memory stays flat."""
        self._flat.pop(shard, None)
        self._arrays.pop(shard, None)

    def gather(
        self, shard_idx: NDArray[np.integer], rows: NDArray[np.integer], out: NDArray[np.uint8]
    ) -> None:
        """Copy samples (shard_idx[j], rows[j]) into out[j], for a C-contiguous `out`.

        NOTE [ copy method ]: measured with benchmarks/bench_loaders.py (12 KiB samples, page
        cache, random batches of 256, 2-core VM; share of a single-thread np.copyto of a large
        buffer): a memoryview slice assignment per row, in the order asked, ~52-55%; np.copyto
        per row ~40%; numpy fancy indexing per shard ~50%; ctypes.memmove, np.concatenate or
        torch.cat of row views, os.preadv and pyarrow's take all lose. A C loop over random rows
        (np.take(mode="clip") on one big array) reaches ~84%: the gap is Python's ~0.9 us per
        row, which only a compiled gather across shard files would remove. np.take per shard is
        C speed (~65-73%) but writes a shard's rows together, so the batch comes out in (shard,
        row) order; restoring the order asked takes a second pass, which loses to the per-row
        loop. Rows consecutive both in a shard and in `out` (sequential orders) are copied as
        one run. Visiting rows sorted by (shard, row), as this did before, was ~15% slower on
        random batches and gained nothing once pages are cached.
        """
        if not out.flags.c_contiguous:
            raise ValueError("gather needs a C-contiguous output buffer")
        n = len(rows)
        if n == 0:
            return
        size = self.sample_bytes
        shard = np.asarray(shard_idx, dtype=np.int64)
        row = np.asarray(rows, dtype=np.int64)
        shards = shard.tolist()
        for s in set(shards).difference(self._flat):
            self._open(s)
        flat = self._flat
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
        self._count(n * size)
