"""Shard access inside one process: memmaps opened lazily, checked on open, copied row by row.

Every shard is opened with `etl.shards.open_shard`, which refuses a file whose header or size
does not match the shards table (`ShardError`, naming the path). Nothing here is shared between
processes: a pickled reader carries only the shard table and reopens what it needs.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch.utils.data import get_worker_info

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


def new_batch(shape: tuple[int, ...], pin: bool) -> torch.Tensor:
    """An uninitialised uint8 batch buffer, allocated where the batch is going next.

    NOTE [ batch buffers ]: in a DataLoader worker the buffer is allocated in shared memory, as
    `default_collate` does, because a plain tensor would be copied into shared memory again when
    it is sent to the main process. With `pin` (main process, CUDA present) the batch is gathered
    straight into page-locked memory so the DataLoader need not pin (copy) it a second time.
    """
    numel = int(np.prod(shape))
    if get_worker_info() is not None:
        storage = torch.UntypedStorage._new_shared(numel)
        return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)
    return torch.empty(shape, dtype=torch.uint8, pin_memory=pin)


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

        NOTE [ copy method ]: measured by benchmarks/bench_loaders.py (12 KiB samples, page
        cache, batches of 256, 2-core VM; GB/s, memcpy ~7-9): a memoryview slice assignment per
        row, a bare memcpy with little interpreter overhead, ~4.0; np.copyto per row ~2.9 (1.7 on
        np.memmap objects); fancy indexing of one 4-d memmap ~3.9, np.take ~2.9. Fancy indexing
        per shard (a temporary, then a scatter) wins when a batch touches few shards (~4.6 with
        9) and loses badly with many (~2.0 with 120), so rows it is. Rows are visited sorted by
        (shard, row): no gain once pages are cached, but cold reads then go forward through each
        file, which is what readahead expects.
        """
        if not out.flags.c_contiguous:
            raise ValueError("gather needs a C-contiguous output buffer")
        if len(rows) == 0:
            return
        size = self.sample_bytes
        dest = out.reshape(-1).data
        order = np.lexsort((rows, shard_idx))
        shard, row = np.asarray(shard_idx)[order], np.asarray(rows, dtype=np.int64)[order]
        # Runs of rows that are consecutive in the shard and in `out` are copied at once (a
        # sequential batch is one memcpy per shard); a random batch has one run per row.
        cut = (np.diff(shard) != 0) | (np.diff(row) != 1) | (np.diff(order) != 1)
        first = np.concatenate([[0], np.flatnonzero(cut) + 1])
        lengths = (np.diff(np.append(first, len(order))) * size).tolist()
        flat = self._flat
        for s, start, offset, length in zip(
            shard[first].tolist(),
            (row[first] * size).tolist(),
            (order[first] * size).tolist(),
            lengths,
            strict=True,
        ):
            source = flat.get(s)
            if source is None:
                self._open(s)
                source = flat[s]
            dest[offset : offset + length] = source[start : start + length]
        self._count(len(rows) * size)
