"""The loader against FFCV 1.0.2 on the same samples, page-cached, side by side in one run.

    bash benchmarks/load/ffcv_setup.sh            # once: FFCV in .venv-ffcv
    python -m benchmarks.load.against_ffcv [--samples 5000] [--photos 2000] [--rounds 2]
        [--epochs 4] [--threads 1,2] [--ffcv .venv-ffcv/bin/python]

Four datasets, each read in random batches of 256 with the short last batch kept: random
224x224x3 pixels stored raw; `--photos` benchmark photos (`benchmarks.photos`) packed as JPEG
q90 at 224x224 (decoded as stored, and `RandomResizedCrop(224)`), and with the aspect kept
(shorter side 256, longer at most 512; `RandomResizedCrop(224)`). FFCV writes the very pixels
our pack stored, with its own writer (raw, or JPEG at quality 90). Each contender runs in a
fresh process for `--epochs` epochs, alternating, `--rounds` times: ours is `make_loader`'s
defaults with torch's thread count set to each of `--threads` (`loaders.read.threads`), FFCV
its `Loader` with that many `num_workers` (its threads). Beside them, the rate of a plain
numpy copy of as many bytes with that many threads (the memory's limit).

Columns: the first batch's latency (FFCV's includes compiling its pipeline), the first epoch's
rate after its first batch (page faults, first-read row checks), and the median rate of the
epochs after the first. Medians over rounds; no result is asserted.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.ipc as ipc

from benchmarks.common import machine_info

HERE = Path(__file__).resolve().parents[2]
SIDE = Path(__file__).with_name("ffcv_side.py")
BATCH = 256


def ours(data: Path, threads: int, epochs: int, crop: int) -> list[list[float]]:
    """[epoch seconds, seconds to the first batch] of each of `epochs` epochs of a fresh
    `make_loader(shuffle=True)` with torch at `threads` threads (this process)."""
    import warnings

    import torch

    from loaders import PackedDataset, RandomResizedCrop, make_loader

    warnings.filterwarnings("ignore", "CUDA is not available", RuntimeWarning)
    torch.set_num_threads(threads)
    ds = PackedDataset.open(data)
    if crop:
        ds = ds.with_crop(RandomResizedCrop(crop, seed=0))
    loader = make_loader(ds, shuffle=True)
    results = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        start = time.perf_counter()
        first = None
        for _batch in loader:
            if first is None:
                first = time.perf_counter() - start
        results.append([time.perf_counter() - start, first or 0.0])
    return results


def copy_rate(sample_bytes: int, threads: int, total: int = 1 << 28) -> float:
    """Samples/s of `sample_bytes` a plain numpy copy of `total` bytes moves with `threads`
    threads, each copying its part (numpy lets go of the GIL)."""
    source = np.ones(total, np.uint8)
    target = np.empty_like(source)
    parts = np.array_split(np.arange(total), threads)
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts]
    best = float("inf")
    for _ in range(5):
        workers = [
            threading.Thread(target=np.copyto, args=(target[a:b], source[a:b])) for a, b in bounds
        ]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - start)
    return total / sample_bytes / best


def export_for_ffcv(out: Path, work: Path) -> tuple[Path, Path, Path]:
    """Our pack's samples as FFCV's writer takes them: the stored pixels (JPEGs decoded with
    Pillow) back to back in one .npy, each one's (height, width), its label."""
    with ipc.open_file(next((out / "versions").glob("v*/manifest.arrow"))) as f:
        table = f.read_all()
    shards: dict[str, Any] = {}

    def shard(name: str) -> Any:
        if name not in shards:
            shards[name] = np.load(out / name, mmap_mode="r")
        return shards[name]

    if "sample_offset" in table.column_names:  # flat shards: each sample's stored bytes
        places = zip(
            *(table[c].to_pylist() for c in ("shard", "sample_offset", "sample_bytes")), strict=True
        )
        images = [_decoded(bytes(shard(s).reshape(-1)[o : o + n])) for s, o, n in places]
    else:
        images = [
            shard(s)[r]
            for s, r in zip(*(table[c].to_pylist() for c in ("shard", "row")), strict=True)
        ]
    paths = work / "pixels.npy", work / "sizes.npy", work / "labels.npy"
    np.save(paths[0], np.concatenate([i.reshape(-1) for i in images]))
    np.save(paths[1], np.array([i.shape[:2] for i in images], np.int64))
    np.save(paths[2], np.asarray(table["label"].to_numpy(), np.int64))
    return paths


def _decoded(stored: bytes) -> Any:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(stored)).convert("RGB"))


DATASETS = {
    "raw 224": ("raw", 0),
    "JPEG 224, decode": ("jpeg 224", 0),
    "JPEG 224, RRC 224": ("jpeg 224", 224),
    "JPEG <=512, RRC 224": ("jpeg 512", 224),
}
"""Each row of the table: (the pack it reads, the crop's side or 0 for none)."""


def make_packs(work: Path, samples: int, photos: int) -> dict[str, tuple[Path, Path]]:
    """Each pack (our dataset's root) and FFCV's .beton of the same pixels, by name."""
    from benchmarks.formats.encoded import RESIZES, pack
    from benchmarks.photos import make_photos
    from tests.helpers.random_dataset import write_random_dataset

    raw = work / "raw" / "out"
    write_random_dataset(raw, samples, (224, 224, 3), 1000)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "etl-memmap"
    source = cache / f"bench-photos-{photos}"
    make_photos(source, photos)
    pack(work / "jpeg224", source, "jpeg", RESIZES["224 fixed"])
    pack(work / "jpeg512", source, "jpeg", RESIZES["aspect 256/512"])
    outs = {"raw": raw, "jpeg 224": work / "jpeg224" / "out", "jpeg 512": work / "jpeg512" / "out"}
    packs = {}
    for name, out in outs.items():
        folder = out.parent
        beton = folder / "ffcv.beton"
        mode, side = ("raw", 224) if name == "raw" else ("jpg", 512)
        pixels, sizes, labels = export_for_ffcv(out, folder)
        _ffcv("write", pixels, sizes, labels, beton, mode, side)
        for path in (pixels, sizes, labels):
            path.unlink()
        packs[name] = (out, beton)
    return packs


FFCV_PYTHON = [Path(".venv-ffcv/bin/python")]


def _ffcv(*args: Any) -> str:
    done = subprocess.run(
        [str(FFCV_PYTHON[0]), str(SIDE), *map(str, args)], capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(f"FFCV's side failed ({' '.join(map(str, args[:1]))}): {done.stderr[-2000:]}")
    return done.stdout


def _ours(out: Path, threads: int, epochs: int, crop: int) -> list[list[float]]:
    code = (
        "import json, sys; from pathlib import Path;"
        "from benchmarks.load.against_ffcv import ours;"
        f"print(json.dumps(ours(Path({str(out)!r}), {threads}, {epochs}, {crop})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=HERE
    )
    result: list[list[float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(
    packs: dict[str, tuple[Path, Path]], threads: list[int], epochs: int, rounds: int
) -> dict[tuple[str, int, str], list[list[list[float]]]]:
    """Every contender's epochs, [seconds, first batch], round by round, alternating."""
    runs: dict[tuple[str, int, str], list[list[list[float]]]] = {}
    for _ in range(rounds):
        for row, (name, crop) in DATASETS.items():
            out, beton = packs[name]
            for n in threads:
                runs.setdefault((row, n, "ours"), []).append(_ours(out, n, epochs, crop))
                ffcv = json.loads(_ffcv("read", beton, n, epochs, crop).strip().splitlines()[-1])
                runs.setdefault((row, n, "FFCV"), []).append(ffcv)
    return runs


def summary(rounds: list[list[list[float]]], count: int) -> tuple[float, float, float]:
    """(first batch s, first epoch samples/s after its first batch, later epochs samples/s)."""
    first = statistics.median(r[0][1] for r in rounds)
    after = statistics.median((count - BATCH) / (r[0][0] - r[0][1]) for r in rounds)
    later = statistics.median(count / e[0] for r in rounds for e in r[1:])
    return first, after, later


def report(
    runs: dict[tuple[str, int, str], list[list[list[float]]]], counts: dict[str, int]
) -> str:
    lines = [
        "| samples | threads | ours: first batch | FFCV: first batch | ours: first epoch"
        " after it | FFCV | ratio | ours: later epochs | FFCV | ratio | copy limit |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row, (name, _) in DATASETS.items():
        for n in sorted({key[1] for key in runs}):
            count = counts[name]
            o = summary(runs[(row, n, "ours")], count)
            f = summary(runs[(row, n, "FFCV")], count)
            limit = f"{copy_rate(224 * 224 * 3, n):,.0f}" if name == "raw" else ""
            lines.append(
                f"| {row} | {n} | {o[0] * 1000:.0f} ms | {f[0] * 1000:.0f} ms | {o[1]:,.0f}"
                f" | {f[1]:,.0f} | {o[1] / f[1]:.2f}x | {o[2]:,.0f} | {f[2]:,.0f}"
                f" | {o[2] / f[2]:.2f}x | {limit} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=5000, help="raw 224x224x3 samples")
    parser.add_argument("--photos", type=int, default=2000, help="photos packed as JPEG")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4, help="epochs per fresh process")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--ffcv", type=Path, default=FFCV_PYTHON[0], help="FFCV venv's python")
    args = parser.parse_args()
    if not args.ffcv.exists():
        sys.exit(f"{args.ffcv}: no FFCV venv; make one with bash benchmarks/load/ffcv_setup.sh")
    FFCV_PYTHON[0] = args.ffcv.absolute()  # not resolved: a venv's python is a link
    threads = [int(t) for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-ffcv-") as tmp:
        packs = make_packs(Path(tmp), args.samples, args.photos)
        counts = {"raw": args.samples, "jpeg 224": args.photos, "jpeg 512": args.photos}
        runs = measure(packs, threads, args.epochs, args.rounds)
    print(f"# the loader against FFCV 1.0.2, {json.dumps(machine_info())}: {args.rounds} rounds of")
    print(f"# {args.epochs} epochs; batches of {BATCH}, random order, page-cached\n")
    print(report(runs, counts))


if __name__ == "__main__":
    main()
