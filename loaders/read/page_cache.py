"""Hints to the kernel's page cache, advice only: read ahead or drop (offset, length) ranges of
a file (`advise_file`), the whole pages that hold rows (`row_pages`) or byte ranges
(`byte_pages`), and what a reader read, dropped behind it (`drop_read`)."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from etl.format.shards import HEADER_BYTES
from loaders.read.catalog import ShardSet
from loaders.read.span import runs

_PAGE = mmap.PAGESIZE


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


def drop_read(
    shard_set: ShardSet,
    shards: NDArray[np.int64],
    starts: NDArray[np.int64],
    ends: NDArray[np.int64],
) -> None:
    """Drop the pages of bytes [starts, ends) of the data of `shard_set`'s `shards` (not whole
    shards) from the page cache: samples not read yet stay, whether readahead or another
    worker brought them in."""
    sample_bytes = int(np.prod(shard_set.sample_shape))
    order = np.argsort(shards, kind="stable")
    shards, starts, ends = shards[order], starts[order], ends[order]
    cut = np.flatnonzero(np.diff(shards)) + 1
    for shard, first, last in zip(
        shards[np.r_[0, cut]].tolist(), np.split(starts, cut), np.split(ends, cut), strict=True
    ):
        path = shard_set.path(shard)
        header = HEADER_BYTES  # samples of their own size: a flat array, its header fixed
        if not shard_set.flat:
            try:
                size = path.stat().st_size
            except OSError:
                continue  # gone: nothing of it to drop, and the next read names it
            header = size - int(shard_set.rows[shard]) * sample_bytes
        advise_file(path, "DONTNEED", byte_pages(header + first, header + last))


def advise_places(
    shard_set: ShardSet,
    shard: NDArray[np.int64],
    places: NDArray[np.int64],
    lengths: NDArray[np.int64],
) -> None:
    """Read ahead samples of a flat shard at their `places` (offset, height, width), each
    `lengths` bytes, in `shard_set`'s `shard`: each shard's ranges advised WILLNEED at once."""
    starts = HEADER_BYTES + places[:, 0]
    for s in np.unique(shard).tolist():
        mine = shard == s
        ranges = zip(starts[mine].tolist(), lengths[mine].tolist(), strict=True)
        advise_file(shard_set.path(s), "WILLNEED", ranges)
