"""Packing photos that live in a bucket against packing the same photos from local disk, and
against the endpoint's own limit, all against one S3-compatible server (moto's, in its own
process on 127.0.0.1) in one run.

    python -m benchmarks.pack.from_store [--photos 1000] [--jobs 2] [--rounds 3]

The photos (`benchmarks.photos`) are uploaded to a bucket once. Each round, in an order that
rotates: `etl run` as a cold process with `source.path` the local folder, then the bucket
prefix (same stages as `pack.grid`: decode RGB, centre crop 224x224 bilinear); and the
then the bucket prefix into a bucket (`output.dir: s3://...`, a new prefix each round, so each
is a first run: pack, upload, read back to verify, publish); and the endpoint: plain concurrent
GETs (8 threads) of every photo, no decode. Medians over rounds, as photos/s. The datasets'
samples (source, class, split, pixel checksum) must be equal, or the run stops; no speed is
asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import machine_info
from benchmarks.load.from_store import create_bucket, free_port, options, start_server
from benchmarks.pack.grid import write_config
from benchmarks.photos import make_photos

BUCKET = "photos"


def upload(fs: Any, photos: list[Path], root: Path) -> None:
    def put(path: Path) -> None:
        fs.pipe(f"{BUCKET}/photos/{path.relative_to(root).as_posix()}", path.read_bytes())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, photos))


def endpoint_seconds(fs: Any, keys: list[str]) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(fs.cat_file, keys))
    return time.perf_counter() - start


def etl_seconds(config: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "etl", "run", str(config), "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"etl run {config} failed: {done.stderr}")
    return seconds


def samples(out: Path | str, cache: Path) -> list[tuple[Any, ...]]:
    from etl.format.manifest import read_manifest
    from etl.storage.store import StoreDataset

    if isinstance(out, str):  # a dataset in the bucket: its latest version's files, fetched
        remote = StoreDataset(out, cache)
        remote.fetch_version(None)
        out = remote.root
    table = read_manifest(out).samples.select(["source", "class_name", "split", "checksum"])
    return sorted(tuple(row.values()) for row in table.to_pylist())


def _rounds(
    args: argparse.Namespace,
    variants: list[str],
    sources: dict[str, str],
    work: Path,
    env: dict[str, str],
    fs: Any,
    keys: list[str],
    times: dict[str, list[float]],
) -> dict[str, Path | str]:
    """The interleaved rounds, each variant's seconds appended to `times`; where each run
    wrote its dataset."""
    outputs: dict[str, Path | str] = {}
    for round_ in range(args.rounds):
        turn = round_ % len(variants)
        for variant in variants[turn:] + variants[:turn]:
            if variant == "endpoint":
                seconds = endpoint_seconds(fs, keys)
            else:
                out: Path | str = work / f"out-{variant}"
                if variant == "to-bucket":
                    out = f"s3://{BUCKET}/out-{round_}"
                shutil.rmtree(out, ignore_errors=True)
                config = write_config(
                    work / f"{variant}.yaml", sources[variant], out, 256, args.jobs
                )
                seconds = etl_seconds(config, env)
                outputs[variant] = out
            times[variant].append(seconds)
            rate = args.photos / seconds
            print(f"round {round_ + 1}: {variant:>8} {rate:8.1f} photos/s", file=sys.stderr)
    return outputs


def _report(args: argparse.Namespace, times: dict[str, list[float]]) -> None:
    """The JSON line and the README table of the median rates."""
    rate = {v: args.photos / statistics.median(t) for v, t in times.items()}
    info = machine_info()
    print(json.dumps({"machine": info, "photos": args.photos, "jobs": args.jobs, "rate": rate}))
    print(
        f"\n{args.photos:,} photos, {args.jobs} jobs, median of {args.rounds} rounds "
        f"({info['cores']} cores, {info['cpu']}, Python {info['python']}, {info['date']}):\n\n"
        "| | photos/s | x local disk |\n|---|---:|---:|\n"
        f"| `etl run`, source on local disk | {rate['local']:.0f} | 1.00x |\n"
        f"| `etl run`, source in the bucket | {rate['bucket']:.0f} | "
        f"**{rate['bucket'] / rate['local']:.2f}x** |\n"
        f"| `etl run`, bucket into a bucket | {rate['to-bucket']:.0f} | "
        f"**{rate['to-bucket'] / rate['local']:.2f}x** |\n"
        f"| endpoint: 8 concurrent GETs, no decode | {rate['endpoint']:.0f} | "
        f"{rate['endpoint'] / rate['local']:.2f}x |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("data/bench"))
    args = parser.parse_args()
    import s3fs

    root = args.work.resolve() / f"photos-{args.photos}-s0"
    photos = make_photos(root, args.photos, 0)
    port = free_port()
    server = start_server(port)
    work = Path(tempfile.mkdtemp(prefix=".remote-pack-", dir=args.work.resolve()))
    variants = ["local", "bucket", "to-bucket", "endpoint"]
    times: dict[str, list[float]] = {v: [] for v in variants}
    try:
        create_bucket(port, BUCKET)
        fs = s3fs.S3FileSystem(**options(port))
        upload(fs, photos, root)
        keys = [f"{BUCKET}/photos/{p.relative_to(root).as_posix()}" for p in photos]
        env = {
            **os.environ,
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
            "ETL_CACHE": str(work / "cache"),
        }
        sources = {"local": str(root), "bucket": f"s3://{BUCKET}/photos"}
        sources["to-bucket"] = sources["bucket"]
        outputs = _rounds(args, variants, sources, work, env, fs, keys, times)
        os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
        local = samples(outputs["local"], work / "cache")
        for variant in ("bucket", "to-bucket"):
            if samples(outputs[variant], work / "cache") != local:
                raise RuntimeError(f"the {variant} dataset differs from the local one")
    finally:
        server.kill()
        shutil.rmtree(work, ignore_errors=True)
    _report(args, times)


if __name__ == "__main__":
    main()
