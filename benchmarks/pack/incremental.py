"""Incremental re-packing: a no-change rerun and a 1% addition against a full run, in one run.

    python -m benchmarks.pack.incremental [--files 100000] [--quick]

The source tree holds `--files` JPEGs made from realistic photos (benchmarks/photos.py): each
base photo is written several times with a distinct 8-byte trailer after its end-of-image
marker, so every file has unique bytes (no duplicate or reuse shortcut applies) and decodes
exactly like a camera file. Times are wall-clock seconds of whole `etl run --json` commands,
interpreter start included (#60's measure), each with its phases; beside them the floor every
command pays: a fresh interpreter's `import etl.cli`, and `etl --help`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

from benchmarks.common import cpu_model
from benchmarks.photos import make_photos

CONFIG = """\
source: {{kind: folder, path: {source}, split: {{val: 0.1}}}}
stages:
  - decode: {{}}
  - validate: {{duplicates: keep_first}}
  - resize: {{size: [64, 64], mode: center_crop}}
output: {{dir: {out}, samples_per_shard: 2048}}
run: {{n_jobs: {jobs}}}
"""


def build_source(root: Path, files: int, bases: int, work: Path) -> list[Path]:
    """`files` unique JPEGs under root/<class>/, cycling over `bases` photos."""
    photos = make_photos(work / "photos", bases, seed=7)
    blobs = [(p.parent.name, p.read_bytes()) for p in photos]
    if root.exists() and sum(1 for _ in root.rglob("*.jpg")) == files:
        return sorted(root.rglob("*.jpg"))
    shutil.rmtree(root, ignore_errors=True)
    paths = []
    for i in range(files):
        cls, blob = blobs[i % len(blobs)]
        path = root / cls / f"img_{i:07d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob + i.to_bytes(8, "little"))
        paths.append(path)
    return paths


def add_files(root: Path, start: int, count: int, work: Path, bases: int) -> None:
    photos = make_photos(work / "photos", bases, seed=7)
    for i in range(start, start + count):
        p = photos[i % len(photos)]
        (root / p.parent.name / f"new_{i:07d}.jpg").write_bytes(
            p.read_bytes() + (i + 10**9).to_bytes(8, "little")
        )


def timed(config_path: Path) -> tuple[float, dict[str, Any]]:
    """(seconds of one whole `etl run --json` command, its report)."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "etl", "run", str(config_path), "--json"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return time.perf_counter() - start, json.loads(done.stdout)


def floor(command: list[str], rounds: int = 5) -> float:
    """Median seconds of a fresh `command`: what every `etl` command pays before its work."""
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def phases(report: dict[str, Any]) -> str:
    return ", ".join(f"{name} {seconds:.2f}" for name, seconds in report["phases"].items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--bases", type=int, default=2000, help="distinct base photos")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("artifacts/bench-incremental"))
    parser.add_argument("--quick", action="store_true", help="5,000 files, 500 base photos")
    args = parser.parse_args()
    if args.quick:
        args.files, args.bases = 5000, 500
    work: Path = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    source = work / f"source-{args.files}"
    build_source(source, args.files, args.bases, work)
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    yaml = work / "pipeline.yaml"
    yaml.write_text(CONFIG.format(source=source, out=out, jobs=args.jobs))
    # warm the page cache so the full run is not charged for the first disk read
    for path in source.rglob("*.jpg"):
        path.read_bytes()

    full, full_report = timed(yaml)
    nochange, nochange_report = timed(yaml)
    assert not nochange_report["committed"]
    added = max(1, args.files // 100)
    add_files(source, 0, added, work, args.bases)
    incremental, inc_report = timed(yaml)
    assert inc_report["packed_new"] == added, inc_report
    imports = floor([sys.executable, "-c", "import etl.cli"])
    helps = floor([sys.executable, "-m", "etl", "--help"])
    # undo, so the cached source folder stays reusable
    for path in source.rglob("new_*.jpg"):
        path.unlink()

    cpu = cpu_model()
    print(
        f"\n{date.today()}, {os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, "
        f"--jobs {args.jobs}\n"
    )
    print("| run | files | packed | seconds | vs full run | phases |")
    print("|---|---:|---:|---:|---:|---|")
    rows = [
        ("full", args.files, full, full_report),
        ("no change", args.files, nochange, nochange_report),
        ("+1% new files", args.files + added, incremental, inc_report),
    ]
    for name, files, seconds, report in rows:
        packed = report["packed_new"]
        print(
            f"| {name} | {files:,} | {packed:,} | {seconds:.2f} | {seconds / full:.1%} | "
            f"{phases(report)} |"
        )
    print(f"| `python -c 'import etl.cli'` | | | {imports:.2f} | {imports / full:.1%} | |")
    print(f"| `etl --help` | | | {helps:.2f} | {helps / full:.1%} | |")


if __name__ == "__main__":
    main()
