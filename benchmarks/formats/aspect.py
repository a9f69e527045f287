"""Aspect-kept storage against fixed-size storage of the same photos: bytes on disk, packing rate
(whole cold `etl run`), and loading rate with `RandomResizedCrop(224)` on the CPU (#44).

    python -m benchmarks.formats.aspect [--photos 2000] [--rounds 3] [--jobs 2]

The photos are `benchmarks.photos` (300-640 px a side, random aspects, JPEG). "fixed" stores
each at 256x256 (`resize: {size: [256, 256]}`, a centre crop); "aspect" keeps its aspect ratio
(`resize: {mode: keep_aspect, shorter: 256, longer: 512}`). The loader reads an epoch of
random batches of 64 (page-cached) through `DeviceLoader` (on the CPU, or `--device cuda`),
which crops each sample to 224x224 with the same `RandomResizedCrop` and converts to float, each
crop drawn from the sample's stored image. "aspect" batches hold their samples back to back
(what `DeviceLoader` asks for); "aspect padded" reads the same dataset in batches padded to
their largest sample, as before (NOTE [ back to back ] in `loaders.batch.ragged`). Variants
interleave within each round; medians over rounds; nothing is asserted.
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
import warnings
from datetime import date
from pathlib import Path

from benchmarks.common import cpu_model
from benchmarks.photos import make_photos

PADDED = "aspect padded"
"""The aspect-kept dataset read in batches padded to their largest sample."""

RESIZES = {
    "fixed": "{size: [256, 256]}",
    "aspect": "{mode: keep_aspect, shorter: 256, longer: 512}",
}


def write_config(folder: Path, photos: Path, resize: str, jobs: int) -> Path:
    config = folder / "pipeline.yaml"
    config.write_text(
        f"""source: {{kind: folder, path: {photos}}}
stages:
  - decode: {{}}
  - resize: {resize}
output: {{dir: {folder / "out"}}}
run: {{n_jobs: {jobs}}}
"""
    )
    return config


def pack(config: Path) -> float:
    """Seconds of a whole cold `etl run` into an empty output folder."""
    shutil.rmtree(config.parent / "out", ignore_errors=True)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "etl", "run", str(config), "--json"], capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"etl run failed: {done.stderr.strip()[-2000:]}")
    return seconds


def shard_bytes(out: Path) -> int:
    return sum(p.stat().st_size for p in (out / "shards").glob("*.npy"))


def load_rate(
    out: Path, workers: int, epoch: int, device: str = "cpu", padded: bool = False
) -> float:
    """Samples/s of an epoch of random batches of 64 through `DeviceLoader` on `device`,
    cropped to 224x224 there (batched on CUDA); with `padded`, the batches padded to their
    largest sample instead of back to back."""
    import torch

    from loaders import DeviceLoader, PackedDataset, RandomResizedCrop, make_loader
    from loaders.batch.forms import PaddedBatch
    from loaders.loader.gathering import ask_form

    dataset = PackedDataset.open(out)
    loader = make_loader(
        dataset, batch_size=64, shuffle=True, seed=epoch, pin_memory=device != "cpu",
        num_workers=workers, with_indices=True,
    )  # fmt: skip
    crop = RandomResizedCrop(224, seed=1)
    feed = DeviceLoader(loader, device, dtype=torch.float32, augment=crop)
    if padded:
        ask_form(loader.dataset, loader.collate_fn, PaddedBatch)  # undo DeviceLoader's ask
    count = 0
    start = time.perf_counter()
    for batch in feed:
        count += len(batch.labels)
    if device != "cpu":
        torch.cuda.synchronize()
    return count / (time.perf_counter() - start)


def _report(
    args: argparse.Namespace,
    work: Path,
    reads: dict[str, tuple[str, bool]],
    packs: dict[str, list[float]],
    loads: dict[tuple[str, int], list[float]],
    load_before: float,
) -> None:
    """The README table of bytes, pack and load rates, and aspect-kept against fixed."""
    sizes = {n: shard_bytes(work / n / "out") for n in RESIZES}
    med = statistics.median
    print(
        f"Machine: {os.cpu_count()} cores, {cpu_model()}, Python {sys.version.split()[0]}, "
        f"{date.today()}; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} "
        f"after. {args.photos} photos, median of {args.rounds} interleaved rounds.\n"
    )
    print(f"Loading with RandomResizedCrop(224) on the {args.device}.\n")
    print("| storage | bytes on disk | pack photos/s (whole `etl run`, "
          f"{args.jobs} jobs) | load 0 workers samples/s | load 2 workers samples/s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    for name, (stored, _) in reads.items():
        print(
            f"| {name} | {sizes[stored] / 2**20:,.0f} MiB | {med(packs[stored]):,.0f} | "
            f"{med(loads[(name, 0)]):,.0f} | {med(loads[(name, 2)]):,.0f} |"
        )
    print()
    ratio = {
        "bytes": sizes["aspect"] / sizes["fixed"],
        "pack": med(packs["aspect"]) / med(packs["fixed"]),
        **{
            f"load {w} workers{' padded' if name == PADDED else ''}": (
                med(loads[(name, w)]) / med(loads[("fixed", w)])
            )
            for name in ("aspect", PADDED)
            for w in (0, 2)
        },
    }
    print("aspect / fixed: " + ", ".join(f"{k} **{v:.2f}x**" for k, v in ratio.items()))
    print(json.dumps({"ratios": ratio, "sizes": sizes}), file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: crops on the GPU")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    work = args.work or Path(tempfile.gettempdir()) / "bench-aspect"
    work.mkdir(parents=True, exist_ok=True)
    photos = work / "photos"
    make_photos(photos, args.photos)
    configs = {}
    for name, resize in RESIZES.items():
        (work / name).mkdir(exist_ok=True)
        configs[name] = write_config(work / name, photos, resize, args.jobs)
    packs: dict[str, list[float]] = {n: [] for n in RESIZES}
    reads = {"fixed": ("fixed", False), "aspect": ("aspect", False), PADDED: ("aspect", True)}
    loads: dict[tuple[str, int], list[float]] = {(n, w): [] for n in reads for w in (0, 2)}
    load_before = os.getloadavg()[0]
    for round_ in range(args.rounds):
        for name, config in configs.items():
            packs[name].append(args.photos / pack(config))
            print(f"round {round_ + 1}: {name} packed at {packs[name][-1]:.0f} photos/s",
                  file=sys.stderr)  # fmt: skip
        for workers in (0, 2):
            for name, (stored, padded) in reads.items():
                rate = load_rate(work / stored / "out", workers, round_, args.device, padded)
                loads[(name, workers)].append(rate)
                print(f"round {round_ + 1}: {name} {workers} workers: {rate:.0f} samples/s",
                      file=sys.stderr)  # fmt: skip
    _report(args, work, reads, packs, loads, load_before)


if __name__ == "__main__":
    main()
