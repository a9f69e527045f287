"""Pack speed of the sources that hold images inside files, against a folder of the same photos.

    python -m benchmarks.pack.sources [--images N] [--repeats R] [--quick | --tiny]

The same photos (benchmarks/photos.py, ImageNet-like JPEGs) as a class-per-folder tree, as
WebDataset tar shards (<key>.jpg + <key>.cls, 1,000 samples a shard) and as a Parquet table
(an image bytes column and a label column, row groups of 256), each packed by a cold
`python -m etl run` into a fresh folder: 224x224 RGB, bilinear centre crop, 2 loky workers.
Rounds are interleaved (folder, webdataset, parquet, folder, ...); each kind's ratio to the
folder is the median of its per-round ratios, reported with the parent process's peak RSS (the
tar and table kinds read every record in the parent; it must stay flat in the number of
records). Before any number is printed, every
sample is checked equal across the three outputs (matched by the content hash of its photo).
Goal (issue #14): each kind within 10% of the folder's images/s.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from benchmarks.common import cpu_model, peak_rss
from benchmarks.photos import make_photos

SHARD_SAMPLES = 1000
ROW_GROUP = 256
GOAL = 0.9
STAGES = (
    "stages:\n"
    "  - decode: {mode: RGB}\n"
    "  - resize: {size: [224, 224], mode: center_crop, filter: bilinear}\n"
)
SOURCES = {
    "folder": "  kind: folder\n  path: {photos}\n",
    "webdataset": "  kind: webdataset\n  path: {work}/tars\n  files: ['*.tar']\n",
    "parquet": "  kind: parquet\n  path: {work}/tables\n  files: ['*.parquet']\n",
}


def write_containers(photos: list[Path], work: Path) -> None:
    """The same photos as tar shards and as one Parquet file, labels by class folder."""
    for folder in ("tars", "tables"):
        shutil.rmtree(work / folder, ignore_errors=True)
        (work / folder).mkdir(parents=True)
    for start in range(0, len(photos), SHARD_SAMPLES):
        with tarfile.open(work / "tars" / f"shard-{start // SHARD_SAMPLES:05d}.tar", "w") as tar:
            for path in photos[start : start + SHARD_SAMPLES]:
                key = f"{path.parent.name}-{path.stem}"
                tar.add(path, f"{key}.jpg")
                label = path.parent.name.encode()
                info = tarfile.TarInfo(f"{key}.cls")
                info.size = len(label)
                tar.addfile(info, io.BytesIO(label))
    table = pa.table(
        {
            "image": pa.array([p.read_bytes() for p in photos], pa.binary()),
            "label": [p.parent.name for p in photos],
        }
    )
    pq.write_table(table, work / "tables" / "photos.parquet", row_group_size=ROW_GROUP)


@dataclass
class Run:
    seconds: float
    images_per_second: float
    parent_peak_mib: float


def pack(kind: str, photos: Path, work: Path) -> Run:
    """One cold `python -m etl run --json` of `kind` into a fresh output folder."""
    out = work / f"out-{kind}"
    shutil.rmtree(out, ignore_errors=True)
    config = work / f"{kind}.yaml"
    source = SOURCES[kind].format(photos=json.dumps(str(photos)), work=work)
    config.write_text(
        f"source:\n{source}  split: {{}}\n{STAGES}output: {{dir: {json.dumps(str(out))}}}\n"
        "run: {n_jobs: 2, backend: loky}\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "etl", "run", str(config), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak = 0
    while proc.poll() is None:  # VmHWM only grows: the last reading is within 20 ms of the end
        peak = max(peak, peak_rss(proc.pid))
        time.sleep(0.02)
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{kind}: etl run failed ({proc.returncode}): {stderr}")
    report = json.loads(stdout)
    return Run(report["seconds"], report["images_per_second"], peak / 2**20)


def pixels_by_content(out: Path) -> dict[str, np.ndarray]:
    """source_hash -> stored pixels, read with plain pyarrow and numpy."""
    version = sorted((out / "versions").iterdir())[-1]
    with ipc.open_file(version / "manifest.arrow") as reader:
        rows = reader.read_all().to_pylist()
    shards = {name: np.load(out / name, mmap_mode="r") for name in {r["shard"] for r in rows}}
    return {r["source_hash"]: np.asarray(shards[r["shard"]][r["row"]]) for r in rows}


def check_equal(work: Path, images: int) -> None:
    folder = pixels_by_content(work / "out-folder")
    if len(folder) != images:
        raise RuntimeError(f"the folder run packed {len(folder)} of {images} photos")
    for kind in ("webdataset", "parquet"):
        other = pixels_by_content(work / f"out-{kind}")
        if other.keys() != folder.keys():
            raise RuntimeError(f"{kind}: packed other photos than the folder run")
        bad = [h for h in folder if not np.array_equal(folder[h], other[h])]
        if bad:
            raise RuntimeError(f"{kind}: {len(bad)} samples differ from the folder run's")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--quick", action="store_true", help="300 photos, 1 round")
    parser.add_argument("--tiny", action="store_true", help="24 photos, 1 round (a smoke test)")
    parser.add_argument("--work", type=Path, default=Path("data/bench"))
    args = parser.parse_args(argv)
    images, repeats = (300, 1) if args.quick else (args.images, args.repeats)
    if args.tiny:
        images, repeats = 24, 1
    work = args.work.resolve()
    photos = work / f"photos-{images}-s0"
    paths = make_photos(photos, images, 0)
    sources = work / f"sources-{images}"
    sources.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    write_containers(paths, sources)
    took = time.perf_counter() - started
    print(f"wrote {images} photos as tar shards and a Parquet file in {took:.1f} s")
    runs: dict[str, list[Run]] = {kind: [] for kind in SOURCES}
    for round_ in range(repeats):
        for kind in SOURCES:
            runs[kind].append(pack(kind, photos, sources))
            print(f"round {round_ + 1}: {kind} {runs[kind][-1].images_per_second:,.0f} images/s")
    check_equal(sources, images)
    print(f"\n### Sources, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
    print(f"{cpu_model()}, {os.cpu_count()} cores; {images:,} photos, {repeats} round(s).\n")
    print("| source | images/s (median) | vs folder (median of rounds) | >= 0.9x | parent peak |")
    print("|---|---:|---:|:-:|---:|")
    for kind, done in runs.items():
        rate = statistics.median(r.images_per_second for r in done)
        # each round's ratio to the folder run beside it: the machine's drift cancels
        pairs = zip(done, runs["folder"], strict=True)
        ratio = statistics.median(r.images_per_second / f.images_per_second for r, f in pairs)
        met = "yes" if ratio >= GOAL else "**no**"
        peak = max(r.parent_peak_mib for r in done)
        print(f"| {kind} | {rate:,.0f} | {ratio:.2f}x | {met} | {peak:.0f} MiB |")
    for kind in SOURCES:
        shutil.rmtree(sources / f"out-{kind}", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
