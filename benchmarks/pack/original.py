"""JPEG sources already at the output's size, stored as their own bytes (`codec.original`,
#58) against encoded again at quality 90: pack rate, bytes on disk and fidelity, in one run.

    python -m benchmarks.pack.original [--photos 1000] [--rounds 3]

The sources are the benchmark photos (`benchmarks.photos`) as a dataset is often handed over:
centre-cropped and resized to 224x224 with Pillow and saved as quality-90 JPEG. Each variant
packs them with `etl run` (224x224, so no source needs a resize), in interleaved rounds, timed
as whole commands. Then every stored sample is read as docs/FORMAT.md says (pyarrow, numpy)
and decoded with Pillow beside Pillow's decode of its source: the share of samples stored as
their source's own scan, PSNR over all pixels and the largest pixel difference. No result is
asserted.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc
from PIL import Image, ImageOps

from benchmarks.common import cpu_model
from benchmarks.photos import list_photos, make_photos

VARIANTS = {"encoded again": "jpeg", "original": "{kind: jpeg, original: true}"}


def presized(photos: Path, folder: Path) -> list[Path]:
    """Each photo centre-cropped to 224x224 and saved as quality-90 JPEG under `folder`."""
    made = []
    for path in list_photos(photos):
        out = folder / path.relative_to(photos)
        out.parent.mkdir(parents=True, exist_ok=True)
        image = ImageOps.fit(Image.open(path).convert("RGB"), (224, 224), Image.Resampling.BILINEAR)
        image.save(out, "JPEG", quality=90)
        made.append(out)
    return made


def pack(work: Path, sources: Path, codec: str) -> float:
    """Seconds of one fresh `etl run` of `sources` into `work/out` with `codec`."""
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)
    config = work / "pipeline.yaml"
    config.write_text(
        f"source: {{kind: folder, path: {json.dumps(str(sources))}}}\n"
        "stages: [decode: {}, resize: {size: [224, 224]}]\n"
        f"output: {{dir: {json.dumps(str(work / 'out'))}, codec: {codec}}}\n"
    )
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "etl", "run", str(config), "-q"], check=True)
    return time.perf_counter() - start


def fidelity(out: Path, sources: Path) -> dict[str, float]:
    """Stored samples against their sources, both decoded by Pillow."""
    version = sorted((out / "versions").iterdir())[-1]
    with ipc.open_file(version / "manifest.arrow") as f:
        rows = f.read_all().to_pylist()
    squared, count, largest, own, nbytes = 0.0, 0, 0, 0, 0
    for row in rows:
        shard = np.load(out / row["shard"], mmap_mode="r")
        stored = bytes(shard[row["sample_offset"] : row["sample_offset"] + row["sample_bytes"]])
        source = (sources / row["source"]).read_bytes()
        scan = source[source.index(b"\xff\xda") :]
        own += scan in stored
        nbytes += len(stored)
        a = np.asarray(Image.open(io.BytesIO(stored)).convert("RGB")).astype(np.int64)
        b = np.asarray(Image.open(io.BytesIO(source)).convert("RGB")).astype(np.int64)
        squared += float(((a - b) ** 2).sum())
        count += a.size
        largest = max(largest, int(np.abs(a - b).max()))
    mse = squared / count
    psnr = math.inf if mse == 0 else 10 * math.log10(255**2 / mse)
    return {"own": own / len(rows), "psnr": psnr, "largest": largest, "bytes": nbytes / len(rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("data/bench"))
    args = parser.parse_args(argv)
    photos = args.work.resolve() / f"photos-{args.photos}-s0"
    make_photos(photos, args.photos, 0)
    with tempfile.TemporaryDirectory() as tmp:
        sources = Path(tmp) / "presized"
        count = len(presized(photos, sources))
        seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for round_ in range(args.rounds):
            order = list(VARIANTS) if round_ % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                seconds[name].append(pack(Path(tmp) / name, sources, VARIANTS[name]))
        found = {name: fidelity(Path(tmp) / name / "out", sources) for name in VARIANTS}
    print(f"# {count:,} JPEG sources at 224x224, {cpu_model()}, Python {sys.version.split()[0]}, "
          f"median of {args.rounds} interleaved rounds")  # fmt: skip
    print(
        "| stored | photos/s (whole command) | x encoded again | bytes a sample | "
        "stored as the source's own scan | PSNR against the source | largest difference |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    base = count / statistics.median(seconds["encoded again"])
    for name in VARIANTS:
        rate = count / statistics.median(seconds[name])
        f = found[name]
        psnr = "identical" if math.isinf(f["psnr"]) else f"{f['psnr']:.1f} dB"
        print(f"| {name} | {rate:.0f} | {rate / base:.2f}x | {f['bytes']:,.0f} | "
              f"{f['own']:.0%} | {psnr} | {f['largest']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
