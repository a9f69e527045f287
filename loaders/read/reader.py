"""Shard access inside one process: files opened lazily, checked on open, batches gathered
with one numpy call over a `ShardSpan` (row by row where a span cannot be made).

Every shard is opened with `etl.format.shards.open_shard`, which refuses a file whose header or size
does not match the shards table (`ShardError`, naming the path). Nothing here is shared between
processes: a pickled reader carries only the shard table and reopens what it needs.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from etl.errors import ShardError
from etl.format.codecs import RAW
from etl.format.flat import channels_of
from etl.format.row_checksums import mismatch
from etl.format.shards import check_shard, open_shard
from loaders.read.catalog import ShardSet
from loaders.read.flat_rows import (
    Take,
    batch_writer,
    copy_flat,
    pixels_taker,
    places_resident,
    stored_lengths,
)
from loaders.read.page_cache import advise_places, drop_read
from loaders.read.shard_checks import probe_shard, take_checked, verify_shard
from loaders.read.span import SUPPORTED, ShardSpan, copy_rows, no_readahead


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

    NOTE [ readahead ]: measured with benchmarks/load/cold.py (5,000 samples of 147 KiB, page
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
        verify_shards: bool = False,
        release_every: int | None = None,
        readahead: bool = True,
        drop_behind: bool = False,
    ) -> None:
        if release_every is not None and release_every <= 0:
            raise ValueError(f"release_every must be a positive byte count, got {release_every}")
        if drop_behind and release_every is None:
            raise ValueError("drop_behind needs release_every: the bytes read between two drops")
        self.shards = shards
        self.verify_shards = verify_shards
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
        """The path of shard `shard`, its checksum verified first with `verify_shards`; from a
        bounded cache, held and fetched first (NOTE [ bounded cache ] in etl.storage.cache)."""
        cache = self.shards.cache
        if cache is not None:
            cache.acquire([shard])  # a no-op for the shards of a batch `_let_go` acquired
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

    def _open(self, shard: int) -> NDArray[np.uint8]:
        with self._opening(shard):
            path = self._checked_path(shard)
            mapped = open_shard(path, self.shards.stored_shape, int(self.shards.rows[shard]))
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

    def gather_flat(
        self,
        shard_idx: NDArray[np.integer],
        rows: NDArray[np.integer],
        places: NDArray[np.int64],
        layout: str,
        out: NDArray[np.uint8] | None,
        stored: NDArray[np.int64] | None = None,
        take: Take | None = None,
    ) -> None:
        """Copy samples of flat shards (format versions 2 and 3) into `out`, a padded batch
        [B, H, W, C] (or [B, C, H, W]) at least as large as each: sample j, (shard_idx[j],
        rows[j]) at `places[j]` = (byte offset in the shard's data, height, width), into the
        top-left corner of out[j], the rest zero. One slice copy a sample from the shard's
        flat map (memory-mapped, as fixed-size shards are), or with ranged reads one ranged
        GET a sample; where `stored` gives each one's (bytes, codec), decoded after its check.

        A 1-d `out` (`back_to_back_bytes` long) takes the samples back to back instead, each
        in the stored layout: what `DeviceLoader` asks for (see `loaders.batch.ragged`). A `take`
        instead of `out` gets each sample's checked stored bytes (`loaders.augment.worker_crop`)."""
        shard, row = self._checked_rows(shard_idx, rows)
        if take is None:
            assert out is not None
            put, channels = batch_writer(out, places, layout)
            take = pixels_taker(put, self.shards, shard, row, channels, layout, out)
        else:
            channels = channels_of(self.shards.sample_shape, layout)
        sizes = stored_lengths(places, stored, channels)
        if self.shards.ranged is not None:  # no file: verified as they arrive
            fetched = self.shards.ranged.read_spans(shard, row, places[:, 0], sizes)
            codecs = stored[:, 1].tolist() if stored is not None else [RAW] * len(row)
            for j, data in enumerate(fetched):
                take(j, data, int(places[j, 1]), int(places[j, 2]), codecs[j])
            return
        with self._lock:
            self._let_go(shard)
            for s in set(shard.tolist()).difference(self._flat):
                self._open(s)
            resident = self.readahead and places_resident(self._arrays, shard, places)
            if self.drop_behind or (self.readahead and not resident):
                self.prefetch_places(shard, places, sizes)
            copy_flat(self._arrays, self.shards, shard, row, places, take, channels, stored)
            starts = places[:, 0]
            self._count(int(sizes.sum()), shard, starts, starts + sizes)
            self._let_go(())

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
                drop_read(self.shards, *map(np.concatenate, zip(*self._read, strict=True)))
                self._read.clear()

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
                offset = check_shard(path, self.shards.stored_shape, int(self.shards.rows[s]))
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
        `ShardSpan` (see loaders/read/span.py for the measurements). Without a span, one memoryview
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
                    bad = take_checked(
                        span, span_rows, self.shards.row_sums, self.shards.seen(), shard, row, out
                    )
            else:
                self._gather_rows(shard, row, out)
            self._count_rows(shard, row)
            self._let_go(())  # an idle process holds nothing
        if span is None:
            self._check_rows(shard, row, out)
        elif bad is not None:
            s = int(shard[bad])
            raise self.shards.unreadable(s, mismatch(self.shards.path(s), int(row[bad])))

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
        self, shard_idx: NDArray[np.integer], places: NDArray[np.int64], lengths: NDArray[np.int64]
    ) -> None:
        """`prefetch` of samples of flat shards, at their `places` (offset, height, width),
        each `lengths` bytes (`stored_lengths`): each shard's ranges advised WILLNEED at once
        (no residency probe: the kernel skips what it holds). Advice only, as `prefetch`; with
        `drop_behind` always (its maps read nothing the kernel was not asked for)."""
        if not (self.readahead or self.drop_behind) or not len(places):
            return
        if self.shards.cache is not None or self.shards.ranged is not None:
            return  # as `prefetch`'s
        advise_places(self.shards, np.asarray(shard_idx, dtype=np.int64), places, lengths)

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
        for s in set(shard.tolist()).difference(self._flat):
            self._open(s)
        copy_rows(self._flat, shard, row, out, self.sample_bytes)
