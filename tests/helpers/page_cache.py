"""Page-cache state of files for the loaders' disk-read tests: what is cached (`mincore`, an
independent view of the kernel's state), and packed datasets whose shards start out cold."""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from loaders.read.catalog import open_catalog
from loaders.read.page_cache import advise_file
from tests.helpers.packed import Packed, make_packed


def cached_pages(path: Path) -> np.ndarray:
    """1 for each page of the file in the page cache, else 0 (`mincore` on a fresh mapping)."""
    size = path.stat().st_size
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = np.frombuffer(mapped, dtype=np.uint8)
        state = (ctypes.c_ubyte * -(-size // mmap.PAGESIZE))()
        assert libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), state) == 0
        del view
    return np.frombuffer(state, dtype=np.uint8) & 1


def cached_fraction(path: Path) -> float:
    """The fraction of the file's pages in the page cache."""
    return float(cached_pages(path).mean())


def row_cached(path: Path, rows: int, row_bytes: int) -> np.ndarray:
    """The fraction of each row's pages in the page cache, by row."""
    page_in, page = cached_pages(path), mmap.PAGESIZE
    start = path.stat().st_size - rows * row_bytes  # rows end the file, after the header
    bounds = [(start + r * row_bytes, start + (r + 1) * row_bytes) for r in range(rows)]
    return np.array([page_in[a // page : -(-b // page)].mean() for a, b in bounds])


def cold_packed(tmp_path: Path) -> tuple[Packed, list[Path], list[np.ndarray]]:
    """4 shards of 64 samples of 12 KiB, their samples read with np.load, then dropped from
    the page cache (skips where the filesystem keeps its cache on advice, as tmpfs does)."""
    built = make_packed(tmp_path, shard_sizes=(64, 64, 64, 64), sample_shape=(64, 64, 3), orphans=0)
    shards = open_catalog(built.root).select().shards
    paths = [shards.path(s) for s in range(4)]
    expected = [np.load(path) for path in paths]  # read before: np.load caches pages too
    for path in paths:
        with open(path, "rb+") as f:
            os.fsync(f.fileno())  # clean pages: only those can be dropped
        advise_file(path, "DONTNEED")
    if max(cached_fraction(path) for path in paths) > 0.5:
        pytest.skip("this filesystem keeps its page cache on advice (tmpfs?)")
    return built, paths, expected


def wait_for(condition: Callable[[], bool], seconds: float = 10) -> bool:
    """Whether `condition` holds within `seconds` (disk reads finish in their own time)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
