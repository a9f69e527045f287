"""Parent memory on the reject path: a CSV listing whose files do not exist, so every row is a
'missing' reject and nothing is decoded (issue #43's goal: at most 150 bytes per extra entry);
with `--folder`, a class-per-folder tree of links that lead nowhere, each a reject too.

    python -m benchmarks.pack.rejects [--rows 200000,800000] [--folder] [--work data/bench]

Each size is one cold `python -m etl run` (its VmHWM read at exit, `benchmarks.common`); the
figure is (peak at the largest - peak at the smallest) / (difference in rows).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import cpu_model, run_measured

GOAL = 150
"""Bytes of peak RSS per extra listed entry."""


def make_listing(folder: Path, rows: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    listing = folder / f"missing-{rows}.csv"
    if not listing.exists():
        with open(listing, "w") as f:
            f.write("path,label\n")
            for i in range(rows):
                f.write(f"images/class_{i % 100:03d}/photo_{i:08d}.jpg,class_{i % 100:03d}\n")
    return listing


def make_tree(folder: Path, rows: int) -> Path:
    """`rows` links to a missing file, 100 class folders of them."""
    tree = folder / f"links-{rows}"
    if not tree.exists():
        building = folder / f".building-links-{rows}"
        shutil.rmtree(building, ignore_errors=True)
        for c in range(100):
            (building / f"class_{c:03d}").mkdir(parents=True)
        for i in range(rows):
            os.symlink("/nonexistent/photo.jpg", building / f"class_{i % 100:03d}/l{i:08d}.jpg")
        building.rename(tree)
    return tree


def measure(work: Path, rows: int, folder: bool = False) -> tuple[float, int]:
    if folder:
        source = f"{{kind: folder, path: {json.dumps(str(make_tree(work / 'trees', rows)))}}}"
    else:
        listing = make_listing(work / "listings", rows)
        source = f"{{kind: listing, path: {json.dumps(str(listing))}}}"
    out = work / f"out-rejects-{rows}"
    shutil.rmtree(out, ignore_errors=True)
    config = work / f"rejects-{rows}.yaml"
    config.write_text(
        f"source: {source}\n"
        "stages:\n  - decode: {mode: RGB}\n  - resize: {size: [32, 32]}\n"
        f"output: {{dir: {json.dumps(str(out))}}}\nrun: {{n_jobs: 2}}\n"
    )
    seconds, peak, status, stdout = run_measured("etl", "run", str(config), "--json")
    if status != 0:
        raise RuntimeError(f"etl run on {rows} missing files exited {status}")
    report = json.loads(stdout)
    if report["rejected"] != rows or report["packed_new"]:
        raise RuntimeError(f"{rows} rows: {report['rejected']} rejected")
    shutil.rmtree(out, ignore_errors=True)
    return seconds, peak


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", default="200000,800000", type=lambda t: [int(v) for v in t.split(",")]
    )
    parser.add_argument("--folder", action="store_true", help="a tree of broken links instead")
    parser.add_argument("--work", type=Path, default=Path("data/bench"))
    args = parser.parse_args(argv)
    work = args.work.resolve()
    results = []
    for rows in args.rows:
        seconds, peak = measure(work, rows, args.folder)
        results.append((rows, seconds, peak))
        print(f"{rows:>9,} rows  {seconds:6.1f} s  peak {peak / 1e6:7.0f} MB", file=sys.stderr)
    (small, _, low), (large, _, high) = results[0], results[-1]
    per_entry = (high - low) / (large - small)
    print(
        f"Machine: {os.cpu_count()} cores, {cpu_model()}, {datetime.date.today().isoformat()}.\n\n"
        f"| {'links in a folder' if args.folder else 'listed rows'} (all missing) | seconds | "
        "peak RSS of `etl run` |\n|---:|---:|---:|"
    )
    for rows, seconds, peak in results:
        print(f"| {rows:,} | {seconds:.1f} | {peak / 1e6:.0f} MB |")
    verdict = "met" if per_entry <= GOAL else "**not met**"
    print(f"\n{per_entry:.0f} bytes per extra entry (goal <= {GOAL}: {verdict}).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
