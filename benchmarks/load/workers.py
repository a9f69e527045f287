"""Loader epochs with and without workers, ImageNet-sized samples, page-cached; two code trees
side by side in one run.

    python -m benchmarks.load.workers [--samples 5000] [--size 224] [--rounds 5] [--baseline DIR]
        [--device cpu|cuda] [--crop | --jpeg]

A synthetic dataset of `--samples` random 224x224x3 uint8 samples (147 KiB; `--size 64` for
the sample data's 12 KiB; shards of 1,000) is
read in random batches of 256, one whole epoch per measurement, workers not persistent (a fresh
pair each epoch, as DataLoader's default) and persistent: samples/s over the whole epoch (its
start included), the time to the first batch, and the rate after it. Beside them, a
single-threaded per-row copy of the same rows from `np.load(mmap_mode="r")`.

With `--device cuda` (the default where CUDA is present) each batch is also copied to the GPU
(`.to("cuda", non_blocking=True)`, one sync at the epoch's end), as a training loop would, and
two more contenders run: 2 workers whose ring is not page-locked (DataLoader's pin thread copies
each batch, the path before the ring was pinned in place), and, printed after the table, the
host-to-device GB/s of a batch in the pinned ring against one in torch's pinned memory (the
card's copy limit) and the ring's registration time. `--crop` adds a per-sample random resized
crop to 224 on the CPU (uint8 bilinear with antialias), the work a trainer does in its workers,
with 0 and 2 workers.

`--jpeg` measures the work the workers exist for instead (#59): `--samples` photos
(`benchmarks.photos`) packed by `etl run` as JPEG with the aspect kept (shorter side 256,
longer 512), each epoch decoded and cropped to 224 (`RandomResizedCrop`) in the workers
(`PackedDataset.with_crop`): every contender is that, and the per-row copy gives way to a bare
loop of decode + crop + resize over the same stored bytes in one process (the decode limit of
one core).

With `--baseline DIR` (another checkout, e.g. `git worktree add /tmp/base HEAD~3`), every round
measures that tree's loaders and this one's, in alternating fresh processes: the "before and
after, same run" of a change. Medians over rounds; no result is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

BATCH = 256
HERE = Path(__file__).resolve().parents[2]
CONTENDERS = ("0 workers", "2 workers", "2 workers, persistent")


def crop_per_sample(image: Any) -> Any:
    """A random resized crop of one HWC uint8 sample to 224x224, on the CPU (`--crop`)."""
    import torch
    import torch.nn.functional as F

    height, width = image.shape[:2]
    side = int(torch.randint(height // 2, height + 1, ()).item())
    top = int(torch.randint(0, height - side + 1, ()).item())
    left = int(torch.randint(0, width - side + 1, ()).item())
    box = image[top : top + side, left : left + side].permute(2, 0, 1)[None]
    resized = F.interpolate(box, size=(224, 224), mode="bilinear", antialias=True)
    return resized[0].permute(1, 2, 0).contiguous()


def contenders(device: str, crop: bool) -> dict[str, dict[str, Any]]:
    """The loaders measured, by name: make_loader's options (and `unpinned`: a ring left as
    it was before it was page-locked in place; `threads`: torch's thread count during its
    epochs, the loader's threads without workers: `loaders.read.threads`)."""
    chosen: dict[str, dict[str, Any]] = {
        "0 workers": {"num_workers": 0},
        "0 workers, 2 threads": {"num_workers": 0, "threads": 2},
        "num_workers=2 (the habit), 2 threads": {"num_workers": 2, "threads": 2},
        "2 workers": {"num_workers": 2, "workers_as": "processes", "persistent_workers": False},
        "2 workers, persistent": {
            "num_workers": 2,
            "workers_as": "processes",
            "persistent_workers": True,
        },
    }
    if device == "cuda":
        chosen["2 workers, ring not pinned"] = {
            "num_workers": 2,
            "workers_as": "processes",
            "unpinned": True,
        }
    if crop:
        chosen["0 workers, crop per sample"] = {"num_workers": 0, "crop": True}
        chosen["2 workers, crop per sample"] = {"num_workers": 2, "crop": True}
        chosen["2 persistent, crop per sample"] = {
            "num_workers": 2, "persistent_workers": True, "crop": True,
        }  # fmt: skip
    return chosen


BARE = "per-row copy, 1 thread"
BARE_JPEG = "bare loop: decode + crop + resize, 1 process"


def measure(
    data: Path,
    rounds: int,
    size: int,
    device: str = "cpu",
    crop: bool = False,
    jpeg: bool = False,
    only: str | None = None,
    step: float = 0.0,
) -> dict[str, list[list[float]]]:
    """[epoch seconds, seconds to the first batch] per round, for each contender and the
    per-row copy (with `jpeg`, the bare decode loop), or only the one named `only`; run in a
    fresh process whose `sys.path` starts with the tree measured. With CUDA, also "copy GB/s"
    ([ring batch, torch pinned, registration seconds]).

    NOTE [ one contender a process ]: contenders measured in one process disturbed each other:
    a fork for workers write-protects the parent's anonymous pages (its pooled batch buffers),
    so every later in-process batch faulted each page again (0 workers with 2 threads: 26,442
    samples/s beside the workers, 59,103 alone, 2-core VM). `main` gives each its own."""
    import torch

    from loaders import PackedDataset

    warnings.filterwarnings("ignore", "CUDA is not available", RuntimeWarning)
    torch.set_num_threads(1)
    STEP[0] = step
    results: dict[str, list[list[float]]] = {}
    loaders, threads = _loaders(data, device, crop, jpeg, only)
    for name, loader in loaders.items():  # warm up: pages mapped, persistent workers started
        torch.set_num_threads(threads[name])
        _epoch(loader, device)
        torch.set_num_threads(1)
    shards = [np.load(p, mmap_mode="r") for p in sorted((data / "shards").glob("*.npy"))]
    for epoch in range(1, rounds + 1):
        for name, loader in loaders.items():
            loader.set_epoch(epoch)
            torch.set_num_threads(threads[name])
            results.setdefault(name, []).append(_epoch(loader, device))
            torch.set_num_threads(1)
        if only not in (None, BARE, BARE_JPEG):
            continue
        if jpeg:
            from benchmarks.formats.encoded import bare_crop_rate

            seconds = len(PackedDataset.open(data)) / bare_crop_rate(data)
            results.setdefault(BARE_JPEG, []).append([seconds, 0.0])
            continue
        results.setdefault(BARE, []).append([_per_row_copy(shards, epoch, size), 0.0])
    if device == "cuda" and "2 workers, persistent" in loaders:
        results["copy GB/s"] = [_copy_rates(loaders["2 workers, persistent"])]
    return results


def _loaders(
    data: Path, device: str, crop: bool, jpeg: bool, only: str | None
) -> tuple[dict[str, Any], dict[str, int]]:
    """The contenders' loaders by name (only `only`'s when given), and the torch threads each
    runs with."""
    from loaders import PackedDataset, RandomResizedCrop, make_loader

    loaders = {}
    threads: dict[str, int] = {}
    chosen = contenders(device, crop)
    if only is not None:
        chosen = {name: chosen[name] for name in chosen if name == only}
    for name, options in chosen.items():
        options = dict(options)
        unpinned, cropped = options.pop("unpinned", False), options.pop("crop", False)
        threads[name] = options.pop("threads", 1)
        ds = PackedDataset.open(data, transform=crop_per_sample if cropped else None)
        if jpeg:
            ds = ds.with_crop(RandomResizedCrop(224, seed=0))
        try:
            loader = make_loader(ds, batch_size=BATCH, shuffle=True, **options)
        except TypeError:  # a tree from before `workers_as`: its workers were processes
            options.pop("workers_as", None)
            loader = make_loader(ds, batch_size=BATCH, shuffle=True, **options)
        ring = getattr(getattr(loader.dataset, "memory", None), "ring", None)
        if unpinned and ring is not None:
            ring.pin_tried = True  # never registered: the pin thread copies every batch
        loaders[name] = loader
    return loaders, threads


def _per_row_copy(shards: list[Any], epoch: int, size: int) -> float:
    """Seconds of a random epoch's batches copied row by row from `np.load` maps, 1 thread."""
    sizes = np.array([len(s) for s in shards])
    starts = np.cumsum(sizes) - sizes
    order = np.random.default_rng(epoch).permutation(int(sizes.sum()))
    out = np.empty((BATCH, size, size, 3), dtype=np.uint8)
    start = time.perf_counter()
    for b in range(0, len(order), BATCH):
        for k, i in enumerate(order[b : b + BATCH]):
            s = int(np.searchsorted(starts, i, "right") - 1)
            out[k] = shards[s][i - starts[s]]
    return time.perf_counter() - start


STEP = [0.0]
"""Seconds of a training step after each batch (`--step-ms`), set in the measuring process."""


def _epoch(loader: Any, device: str) -> list[float]:
    """[seconds, seconds to the first batch] of one epoch, each batch copied to `device`
    (and a step of `STEP` seconds that leaves the CPU to the loader, as a GPU's would)."""
    import torch

    start = time.perf_counter()
    first = None
    for images, _ in loader:
        if device == "cuda":
            images.to(device, non_blocking=True)
        if first is None:
            first = time.perf_counter() - start
        if STEP[0]:
            time.sleep(STEP[0])
    if device == "cuda":
        torch.cuda.synchronize()
    return [time.perf_counter() - start, first or 0.0]


def _copy_rates(loader: Any, repeats: int = 20) -> list[float]:
    """Host-to-device GB/s of one batch in the loader's pinned ring, and of as many bytes in
    torch's own pinned memory (the card's copy limit here); the ring's registration seconds."""
    import torch

    images = next(iter(loader)).images
    ring = loader.dataset.memory.ring
    pinned = torch.empty(images.shape, dtype=torch.uint8, pin_memory=True)
    target = torch.empty(images.shape, dtype=torch.uint8, device="cuda")
    rates = []
    for source in (images, pinned):
        target.copy_(source, non_blocking=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            target.copy_(source, non_blocking=True)
        torch.cuda.synchronize()
        rates.append(images.numel() * repeats / (time.perf_counter() - start) / 1e9)
    registered = getattr(ring, "pinned", None)
    return [*rates, registered.seconds if registered is not None else float("nan")]


def run_tree(
    tree: Path,
    data: Path,
    rounds: int,
    size: int,
    device: str,
    crop: bool,
    jpeg: bool,
    only: str | None = None,
    step: float = 0.0,
) -> dict[str, list[list[float]]]:
    # This file's `measure`, run against `tree`'s loaders (first on sys.path).
    code = (
        f"import sys, json, runpy; sys.path.insert(0, {str(tree)!r}); import loaders;"
        f"assert loaders.__file__.startswith({str(tree)!r}), loaders.__file__;"
        f"measure = runpy.run_path({__file__!r})['measure'];"
        "from pathlib import Path;"
        f"print(json.dumps(measure(Path({str(data)!r}), {rounds}, {size}, {device!r}, {crop},"
        f" {jpeg}, {only!r}, {step})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tree
    )
    result: dict[str, list[list[float]]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--size", type=int, default=224, help="samples are size x size x 3")
    parser.add_argument("--rounds", type=int, default=5, help="epochs per contender and tree")
    parser.add_argument("--baseline", type=Path, help="another checkout to measure beside this")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda where present")
    parser.add_argument("--crop", action="store_true", help="add a per-sample crop in workers")
    parser.add_argument("--jpeg", action="store_true", help="photos stored as JPEG, cropped")
    parser.add_argument(
        "--step-ms", type=float, default=0.0, help="a training step's ms after each batch"
    )
    args = parser.parse_args()
    if args.crop and args.jpeg:
        parser.error("--crop and --jpeg are two different datasets: give one")
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    from benchmarks.load.throughput import write_synthetic

    trees = {"this": HERE} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        data = Path(tmp) / "ds"
        shape = (args.size, args.size, 3)
        if args.jpeg:
            data = _jpeg_pack(Path(tmp), args.samples)
            what = f"{args.samples} photos stored as JPEG, decoded + cropped to 224 in the workers"
        else:
            write_synthetic(data, args.samples * int(np.prod(shape)), shape)
            what = f"{args.samples} samples of {shape} uint8"
        print(
            f"# loader epochs with workers: {what}, page-cached, random batches of {BATCH};"
            f" {os.cpu_count()} CPUs; {args.rounds} rounds; batches to {device}\n"
        )
        runs: dict[str, list[dict[str, list[list[float]]]]] = {name: [] for name in trees}
        names = [*contenders(device, args.crop), BARE_JPEG if args.jpeg else BARE]
        for _ in range(2):  # two rounds of fresh processes, trees interleaved
            for name, tree in trees.items():
                result: dict[str, list[list[float]]] = {}
                for only in names:  # NOTE [ one contender a process ]
                    result |= run_tree(
                        tree, data, args.rounds, args.size, device, args.crop, args.jpeg, only,
                        args.step_ms / 1000,
                    )  # fmt: skip
                runs[name].append(result)
    print(report(runs, args.samples))
    print(stats_cost(runs, args.samples))
    for name, results in runs.items():
        for result in results:
            if "copy GB/s" in result:
                ring, pinned, seconds = result["copy GB/s"][0]
                print(
                    f"{name}: host-to-device copy of a batch: {ring:.1f} GB/s from the pinned"
                    f" ring, {pinned:.1f} GB/s from torch's pinned memory; ring registered in"
                    f" {seconds * 1000:.1f} ms"
                )


def _jpeg_pack(work: Path, photos: int) -> Path:
    """`photos` benchmark photos packed by `etl run` as JPEG, aspect kept: the out dir."""
    from benchmarks.formats.encoded import RESIZES, pack
    from benchmarks.photos import make_photos

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "etl-memmap"
    source = cache / f"bench-photos-{photos}"
    make_photos(source, photos)
    pack(work / "jpeg", source, "jpeg", RESIZES["aspect 256/512"])
    return work / "jpeg" / "out"


def stats_cost(runs: dict[str, list[dict[str, list[list[float]]]]], n: int) -> str:
    """What the loader's stats (`loaders.loader.stats`) cost a batch: the clock reads and
    records one in-process batch makes (the loop's wait and step, the making, two stages),
    timed alone here, against the batch time of this tree's default contender."""
    from loaders.loader.stats import LoopTimes
    from loaders.read.timing import MakingTimes, stage

    loop, making, repeats = LoopTimes(), MakingTimes(), 20_000
    start = time.perf_counter()
    for _ in range(repeats):
        asked = loop.asked()
        with making.making():
            with stage("read"):
                pass
            with stage("crop"):
                pass
        loop.handed(asked)
    cost = (time.perf_counter() - start) / repeats
    default = "num_workers=2 (the habit), 2 threads"
    epochs = [e for r in runs["this"] for e in r.get(default, [])]
    if not epochs:
        return f"the stats cost {cost * 1e6:.1f} us a batch"
    per_batch = statistics.median(seconds for seconds, _ in epochs) / -(-n // BATCH)
    return (
        f"the stats cost {cost * 1e6:.1f} us a batch: {cost / per_batch:.2%} of a batch of"
        f" {default!r} ({per_batch * 1000:.2f} ms)"
    )


def report(runs: dict[str, list[dict[str, list[list[float]]]]], n: int) -> str:
    header = "| tree | contender | samples/s (epoch) | first batch | samples/s after it |"
    lines = [header, "|---|---|---:|---:|---:|"]
    for tree, results in runs.items():
        names = [name for name in results[0] if name != "copy GB/s"]
        for name in names:
            epochs: list[Any] = [e for r in results for e in r[name]]
            whole = statistics.median(n / seconds for seconds, _ in epochs)
            first = statistics.median(f for _, f in epochs)
            rest = statistics.median(
                (n - BATCH) / (seconds - f) if f else n / seconds for seconds, f in epochs
            )
            shown = f"{first * 1000:.0f} ms" if first else ""
            lines.append(f"| {tree} | {name} | {whole:,.0f} | {shown} | {rest:,.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
