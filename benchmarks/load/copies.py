"""(c) of `benchmarks.load.throughput`: memcpy, and the ways to gather random batches into a
preallocated buffer that the loaders' gather is measured against (its own with and without a
span, numpy by hand over the shards, one big array), each as GB/s of the memcpy of its round.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from benchmarks.common import table
from loaders import PackedDataset
from loaders.datasets.packed import collate_batch
from loaders.read.reader import ShardReader

BATCH = 256


def seconds(run: Callable[[], Any]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


class Memcpy:
    """(c): single-thread np.copyto of one large buffer, far larger than the caches; measured
    again in every round so that ratios compare numbers taken under the same load, as the best
    of three copies (other processes can only make a copy slower, never faster)."""

    def __init__(self, nbytes: int) -> None:
        self.src = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
        self.dst = np.empty_like(self.src)
        np.copyto(self.dst, self.src)  # fault every page in first

    def gbps(self) -> float:
        best = min(seconds(lambda: np.copyto(self.dst, self.src)) for _ in range(3))
        return self.src.nbytes / best / 1e9


def median(values: Iterable[float]) -> float:
    return float(np.median(list(values)))


def copy_methods(
    ds: PackedDataset, big: NDArray[np.uint8], memcpy: Memcpy, batches: int, rounds: int
) -> dict[str, list[tuple[float, float]]]:
    """(GB/s, GB/s of memcpy in the same round) per round, for ways to gather random batches of
    BATCH samples into a preallocated buffer."""
    rng = np.random.default_rng(1)
    picks = [rng.integers(0, len(ds), BATCH) for _ in range(batches)]
    out = torch.empty((BATCH, *ds.sample_shape), dtype=torch.uint8).numpy()
    methods = {**_ours(ds, out), **_by_hand(ds, out), **_one_array(big, out)}
    nbytes = batches * BATCH * int(np.prod(ds.sample_shape))
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in methods}
    for _ in range(rounds):
        reference = memcpy.gbps()
        for name, method in methods.items():
            rate = nbytes / seconds(partial(_each, method, picks)) / 1e9
            results[name].append((rate, reference))
    return results


def _each(method: Callable[[NDArray[np.int64]], None], picks: list[NDArray[np.int64]]) -> None:
    for pick in picks:
        method(pick)


Method = Callable[[NDArray[np.int64]], None]
"""Gathers the samples of a batch of dataset indices into the preallocated buffer."""


def _ours(ds: PackedDataset, out: NDArray[np.uint8]) -> dict[str, Method]:
    """The loaders' own gathers: through a span, row by row, and a whole `__getitems__`."""
    sel = ds.selection

    def loaders_gather(i: NDArray[np.int64]) -> None:
        ds.reader.gather(sel.shard_idx[i], sel.rows[i], out)

    by_rows = ShardReader(sel.shards)
    by_rows.maps.use_span = False

    def loaders_rows(i: NDArray[np.int64]) -> None:
        by_rows.gather(sel.shard_idx[i], sel.rows[i], out)

    def loaders_getitems(i: NDArray[np.int64]) -> None:
        collate_batch(ds.__getitems__(i.tolist()))  # a list of ints, as DataLoader passes it

    return {
        "loaders ShardReader.gather: one np.take over a ShardSpan, order kept": loaders_gather,
        "loaders ShardReader.gather without a span: a slice copy per row": loaders_rows,
        "loaders __getitems__: gather + labels + reused batch buffer": loaders_getitems,
    }


def _by_hand(ds: PackedDataset, out: NDArray[np.uint8]) -> dict[str, Method]:
    """What one writes with numpy over the same shards: a copy per row, fancy indexing or a
    take per shard."""
    sel = ds.selection
    shards = [ds.reader.array(s) for s in range(len(sel.shards))]
    memmaps = [np.load(sel.shards.path(s), mmap_mode="r") for s in range(len(shards))]

    def copyto_rows(i: NDArray[np.int64]) -> None:
        pairs = zip(sel.shard_idx[i].tolist(), sel.rows[i].tolist(), strict=True)
        for j, (s, r) in enumerate(pairs):
            np.copyto(out[j], shards[s][r])

    def copyto_rows_memmap(i: NDArray[np.int64]) -> None:
        pairs = zip(sel.shard_idx[i].tolist(), sel.rows[i].tolist(), strict=True)
        for j, (s, r) in enumerate(pairs):
            np.copyto(out[j], memmaps[s][r])

    def fancy_per_shard(i: NDArray[np.int64]) -> None:
        for s in np.unique(sel.shard_idx[i]).tolist():
            where = np.flatnonzero(sel.shard_idx[i] == s)
            out[where] = shards[s][sel.rows[i][where]]

    def take_per_shard_sorted(i: NDArray[np.int64]) -> None:
        order = np.argsort(sel.shard_idx[i], kind="stable")
        shard, row = sel.shard_idx[i][order], sel.rows[i][order]
        cuts = (np.flatnonzero(np.diff(shard)) + 1).tolist()
        for a, b in zip([0, *cuts], [*cuts, len(i)], strict=True):
            np.take(shards[shard[a]], row[a:b], axis=0, out=out[a:b], mode="clip")

    return {
        "np.copyto per row, ndarray views": copyto_rows,
        "np.copyto per row, np.memmap objects": copyto_rows_memmap,
        "numpy fancy indexing per shard, scattered into the batch": fancy_per_shard,
        "np.take(mode='clip') per shard, batch left in (shard, row) order**": (
            take_per_shard_sorted
        ),
    }


def _one_array(big: NDArray[np.uint8], out: NDArray[np.uint8]) -> dict[str, Method]:
    """Gathers from one 4-d array of the whole dataset, for comparison, and a memcpy."""
    big_tensor = torch.from_numpy(np.array(big))  # a private copy: torch wants writable memory
    flat_out = torch.from_numpy(out)

    def fancy_big(i: NDArray[np.int64]) -> None:
        out[...] = big[i]

    def take_big(i: NDArray[np.int64]) -> None:
        np.take(big, i, axis=0, out=out)

    def take_big_clip(i: NDArray[np.int64]) -> None:
        np.take(big, i, axis=0, out=out, mode="clip")

    def index_select_big(i: NDArray[np.int64]) -> None:
        torch.index_select(big_tensor, 0, torch.from_numpy(i), out=flat_out)

    def memcpy_batch(i: NDArray[np.int64]) -> None:
        np.copyto(out, big[:BATCH])

    return {
        "numpy fancy indexing, one 4-d memmap*": fancy_big,
        "np.take(axis=0, out=), one 4-d memmap* (mode='raise' copies out)": take_big,
        "np.take(axis=0, out=, mode='clip'), one 4-d memmap*: a C loop per row": take_big_clip,
        "torch.index_select(out=), one big tensor*": index_select_big,
        "memcpy of the same bytes, contiguous": memcpy_batch,
    }


def report_copies(ds: PackedDataset, big: NDArray[np.uint8], memcpy: Memcpy, quick: bool) -> None:
    rounds = 3 if quick else 7
    methods = copy_methods(ds, big, memcpy, batches=20 if quick else 60, rounds=rounds)
    rows = [
        [name, f"{median(r for r, _ in v):.2f}", f"{median(r / c for r, c in v):.0%}"]
        for name, v in methods.items()
    ]
    reference = [c for _, c in next(iter(methods.values()))]
    rows.append(["(c) np.copyto of one large buffer (memcpy)", f"{median(reference):.2f}", "100%"])
    print(f"## Copy methods: random batches of {BATCH} into a preallocated buffer\n")
    print(f"Median of {rounds} rounds; 'of memcpy' is the median of per-round ratios.\n")
    print(table(["method", "GB/s", "of memcpy"], rows))
    print(
        "\n*one file holding the whole dataset, for comparison. "
        "**C speed, but a batch in the order asked needs a second pass.\n"
    )
