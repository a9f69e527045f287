"""The shards one process holds mapped: what a `ShardReader` reads from, and what it lets go.

Each shard is opened lazily with `etl.format.shards.open_shard`, which refuses a file whose
header or size does not match the shards table (`ShardError`, naming the path), and checked on
open (its probe row; its checksum with `verify_shards`). Shards are mapped one array each, and
together in one `ShardSpan` when the reader gathers through one. Mappings are let go after
`release_every` bytes (dropping what was read with `drop_behind`), after each shard of a stream,
and, from a bounded cache, as soon as a batch is read. Not thread-safe: the reader's lock
serialises every call.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from etl.errors import ShardError
from etl.format.shards import check_shard, open_shard
from loaders.read.catalog import ShardSet
from loaders.read.page_cache import drop_read
from loaders.read.shard_checks import probe_shard, verify_shard
from loaders.read.span import SUPPORTED, ShardSpan, no_readahead


class ShardMaps:
    """The open mappings of a `ShardSet`'s shards in one process (see the module docstring).

    `release_every` (bytes, default None: never) drops every mapping after that much has been
    read, so the process's RSS stays bounded even when an epoch touches far more: by a few times
    `release_every` for random reads, as the kernel maps 64 KiB around each page it faults in.

    `drop_behind` (default off; needs `release_every`) also asks the kernel, at each release,
    to drop the pages of the rows read since the last one (`posix_fadvise` DONTNEED), so
    an epoch over a dataset larger than memory leaves at most about `release_every` of it
    cached per process instead of evicting everything else. Rows not read yet stay, whoever
    fetched them. It also reads exactly what is asked: every batch is advised (whatever
    `readahead` says) and the kernel's own readahead is off (MADV_RANDOM), which would
    otherwise bring in up to read_ahead_kb around each fault that no drop would name. Off for
    a dataset that fits in memory: the next epoch would read it from disk again.

    NOTE [ RSS of memmaps ]: pages read through a mapping count in the reader's RSS (as
    file-backed, shared memory) until it is unmapped, although they are page cache that every
    worker shares and the kernel can reclaim. Tools that police RSS see a loader that "grows"
    to the dataset size; releasing costs one `open_shard` per shard per release (~0.2 ms here).
    """

    def __init__(
        self,
        shards: ShardSet,
        verify_shards: bool = False,
        release_every: int | None = None,
        drop_behind: bool = False,
    ) -> None:
        if release_every is not None and release_every <= 0:
            raise ValueError(f"release_every must be a positive byte count, got {release_every}")
        if drop_behind and release_every is None:
            raise ValueError("drop_behind needs release_every: the bytes read between two drops")
        self.shards = shards
        self.verify_shards = verify_shards
        self.release_every = release_every
        self.drop_behind = drop_behind
        self.sample_bytes = int(np.prod(shards.sample_shape))
        self.arrays: dict[int, NDArray[np.uint8]] = {}
        self.flat: dict[int, memoryview] = {}
        self.span: ShardSpan | None = None
        self.use_span = SUPPORTED
        """Gather through a `ShardSpan`; False after a shard did not fit one (row by row then)."""
        self._read: list[tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]] = []
        """(shards, starts, ends) of the bytes read since the last release, from each shard's
        data (after its header): what `drop_behind` drops."""
        self._read_since_release = 0

    def __getstate__(self) -> dict[str, Any]:
        # NOTE: open mappings stay behind; each worker reopens (and re-checks) what it reads.
        state = self.__dict__.copy()
        state["arrays"], state["flat"], state["span"] = {}, {}, None
        return state

    def array(self, shard: int) -> NDArray[np.uint8]:
        """Shard `shard` as a read-only [rows, *sample_shape] array backed by the page cache."""
        found = self.arrays.get(shard)
        if found is None:
            found = self.open(shard)
        return found

    def open(self, shard: int) -> NDArray[np.uint8]:
        """Map shard `shard` as one array (checked first), and keep it."""
        with self._opening(shard):
            path = self._checked_path(shard)
            mapped = open_shard(path, self.shards.stored_shape, int(self.shards.rows[shard]))
            self._probe(shard, path, mapped.offset)
        # NOTE: a plain ndarray view of the memmap: indexing an np.memmap subclass runs Python
        # code (__array_finalize__) on every row, which costs more than copying the row.
        array: NDArray[np.uint8] = np.asarray(mapped)
        if self.drop_behind:  # every read advised (`prefetch_places`), none read around
            no_readahead(array)
        self.arrays[shard] = array
        self.flat[shard] = array.reshape(-1).data
        return array

    def open_all(self, shards: ArrayLike) -> None:
        """`open` each of `shards` not mapped yet."""
        for s in set(np.asarray(shards).tolist()).difference(self.flat):
            self.open(s)

    def _checked_path(self, shard: int) -> Path:
        """The path of shard `shard`, its checksum verified first with `verify_shards`; from a
        bounded cache, held and fetched first (NOTE [ bounded cache ] in etl.storage.cache)."""
        cache = self.shards.cache
        if cache is not None:
            cache.acquire([shard])  # a no-op for the shards of a batch `hold_only` acquired
        path = self.shards.path(shard)
        if self.verify_shards:
            verify_shard(path, self.shards.algorithm, self.shards.checksums[shard])
        return path

    def _probe(self, shard: int, path: Path, offset: int) -> None:
        if shard < len(self.shards.probes):
            row, expected = self.shards.probes[shard]
            start, size = row * self.sample_bytes, self.sample_bytes
            if self.shards.flat:
                start, size = self.shards.probe_spans[shard]
            probe_shard(path, offset, start, size, row, self.shards.algorithm, expected)

    @contextmanager
    def _opening(self, shard: int) -> Iterator[None]:
        """Turn any failure to open or check shard `shard` into one ShardError that names the
        shard, its samples and the repair command (see `ShardSet.unreadable`)."""
        try:
            yield
        except (ShardError, OSError) as exc:
            raise self.shards.unreadable(shard, exc) from None

    def spanned(self, shards: NDArray[np.int64]) -> ShardSpan | None:
        """The span with every shard in `shards` mapped, or None (then copy row by row)."""
        span = self.span
        if span is not None and span.mapped[shards].all():
            return span
        for s in np.unique(shards).tolist():
            if span is not None and span.mapped[s]:
                continue
            with self._opening(s):
                path = self._checked_path(s)
                offset = check_shard(path, self.shards.stored_shape, int(self.shards.rows[s]))
                self._probe(s, path, offset)
            if span is None:
                span = self._new_span(offset)
                if span is None:
                    return None
            if offset != span.offset:  # a header length this span cannot place: see ShardSpan
                self.use_span = False
                span.close()
                self.span = None
                return None
            with self._opening(s):
                span.map(s, path)
        return span

    def _new_span(self, offset: int) -> ShardSpan | None:
        try:
            self.span = ShardSpan(
                self.shards.rows, self.sample_bytes, offset, exact=self.drop_behind
            )
        except (OSError, OverflowError, ValueError, MemoryError):
            # NOTE: a span that cannot be made: no room to reserve address space for every
            # shard at once (a `ulimit -v`), or a manifest read with verify_manifest=False
            # that claims far more rows than its shards hold (633 TB: mmap's ENOMEM; past
            # 2**64 bytes, which `span._map` refuses rather than let ctypes wrap it: both
            # found by the fuzz tests). Copy row by row, and each shard's own check names the
            # one that does not match.
            self.use_span = False
        return self.span

    def hold_only(self, keep: ArrayLike) -> None:
        """From a bounded cache, close every shard but those of `keep` (the batch about to be
        read, or none after it was), then hold and fetch those, all at once: a process holds
        the shards of the batch it reads, and nothing while it waits for its next one, which
        another process may need room for (NOTE [ bounded cache ])."""
        cache = self.shards.cache
        if cache is None:
            return
        wanted = np.unique(keep).tolist()
        for shard in (self.mapped() | cache.held()).difference(wanted):
            self.close(shard)
        if wanted:
            cache.acquire(wanted)

    def count_rows(self, shards: NDArray[np.int64], rows: NDArray[np.int64]) -> None:
        """`count` of fixed-size rows."""
        starts = rows.astype(np.int64) * self.sample_bytes
        self.count(len(rows) * self.sample_bytes, shards, starts, starts + self.sample_bytes)

    def count(self, nbytes: int, shards: ArrayLike, starts: ArrayLike, ends: ArrayLike) -> None:
        """Count bytes [starts, ends) read of `shards`' data toward `release_every` (and
        remember them for `drop_behind`)."""
        self._read_since_release += nbytes
        if self.drop_behind:  # copies: a caller may reuse its index arrays
            self._read.append(
                (np.array(shards, np.int64), np.array(starts, np.int64), np.array(ends, np.int64))
            )
        if self.release_every is not None and self._read_since_release >= self.release_every:
            self.release()

    def release(self) -> None:
        """Unmap every shard; the next read reopens (and re-checks) what it needs. With
        `drop_behind`, the page cache of the shards read since the last release is dropped."""
        self.arrays.clear()
        self.flat.clear()
        if self.span is not None:
            self.span.close()
            self.span = None
        self._read_since_release = 0
        cache = self.shards.cache
        if cache is not None:
            for shard in cache.held():
                cache.release(shard)
        if self._read:
            drop_read(self.shards, *map(np.concatenate, zip(*self._read, strict=True)))
            self._read.clear()

    def close(self, shard: int) -> None:
        """Drop one shard's mapping (its pages leave this process's RSS; the page cache keeps
        them)."""
        self.flat.pop(shard, None)
        self.arrays.pop(shard, None)
        if self.span is not None:
            self.span.unmap(shard)
        if self.shards.cache is not None:
            self.shards.cache.release(shard)

    def mapped(self) -> set[int]:
        """The shards mapped now."""
        spanned = [] if self.span is None else np.flatnonzero(self.span.mapped).tolist()
        return set(self.arrays).union(spanned)
