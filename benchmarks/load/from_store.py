"""Training from object storage against local disk and against the endpoint's own limit, all
against one S3-compatible server (moto's, in its own process on 127.0.0.1) in one run.

    python -m benchmarks.load.from_store [--samples 5000] [--size 224] [--per-shard 1000]
        [--rounds 3]

A synthetic dataset of `--samples` random uint8 samples (shards of `--per-shard`) is uploaded to a
bucket. Each round measures, in this order:
- endpoint: plain concurrent GETs (8 threads) of every shard's bytes, no verification, no
  file written: the most any client of this endpoint gets;
- cold: `PackedDataset.open(url, store=StoreOptions(cache_dir=<empty>))` and one epoch of
  random batches of 256 (download, verify, map, read);
- warm: the same again on the filled cache (no byte from the store);
- local: the same dataset opened from local disk, one epoch;
- limit, epoch 1 and 2: `cache_limit` at half the dataset, an empty cache, two epochs of the
  shard-group order, one shard at a time (`ShardGroupSampler(group=1)`; a random or block
  order touches every shard in each batch, which no cache smaller than the dataset can hold),
  shards fetched ahead in it;
- local, shard groups: the same order from local disk.
Medians over rounds, as samples/s. Every cached shard is then compared byte for byte with the
packed one (the run stops if one differs); no speed is asserted.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import cpu_model
from benchmarks.load.throughput import write_synthetic

BATCH = 256


def shards_of(local: Path) -> list[str]:
    from loaders import PackedDataset

    return list(PackedDataset.open(local).selection.shards.names)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(port: int) -> subprocess.Popen[bytes]:
    """moto's S3 server in its own process, so it does not share this one's GIL."""
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("moto server did not start")


def options(port: int) -> dict[str, Any]:
    return {
        "key": "bench",
        "secret": "bench",
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"},
    }


def create_bucket(port: int, name: str) -> None:
    """A bucket on the server at `port`, with the credentials of `options`."""
    import boto3

    boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    ).create_bucket(Bucket=name)


def epoch(ds: Any) -> None:
    from loaders import make_loader

    for _ in make_loader(ds, batch_size=BATCH, shuffle=True, pin_memory=False):
        pass


def block_epochs(ds: Any, epochs: int) -> list[float]:
    """Seconds of each of `epochs` epochs of the shard-group order, one shard at a time (a
    batch then reads at most two shards, which half of 5 shards holds), one loader."""
    from loaders import make_loader
    from loaders.order.samplers import ShardGroupSampler

    order = ShardGroupSampler(ds.shard_idx, group=1, seed=1)
    loader = make_loader(ds, batch_size=BATCH, sampler=order, pin_memory=False)
    seconds = []
    for number in range(epochs):
        loader.set_epoch(number)
        start = time.perf_counter()
        for _ in loader:
            pass
        seconds.append(time.perf_counter() - start)
    return seconds


def _one_round(
    work: Path,
    url: str,
    local: Path,
    shards: list[str],
    port: int,
    limit: int,
    times: dict[str, list[float]],
) -> None:
    """Each contender once, its seconds appended to `times`: the endpoint's GETs, epochs from
    the bucket (cache cold, then warm) and from local disk, and shard-group epochs through a
    cache half the dataset's size."""
    import s3fs

    from etl.storage.location import StoreOptions
    from loaders import PackedDataset

    fresh = s3fs.S3FileSystem(**options(port), skip_instance_cache=True)
    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(fresh.cat_file, shards))
    times["endpoint"].append(time.perf_counter() - start)
    cache = work / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    for name in ("cold", "warm"):
        start = time.perf_counter()
        epoch(
            PackedDataset.open(
                url, store=StoreOptions(cache_dir=cache, storage_options=options(port))
            )
        )
        times[name].append(time.perf_counter() - start)
    start = time.perf_counter()
    epoch(PackedDataset.open(local))
    times["local"].append(time.perf_counter() - start)
    limited = work / "limited"
    shutil.rmtree(limited, ignore_errors=True)
    ds = PackedDataset.open(
        url,
        store=StoreOptions(cache_dir=limited, storage_options=options(port), cache_limit=limit),
    )
    first, second = block_epochs(ds, 2)
    times["limit-1"].append(first)
    times["limit-2"].append(second)
    times["local-blocks"].append(block_epochs(PackedDataset.open(local), 1)[0])


def _report(args: argparse.Namespace, times: dict[str, list[float]], n: int, shape: tuple) -> None:
    """The README table: each contender's samples/s, against local disk and the endpoint."""
    rate = {k: n / statistics.median(v) for k, v in times.items()}
    mib = n * shape[0] * shape[1] * 3 / 2**20
    print(
        f"# load.from_store, {time.strftime('%Y-%m-%d')}, {cpu_model()}, "
        f"{os.cpu_count()} CPUs: {n} samples of {shape} ({mib:,.0f} MiB), "
        f"shards of {args.per_shard:,}, moto S3 on "
        "127.0.0.1, "
        f"median of {args.rounds} rounds\n"
    )
    print("| contender | samples/s | vs local | vs endpoint |")
    print("|---|---:|---:|---:|")
    for name, label in (
        ("endpoint", "endpoint: 8 concurrent GETs of every shard"),
        ("cold", "from the bucket, cache cold (open + epoch)"),
        ("warm", "from the bucket, cache warm (open + epoch)"),
        ("local", "local disk (open + epoch)"),
        ("limit-1", "cache limit half the dataset, shard groups, epoch 1 (cold)"),
        ("limit-2", "cache limit half the dataset, shard groups, epoch 2"),
        ("local-blocks", "local disk, shard groups (epoch)"),
    ):
        print(
            f"| {label} | {rate[name]:,.0f} | {rate[name] / rate['local']:.2f} "
            f"| {rate[name] / rate['endpoint']:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import s3fs

    from etl.storage.store import StoreDataset
    from loaders import PackedDataset

    shape = (args.size, args.size, 3)
    work = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    port = free_port()
    server = start_server(port)
    try:
        local = work / "local"
        n = write_synthetic(local, args.samples * shape[0] * shape[1] * 3, shape, args.per_shard)
        create_bucket(port, "bench")
        fs = s3fs.S3FileSystem(**options(port))
        fs.put(str(local), "bench/ds", recursive=True)
        url = "s3://bench/ds"
        shards = [f"bench/ds/{name}" for name in shards_of(local)]
        names = ("endpoint", "cold", "warm", "local", "limit-1", "limit-2", "local-blocks")
        times: dict[str, list[float]] = {k: [] for k in names}
        sizes = [(local / name).stat().st_size for name in shards_of(local)]
        limit = max(sum(sizes) // 2, max(sizes))  # never below one shard (an error)
        for _ in range(args.rounds):
            _one_round(work, url, local, shards, port, limit, times)
        mirror = StoreDataset(url, work / "cache", options(port)).root
        for name in PackedDataset.open(local).selection.shards.names:
            if not filecmp.cmp(local / name, mirror / name, shallow=False):
                raise SystemExit(f"{name}: the cached copy differs from the packed shard")
        _report(args, times, n, shape)
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
