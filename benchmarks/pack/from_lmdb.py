"""Moving an LMDB dataset to memmap shards: the conversion, then loaders against LMDB.

    python -m benchmarks.pack.from_lmdb [--samples N] [--quick]

Self-contained, in a temp folder, in one run on one machine:
1. a "team's existing dataset": an LMDB environment with one JPEG per key (varied sizes, 10
   classes), converted by `etl run` with `source: lmdb` (timed: images/s);
2. from the packed result, a second LMDB environment holding the *same resized pixels*, one
   key per sample (raw HWC uint8 bytes), the usual LMDB-per-sample training Dataset;
3. random-order batches of 256 from both, page-cached (a warm-up pass first): the `loaders`
   package's PackedDataset + make_loader against a map-style torch Dataset that opens LMDB
   lazily per worker, reads one sample per `__getitem__` and uses the default collate.
Timings are the best of whole passes over `--seconds`; nothing is asserted.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import torch
from numpy.typing import NDArray
from PIL import Image
from torch.utils.data import DataLoader, Dataset, RandomSampler

from benchmarks.common import cpu_model
from etl.config import load_config
from etl.run import pipeline
from loaders import PackedDataset, make_loader

BATCH = 256
SIZE = (64, 64)
CLASSES = 10


# --- 1. the source environment and its conversion ----------------------------------------------


def write_source_env(path: Path, samples: int) -> None:
    """JPEGs of 96..192 px a side: smooth colour fields with noise, like small photos."""
    rng = np.random.default_rng(0)
    env = lmdb.open(str(path), map_size=1 << 34)
    with env.begin(write=True) as txn:
        for i in range(samples):
            height, width = rng.integers(96, 193, 2)
            y, x = np.mgrid[0:height, 0:width]
            tint = rng.integers(0, 256, 3)
            field = np.stack([x * 255 // width, y * 255 // height, (x + y) % 256], -1) + tint
            noise = rng.integers(0, 24, (height, width, 3))
            buffer = io.BytesIO()
            Image.fromarray(((field + noise) % 256).astype(np.uint8)).save(
                buffer, "JPEG", quality=90
            )
            txn.put(f"{i:08d}".encode(), buffer.getvalue())
    env.close()


def convert(workdir: Path, samples: int) -> tuple[Path, float]:
    """`etl run` over the source environment -> (dataset folder, images/s)."""
    (workdir / "labels.csv").write_text(
        "key,label\n" + "".join(f"{i:08d},c{i % CLASSES}\n" for i in range(samples))
    )
    config_path = workdir / "pipeline.yaml"
    config_path.write_text(
        f"""\
source: {{kind: lmdb, path: source-env, labels: labels.csv, split: {{}}}}
stages:
  - decode: {{mode: RGB}}
  - resize: {{size: [{SIZE[0]}, {SIZE[1]}], draft: true}}
output: {{dir: packed, shard_size: 64MiB}}
run: {{n_jobs: -1}}
"""
    )
    config = load_config(config_path)
    started = time.perf_counter()
    report = pipeline.run(config)
    seconds = time.perf_counter() - started
    assert report.packed_new == samples, report.to_dict()
    return Path(config.output.dir), samples / seconds


# --- 2. the LMDB-per-sample baseline ----------------------------------------------------------


def write_pixels_env(path: Path, ds: PackedDataset) -> None:
    """Key f"{i:08d}" -> the raw HWC bytes of sample i of `ds`, read back from its shards."""
    env = lmdb.open(str(path), map_size=1 << 36)
    step = 4096
    with env.begin(write=True) as txn:
        for start in range(0, len(ds), step):
            images = ds.gather(list(range(start, min(start + step, len(ds))))).images
            for offset, image in enumerate(images.numpy()):
                txn.put(f"{start + offset:08d}".encode(), image.tobytes())
    env.close()


class LmdbPerSample(Dataset[tuple[torch.Tensor, int]]):
    """The usual LMDB Dataset: opened lazily in each worker (read-only, no lock, no readahead),
    one txn.get per `__getitem__`, one copy out of the map, default collate."""

    def __init__(self, path: Path, labels: NDArray[np.int32], shape: tuple[int, ...]) -> None:
        self.path, self.labels, self.shape = path, labels, shape
        self.env: Any = None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.env is None:
            self.env = lmdb.open(
                str(self.path), readonly=True, lock=False, readahead=False, meminit=False
            )
        with self.env.begin(buffers=True) as txn:
            value = txn.get(f"{i:08d}".encode())
            image = np.frombuffer(value, np.uint8).reshape(self.shape).copy()
        return torch.from_numpy(image), int(self.labels[i])


# --- 3. throughput ------------------------------------------------------------------------------


def samples_per_second(make: Callable[[], Iterable[Any]], seconds: float) -> float:
    """Best whole pass after a warm-up pass (workers started, pages cached)."""
    loader = make()
    for _ in loader:
        pass
    best, spent = 0.0, 0.0
    while spent < seconds or best == 0.0:
        count, start = 0, time.perf_counter()
        for batch in loader:
            count += len(batch[1])
        elapsed = time.perf_counter() - start
        best, spent = max(best, count / elapsed), spent + elapsed
    return best


def machine() -> str:
    cpu = cpu_model()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM; Linux {platform.release()}; "
        f"Python {platform.python_version()}, torch {torch.__version__}, numpy "
        f"{np.__version__}, lmdb {version('lmdb')}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="timed per loader")
    parser.add_argument("--quick", action="store_true", help="2,000 samples, 1 s per loader")
    args = parser.parse_args()
    samples, seconds = (2_000, 1.0) if args.quick else (args.samples, args.seconds)
    warnings.filterwarnings("ignore", "CUDA is not available", RuntimeWarning)
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory(prefix="bench-lmdb-") as tmp:
        workdir = Path(tmp)
        write_source_env(workdir / "source-env", samples)
        packed, convert_rate = convert(workdir, samples)
        ds = PackedDataset.open(packed)
        write_pixels_env(workdir / "pixels-env", ds)
        sample_bytes = int(np.prod(ds.sample_shape))
        generator = torch.Generator().manual_seed(0)

        def ours(workers: int) -> Iterable[Any]:
            return make_loader(
                ds, BATCH, shuffle=True, num_workers=workers, persistent_workers=workers > 0
            )

        def per_sample(workers: int) -> Iterable[Any]:
            dataset = LmdbPerSample(workdir / "pixels-env", ds.labels, ds.sample_shape)
            sampler = RandomSampler(range(len(ds)), generator=generator)
            return DataLoader(
                dataset,
                BATCH,
                sampler=sampler,
                num_workers=workers,
                persistent_workers=workers > 0,
            )

        rows = []
        for workers in (0, 2):
            rate_ours = samples_per_second(lambda w=workers: ours(w), seconds)
            rate_lmdb = samples_per_second(lambda w=workers: per_sample(w), seconds)
            rows.append((workers, rate_ours, rate_lmdb))

    print(f"### LMDB -> memmap shards, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
    print(f"{machine()}.\n")
    print(
        f"{samples:,} JPEGs (96-192 px a side) in an LMDB environment, converted by `etl run` "
        f"(`source: lmdb`, {SIZE[0]}x{SIZE[1]} RGB, draft decode, every core): "
        f"**{convert_rate:,.0f} images/s**. Then random-order batches of {BATCH} over the same "
        f"{ds.sample_shape} uint8 pixels ({sample_bytes / 1024:.0f} KiB a sample, "
        f"{samples * sample_bytes / 2**20:.0f} MiB, page-cached), best pass of {seconds:g} s:\n"
    )
    print(
        "| workers | loaders PackedDataset (samples/s) | LMDB per-sample Dataset (samples/s) "
        "| ratio |"
    )
    print("|---|---|---|---|")
    for workers, rate_ours, rate_lmdb in rows:
        print(f"| {workers} | {rate_ours:,.0f} | {rate_lmdb:,.0f} | {rate_ours / rate_lmdb:.1f}x |")


if __name__ == "__main__":
    main()
