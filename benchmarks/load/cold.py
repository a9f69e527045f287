"""Reads from disk, not the page cache: the loaders against the device itself (issue #13).

    python -m benchmarks.load.cold [--samples 5000] [--rounds 3] [--work DIR] [--warm-only]

Writes a packed dataset of `--samples` random 224x224x3 samples (147 KiB each) in shards of
1,000, then, once per round and with the page cache dropped before each contender (as root:
`sync; echo 3 > /proc/sys/vm/drop_caches`), reads every sample once:

    device            random reads of one sample's bytes at a time (`os.pread`, the block size
                      the loaders read) from the same files, 1 and 16 threads: what `fio
                      --rw=randread --bs=147k` measures, in Python, as fio is not installed
    per-row copy      a plain single-threaded loop copying one row at a time from
                      `np.load(mmap_mode="r")` of each shard, in a random order
    loaders           `make_loader(PackedDataset.open(...), batch_size=256)`, random and
                      block-shuffled orders, 0 and 2 workers, `readahead` off and on; and
                      with `drop_behind` (each process's reads released and dropped from
                      the page cache every 64 MiB)
    training step     the loaders, random order, 0 workers, sleeping 25 ms per batch (a GPU
                      step, which leaves the CPU free), with and without reading the next
                      batch ahead while the step runs (NOTE [ read the next batch ahead ])

The tables give medians over rounds of samples/s, the ratio to the best device reading of
the same round (per-round ratios, then the median), the same after the loaders' first batch
(which carries their fixed cost: opening, the shared-memory ring, starting workers), and how
much of the dataset the page cache holds after the contender's epoch (`mincore`). A last
table reads the same loaders from the page cache (warm), to show what `readahead` costs when
the data is in memory. Beside each order, its shuffle quality on class-sorted labels
(`loaders.class_mix_distance`, 1.00 = as mixed as a full shuffle). Without permission to
drop the cache (or with `--warm-only`), every round is warm and the table says so. No result
is asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import numpy as np

from benchmarks.common import cached_bytes, cpu_model
from benchmarks.load.throughput import write_synthetic
from loaders import PackedDataset, make_loader
from loaders.order.orders import block_order, random_order
from loaders.order.quality import class_mix_distance

SHAPE = (224, 224, 3)
BATCH = 256
CLASSES = 100
DROP_EVERY = 64 << 20
"""`release_every` of the drop_behind contenders: bytes a process reads between two drops."""
STEP = 0.025
"""Seconds of the simulated training step: about what the device takes to read a batch."""


def drop_page_cache() -> bool:
    """Write back and drop the page cache; False when this process may not."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


class Rows:
    """Every sample of the packed dataset as (file, byte offset), in (shard, row) order."""

    def __init__(self, root: Path) -> None:
        self.files = sorted((root / "shards").glob("*.npy"))
        self.arrays = [np.load(f, mmap_mode="r") for f in self.files]
        self.row_bytes = int(np.prod(SHAPE))
        self.shard = np.concatenate(
            [np.full(len(a), s, dtype=np.int64) for s, a in enumerate(self.arrays)]
        )
        self.row = np.concatenate([np.arange(len(a), dtype=np.int64) for a in self.arrays])
        self.offset = np.array([a.offset for a in self.arrays])[self.shard] + self.row * (
            self.row_bytes
        )

    def __len__(self) -> int:
        return len(self.shard)


def device_reads(rows: Rows, order: np.ndarray, threads: int) -> None:
    """`os.pread` of each sample's bytes in `order`, by `threads` threads (fio's randread)."""
    fds = [os.open(f, os.O_RDONLY) for f in rows.files]
    shard, offset, size = rows.shard[order].tolist(), rows.offset[order].tolist(), rows.row_bytes
    buffers = threading.local()  # one reused buffer a thread: no allocation in the timing

    def read(i: int) -> None:
        if not hasattr(buffers, "one"):
            buffers.one = bytearray(size)
        if os.preadv(fds[shard[i]], [buffers.one], offset[i]) != size:
            raise OSError(f"short read of {rows.files[shard[i]]}")

    try:
        if threads == 1:
            for i in range(len(order)):
                read(i)
        else:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(read, range(len(order)), chunksize=4))
    finally:
        for fd in fds:
            os.close(fd)


def per_row_copy(rows: Rows, order: np.ndarray) -> None:
    """One `np.copyto` per sample from fresh `np.load` memmaps, single-threaded."""
    arrays = [np.load(f, mmap_mode="r") for f in rows.files]
    out = np.empty(SHAPE, dtype=np.uint8)
    for s, r in zip(rows.shard[order].tolist(), rows.row[order].tolist(), strict=True):
        np.copyto(out, arrays[s][r])


def loader_epoch(
    root: Path,
    shuffle: str,
    workers: int,
    readahead: bool,
    drop_behind: bool = False,
    step: float = 0.0,
    look_ahead: bool = True,
) -> float:
    """One epoch through `make_loader`, a fresh dataset and workers each time (cold maps),
    sleeping `step` seconds per batch (a training step that leaves the CPU to the loader, as
    a GPU's does); `look_ahead=False` stops the in-process loader from prefetching the next
    batch. Returns the seconds to the first batch (opening and starting workers included)."""
    started = time.perf_counter()
    release = DROP_EVERY if drop_behind else None
    ds = PackedDataset.open(
        root, readahead=readahead, release_every=release, drop_behind=drop_behind
    )
    if not look_ahead:
        ds.prefetch = lambda indices: None  # type: ignore[method-assign]
    loader = make_loader(ds, batch_size=BATCH, shuffle=shuffle, num_workers=workers)
    delivered, first = 0, 0.0
    for batch in loader:
        if not delivered:
            first = time.perf_counter() - started
        delivered += len(batch.labels)
        time.sleep(step)
    if delivered != len(ds):
        raise SystemExit(f"an epoch of {shuffle} order delivered {delivered} of {len(ds)} samples")
    return first


def contenders(root: Path, rows: Rows) -> dict[str, Callable[[], float | None]]:
    order = random_order(len(rows), 0, 0)
    runs: dict[str, Callable[[], float | None]] = {
        "device: pread, 1 thread": lambda: device_reads(rows, order, 1),
        "device: pread, 16 threads": lambda: device_reads(rows, order, 16),
        "per-row copy, 1 thread": lambda: per_row_copy(rows, order),
    }
    for shuffle in ("random", "blocks"):
        for workers in (0, 2):
            for readahead in (False, True):
                ahead = "on" if readahead else "off"
                name = f"loaders {shuffle}, {workers} workers, readahead {ahead}"
                runs[name] = partial(loader_epoch, root, shuffle, workers, readahead)
        name = f"loaders {shuffle}, 2 workers, readahead on, drop_behind"
        runs[name] = partial(loader_epoch, root, shuffle, 2, True, True)
    for look_ahead in (False, True):
        name = f"loaders random, 0 workers, {STEP * 1e3:.0f} ms step, look-ahead " + (
            "on" if look_ahead else "off"
        )
        runs[name] = partial(
            loader_epoch, root, "random", 0, True, step=STEP, look_ahead=look_ahead
        )
    return runs


Measured = dict[str, list[tuple[float, float | None, int]]]
"""Per contender, per round: seconds, seconds to its first batch (loaders), and bytes of the
dataset in the page cache after."""


def measure(
    runs: dict[str, Callable[[], float | None]], rows: Rows, rounds: int, cold: bool
) -> Measured:
    """Each contender in each round, the page cache dropped before each if `cold`."""
    measured: Measured = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            if cold:
                drop_page_cache()
            else:
                run()  # once to fill the page cache
            started = time.perf_counter()
            first = run()
            seconds = time.perf_counter() - started
            measured[name].append((seconds, first, cached_bytes(rows.files)))
    return measured


def report(measured: Measured, n: int, quality: dict[str, str]) -> None:
    """One row a contender: the whole epoch, and the epoch after its first batch (what a
    longer epoch tends to: the first batch carries opening the dataset, making the loader
    and its shared-memory ring, starting workers), each against the device's rate."""
    seconds = {name: [t for t, _, _ in rounds] for name, rounds in measured.items()}
    device = [
        min(a, b)
        for a, b in zip(
            seconds["device: pread, 1 thread"], seconds["device: pread, 16 threads"], strict=True
        )
    ]
    print(
        "| contender | samples/s | vs device | first batch (ms) | after it: samples/s "
        "| vs device | cached after (MiB) | order's shuffle quality |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, rounds in measured.items():
        times = seconds[name]
        rate = statistics.median(n / t for t in times)
        ratio = statistics.median(d / t for d, t in zip(device, times, strict=True))
        cached = statistics.median(c for _, _, c in rounds) / 2**20
        order = next((q for key, q in quality.items() if key in name), "")
        firsts = [f for _, f, _ in rounds if f is not None]
        after = ["", "", ""]
        if len(firsts) == len(rounds):
            rest = [(n - BATCH) / (t - f) for t, f in zip(times, firsts, strict=True)]
            rest_ratio = [r * d / n for r, d in zip(rest, device, strict=True)]
            after = [
                f"{statistics.median(firsts) * 1e3:,.0f}",
                f"{statistics.median(rest):,.0f}",
                f"{statistics.median(rest_ratio):.2f}",
            ]
        print(
            f"| {name} | {rate:,.0f} | {ratio:.2f} | {' | '.join(after)} | {cached:,.0f} "
            f"| {order} |"
        )


def quality_of_orders(rows: Rows) -> dict[str, str]:
    """Class-mix distance / a full shuffle's, with labels sorted by class as a class-per-folder
    pack stores them (the synthetic labels are interleaved, which any order mixes well)."""
    labels = (np.arange(len(rows)) * CLASSES // len(rows)).astype(np.int64)
    reference = class_mix_distance(random_order(len(rows), 1, 0), labels, BATCH)
    orders = {
        "random": random_order(len(rows), 0, 0),
        "blocks": block_order(rows.shard, 0, 0),
        "device": random_order(len(rows), 0, 0),
        "per-row": random_order(len(rows), 0, 0),
    }
    return {k: f"{class_mix_distance(o, labels, BATCH) / reference:.2f}" for k, o in orders.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None, help="where the dataset goes")
    parser.add_argument("--warm-only", action="store_true", help="do not drop the page cache")
    parser.add_argument("--tiny", action="store_true", help="1,000 samples, 1 round, warm")
    args = parser.parse_args()
    if args.tiny:
        args.samples, args.rounds, args.warm_only = 1000, 1, True
    warnings.filterwarnings("ignore", "CUDA is not available")
    work = Path(tempfile.mkdtemp(prefix="bench-cold-", dir=args.work))
    try:
        write_synthetic(work, args.samples * int(np.prod(SHAPE)), SHAPE)
        rows = Rows(work)
        runs = contenders(work, rows)
        quality = quality_of_orders(rows)
        cold = not args.warm_only and drop_page_cache()
        print(f"# load.cold, {datetime.now(UTC):%Y-%m-%d}, {cpu_model()}, {os.cpu_count()} cores")
        print(
            f"# {len(rows):,} samples of {int(np.prod(SHAPE)) / 1024:.0f} KiB, batches of "
            f"{BATCH}, median of {args.rounds} rounds\n"
        )
        if cold:
            print("## Cold: page cache dropped before each contender\n")
            report(measure(runs, rows, args.rounds, cold=True), len(rows), quality)
            warm_runs = {k: v for k, v in runs.items() if "device" in k or "workers, r" in k}
        else:
            warm_runs = runs
            print("(--warm-only, or the page cache could not be dropped: every figure is warm)")
        print("\n## Warm: the same reads from the page cache\n")
        report(measure(warm_runs, rows, args.rounds, cold=False), len(rows), quality)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
