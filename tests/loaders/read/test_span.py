"""ShardSpan: the layout rules, and reads through it against np.load of each shard file."""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from etl.format.shards import HEADER_BYTES
from loaders.read.catalog import open_catalog
from loaders.read.reader import ShardReader
from loaders.read.span import SUPPORTED, ShardSpan, layout
from tests.helpers.packed import Packed, make_packed

pytestmark = pytest.mark.skipif(not SUPPORTED, reason="shard spans need Linux or macOS")
PAGE = mmap.PAGESIZE
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


@given(
    rows=st.lists(st.integers(0, 50), min_size=1, max_size=8),
    row_bytes=st.sampled_from([1, 7, 192, 1000, 4096, 12288, 150528, 3 * 224 * 224 + 1]),
    offset=st.sampled_from([64, 128, 192, 4095]),
)
def test_layout_places_every_shard_on_a_page_in_its_own_pages(
    rows: list[int], row_bytes: int, offset: int
) -> None:
    bounds = layout(np.array(rows, dtype=np.int64), row_bytes, offset)
    starts = bounds[:-1] * row_bytes  # byte offset of each slot (its header) from the first
    assert (starts % PAGE == 0).all(), "a file maps from offset 0 onto a page boundary"
    ends = starts + offset + np.array(rows) * row_bytes  # one past each shard's last byte
    next_pages = -(-ends // PAGE) * PAGE
    assert (next_pages[:-1] <= starts[1:]).all(), "no two slots share a page"
    assert ends[-1] <= bounds[-1] * row_bytes + PAGE, "the reservation holds the last slot"


def copy_with_longer_header(src: Path, dst: Path) -> None:
    """The same .npy array with a 192-byte header (valid .npy; np.load reads it)."""
    with open(src, "rb") as f:
        raw = f.read()
    (length,) = struct.unpack("<H", raw[8:10])
    body = raw[10 : 10 + length].decode("latin1").rstrip()
    room = 192 - 10
    header = raw[:8] + struct.pack("<H", room) + (body.ljust(room - 1) + "\n").encode("latin1")
    dst.write_bytes(header + raw[10 + length :])


@pytest.fixture
def packed(tmp_path: Path) -> Packed:
    return make_packed(tmp_path / "ds", shard_sizes=(11, 4, 9), sample_shape=(8, 8, 3))


def expected(packed: Packed, shard: list[int], row: list[int]) -> np.ndarray:
    shards = open_catalog(packed.root).select().shards
    return np.stack([np.load(shards.path(s))[r] for s, r in zip(shard, row, strict=True)])


def test_a_shard_with_another_header_length_falls_back_to_row_copies(packed: Packed) -> None:
    shards = open_catalog(packed.root).select().shards
    path = shards.path(1)
    shutil.copy(path, path.with_suffix(".orig"))
    copy_with_longer_header(path.with_suffix(".orig"), path)
    np.testing.assert_array_equal(np.load(path), np.load(path.with_suffix(".orig")))
    reader = ShardReader(shards)
    shard, row = [0, 1, 2, 1, 0], [10, 3, 8, 0, 0]
    out = np.empty((5, 8, 8, 3), dtype=np.uint8)
    reader.gather(np.array(shard), np.array(row), out)
    assert reader.maps.use_span is False
    np.testing.assert_array_equal(out, expected(packed, shard, row))


def test_unmapped_shards_map_again_and_gaps_read_as_zeros(packed: Packed) -> None:
    shards = open_catalog(packed.root).select().shards
    reader = ShardReader(shards)
    shard, row = np.array([2, 0, 1, 2]), np.array([8, 10, 3, 0])
    out = np.empty((4, 8, 8, 3), dtype=np.uint8)
    reader.gather(shard, row, out)
    assert reader.mapped() == {0, 1, 2}
    reader.close(2)
    assert reader.mapped() == {0, 1}
    out[:] = 7
    reader.gather(shard, row, out)
    np.testing.assert_array_equal(out, expected(packed, shard.tolist(), row.tolist()))
    reader.release()
    assert reader.mapped() == set()
    reader.gather(shard, row, out)
    np.testing.assert_array_equal(out, expected(packed, shard.tolist(), row.tolist()))


def test_span_rows_are_the_file_rows_and_unmapped_slots_are_zero(packed: Packed) -> None:
    shards = open_catalog(packed.root).select().shards
    span = ShardSpan(shards.rows, 8 * 8 * 3, HEADER_BYTES)
    span.map(0, shards.path(0))
    out = np.empty((2, 8 * 8 * 3), dtype=np.uint8)
    first = span.first
    span.take(np.array([first[0] + 10, first[1] + 2]), out)  # shard 1 not mapped: zero pages
    np.testing.assert_array_equal(out[0], np.load(shards.path(0))[10].reshape(-1))
    assert not out[1].any()
    span.close()
    with pytest.raises(AssertionError, match="after close"):
        span.take(np.array([0]), out[:1])


def test_a_forked_child_reads_the_parents_span(packed: Packed) -> None:
    shards = open_catalog(packed.root).select().shards
    reader = ShardReader(shards)
    shard, row = np.array([1, 2, 0]), np.array([1, 5, 9])
    out = np.empty((3, 8, 8, 3), dtype=np.uint8)
    reader.gather(shard, row, out)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child copies through the inherited mappings and reports the bytes
        os.close(read)
        child = np.zeros_like(out)
        reader.gather(shard, row, child)
        os.write(write, child.tobytes())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    got = np.frombuffer(data, dtype=np.uint8).reshape(out.shape)
    np.testing.assert_array_equal(got, expected(packed, shard.tolist(), row.tolist()))


def test_threads_gathering_while_another_releases_read_right(packed: Packed) -> None:
    """np.take lets go of the GIL: unmapping must wait for a copy in flight, never crash it."""
    shards = open_catalog(packed.root).select().shards
    reader = ShardReader(shards)
    rng = np.random.default_rng(8)
    shard = rng.integers(0, 3, 400)
    row = np.array([rng.integers(0, shards.rows[s]) for s in shard])
    want = expected(packed, shard.tolist(), row.tolist())
    stop = threading.Event()
    failures: list[str] = []

    def read() -> None:
        out = np.empty_like(want)
        try:
            for _ in range(30):
                reader.gather(shard, row, out)
                if not np.array_equal(out, want):
                    failures.append("wrong bytes")
        except Exception as exc:  # a thread's exception would not fail the test by itself
            failures.append(repr(exc))

    def churn() -> None:
        while not stop.is_set():
            reader.release()
            reader.close(1)

    threads = [threading.Thread(target=read) for _ in range(2)]
    churner = threading.Thread(target=churn)
    churner.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    churner.join()
    assert not failures


def evicted(path: Path) -> bool:
    """Drop a file's pages from the page cache; whether the kernel did (it does not on tmpfs),
    checked with a plain `mincore` of a fresh private mapping."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        size = os.fstat(f.fileno()).st_size
        mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    pages = (ctypes.c_ubyte * (-(-size // PAGE)))()
    start = ctypes.c_char.from_buffer(mapped)
    try:
        if LIBC.mincore(ctypes.addressof(start), size, pages):
            raise OSError(ctypes.get_errno(), "mincore failed")
    finally:
        del start
        mapped.close()
    return not any(page & 1 for page in pages)


def test_readahead_advises_cold_batches_only_and_reads_the_file_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    packed = make_packed(tmp_path / "ds", shard_sizes=(11, 4, 9), sample_shape=(32, 32, 3))
    shards = open_catalog(packed.root).select().shards
    advised: list[int] = []
    real_advise = ShardSpan.advise
    monkeypatch.setattr(
        ShardSpan, "advise", lambda span, rows: (advised.append(len(rows)), real_advise(span, rows))
    )
    rng = np.random.default_rng(0)
    shard = rng.integers(0, 3, 16)
    row = rng.integers(0, shards.rows[shard])
    want = expected(packed, shard.tolist(), row.tolist())
    cold = all(evicted(shards.path(s)) for s in range(3))

    reader = ShardReader(shards, readahead=True)
    out = np.empty((16, 32, 32, 3), dtype=np.uint8)
    reader.gather(shard, row, out)
    np.testing.assert_array_equal(out, want)
    if cold:  # on tmpfs pages never leave memory: nothing to advise
        assert advised == [16]
    out[:] = 0
    reader.gather(shard, row, out)  # now in memory: the probe finds it, no advice
    np.testing.assert_array_equal(out, want)
    assert len(advised) == (1 if cold else 0)

    advised.clear()
    for s in range(3):
        evicted(shards.path(s))
    plain = ShardReader(shards, readahead=False)
    plain.gather(shard, row, out)
    np.testing.assert_array_equal(out, want)
    assert advised == []
