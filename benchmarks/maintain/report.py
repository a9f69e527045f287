"""The report stays bounded whatever the dataset's size (issue #62): `etl report` on synthetic
versions of growing row counts, its size and time.

    python -m benchmarks.maintain.report [--rows 100000 1000000 10000000] [--work DIR] [--tiny]

For each size, writes versions 1 and 2 through the project's own commit path (formats.scale's
synthetic manifests: 1,000 classes, 90 % train / 10 % val, 64x64x3 samples, 10,000 rows a
shard; version 2 repacks 1 % of the rows, removes 0.5 % and adds as many), gives each shard a
shard file of real pixels (500 of benchmarks.photos' photos, resized to 64x64 and repeated:
one file, hard-linked under every full shard's name, so 10M rows cost one shard's disk), so
the thumbnails and the page's size are those of photos,
then runs the whole `etl report` command in a fresh interpreter, imports included, and reports
its wall time, peak RSS, the HTML's size and its thumbnails. The report's counts are checked
against the manifest: the page must name every row count it was given.

Prints a markdown table.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from benchmarks.common import cpu_model, run_measured
from benchmarks.formats.scale import SHAPE, write_next_version, write_version
from etl.format.manifest import read_manifest

DISTINCT = 500
"""Distinct photos in the shard files' pixels."""


def photo_rows(rows: int) -> np.ndarray:
    """`rows` 64x64x3 samples: benchmarks.photos' first DISTINCT photos, over and over."""
    from PIL import Image

    from benchmarks.photos import photo

    distinct = np.stack(
        [
            np.asarray(
                Image.open(io.BytesIO(photo(i, seed=0)[1])).convert("RGB").resize(SHAPE[1::-1])
            )
            for i in range(min(rows, DISTINCT))
        ]
    )
    return distinct[np.arange(rows) % len(distinct)]


def photo_shards(root: Path) -> None:
    """Every shard file of versions 1 and 2, of real pixels: one file per row count, written
    once and hard-linked under each shard's name."""
    written: dict[int, Path] = {}
    for version in (1, 2):
        shards = read_manifest(root, version).shards
        for name, rows in zip(
            shards.column("shard").to_pylist(), shards.column("rows").to_pylist(), strict=True
        ):
            path = root / name
            if path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            if rows in written:
                os.link(written[rows], path)
                continue
            np.save(path, photo_rows(rows))
            written[rows] = path


def measure(rows: int, work: Path) -> dict[str, float]:
    root = work / f"rows{rows}"
    write_version(root, rows)
    write_next_version(root)
    photo_shards(root)
    page = work / f"report{rows}.html"
    seconds, rss, status, _ = run_measured("etl", "report", str(root), "-o", str(page), "-q")
    if status != 0:
        raise SystemExit(f"etl report failed on {rows:,} rows (exit {status})")
    text = page.read_text()
    samples = len(read_manifest(root, 2).samples)
    if f"{samples:,}" not in text:
        raise SystemExit(f"the report of {rows:,} rows does not give its {samples:,} samples")
    thumbs = len(re.findall(r'<img src="data:image/jpeg;base64,', text))
    result = {
        "rows": rows,
        "seconds": seconds,
        "rss": rss / 2**20,
        "kib": page.stat().st_size / 1024,
        "thumbs": thumbs,
    }
    shutil.rmtree(root)
    page.unlink()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: temp)")
    parser.add_argument("--tiny", action="store_true", help="20,000 rows: a smoke run")
    args = parser.parse_args()
    sizes = [20_000] if args.tiny else args.rows
    with tempfile.TemporaryDirectory(dir=args.work) as scratch:
        results = [measure(n, Path(scratch)) for n in sizes]
    print(f"\n{datetime.now(UTC):%Y-%m-%d}, {cpu_model()}\n")
    print("| rows | etl report (s, wall, imports in) | peak RSS (MiB) | HTML (KiB) | thumbnails |")
    print("|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['rows']:,} | {r['seconds']:.1f} | {r['rss']:.0f} | {r['kib']:,.0f} | "
            f"{r['thumbs']} |"
        )


if __name__ == "__main__":
    main()
