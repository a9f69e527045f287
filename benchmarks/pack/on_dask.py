"""The Dask engine's overhead: loky against a Dask LocalCluster with the same number of worker
processes, on the same photos, interleaved in one run.

    python -m benchmarks.pack.on_dask [--images 1500] [--jobs 2] [--repeats 3]

Dask runs connect to a LocalCluster started once by this script (as they would to a real
cluster); the cost of starting one, which `backend: dask` without an address pays per run, is
reported on its own line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from datetime import date
from pathlib import Path

from benchmarks.common import cpu_model
from benchmarks.photos import make_photos
from etl.config import load_config
from etl.run import pipeline

CONFIG = """\
source: {{kind: folder, path: {source}}}
stages:
  - decode: {{}}
  - resize: {{size: [128, 128]}}
output: {{dir: {out}, samples_per_shard: 64}}
run: {{n_jobs: {jobs}, backend: {backend}{address}}}
"""


def one_run(work: Path, source: Path, backend: str, jobs: int, address: str | None) -> float:
    out = work / f"out-{backend}"
    shutil.rmtree(out, ignore_errors=True)
    yaml = work / f"{backend}.yaml"
    extra = f", address: '{address}'" if address else ""
    yaml.write_text(
        CONFIG.format(source=source, out=out, jobs=jobs, backend=backend, address=extra)
    )
    config = load_config(yaml)
    start = time.perf_counter()
    report = pipeline.run(config)
    seconds = time.perf_counter() - start
    return report.packed_new / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1500)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("artifacts/bench-dask"))
    args = parser.parse_args()
    from distributed import Client, LocalCluster

    work: Path = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    photos = make_photos(work / "photos", args.images, seed=3)
    source = work / "photos"
    for p in photos:
        p.read_bytes()

    start = time.perf_counter()
    cluster = LocalCluster(
        n_workers=args.jobs,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
    )
    client = Client(cluster)
    startup = time.perf_counter() - start
    rates: dict[str, list[float]] = {"loky": [], "dask": []}
    try:
        for _ in range(args.repeats):
            rates["loky"].append(one_run(work, source, "loky", args.jobs, None))
            rates["dask"].append(
                one_run(work, source, "dask", args.jobs, cluster.scheduler_address)
            )
    finally:
        client.close()
        cluster.close()
    loky, dask = statistics.median(rates["loky"]), statistics.median(rates["dask"])
    cpu = cpu_model()
    print(
        f"\n{date.today()}, {os.cpu_count()} cores ({cpu}), {args.images} photos -> 128x128, "
        f"{args.jobs} worker processes each, median of {args.repeats} interleaved runs\n"
    )
    print("| engine | images/s | vs loky |")
    print("|---|---:|---:|")
    print(f"| joblib loky | {loky:.0f} | 100% |")
    print(f"| joblib Dask backend, LocalCluster | {dask:.0f} | {dask / loky:.1%} |")
    print(
        f"\nStarting the LocalCluster took {startup:.1f} s (paid per run by `backend: dask` "
        "without an address)."
    )


if __name__ == "__main__":
    main()
