"""What a run's parent costs per source file: a tree of tiny distinct JPEGs (issue #13).

    python -m benchmarks.pack.tree [--files 100000 1000000] [--work DIR] [--jobs 2] [--tiny]

For each size, writes `--files` tiny JPEGs (48x48, a few base images, each copy made unique by
an 8-byte trailer after its end-of-image marker, as `pack.incremental` does) under 1,000
class folders, then runs `etl run` in fresh processes, each reporting wall time and its own
peak RSS:

    dry-run     etl run --dry-run on the new tree: listing, hashing every file, planning
    first run   packing every file (decode, resize to 32x32, shards, commit)
    no change   the same command again: stat only, nothing read, nothing committed
    +1%         1 % more files added: only they are read and packed

The per-file figures are the growth between the two sizes: (B - A) / (files B - files A),
which leaves out what every run pays once (imports, workers).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.common import cpu_model, run_measured

CLASSES = 1000
SIDE = 48
CONFIG = """\
source: {{kind: folder, path: {source}, split: {{val: 0.1}}}}
stages:
  - decode: {{}}
  - resize: {{size: [32, 32]}}
output: {{dir: {out}}}
run: {{n_jobs: {jobs}}}
"""
OPS = ("dry-run", "first run", "no change", "+1%")


def base_images(count: int = 16, seed: int = 0) -> list[bytes]:
    """`count` small JPEGs of smooth random colour fields (a few hundred bytes each)."""
    rng = np.random.default_rng(seed)
    blobs = []
    for _ in range(count):
        small = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
        image = Image.fromarray(small).resize((SIDE, SIDE), Image.Resampling.BILINEAR)
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=80)
        blobs.append(buffer.getvalue())
    return blobs


def write_tree(root: Path, start: int, count: int, prefix: str = "img") -> None:
    """Files start..start+count-1, spread over the class folders, each with unique bytes."""
    blobs = base_images()
    for c in range(CLASSES):
        (root / f"c{c:04d}").mkdir(parents=True, exist_ok=True)
    for i in range(start, start + count):
        path = f"{root}/c{i % CLASSES:04d}/{prefix}_{i:08d}.jpg"
        with open(path, "wb") as f:
            f.write(blobs[i % len(blobs)] + i.to_bytes(8, "little"))


def etl_run(config: Path, *flags: str) -> tuple[float, int, dict[str, object]]:
    """`etl run config --json` in a fresh process: seconds, peak RSS, its JSON report."""
    seconds, rss, status, out = run_measured("etl", "run", str(config), "--json", *flags)
    if status:
        raise SystemExit(f"etl run {config} {' '.join(flags)} failed (status {status})")
    report: dict[str, object] = json.loads(out)
    return seconds, rss, report


def measure(work: Path, files: int, jobs: int) -> dict[str, tuple[float, int]]:
    source, out = work / "source", work / "out"
    write_tree(source, 0, files)
    config = work / "pipeline.yaml"
    config.write_text(CONFIG.format(source=source, out=out, jobs=jobs))
    results: dict[str, tuple[float, int]] = {}
    seconds, rss, report = etl_run(config, "--dry-run")
    results["dry-run"] = (seconds, rss)
    seconds, rss, report = etl_run(config)
    if report["packed_new"] != files:
        raise SystemExit(f"first run packed {report['packed_new']}, not {files}")
    results["first run"] = (seconds, rss)
    seconds, rss, report = etl_run(config)
    if report["committed"] or report["packed_new"]:
        raise SystemExit(f"no-change run did work: {report}")
    results["no change"] = (seconds, rss)
    write_tree(source, files, files // 100, prefix="new")
    seconds, rss, report = etl_run(config)
    if report["packed_new"] != files // 100:
        raise SystemExit(f"+1% run packed {report['packed_new']}, not {files // 100}")
    results["+1%"] = (seconds, rss)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None, help="where the trees go")
    parser.add_argument("--tiny", action="store_true", help="2,000 and 4,000 files: a smoke test")
    args = parser.parse_args()
    sizes = [2_000, 4_000] if args.tiny else sorted(args.files)
    print(f"# pack.tree, {datetime.now(UTC):%Y-%m-%d}, {cpu_model()}, {os.cpu_count()} cores")
    print(f"# etl run in fresh processes, --jobs {args.jobs}: seconds / peak RSS\n")
    print("| files | " + " | ".join(OPS) + " |")
    print("|---:|" + "---:|" * len(OPS))
    rows: dict[int, dict[str, tuple[float, int]]] = {}
    for n in sizes:
        work = Path(tempfile.mkdtemp(prefix="bench-tree-", dir=args.work))
        try:
            rows[n] = measure(work, n, args.jobs)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        cells = (f"{s:.1f} s / {r / 2**20:,.0f} MiB" for s, r in rows[n].values())
        print(f"| {n:,} | " + " | ".join(cells) + " |", flush=True)
    if len(sizes) > 1:
        a, b = sizes[0], sizes[-1]
        per = (
            f"{(rows[b][op][0] - rows[a][op][0]) / (b - a) * 1e6:.0f} µs / "
            f"{(rows[b][op][1] - rows[a][op][1]) / (b - a):,.0f} B"
            for op in OPS
        )
        print("| per file | " + " | ".join(per) + " |")


if __name__ == "__main__":
    main()
