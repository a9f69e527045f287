"""Packing speed and memory: `etl.run.pipeline.run` against a bare Pillow loop, on the same photos.

    python -m benchmarks.pack.throughput [--images 3000] [--repeats 3] [--quick | --tiny]

Every measurement runs in this one process, on the same page-cached files, in interleaved rounds
(the order rotates each round) so that a noisy neighbour slows all variants alike; the table gives
medians and each ratio is the median of the per-round ratios. Peak memory is measured on cold
`python -m etl run` processes for N and 4N photos, and for N with the default 256MiB shards.
The last output is a Markdown table for the
README.

The bare loop is the least a packer must do per file: open, (draft,) decode, apply EXIF
orientation, convert to RGB, `ImageOps.fit` to 224x224 bilinear, copy into a preallocated array.
The pipeline does the same stages (decode RGB, resize center_crop bilinear, no validate stage)
plus its own work: listing and hashing the files, reading each again to pack it, a checksum per
sample, writing the shards (fsynced, then hashed), and the manifest.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.common import machine_info
from benchmarks.pack.contenders import (
    HEIGHT,
    SAMPLES_PER_SHARD,
    WIDTH,
    Photos,
    bare_loop,
    bare_worker,
    naive_writer,
    read_packed,
    run_pipeline,
    timed,
)
from benchmarks.pack.measures import FIXED_IMAGES, Results, measure_fixed_cost, measure_memory
from benchmarks.pack.throughput_table import markdown
from benchmarks.photos import list_photos, make_photos

# --- the benchmark ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    run: Callable[[], dict[str, float]]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _photo_sets(
    work: Path, images: int, memory_scale: int, seed: int, results: Results
) -> tuple[Path, Path]:
    """Make (or reuse) the N and memory_scale * N photo folders and read them into the page
    cache; records their mean file size and pixel count."""
    log(f"photos: {images} (and {images * memory_scale} for the memory run) in {work}")
    photos = work / f"photos-{images}-s{seed}"
    paths = make_photos(photos, images, seed)
    big = photos
    if memory_scale > 1:
        big = work / f"photos-{images * memory_scale}-s{seed}"
        make_photos(big, images * memory_scale, seed, like=photos)
    pixels = []
    for p in paths:
        with Image.open(p) as image:
            pixels.append(image.width * image.height)
    results.settings["mean_kb"] = float(np.mean([p.stat().st_size for p in paths]) / 1e3)
    results.settings["mean_pixels"] = float(np.mean(pixels))
    for p in big.glob("*/*.jpg"):  # page cache: every run below reads from memory
        p.read_bytes()
    return photos, big


def _variants(
    photos: Path, runs: Path, files: list[str], full: Photos, drafted: Photos, outputs: dict
) -> list[Variant]:
    """Every contender and pipeline setting a round times; the bare loops fill `full` and
    `drafted`, the writers leave where they wrote in `outputs`."""
    images = len(files)

    def bare(draft: bool) -> Callable[[], dict[str, float]]:
        def go() -> dict[str, float]:
            with timed() as timing:
                bare_loop(files, draft, drafted if draft else full)
            return {**timing, "images": images}

        return go

    def bare_two() -> dict[str, float]:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(2, mp_context=context) as pool:
            list(pool.map(bare_worker, [files[:2], files[2:4]], [False, False]))  # warm up
            with timed() as timing:
                halves = [files[0::2], files[1::2]]
                done = sum(pool.map(bare_worker, halves, [False, False]))
        return {**timing, "images": done}

    def naive() -> dict[str, float]:
        out = runs / "naive.npy"
        with timed() as timing:
            done = naive_writer(files, out)
        outputs["naive"] = out
        return {**timing, "images": done}

    def pipe(key: str, n_jobs: int, backend: str, draft: bool) -> Callable[[], dict[str, float]]:
        def go() -> dict[str, float]:
            timing, output = run_pipeline(photos, runs, key, n_jobs, backend, draft)
            outputs[key] = output
            return timing

        return go

    return [
        Variant("bare", "bare Pillow loop, 1 process", bare(False)),
        Variant("bare_draft", "bare Pillow loop + draft, 1 process", bare(True)),
        Variant("bare_x2", "bare Pillow loop, 2 processes (machine ceiling)", bare_two),
        Variant("naive", "naive writer: joblib chunks -> one np.memmap, 2 jobs", naive),
        Variant("seq", "pipeline, backend sequential", pipe("seq", 1, "sequential", False)),
        Variant("loky2", "pipeline, loky, n_jobs 2", pipe("loky2", 2, "loky", False)),
        Variant(
            "seq_draft", "pipeline + draft, sequential", pipe("seq_draft", 1, "sequential", True)
        ),
        Variant(
            "loky2_draft", "pipeline + draft, loky, n_jobs 2", pipe("loky2_draft", 2, "loky", True)
        ),
    ]


def _speed_rounds(photos: Path, runs: Path, repeats: int, results: Results) -> None:
    """The interleaved rounds; also checks every pipeline output against the bare loop's pixels
    and measures draft against full decode."""
    paths = list_photos(photos)
    files = [str(p) for p in paths]
    sources = [p.relative_to(photos).as_posix() for p in paths]
    images = len(files)
    full = np.empty((images, HEIGHT, WIDTH, 3), np.uint8)
    drafted = np.empty_like(full)
    outputs: dict[str, Path] = {}
    variants = _variants(photos, runs, files, full, drafted, outputs)
    results.settings["labels"] = {v.key: v.label for v in variants}

    log("warm-up: start the loky workers, import everything")
    shutil.rmtree(run_pipeline(photos, runs, "warmup", 2, "loky", False)[1])
    bare_loop(files[: min(20, images)], False)

    for round_ in range(repeats):
        order = variants[round_ % len(variants) :] + variants[: round_ % len(variants)]
        if round_ % 2:
            order.reverse()
        timings: dict[str, dict[str, float]] = {}
        for variant in order:
            timings[variant.key] = variant.run()
            rate = timings[variant.key]["images"] / timings[variant.key]["seconds"]
            log(f"round {round_ + 1}/{repeats}  {variant.key:<12} {rate:7.1f} images/s")
            if variant.key in outputs and round_ > 0:
                _remove(outputs.pop(variant.key))
        results.rounds.append(timings)
        if round_ == 0:  # now both bare arrays are filled: compare every output with them
            _compare_outputs(outputs, sources, full, drafted, results)

    per_image = np.abs(full.astype(np.int16) - drafted).reshape(images, -1).mean(axis=1)
    results.pixel_diff = {
        "mean": float(per_image.mean()),
        "p99_image": float(np.percentile(per_image, 99)),
        "max_image": float(per_image.max()),
    }


def _compare_outputs(
    outputs: dict[str, Path], sources: list[str], full: Photos, drafted: Photos, results: Results
) -> None:
    """How many samples of each writer's output equal the bare loop's pixels (its draft or
    full decode), read plainly: the naive writer's one array, the pipeline's through its
    manifest. Each output is removed once counted."""
    images = len(sources)
    for key in list(outputs):
        reference = (drafted if "draft" in key else full).reshape(images, -1)
        if key == "naive":  # one array, in the order of `files`
            packed = np.load(outputs[key], mmap_mode="r").reshape(images, -1)
        else:
            packed = read_packed(outputs[key], sources).reshape(images, -1)
        results.identical[key] = int(np.all(packed == reference, axis=1).sum())
        del packed
        _remove(outputs.pop(key))


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def benchmark(
    images: int,
    repeats: int,
    memory_scale: int,
    work: Path,
    seed: int = 0,
    default_shards: bool = True,
) -> Results:
    """Everything in the module docstring. Photos stay cached in `work`; configs and outputs go
    to a temp folder inside it, removed at the end. `default_shards` adds a memory run with the
    default 256MiB shards."""
    if memory_scale < 1:
        raise ValueError(f"memory_scale must be at least 1, got {memory_scale}")
    work = work.resolve()  # the generated pipeline.yaml files hold absolute paths
    work.mkdir(parents=True, exist_ok=True)
    results = Results(
        settings={
            "images": images,
            "repeats": repeats,
            "memory_scale": memory_scale,
            "size": [HEIGHT, WIDTH],
            "samples_per_shard": SAMPLES_PER_SHARD,
            "seed": seed,
        },
        machine=machine_info(),
    )
    photos, big = _photo_sets(work, images, memory_scale, seed, results)
    runs = Path(tempfile.mkdtemp(prefix=".runs-", dir=work))
    try:
        _speed_rounds(photos, runs, repeats, results)
        memory_runs: list[tuple[int, Path, int | None]] = [(images, photos, SAMPLES_PER_SHARD)]
        if memory_scale > 1:
            memory_runs.append((images * memory_scale, big, SAMPLES_PER_SHARD))
        if default_shards:
            memory_runs.append((images, photos, None))
        n_few = min(FIXED_IMAGES, images)
        few = work / f"photos-{n_few}-s{seed}"
        make_photos(few, n_few, seed, like=photos)
        log(f"fixed cost: cold `python -m etl run`, 2 jobs, {n_few} photos")
        results.fixed = measure_fixed_cost(few, runs)
        for n, folder, per_shard in memory_runs:
            log(f"memory: cold `python -m etl run`, 2 jobs, {n} photos, {per_shard} a shard")
            results.memory.append(measure_memory(folder, runs, n, 2, per_shard))
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    results.machine["load_after"] = os.getloadavg()[0]
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=3000, help="photos to pack (default 3000)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument(
        "--memory-scale",
        type=int,
        default=4,
        help="memory runs on N and on this times N photos (default 4; 1: only N)",
    )
    parser.add_argument("--quick", action="store_true", help="300 photos: about a minute")
    parser.add_argument(
        "--tiny", action="store_true", help="16 photos, 1 round, 1 memory run: a smoke test"
    )
    parser.add_argument(
        "--work", type=Path, default=Path("data/bench"), help="photos and outputs (kept cached)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.images = 300
    if args.tiny:
        args.images, args.repeats, args.memory_scale = 16, 1, 1
    results = benchmark(
        args.images, args.repeats, args.memory_scale, args.work, args.seed, not args.tiny
    )
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(results), indent=2))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
