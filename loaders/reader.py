"""Shard access inside one process: files opened lazily, checked on open, batches gathered
with one numpy call over a `ShardSpan` (row by row where a span cannot be made).

Every shard is opened with `etl.format.shards.open_shard`, which refuses a file whose header or size
does not match the shards table (`ShardError`, naming the path). Nothing here is shared between
processes: a pickled reader carries only the shard table and reopens what it needs.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from etl.errors import ShardError
from etl.format.checksums import digest, file_digests
from etl.format.ragged import shape_of
from etl.format.rowsums import mismatch
from etl.format.shards import HEADER_BYTES, check_shard, open_shard
from loaders.batches import SIZE_COLUMNS, Columns
from loaders.catalog import Selection, ShardSet
from loaders.span import SUPPORTED, ShardSpan, no_readahead, resident, runs

_PAGE = mmap.PAGESIZE

CHECK_BYTES = 512 << 10
"""Rows copied at a time when each is hashed after its copy (`ShardReader._take_checked`).

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


def advise_file(path: Path, advice: str, ranges: Iterable[tuple[int, int]] = ((0, 0),)) -> None:
    """`posix_fadvise` of the file at `path`, of the whole file or of (offset, length) `ranges`:
    'WILLNEED' (read it ahead) or 'DONTNEED' (drop its clean, unmapped pages from the page
    cache). Advice only: where it cannot be given (a file that cannot be opened, which reading
    it names; no posix_fadvise, as on macOS), nothing happens."""
    fadvise, flag = getattr(os, "posix_fadvise", None), getattr(os, f"POSIX_FADV_{advice}", None)
    if fadvise is None or flag is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        for offset, length in ranges:
            fadvise(fd, offset, length, flag)
    except OSError:
        pass
    finally:
        os.close(fd)


def row_pages(rows: NDArray[np.int64], row_bytes: int, header: int) -> list[tuple[int, int]]:
    """(offset, length) of the whole pages holding `rows` of a file whose rows of `row_bytes`
    start after `header` bytes: one range per run of consecutive rows, widened to page bounds
    (the kernel drops whole pages only, so a narrower range would leave each run's edge pages
    behind; a neighbour row that shares one is faulted in again, one page).

    NOTE [ large folios ]: the kernel keeps a cached folio (a block of pages, up to the
    readahead size on ext4 since Linux 6.16) that the range covers only in part. Folios read in
    by mmap faults and MADV_WILLNEED, as the reader's are, are small; a file first read with
    buffered `read` (np.load, cp) may keep a run's edge folios cached.
    """
    firsts, lasts = runs(rows)
    return byte_pages(header + firsts * row_bytes, header + (lasts + 1) * row_bytes)


def byte_pages(starts: NDArray[np.int64], ends: NDArray[np.int64]) -> list[tuple[int, int]]:
    """(offset, length) of the whole pages holding bytes [starts[i], ends[i]) of a file, in
    order, overlapping or touching ranges merged (`row_pages`; samples of their own size)."""
    if not len(starts):
        return []
    order = np.argsort(starts, kind="stable")
    first = starts[order] - starts[order] % _PAGE
    last = ends[order] + -ends[order] % _PAGE
    reach = np.maximum.accumulate(last)
    begins = np.r_[True, first[1:] > reach[:-1]]
    merged_starts = first[begins]
    merged_ends = reach[np.r_[np.flatnonzero(begins)[1:] - 1, len(reach) - 1]]
    return list(zip(merged_starts.tolist(), (merged_ends - merged_starts).tolist(), strict=True))


class ShardReader:
    """Lazily opened, read-only views of the shards of a `ShardSet`, one set per process.

    `release_every` (bytes, default None: never) drops every mapping after that much has been
    read, so the process's RSS stays bounded even when an epoch touches far more: by a few times
    `release_every` for random reads, as the kernel maps 64 KiB around each page it faults in.

    `readahead` (default on) has a batch whose rows are not in memory read from disk all at
    once before the copy: `ShardSpan.resident` probes a few rows, and if any is missing,
    `ShardSpan.advise` asks for every row, so the device gets a batch of requests in flight
    instead of one page fault at a time. A page-cached batch costs the probe only. Without a
    span (the row-by-row fallback) nothing is advised.

    `drop_behind` (default off; needs `release_every`) also asks the kernel, at each release,
    to drop the pages of the rows read since the last one (`posix_fadvise` DONTNEED), so
    an epoch over a dataset larger than memory leaves at most about `release_every` of it
    cached per process instead of evicting everything else. Rows not read yet stay, whoever
    fetched them. It also reads exactly what is asked: every batch is advised (whatever
    `readahead` says) and the kernel's own readahead is off (MADV_RANDOM), which would
    otherwise bring in up to read_ahead_kb around each fault that no drop would name. Off for
    a dataset that fits in memory: the next epoch would read it from disk again.

    NOTE [ readahead ]: measured with benchmarks/bench_cold.py (5,000 samples of 147 KiB, page
    cache dropped before each epoch, 2-core VM with a ~1 GB/s virtual disk): random batches
    with 0 workers 6,725 -> 7,880 samples/s (0.89 -> 1.09 of 1-thread `pread` of the same
    rows), blocks 7,005 -> 8,675; with 2 workers within noise (7,262 -> 7,337), as two
    processes already keep two faults in flight. Page-cached: 30,773 vs 30,684 (the probe);
    advising without the probe cost 10-20% there.

    NOTE [ RSS of memmaps ]: pages read through a mapping count in the reader's RSS (as
    file-backed, shared memory) until it is unmapped, although they are page cache that every
    worker shares and the kernel can reclaim. Tools that police RSS see a loader that "grows"
    to the dataset size; releasing costs one `open_shard` per shard per release (~0.2 ms here).
    """

    def __init__(
        self,
        shards: ShardSet,
        verify: bool = False,
        release_every: int | None = None,
        readahead: bool = True,
        drop_behind: bool = False,
    ) -> None:
        if release_every is not None and release_every <= 0:
            raise ValueError(f"release_every must be a positive byte count, got {release_every}")
        if drop_behind and release_every is None:
            raise ValueError("drop_behind needs release_every: the bytes read between two drops")
        self.shards = shards
        self.verify = verify
        self.release_every = release_every
        self.readahead = readahead
        self.drop_behind = drop_behind
        self._read: list[tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]] = []
        """(shards, starts, ends) of the bytes read since the last release, from each shard's
        data (after its header): what `drop_behind` drops."""
        self.sample_bytes = int(np.prod(shards.sample_shape))
        self._arrays: dict[int, NDArray[np.uint8]] = {}
        self._flat: dict[int, memoryview] = {}
        self._span: ShardSpan | None = None
        self.use_span = SUPPORTED
        """Gather through a `ShardSpan`; False after a shard did not fit one (row by row then)."""
        self._read_since_release = 0
        self._lock = threading.RLock()
        """Held by gather, release and close: threads may share a reader (see ShardSpan)."""

    def __getstate__(self) -> dict[str, Any]:
        # NOTE: open mappings stay behind; each worker reopens (and re-checks) what it reads.
        state = self.__dict__.copy()
        state["_arrays"], state["_flat"], state["_span"] = {}, {}, None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    def array(self, shard: int) -> NDArray[np.uint8]:
        """Shard `shard` as a read-only [rows, *sample_shape] array backed by the page cache."""
        found = self._arrays.get(shard)
        if found is None:
            found = self._open(shard)
        return found

    def _checked_path(self, shard: int) -> Path:
        """The path of shard `shard`, its checksum verified first when `verify` is on; from a
        bounded cache, held and fetched first (NOTE [ bounded cache ] in etl.storage.cache)."""
        cache = self.shards.cache
        if cache is not None:
            cache.acquire([shard])  # a no-op for the shards of a batch `_let_go` acquired
        path = self.shards.path(shard)
        if self.verify:
            verify_shard(path, self.shards.algorithm, self.shards.checksums[shard])
        return path

    def _probe(self, shard: int, path: Path, offset: int) -> None:
        if shard < len(self.shards.probes):
            row, expected = self.shards.probes[shard]
            start, size = row * self.sample_bytes, self.sample_bytes
            if self.shards.ragged:
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

    def _open(self, shard: int) -> NDArray[np.uint8]:
        with self._opening(shard):
            path = self._checked_path(shard)
            mapped = open_shard(path, self.shards.sample_shape, int(self.shards.rows[shard]))
            self._probe(shard, path, mapped.offset)
        # NOTE: a plain ndarray view of the memmap: indexing an np.memmap subclass runs Python
        # code (__array_finalize__) on every row, which costs more than copying the row.
        array: NDArray[np.uint8] = np.asarray(mapped)
        if self.drop_behind:  # every read advised (`prefetch_places`), none read around
            no_readahead(array)
        self._arrays[shard] = array
        self._flat[shard] = array.reshape(-1).data
        return array

    def row(self, shard: int, row: int) -> NDArray[np.uint8]:
        """A copy of one sample."""
        ranged = self.shards.ranged
        if ranged is not None:
            sample = np.empty((1, *self.shards.sample_shape), np.uint8)
            ranged.read(np.array([shard], np.int64), np.array([row], np.int64), sample)
            return sample[0]
        with self._lock:
            self._let_go(np.array([shard]))
            sample = np.array(self.array(shard)[row])
            self._count_rows(np.array([shard]), np.array([row]))
            self._let_go(())
        self._check_rows(np.array([shard]), np.array([row]), sample[None])
        return sample

    def gather_ragged(
        self,
        shard_idx: NDArray[np.integer],
        rows: NDArray[np.integer],
        places: NDArray[np.int64],
        layout: str,
        out: NDArray[np.uint8],
    ) -> None:
        """Copy samples that keep their aspect ratio (format version 2) into `out`, a padded
        batch [B, H, W, C] (or [B, C, H, W]) at least as large as each: sample j, (shard_idx[j],
        rows[j]) at `places[j]` = (byte offset in the shard's data, height, width), into the
        top-left corner of out[j], the rest zero. One slice copy a sample from the shard's
        flat map (memory-mapped, as fixed-size shards are), or with ranged reads one ranged
        GET a sample.

        A 1-d `out` (`back_to_back_bytes` long) takes the samples back to back instead, each
        in the stored layout: what `DeviceLoader` asks for (see `loaders.ragged`)."""
        shard, row = self._checked_rows(shard_idx, rows)
        hwc = layout == "HWC"
        pixels = places[:, 1] * places[:, 2]
        if out.ndim == 1:  # back to back: as many channels as the bytes hold
            channels = out.size // max(int(pixels.sum()), 1)
            if channels * int(pixels.sum()) != out.size:
                raise ValueError(f"{out.size} bytes do not hold samples of {pixels.sum()} pixels")
            put = partial(_put_flat, out, np.cumsum(pixels * channels).tolist())
        else:
            channels = out.shape[3] if hwc else out.shape[1]
            put = partial(_place, out, channels=channels, hwc=hwc)
        sizes = pixels * channels
        if self.shards.ranged is not None:  # no file: verified as they arrive
            fetched = self.shards.ranged.read_spans(shard, row, places[:, 0], sizes)
            for j, data in enumerate(fetched):
                put(j, data, int(places[j, 1]), int(places[j, 2]))
            return
        with self._lock:
            self._let_go(shard)
            for s in set(shard.tolist()).difference(self._flat):
                self._open(s)
            arrays = self._arrays  # each shard one flat array
            if self.drop_behind or (self.readahead and not self._places_resident(shard, places)):
                self.prefetch_places(shard, places, channels)
            sums, seen = self.shards.row_sums, self.shards.seen()
            hashed = np.zeros(len(row), dtype=bool)  # rows checked as they are copied
            at = np.zeros(len(row), dtype=np.int64)
            if sums is not None:
                at, todo = sums.unchecked(shard, row, seen)
                hashed[todo] = True
            for j, (s, (offset, height, width)) in enumerate(
                zip(shard.tolist(), places.tolist(), strict=True)
            ):
                size = height * width * channels
                data = arrays[s][offset : offset + size]
                if len(data) != size:
                    raise self.shards.unreadable(s, ShardError(f"row {row[j]} runs past its end"))
                put(j, data, height, width)
                if sums is not None and hashed[j] and not sums.matches(int(at[j]), data):
                    raise self.shards.unreadable(s, mismatch(self.shards.path(s), int(row[j])))
            if seen is not None and hashed.any():
                seen[at[hashed]] = True
            starts = places[:, 0]
            self._count(int(sizes.sum()), shard, starts, starts + sizes)
            self._let_go(())

    def _places_resident(self, shard: NDArray[np.int64], places: NDArray[np.int64]) -> bool:
        """Whether the first page of up to 4 samples spread over a batch of samples of their
        own size is in memory: the probe `_advise` makes of fixed-size rows, so a DataLoader
        worker's cold batch is read ahead all at once, a cached one costs 4 `mincore` calls."""
        picked = np.arange(0, len(shard), -(-len(shard) // 4) or 1)
        bases = {s: self._arrays[s].ctypes.data for s in np.unique(shard[picked]).tolist()}
        starts = [bases[s] + offset for s, offset in zip(
            shard[picked].tolist(), places[picked, 0].tolist(), strict=True
        )]  # fmt: skip
        return resident(np.asarray(starts, dtype=np.int64))

    def _let_go(self, keep: ArrayLike) -> None:
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

    def _count_rows(self, shards: NDArray[np.int64], rows: NDArray[np.int64]) -> None:
        """`_count` of fixed-size rows."""
        starts = rows.astype(np.int64) * self.sample_bytes
        self._count(len(rows) * self.sample_bytes, shards, starts, starts + self.sample_bytes)

    def _count(self, nbytes: int, shards: ArrayLike, starts: ArrayLike, ends: ArrayLike) -> None:
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
        with self._lock:
            self._arrays.clear()
            self._flat.clear()
            if self._span is not None:
                self._span.close()
                self._span = None
            self._read_since_release = 0
            cache = self.shards.cache
            if cache is not None:
                for shard in cache.held():
                    cache.release(shard)
            if self._read:
                self._drop(*map(np.concatenate, zip(*self._read, strict=True)))
                self._read.clear()

    def _drop(
        self, shards: NDArray[np.int64], starts: NDArray[np.int64], ends: NDArray[np.int64]
    ) -> None:
        """Drop the pages of these bytes of the shards' data (not whole shards) from the page
        cache: samples not read yet stay, whether readahead or another worker brought them in."""
        order = np.argsort(shards, kind="stable")
        shards, starts, ends = shards[order], starts[order], ends[order]
        cut = np.flatnonzero(np.diff(shards)) + 1
        for shard, first, last in zip(
            shards[np.r_[0, cut]].tolist(), np.split(starts, cut), np.split(ends, cut), strict=True
        ):
            path = self.shards.path(shard)
            header = HEADER_BYTES  # samples of their own size: a flat array, its header fixed
            if not self.shards.ragged:
                try:
                    size = path.stat().st_size
                except OSError:
                    continue  # gone: nothing of it to drop, and the next read names it
                header = size - int(self.shards.rows[shard]) * self.sample_bytes
            advise_file(path, "DONTNEED", byte_pages(header + first, header + last))

    def close(self, shard: int) -> None:
        """Drop one shard's mapping (its pages leave this process's RSS; the page cache keeps
        them). The stream calls this after each shard so resident memory stays flat."""
        with self._lock:
            self._flat.pop(shard, None)
            self._arrays.pop(shard, None)
            if self._span is not None:
                self._span.unmap(shard)
            if self.shards.cache is not None:
                self.shards.cache.release(shard)

    def mapped(self) -> set[int]:
        """The shards this reader holds mapped now."""
        spanned = [] if self._span is None else np.flatnonzero(self._span.mapped).tolist()
        return set(self._arrays).union(spanned)

    def _spanned(self, shards: NDArray[np.int64]) -> ShardSpan | None:
        """The span with every shard in `shards` mapped, or None (then copy row by row)."""
        span = self._span
        if span is not None and span.mapped[shards].all():
            return span
        for s in np.unique(shards).tolist():
            if span is not None and span.mapped[s]:
                continue
            with self._opening(s):
                path = self._checked_path(s)
                offset = check_shard(path, self.shards.sample_shape, int(self.shards.rows[s]))
                self._probe(s, path, offset)
            if span is None:
                try:
                    span = self._span = ShardSpan(
                        self.shards.rows, self.sample_bytes, offset, exact=self.drop_behind
                    )
                except (OSError, OverflowError, ValueError, MemoryError):
                    # NOTE: a span that cannot be made: no room to reserve address space for
                    # every shard at once (a `ulimit -v`), or a manifest read with
                    # verify_manifest=False that claims far more rows than its shards hold
                    # (633 TB: mmap's ENOMEM; past 2**64 bytes, which `span._map` refuses
                    # rather than let ctypes wrap it: both found by the fuzz tests). Copy row
                    # by row, and each shard's own check names the one that does not match.
                    self.use_span = False
                    return None
            if offset != span.offset:  # a header length this span cannot place: see ShardSpan
                self.use_span = False
                span.close()
                self._span = None
                return None
            with self._opening(s):
                span.map(s, path)
        return span

    def gather(
        self, shard_idx: NDArray[np.integer], rows: NDArray[np.integer], out: NDArray[np.uint8]
    ) -> None:
        """Copy samples (shard_idx[j], rows[j]) into out[j], for a C-contiguous `out`.

        Out-of-range rows raise IndexError. NOTE [ copy method ]: one `np.take` over a
        `ShardSpan` (see loaders/span.py for the measurements). Without a span, one memoryview
        slice copy per row, or per run of rows consecutive both in a shard and in `out`.
        """
        if not out.flags.c_contiguous:
            raise ValueError("gather needs a C-contiguous output buffer")
        n = len(rows)
        if n == 0:
            return
        shard, row = self._checked_rows(shard_idx, rows)
        if n != len(shard) or out.nbytes != n * self.sample_bytes:
            raise ValueError(f"gather of {n} rows into an output of shape {out.shape}")
        if self.shards.ranged is not None:
            self.shards.ranged.read(shard, row, out)  # no file: ranged GETs, rows verified
            return
        bad = None
        with self._lock:
            self._let_go(shard)  # first: what the last batch held may make room for this one
            span = self._spanned(shard) if self.use_span else None
            if span is not None:
                span_rows = span.first[shard] + row
                self._advise(span, span_rows)
                if self.shards.row_sums is None:
                    span.take(span_rows, out)
                else:
                    bad = self._take_checked(span, span_rows, shard, row, out)
            else:
                self._gather_rows(shard, row, out)
            self._count_rows(shard, row)
            self._let_go(())  # an idle process holds nothing
        if span is None:
            self._check_rows(shard, row, out)
        elif bad is not None:
            s = int(shard[bad])
            raise self.shards.unreadable(s, mismatch(self.shards.path(s), int(row[bad])))

    def _take_checked(
        self,
        span: ShardSpan,
        span_rows: NDArray[np.int64],
        shard: NDArray[np.int64],
        row: NDArray[np.int64],
        out: NDArray[np.uint8],
    ) -> int | None:
        """`span.take` with each row to check (`verify="rows"` or "once") hashed right after
        its copy, a few hundred KB at a time while they are in the CPU's cache: 0.83x the
        unchecked copy where hashing the whole batch after it was 0.67x (NOTE [ verify
        once ]). The position of the first row that does not match, else None."""
        sums = self.shards.row_sums
        assert sums is not None
        seen = self.shards.seen()
        at, todo = sums.unchecked(shard, row, seen)
        if not len(todo):
            span.take(span_rows, out)
            return None
        hashed = np.zeros(len(row), dtype=bool)
        hashed[todo] = True
        flat = out.reshape(len(row), -1)
        step = max(1, CHECK_BYTES // max(self.sample_bytes, 1))
        for begin in range(0, len(row), step):
            end = begin + step
            span.take(span_rows[begin:end], flat[begin:end])
            for j in np.flatnonzero(hashed[begin:end]).tolist():
                if not sums.matches(int(at[begin + j]), flat[begin + j]):
                    return begin + j
        if seen is not None:
            seen[at[todo]] = True
        return None

    def _check_rows(
        self, shard: NDArray[np.int64], row: NDArray[np.int64], out: NDArray[np.uint8]
    ) -> None:
        """With `verify="rows"`: a ShardError (naming the shard, its samples and the repair)
        for the first row read whose bytes are not its sample's."""
        sums = self.shards.row_sums
        if sums is None:
            return
        bad = sums.first_mismatch(shard, row, out, self.shards.seen())
        if bad is not None:
            s = int(shard[bad])
            raise self.shards.unreadable(s, mismatch(self.shards.path(s), int(row[bad])))

    def prefetch(self, shard_idx: NDArray[np.integer], rows: NDArray[np.integer]) -> None:
        """Have the kernel start reading samples (shard_idx[j], rows[j]) from disk now and
        return at once, so a later `gather` of them finds them in memory: the in-process loader
        asks for its next batch while the training step works on the current one. Advised as
        `gather` advises a batch (`_advise`): nothing when `readahead` is off (unless
        `drop_behind`), or for rows already in memory.

        Advice only: a bad row or an unreadable shard is left for the `gather` to name."""
        if not (self.readahead or self.drop_behind) or not len(rows):
            return
        if self.shards.cache is not None or self.shards.ranged is not None:
            return  # a bounded cache's shards come through its fetch-ahead; ranged: no file
        try:
            shard, row = self._checked_rows(shard_idx, rows)
            with self._lock:
                span = self._spanned(shard) if self.use_span else None
                if span is not None:
                    self._advise(span, span.first[shard] + row)
        except (IndexError, ShardError):
            return

    def prefetch_places(
        self, shard_idx: NDArray[np.integer], places: NDArray[np.int64], channels: int
    ) -> None:
        """`prefetch` of samples that keep their aspect ratio, at their `places` (offset,
        height, width): each shard's ranges advised WILLNEED at once (no residency probe: the
        kernel skips what it holds). Advice only, as `prefetch`; with `drop_behind` always (its
        maps read nothing the kernel was not asked for)."""
        if not (self.readahead or self.drop_behind) or not len(places):
            return
        if self.shards.cache is not None or self.shards.ranged is not None:
            return  # as `prefetch`'s
        shard = np.asarray(shard_idx, dtype=np.int64)
        starts = HEADER_BYTES + places[:, 0]
        lengths = places[:, 1] * places[:, 2] * channels
        for s in np.unique(shard).tolist():
            mine = shard == s
            ranges = zip(starts[mine].tolist(), lengths[mine].tolist(), strict=True)
            advise_file(self.shards.path(s), "WILLNEED", ranges)

    def _checked_rows(
        self, shard_idx: NDArray[np.integer], rows: NDArray[np.integer]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Shards and rows as int64 arrays; IndexError naming the shard of a row it lacks."""
        shard = np.asarray(shard_idx, dtype=np.int64)
        row = np.asarray(rows, dtype=np.int64)
        if (row < 0).any() or (row >= self.shards.rows[shard]).any():
            bad = int(np.flatnonzero((row < 0) | (row >= self.shards.rows[shard]))[0])
            raise IndexError(f"row {row[bad]} is not in shard {self.shards.path(shard[bad])}")
        return shard, row

    def _advise(self, span: ShardSpan, span_rows: NDArray[np.int64]) -> None:
        """Ask for `span_rows` from disk when `readahead` finds them missing (see the class),
        and always with `drop_behind`, whose span reads nothing the kernel was not asked for."""
        if span.exact or (self.readahead and not span.resident(span_rows)):
            span.advise(span_rows)

    def _gather_rows(
        self, shard: NDArray[np.int64], row: NDArray[np.int64], out: NDArray[np.uint8]
    ) -> None:
        """`gather` with one slice copy per row (or per run of consecutive rows)."""
        n, size = len(row), self.sample_bytes
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


def _place(
    out: NDArray[np.uint8],
    j: int,
    data: NDArray[np.uint8],
    height: int,
    width: int,
    *,
    channels: int,
    hwc: bool,
) -> None:
    """Sample `data` (flat, `height` x `width` x `channels` in the stored layout) into the
    top-left corner of out[j], the rest of out[j] zeros.

    NOTE: only the padding is zeroed, not the whole batch: a batch padded to 512x512 is mostly
    its samples, and filling it first wrote it twice."""
    if hwc:
        out[j, :height, :width] = data.reshape(height, width, channels)
        out[j, height:] = 0
        out[j, :height, width:] = 0
    else:
        out[j, :, :height, :width] = data.reshape(channels, height, width)
        out[j, :, height:] = 0
        out[j, :, :height, width:] = 0


def _put_flat(
    out: NDArray[np.uint8], ends: list[int], j: int, data: NDArray[np.uint8], *_: int
) -> None:
    """Sample `data` (flat) into 1-d `out` as the j-th of samples back to back ending at `ends`."""
    out[ends[j] - data.size : ends[j]] = data


def batch_reads(
    reader: ShardReader,
    sel: Selection,
    index: NDArray[np.int64],
    columns: Columns | None,
    back_to_back: bool = False,
) -> tuple[tuple[int, ...], Callable[[NDArray[np.uint8]], None], Columns | None]:
    """(shape, fill, columns) of the batch of `index` (checked) for `BatchMemory.batch`: rows of
    the stored shape, or samples that keep their aspect ratio padded to their largest sides
    (with `back_to_back`, one after another in a 1-d batch), with each one's size in
    `SIZE_COLUMNS` beside `columns`."""
    shard_idx, rows = sel.shard_idx[index], sel.rows[index]
    if sel.places is None:
        return (len(index), *sel.sample_shape), partial(reader.gather, shard_idx, rows), columns
    places = sel.places[index]
    if back_to_back:
        shape: tuple[int, ...] = (back_to_back_bytes(places, sel.channels),)
    else:
        shape = padded_shape(len(index), places, sel.channels, sel.layout)
    read = partial(reader.gather_ragged, shard_idx, rows, places, sel.layout)
    sizes = {SIZE_COLUMNS[0]: places[:, 1].copy(), SIZE_COLUMNS[1]: places[:, 2].copy()}
    return shape, read, {**(columns or {}), **sizes}


def back_to_back_bytes(places: NDArray[np.int64], channels: int) -> int:
    """Bytes of samples at `places` (offset, height, width) stored one after another."""
    return int((places[:, 1] * places[:, 2]).sum()) * channels


def padded_shape(
    count: int, places: NDArray[np.int64], channels: int, layout: str
) -> tuple[int, ...]:
    """The shape of a batch of `count` samples that keep their aspect ratio, padded to the
    largest height and width among their `places` (offset, height, width)."""
    height, width = (int(places[:, k].max(initial=1)) for k in (1, 2))
    return (count, *shape_of(height, width, channels, layout))
