"""Shard reads inside one process: batches gathered with one numpy call over a `ShardSpan`
(row by row where a span cannot be made), flat samples copied or handed to a crop, rows checked
as read, and the kernel asked ahead for what a batch will need.

The shards themselves are opened, checked and let go by `loaders.read.maps.ShardMaps`. Nothing
here is shared between processes: a pickled reader carries only the shard table and reopens
what it needs.
"""

import threading
from typing import Any

import numpy as np
from numpy.typing import NDArray

from etl.errors import ShardError
from etl.format.codecs import RAW
from etl.format.flat import channels_of
from etl.format.row_checksums import mismatch
from loaders.read.catalog import ShardSet
from loaders.read.flat_rows import (
    Take,
    batch_writer,
    copy_flat,
    pixels_taker,
    places_resident,
    stored_lengths,
)
from loaders.read.maps import ShardMaps
from loaders.read.page_cache import advise_places
from loaders.read.shard_checks import take_checked
from loaders.read.span import ShardSpan, copy_rows, take_spread
from loaders.read.timing import stage


class ShardReader:
    """Lazily opened, read-only views of the shards of a `ShardSet`, one set per process:
    mapping, checking and letting go are `ShardMaps`' (loaders/read/maps.py), reading is here.

    `readahead` (default on) has a batch whose rows are not in memory read from disk all at
    once before the copy: `ShardSpan.resident` probes a few rows, and if any is missing,
    `ShardSpan.advise` asks for every row, so the device gets a batch of requests in flight
    instead of one page fault at a time. A page-cached batch costs the probe only. Without a
    span (the row-by-row fallback) nothing is advised.

    NOTE [ readahead ]: measured with benchmarks/load/cold.py (5,000 samples of 147 KiB, page
    cache dropped before each epoch, 2-core VM with a ~1 GB/s virtual disk): random batches
    with 0 workers 6,725 -> 7,880 samples/s (0.89 -> 1.09 of 1-thread `pread` of the same
    rows), blocks 7,005 -> 8,675; with 2 workers within noise (7,262 -> 7,337), as two
    processes already keep two faults in flight. Page-cached: 30,773 vs 30,684 (the probe);
    advising without the probe cost 10-20% there.
    """

    def __init__(
        self,
        shards: ShardSet,
        verify_shards: bool = False,
        release_every: int | None = None,
        readahead: bool = True,
        drop_behind: bool = False,
    ) -> None:
        self.shards = shards
        self.maps = ShardMaps(shards, verify_shards, release_every, drop_behind)
        self.readahead = readahead
        self._lock = threading.RLock()
        """Held by every read, release and close: threads may share a reader (see ShardSpan)."""

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    @property
    def settings(self) -> tuple[bool, int | None, bool, bool]:
        """(verify_shards, release_every, readahead, drop_behind): `like` takes them."""
        maps = self.maps
        return maps.verify_shards, maps.release_every, self.readahead, maps.drop_behind

    def like(self, shards: ShardSet) -> "ShardReader":
        """A reader of `shards` set up as this one."""
        return ShardReader(shards, *self.settings)

    def array(self, shard: int) -> NDArray[np.uint8]:
        """Shard `shard` as a read-only [rows, *sample_shape] array backed by the page cache."""
        with self._lock:
            return self.maps.array(shard)

    def release(self) -> None:
        """Unmap every shard; the next read reopens (and re-checks) what it needs. With
        `drop_behind`, the page cache of the shards read since the last release is dropped."""
        with self._lock:
            self.maps.release()

    def close(self, shard: int) -> None:
        """Drop one shard's mapping (its pages leave this process's RSS; the page cache keeps
        them). The stream calls this after each shard so resident memory stays flat."""
        with self._lock:
            self.maps.close(shard)

    def mapped(self) -> set[int]:
        """The shards this reader holds mapped now."""
        return self.maps.mapped()

    def row(self, shard: int, row: int) -> NDArray[np.uint8]:
        """A copy of one sample."""
        ranged = self.shards.ranged
        if ranged is not None:
            sample = np.empty((1, *self.shards.sample_shape), np.uint8)
            ranged.read(np.array([shard], np.int64), np.array([row], np.int64), sample)
            return sample[0]
        with self._lock:
            self.maps.hold_only(np.array([shard]))
            sample = np.array(self.maps.array(shard)[row])
            self.maps.count_rows(np.array([shard]), np.array([row]))
            self.maps.hold_only(())
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
        given = take
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
            self.maps.hold_only(shard)
            self.maps.open_all(shard)
            resident = self.readahead and places_resident(self.maps.arrays, shard, places)
            if self.maps.drop_behind or (self.readahead and not resident):
                self.prefetch_places(shard, places, sizes)
            decoding = given is None and stored is not None and bool((stored[:, 1] != RAW).any())
            with stage("decode" if decoding else "read"):
                copy_flat(self.maps.arrays, self.shards, shard, row, places, take, channels, stored)
            starts = places[:, 0]
            self.maps.count(int(sizes.sum()), shard, starts, starts + sizes)
            self.maps.hold_only(())

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
        if n != len(shard) or out.nbytes != n * self.maps.sample_bytes:
            raise ValueError(f"gather of {n} rows into an output of shape {out.shape}")
        if self.shards.ranged is not None:
            self.shards.ranged.read(shard, row, out)  # no file: ranged GETs, rows verified
            return
        bad = None
        with self._lock:
            self.maps.hold_only(shard)  # first: what the last batch held may make room for this one
            span = self.maps.spanned(shard) if self.maps.use_span else None
            with stage("read"):
                if span is not None:
                    span_rows = span.first[shard] + row
                    self._advise(span, span_rows)
                    bad = _take(self.shards, span, span_rows, shard, row, out)
                else:
                    self._gather_rows(shard, row, out)
            self.maps.count_rows(shard, row)
            self.maps.hold_only(())  # an idle process holds nothing
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
        if not (self.readahead or self.maps.drop_behind) or not len(rows):
            return
        if self.shards.cache is not None or self.shards.ranged is not None:
            return  # a bounded cache's shards come through its fetch-ahead; ranged: no file
        try:
            shard, row = self._checked_rows(shard_idx, rows)
            with self._lock:
                span = self.maps.spanned(shard) if self.maps.use_span else None
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
        if not (self.readahead or self.maps.drop_behind) or not len(places):
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
        self.maps.open_all(shard)
        copy_rows(self.maps.flat, shard, row, out, self.maps.sample_bytes)


def _take(
    shards: ShardSet,
    span: ShardSpan,
    span_rows: NDArray[np.int64],
    shard: NDArray[np.int64],
    row: NDArray[np.int64],
    out: NDArray[np.uint8],
) -> int | None:
    """Rows `span_rows` of `span` into `out` on the loader's threads, checked where `shards`
    are read with row checks: the first bad one's position in the batch, or None."""
    sums = shards.row_sums
    if sums is None:
        take_spread(span, span_rows, out)
        return None
    return take_checked(span, span_rows, sums, shards.seen(), shard, row, out)
