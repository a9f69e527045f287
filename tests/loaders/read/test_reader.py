"""ShardReader.gather against an independent read of each sample with np.load(shard)[row]."""

from __future__ import annotations

import itertools
import mmap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import loaders.read.maps
from etl.errors import ShardError
from loaders.read.catalog import ShardSet, open_catalog
from loaders.read.page_cache import advise_file, byte_pages, row_pages
from loaders.read.reader import ShardReader
from tests.helpers.packed import Packed
from tests.helpers.page_cache import (
    cached_fraction,
    cached_pages,
    cold_packed,
    row_cached,
    wait_for,
)


def expected(packed: Packed, names: tuple[str, ...], shard: list[int], row: list[int]):
    """The samples read one by one with numpy, without the reader."""
    opened = {n: np.load(packed.root / n) for n in names}
    return np.stack([opened[names[s]][r] for s, r in zip(shard, row, strict=True)])


@pytest.fixture(params=[True, False], ids=["span", "rows"])
def use_span(request: pytest.FixtureRequest) -> bool:
    """Gather through a ShardSpan, or with the row-by-row copy used where a span cannot be made."""
    return bool(request.param)


def check(
    packed: Packed,
    shard: list[int],
    row: list[int],
    use_span: bool,
    release_every: int | None = None,
):
    shards = open_catalog(packed.root).select().shards
    reader = ShardReader(shards, release_every=release_every)
    reader.maps.use_span = use_span
    out = np.full((len(shard), *packed.sample_shape), 7, dtype=np.uint8)
    reader.gather(np.asarray(shard, dtype=np.int32), np.asarray(row, dtype=np.int32), out)
    np.testing.assert_array_equal(out, expected(packed, shards.names, shard, row))


def test_random_rows_across_shards_with_duplicates(packed: Packed, use_span: bool) -> None:
    rng = np.random.default_rng(3)
    sizes = [13, 8, 21, 5, 17 + 1]  # the last shard also holds an orphan row
    shard = rng.integers(0, 5, 300).tolist()
    row = [int(rng.integers(0, sizes[s])) for s in shard]
    assert len(set(zip(shard, row, strict=True))) < len(shard), "duplicates"
    check(packed, shard, row, use_span)


def test_runs_and_single_rows_mixed(packed: Packed, use_span: bool) -> None:
    # Sequential runs (copied as one), runs that cross a shard boundary, a run interrupted by a
    # repeat, descending rows, and a single row.
    shard = [0] * 13 + [1] * 8 + [2, 2, 2, 2, 2, 3, 3, 1, 1, 0, 4, 4, 4, 4]
    row = [*range(13), *range(8), 4, 5, 5, 6, 7, 4, 3, 0, 1, 12, 0, 1, 2, 17]
    check(packed, shard, row, use_span)
    check(packed, [2], [20], use_span)
    check(packed, [4, 4, 4], [2, 1, 0], use_span)


def test_release_every_within_a_gather_still_reads_right(packed: Packed, use_span: bool) -> None:
    rng = np.random.default_rng(5)
    shard = rng.integers(0, 4, 50).tolist()
    row = [int(rng.integers(0, 5)) for _ in shard]
    check(packed, shard, row, use_span, release_every=int(np.prod(packed.sample_shape)))


def test_empty_and_wrong_outputs(packed: Packed, use_span: bool) -> None:
    reader = ShardReader(open_catalog(packed.root).select().shards)
    reader.maps.use_span = use_span
    none = np.zeros(0, dtype=np.int32)
    reader.gather(none, none, np.empty((0, *packed.sample_shape), dtype=np.uint8))
    strided = np.empty((4, *packed.sample_shape), dtype=np.uint8)[::2]
    with pytest.raises(ValueError, match="C-contiguous"):
        reader.gather(np.zeros(2, np.int32), np.zeros(2, np.int32), strided)
    small = np.empty((1, *packed.sample_shape), dtype=np.uint8)
    with pytest.raises(ValueError):
        reader.gather(np.zeros(2, np.int32), np.array([0, 5], np.int32), small)
    two = np.empty((2, *packed.sample_shape), dtype=np.uint8)
    for shard, row in [(1, 8), (0, -1), (3, 5)]:  # shard 1 has 8 rows, shard 3 has 5
        with pytest.raises(IndexError, match="is not in shard"):
            reader.gather(np.array([0, shard]), np.array([0, row]), two)


def cold_shards(tmp_path: Path) -> tuple[ShardSet, list[Path], list[np.ndarray]]:
    """`cold_packed`'s shards as the reader sees them."""
    built, paths, expected = cold_packed(tmp_path)
    return open_catalog(built.root).select().shards, paths, expected


@pytest.mark.parametrize("drop_behind", [False, True])
def test_drop_behind_takes_what_was_read_out_of_the_page_cache(
    tmp_path: Path, drop_behind: bool
) -> None:
    """Read every sample of 4 shards of 768 KiB, a shard at a time, releasing after each: with
    `drop_behind` the shards read leave the page cache at each release; without it they stay.
    The samples read are the same either way."""
    shards, paths, expected = cold_shards(tmp_path)
    reader = ShardReader(shards, release_every=64 * 64 * 64 * 3, drop_behind=drop_behind)
    for s in range(4):
        out = np.empty((64, 64, 64, 3), dtype=np.uint8)
        reader.gather(np.full(64, s), np.arange(64), out)
        np.testing.assert_array_equal(out, expected[s])
    cached = [cached_fraction(path) for path in paths]
    if drop_behind:
        assert max(cached) < 0.1, cached
    else:
        assert min(cached) > 0.9, cached


def test_drop_behind_drops_only_the_rows_read(tmp_path: Path) -> None:
    """With every shard in the page cache, a reader reads rows 0-15 and 32-47 of shards 0 and
    2 in a random order and releases: those rows leave the cache, the rows it did not read stay
    (another worker's, or mmap readahead's, next reads), and shards 1 and 3 are untouched. A
    neighbour of a read row may lose the page the two share."""
    shards, paths, expected = cold_shards(tmp_path)
    row_bytes = 64 * 64 * 3
    for path in paths:  # cache every page, in small folios (see `row_pages`)
        advise_file(path, "WILLNEED")
    assert wait_for(lambda: min(cached_fraction(path) for path in paths) == 1)
    read = np.r_[0:16, 32:48]
    shard = np.repeat([0, 2], len(read))
    row = np.tile(read, 2)
    order = np.random.default_rng(0).permutation(len(row))
    reader = ShardReader(shards, release_every=1 << 30, drop_behind=True)
    for batch in np.array_split(order, 4):
        out = np.empty((len(batch), 64, 64, 3), dtype=np.uint8)
        reader.gather(shard[batch], row[batch], out)
        np.testing.assert_array_equal(
            out, np.stack([expected[s][r] for s, r in zip(shard[batch], row[batch], strict=True)])
        )
    reader.release()
    unread = np.r_[17:31, 49:64]  # not read, and not next to a row read
    for s in range(4):
        cached = row_cached(paths[s], 64, row_bytes)
        if s in (0, 2):
            assert cached[read].max() == 0, (s, cached[read])
        else:
            assert cached[read].min() == 1, (s, cached[read])
        assert cached[unread].min() == 1, (s, cached[unread])


@pytest.mark.parametrize("readahead", [True, False])
def test_drop_behind_leaves_nothing_read_ahead(tmp_path: Path, readahead: bool) -> None:
    """From a cold page cache, a reader with `drop_behind` reads a run of rows and a few
    scattered ones and releases: the shards' pages are gone again, the few header pages its
    open reads aside. The kernel's own readahead (which on a disk with a large read_ahead_kb
    brings in megabytes around each fault) would have left what it read and nobody asked for."""
    shards, paths, expected = cold_shards(tmp_path)
    shard, row = np.array([0] * 8 + [2, 2, 2]), np.r_[8:16, 40, 3, 22]
    reader = ShardReader(shards, release_every=1 << 30, readahead=readahead, drop_behind=True)
    out = np.empty((len(row), 64, 64, 3), dtype=np.uint8)
    reader.gather(shard, row, out)
    np.testing.assert_array_equal(
        out, np.stack([expected[s][r] for s, r in zip(shard, row, strict=True)])
    )
    reader.release()
    left = [int(cached_pages(path).sum()) for path in paths]
    assert max(left) <= 8, left  # of 193 pages a shard


@given(
    rows=st.lists(st.integers(0, 199), max_size=60),
    row_bytes=st.sampled_from([1, 3000, 4096, 12288, 150528]),
    header=st.sampled_from([0, 128, 4095]),
)
def test_row_pages_are_the_pages_the_rows_touch(rows: list[int], row_bytes: int, header: int):
    """The ranges cover exactly the pages holding a byte of a row read, in whole pages."""
    page = mmap.PAGESIZE
    ranges = row_pages(np.array(rows, dtype=np.int64), row_bytes, header)
    covered = set()
    for start, length in ranges:
        assert start % page == 0 and length % page == 0 and length > 0
        covered.update(range(start // page, (start + length) // page))
    touched = {
        p
        for r in set(rows)
        for p in range(
            (header + r * row_bytes) // page, (header + (r + 1) * row_bytes - 1) // page + 1
        )
    }
    assert covered == touched


@given(spans=st.lists(st.tuples(st.integers(0, 60_000), st.integers(1, 20_000)), max_size=40))
def test_byte_pages_are_the_pages_the_bytes_touch(spans: list[tuple[int, int]]) -> None:
    """Samples of their own size (any offsets and lengths, overlapping or not): the ranges are
    whole pages, in order, apart, and cover exactly the pages holding a byte read."""
    page = mmap.PAGESIZE
    starts = np.array([a for a, _ in spans], dtype=np.int64)
    ends = np.array([a + n for a, n in spans], dtype=np.int64)
    ranges = byte_pages(starts, ends)
    covered: list[int] = []
    for start, length in ranges:
        assert start % page == 0 and length % page == 0 and length > 0
        covered.extend(range(start // page, (start + length) // page))
    assert covered == sorted(set(covered))  # in order, no page twice
    assert all(a + n < b for (a, n), (b, _) in itertools.pairwise(ranges))  # apart
    touched = {p for a, n in spans for p in range(a // page, (a + n - 1) // page + 1)}
    assert set(covered) == touched


def test_drop_behind_needs_a_window(packed: Packed) -> None:
    with pytest.raises(ValueError, match="drop_behind needs release_every"):
        ShardReader(open_catalog(packed.root).select().shards, drop_behind=True)


@pytest.mark.parametrize("readahead", [True, False])
def test_prefetch_reads_the_rows_asked_for_without_waiting(tmp_path: Path, readahead: bool):
    """From a cold page cache, `prefetch` of scattered rows of two shards has the kernel read
    them (they turn up in the page cache while nothing is copied) and a later gather returns
    the samples np.load reads; with `readahead` off it asks for nothing. A row that is not in
    its shard is left for the gather to name."""
    shards, paths, expected = cold_shards(tmp_path)
    row_bytes = 64 * 64 * 3
    shard, row = np.array([1, 1, 1, 3]), np.array([5, 20, 33, 60])
    reader = ShardReader(shards, readahead=readahead)
    reader.prefetch(shard, row)

    def asked_for_cached() -> bool:
        cached = {s: row_cached(paths[s], 64, row_bytes) for s in (1, 3)}
        return all(cached[s][r] == 1 for s, r in zip(shard, row, strict=True))

    assert wait_for(asked_for_cached, seconds=10 if readahead else 0.5) is readahead
    assert cached_fraction(paths[0]) == 0 and cached_fraction(paths[2]) == 0
    out = np.empty((len(row), 64, 64, 3), dtype=np.uint8)
    reader.gather(shard, row, out)
    np.testing.assert_array_equal(
        out, np.stack([expected[s][r] for s, r in zip(shard, row, strict=True)])
    )
    reader.prefetch(np.array([0]), np.array([64]))  # advice only: nothing raised
    with pytest.raises(IndexError, match="row 64 is not in shard"):
        reader.gather(np.array([0]), np.array([64]), out[:1])


def test_no_address_space_for_a_span_means_row_by_row_not_an_error(
    packed: Packed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reserving every shard's rows at once can fail (a `ulimit -v`; a damaged manifest read
    with verify_manifest=False claiming 633 TB of rows): the reader copies row by row."""

    def no_room(*args: object, **kwargs: object) -> None:
        raise OSError(12, "mmap of 633318697828352 bytes failed: Cannot allocate memory")

    monkeypatch.setattr(loaders.read.maps, "ShardSpan", no_room)
    shards = open_catalog(packed.root).select().shards
    reader = ShardReader(shards)
    out = np.empty((4, *packed.sample_shape), dtype=np.uint8)
    shard, row = np.array([0, 1, 2, 0]), np.array([1, 0, 2, 3])
    reader.gather(shard, row, out)
    assert not reader.maps.use_span
    want = expected(packed, shards.names, shard.tolist(), row.tolist())
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("claimed", [2**40, 2**52, "wraps", 2**62])
def test_a_shards_table_claiming_absurd_rows_is_row_by_row_then_named(
    packed: Packed, claimed: int | str
) -> None:
    """A shards table read with verify_manifest=False whose last shard claims absurd rows
    (2**58 + 3: the fuzz tests' case, a span length past 2**64 that ctypes would wrap): shard
    0 reads row by row, the lying shard is a ShardError naming it, never an OverflowError."""
    shards = open_catalog(packed.root).select().shards
    rows = shards.rows.copy()
    row_bytes = int(np.prod(packed.sample_shape))
    # "wraps": the span's length just past 2**64, which ctypes would pass as a few bytes
    rows[-1] = 2**64 // row_bytes + 1 if claimed == "wraps" else int(claimed)
    reader = ShardReader(replace(shards, rows=rows))
    out = np.empty((2, *packed.sample_shape), dtype=np.uint8)
    shard, row = np.array([0, 0]), np.array([1, 0])
    reader.gather(shard, row, out)
    np.testing.assert_array_equal(out, expected(packed, shards.names, [0, 0], [1, 0]))
    last = len(rows) - 1
    with pytest.raises(ShardError, match=Path(shards.names[last]).name):
        reader.gather(np.array([last]), np.array([0]), out[:1])
