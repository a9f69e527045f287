"""Loader throughput against the alternatives, resident memory over an epoch, shuffle quality.

    etl sample-data data/sample && etl run pipeline.yaml      # once: sources and artifacts/
    python -m benchmarks.load.throughput [--quick]

Everything is measured in one run on the same machine and page-cached data: random-order
batches of 256 from `artifacts/` through `loaders` (map-style and stream, 0 and 2 workers),
against (a) a per-file Dataset that decodes and resizes each source image with Pillow, (b) one
sample per `__getitem__` from a single big memmap with the default collate, and (c) memcpy (a
single-thread np.copyto of one large buffer). The machine may be shared and noisy: every
contender, memcpy included, is measured once per round, rounds are repeated, and the tables
give medians over rounds (ratios are per-round ratios, then the median). No result is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from numpy.typing import NDArray
from PIL import Image
from torch.utils.data import DataLoader, Dataset, RandomSampler

from benchmarks.common import table
from benchmarks.load.copies import BATCH, Memcpy, median, report_copies
from loaders import PackedDataset, PackedStream, make_loader, stream_loader
from loaders.order.orders import balanced_order, block_order, random_order
from loaders.order.quality import class_mix_distance
from loaders.order.stream_orders import stream_order
from loaders.read.catalog import open_catalog
from tests.helpers.random_dataset import write_random_dataset

# --- the loaders being compared ------------------------------------------------------------


class PillowFiles(Dataset[tuple[torch.Tensor, int]]):
    """(a) What a folder of images costs: open, decode, RGB, resize to the packed size."""

    def __init__(self, files: list[Path], labels: list[int], size: tuple[int, ...]) -> None:
        self.files, self.labels, self.size = files, labels, size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.files[i]) as image:
            height, width = self.size[:2]
            rgb = image.convert("RGB").resize((width, height), Image.Resampling.BILINEAR)
            return torch.from_numpy(np.asarray(rgb).copy()), self.labels[i]


class BigMemmap(Dataset[tuple[torch.Tensor, int]]):
    """(b) The usual memmap Dataset: one np.memmap, one sample per __getitem__."""

    def __init__(self, path: Path, labels: NDArray[np.int32]) -> None:
        self.path, self.labels = path, labels
        self.data: NDArray[np.uint8] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.data is None:
            self.data = np.load(self.path, mmap_mode="r")
        assert self.data is not None
        return torch.from_numpy(np.array(self.data[i])), int(self.labels[i])


def one_round(loader: Iterable[Any], min_seconds: float) -> tuple[float, float, float]:
    """(samples/s, CPU seconds per batch of the main process, of its children) over whole
    epochs lasting at least min_seconds.

    CPU times count all threads: the main process's is what receiving costs the training
    process; the children's is the workers' (idle workers of other loaders add nothing).
    """
    samples = batches = 0
    start, cpu, children = time.perf_counter(), time.process_time(), _children_cpu()
    while True:
        for batch in loader:
            samples += len(batch[1])
            batches += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            main = (time.process_time() - cpu) / batches
            return samples / elapsed, main, (_children_cpu() - children) / batches


def _children_cpu() -> float:
    total = 0.0
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            times = child.cpu_times()
            total += times.user + times.system
    return total


# --- resident memory over an epoch ---------------------------------------------------------


def write_synthetic(
    root: Path, total_bytes: int, shape: tuple[int, ...], per_shard: int = 1000
) -> int:
    """A packed dataset of random pixels, `total_bytes` large, in shards of `per_shard`
    samples (`tests.helpers.random_dataset`); its sample count."""
    n = max(per_shard, total_bytes // int(np.prod(shape)))
    write_random_dataset(root, n, shape, per_shard)
    return n


def rss_over_epoch(root: Path, release_every: int | None, workers: int) -> list[str]:
    """MiB of RSS (total, anonymous, file-backed) of the reading process over one random epoch,
    first batch -> peak; with workers, of the largest worker."""
    ds = PackedDataset.open(root, release_every=release_every)
    loader = make_loader(ds, batch_size=BATCH, shuffle=True, num_workers=workers)
    me = psutil.Process()
    points = []
    for i, _ in enumerate(loader):
        if i in (1, 2) or i % 8 == 0:
            infos = [p.memory_info() for p in (me.children() if workers else [me])]
            rss = max(m.rss for m in infos) / 2**20
            file = max(m.shared for m in infos) / 2**20
            anon = max(m.rss - m.shared for m in infos) / 2**20
            points.append((rss, anon, file))
    first, peak = points[0], np.max(points, axis=0)
    return [f"{a:.0f} -> {b:.0f}" for a, b in zip(first, peak, strict=True)]


# --- report --------------------------------------------------------------------------------


Contenders = dict[tuple[str, int], Iterable[Any]]
A_NAME = "(a) Pillow open + decode + resize per file"
B_NAME = "(b) one big memmap, __getitem__ + collate"
OURS = "loaders PackedDataset (shuffle=True)"


def ours(ds: PackedDataset, w: int) -> Iterable[Any]:
    return make_loader(ds, batch_size=BATCH, shuffle=True, num_workers=w, persistent_workers=w > 0)


def torch_loader(dataset: Dataset[Any], w: int) -> Iterable[Any]:
    sampler = RandomSampler(
        range(len(dataset)),  # type: ignore[arg-type]
        generator=torch.Generator().manual_seed(0),
    )
    return DataLoader(dataset, BATCH, sampler=sampler, num_workers=w, persistent_workers=w > 0)


def measure_rounds(
    contenders: Contenders, memcpy: Memcpy, quick: bool
) -> dict[tuple[str, int], list[tuple[float, float, float, float]]]:
    """(samples/s, main CPU s/batch, workers' CPU s/batch, memcpy GB/s) per round and contender."""
    min_seconds, rounds = (0.5, 3) if quick else (1.5, 5)
    for loader in contenders.values():  # warm up: workers started, pages mapped
        for _ in loader:
            pass
    measured: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {
        key: [] for key in contenders
    }
    for _ in range(rounds):
        reference = memcpy.gbps()
        for key, loader in contenders.items():
            measured[key].append((*one_round(loader, min_seconds), reference))
    print(
        f"Median of {rounds} rounds of >= {min_seconds} s each, every contender and memcpy once "
        "per round; ratios are medians of per-round ratios. 'vs (a)' and 'vs (b)' compare at "
        "the same number of workers. 'main CPU' is the main process's CPU time per batch (all "
        "its threads): with workers, what receiving a batch costs the training process; "
        "'workers' CPU' is theirs, all workers together. Workers beat 0 workers only when the "
        "cores can run main + workers' CPU per batch in less time than 0 workers take.\n"
    )
    return measured


def throughput_table(
    measured: dict[tuple[str, int], list[tuple[float, float, float, float]]], sample_bytes: int
) -> str:
    def per_round(key: tuple[str, int], other: tuple[str, int]) -> str:
        if other not in measured:
            return "-"
        ratio = median(x[0] / y[0] for x, y in zip(measured[key], measured[other], strict=True))
        return f"{ratio:,.0f}x" if other[0] == A_NAME else f"{ratio:.2f}x"

    rows = []
    for (name, w), values in measured.items():
        rate = median(v[0] for v in values)
        rows.append(
            [
                name,
                str(w),
                f"{rate:,.0f}",
                f"{rate * sample_bytes / 1e9:.2f}",
                per_round((name, w), (A_NAME, w)),
                per_round((name, w), (B_NAME, w)),
                f"{median(v[0] * sample_bytes / 1e9 / v[3] for v in values):.0%}",
                per_round((name, w), (name, 0)),
                f"{median(v[1] for v in values) * 1e6:,.0f}",
                f"{median(v[2] for v in values) * 1e6:,.0f}" if w else "-",
            ]
        )
    reference = median(v[3] for v in next(iter(measured.values())))
    memcpy_row = ["(c) np.copyto of one large buffer (memcpy)", "-", "-", f"{reference:.2f}"]
    rows.append(memcpy_row + ["-"] * (len(rows[0]) - len(memcpy_row)))
    header = [
        "loader",
        "workers",
        "samples/s",
        "GB/s",
        "vs (a)",
        "vs (b)",
        "of (c) memcpy",
        "vs 0 workers",
        "main CPU us/batch",
        "workers' CPU us/batch",
    ]
    return table(header, rows)


def report_throughput(
    ds: PackedDataset, files: list[Path], big_path: Path, memcpy: Memcpy, quick: bool
) -> None:
    labels = ds.labels
    # (a) reads a random subset, whole epochs of it: an abandoned epoch would leave workers
    # decoding in the background while the next contender is measured.
    subset = np.random.default_rng(2).permutation(len(ds))[: (2 if quick else 6) * BATCH]
    some_files = [files[i] for i in subset]
    some_labels = labels[subset].tolist()

    def stream(w: int) -> Iterable[Any]:
        packed = PackedStream(ds.selection, batch_size=BATCH)
        return stream_loader(packed, num_workers=w, persistent_workers=w > 0)

    kinds: dict[str, Callable[[int], Iterable[Any]]] = {
        OURS: partial(ours, ds),
        "loaders PackedStream": stream,
        B_NAME: lambda w: torch_loader(BigMemmap(big_path, labels), w),
        A_NAME: lambda w: torch_loader(
            PillowFiles(some_files, some_labels, ds.sample_shape[:2]), w
        ),
    }
    contenders = {(name, w): make(w) for w in (0, 2) for name, make in kinds.items()}
    print(f"## Random-order batches of {BATCH} from page-cached data\n")
    print(
        throughput_table(measure_rounds(contenders, memcpy, quick), int(np.prod(ds.sample_shape)))
    )


def report_large_samples(workdir: Path, memcpy: Memcpy, quick: bool) -> None:
    """The same measurement with ImageNet-sized samples (224x224x3, 147 KiB), synthetic."""
    shape = (224, 224, 3)
    root = workdir / "large"
    n = write_synthetic(root, (150 if quick else 400) << 20, shape)
    ds = PackedDataset.open(root)
    big_path = workdir / "large.npy"
    np.save(big_path, ds.gather(list(range(len(ds)))).images.numpy())
    labels = ds.labels
    contenders: Contenders = {(OURS, w): ours(ds, w) for w in (0, 2)} | {
        (B_NAME, w): torch_loader(BigMemmap(big_path, labels), w) for w in (0, 2)
    }
    print(f"\n## Larger samples: {n} synthetic samples of {shape} uint8, page-cached\n")
    print(throughput_table(measure_rounds(contenders, memcpy, quick), int(np.prod(shape))))
    big_path.unlink()


def report_rss(workdir: Path, sample_shape: tuple[int, ...], quick: bool) -> None:
    root = workdir / "synthetic"
    sample_bytes = int(np.prod(sample_shape))
    n = write_synthetic(root, (128 if quick else 768) << 20, sample_shape)
    budget = 16 << 20
    print("\n## Resident memory over one random epoch\n")
    print(
        f"A synthetic dataset of {n} samples ({n * sample_bytes / 2**20:.0f} MiB); a batch is "
        f"{BATCH * sample_bytes / 2**20:.1f} MiB. MiB of the reading process (with workers, "
        "the largest worker), first batch -> peak. 'file-backed' is page cache mapped into the "
        "process: shared, reclaimable, and bounded by `release_every`.\n"
    )
    rows = []
    for release, w in [(None, 0), (budget, 0), (None, 2), (budget, 2)]:
        shown = "never" if release is None else f"{release >> 20} MiB"
        rows.append([str(w), shown, *rss_over_epoch(root, release, w)])
    print(table(["workers", "release_every", "RSS", "anonymous", "file-backed"], rows))


def report_quality(ds: PackedDataset) -> None:
    shard_idx, labels = ds.shard_idx, ds.labels

    def mean_tv(order_of: Callable[[int], NDArray[np.int64]]) -> float:
        return float(np.mean([class_mix_distance(order_of(s), labels, BATCH) for s in range(5)]))

    def stream_tv(slots: int, window: int) -> float:
        distances = []
        for seed, slot in itertools.product(range(5), range(slots)):
            order = np.concatenate(stream_order(shard_idx, slot, slots, seed, 0, window))
            distances.append(class_mix_distance(order, labels, BATCH))
        return float(np.mean(distances))

    random_tv = mean_tv(lambda s: random_order(len(ds), s, 0))
    orders = {
        "sequential (shard, row) order": class_mix_distance(np.arange(len(ds)), labels, BATCH),
        "random permutation": random_tv,
        "blocks of 16, window 1024": mean_tv(lambda s: block_order(shard_idx, s, 0, 16, 1024)),
        "blocks of 16, window 4096 (shuffle='blocks')": mean_tv(
            lambda s: block_order(shard_idx, s, 0, 16, 4096)
        ),
        "class-balanced": mean_tv(lambda s: balanced_order(labels, s, 0)),
        "stream, 1 worker, window 8 shards": stream_tv(1, 8),
        "stream, 4 slots (2 ranks x 2 workers), window 8": stream_tv(4, 8),
    }
    print(f"\n## Shuffle quality: class mix of batches of {BATCH}, sample data train split\n")
    print(
        "Mean total-variation distance between each batch's class mix and the dataset's "
        "(`loaders.class_mix_distance`; 0 = identical, mean of 5 seeds). The shards are packed "
        "class by class, so the reading order decides the mix.\n"
    )
    rows = [[k, f"{v:.3f}", f"{v / random_tv:.2f}"] for k, v in orders.items()]
    print(table(["order", "class-mix TV", "vs random"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("artifacts"))
    parser.add_argument("--sources", type=Path, default=Path("data/sample"))
    parser.add_argument("--quick", action="store_true", help="fewer repeats, smaller data")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", "CUDA is not available", RuntimeWarning)
    if not (args.data / "versions").is_dir() or not args.sources.is_dir():
        raise SystemExit(
            f"need {args.data}/ and {args.sources}/: run "
            "'etl sample-data data/sample && etl run pipeline.yaml' first"
        )
    torch.set_num_threads(1)
    catalog = open_catalog(args.data)
    ds = PackedDataset(catalog.select(split="train"))
    print(f"# loaders benchmark ({'quick' if args.quick else 'full'})\n")
    print(
        f"{len(ds)} train samples of {ds.sample_shape} uint8 in {len(ds.selection.shards)} "
        f"shards; {os.cpu_count()} CPUs; torch {torch.__version__}; "
        f"load average before: {os.getloadavg()[0]:.2f}\n"
    )
    with tempfile.TemporaryDirectory(prefix="bench-loaders-") as tmp:
        workdir = Path(tmp)
        big_path = workdir / "big.npy"
        np.save(big_path, ds.gather(list(range(len(ds)))).images.numpy())
        big = np.load(big_path, mmap_mode="r")
        memcpy = Memcpy((64 if args.quick else 512) << 20)
        report_copies(ds, big, memcpy, args.quick)
        sources = catalog.table.take(ds.selection.positions).column("source").to_pylist()
        files = [args.sources / s for s in sources]
        report_throughput(ds, files, big_path, memcpy, args.quick)
        report_large_samples(workdir, memcpy, args.quick)
        print(f"\nLoad average (1 min) after these measurements: {os.getloadavg()[0]:.2f}")
        del memcpy, big  # their buffers would count in the resident memory measured next
        report_rss(workdir, ds.sample_shape, args.quick)
    report_quality(ds)


if __name__ == "__main__":
    main()
