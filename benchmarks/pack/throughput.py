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
import contextlib
import datetime
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from joblib import Parallel, delayed
from joblib.parallel import LokyBackend
from numpy.typing import NDArray
from PIL import Image, ImageOps

from benchmarks.common import cpu_model, peak_rss
from benchmarks.photos import list_photos, make_photos
from etl.config import load_config
from etl.engine import interrupt
from etl.format.manifest import read_manifest
from etl.run import pipeline

HEIGHT, WIDTH = 224, 224
SAMPLES_PER_SHARD = 64
"""64 samples (9.6 MB) a shard, as this benchmark has always measured; since #43 a pack task is
a batch of sources whatever the shard size (`benchmarks/pack/grid.py` varies it)."""

Photos = NDArray[np.uint8]


# --- the bare loop ----------------------------------------------------------------------------


REDUCING_GAP = 2
"""The reduced decode keeps at least twice what the fit needs (Pillow's `thumbnail` default,
and `etl`'s draft rule since #60); Pillow's draft keeps exactly what it is asked for."""


def _draft_request(width: int, height: int) -> tuple[int, int]:
    """REDUCING_GAP times the smallest (width, height) that ImageOps.fit to WIDTHxHEIGHT does
    not upscale (the shorter side relative to the target becomes the target; exact integer
    ceilings), capped at the image's own size."""
    if WIDTH * height >= HEIGHT * width:  # width is the binding side
        need = WIDTH, -(-height * WIDTH // width)
    else:
        need = -(-width * HEIGHT // height), HEIGHT
    return min(width, REDUCING_GAP * need[0]), min(height, REDUCING_GAP * need[1])


def bare_loop(paths: Sequence[str], draft: bool, out: Photos | None = None) -> Photos:
    """Decode and resize `paths` into `out` (allocated if None), one file after the other."""
    if out is None:
        out = np.empty((len(paths), HEIGHT, WIDTH, 3), np.uint8)
    for i, path in enumerate(paths):
        with Image.open(path) as image:
            if draft:
                image.draft("RGB", _draft_request(*image.size))
            image.load()
            ImageOps.exif_transpose(image, in_place=True)
            rgb = image if image.mode == "RGB" else image.convert("RGB")
            out[i] = np.asarray(ImageOps.fit(rgb, (WIDTH, HEIGHT), Image.Resampling.BILINEAR))
    return out


def _bare_worker(paths: Sequence[str], draft: bool) -> int:
    """A bare loop in a pool process; returns the count (pixels stay in the worker)."""
    return len(bare_loop(paths, draft))


NAIVE_CHUNK = SAMPLES_PER_SHARD
"""Photos per task of the naive writer: the pipeline's shard size, so both dispatch alike."""


def naive_writer(paths: Sequence[str], out: Path, n_jobs: int = 2) -> int:
    """What one writes without a packing tool: joblib decodes chunks of photos in worker
    processes (the bare loop), the pixels travel back pickled, and the parent copies them into
    one big `.npy` opened with `np.lib.format.open_memmap`, flushed at the end. No hashing,
    checksums, validation, manifest or fsync.

    NOTE: on the pipeline's own loky workers (same initializer), because joblib keeps one
    reusable loky pool and starts it afresh whenever its settings change: alternating two
    settings would charge a worker start to every timed run of both."""
    chunks = [paths[i : i + NAIVE_CHUNK] for i in range(0, len(paths), NAIVE_CHUNK)]
    array = np.lib.format.open_memmap(out, "w+", np.uint8, (len(paths), HEIGHT, WIDTH, 3))
    at = 0
    backend = LokyBackend(initializer=interrupt.worker_setup, initargs=(os.getpid(),))
    decoded = Parallel(n_jobs=n_jobs, backend=backend, return_as="generator")(
        delayed(bare_loop)(chunk, False) for chunk in chunks
    )
    for pixels in decoded:
        array[at : at + len(pixels)] = pixels
        at += len(pixels)
    array.flush()
    del array
    return at


# --- CPU time and the pipeline ------------------------------------------------------------------


def _cpu_by_process() -> dict[int, float]:
    """CPU seconds (user + system) of this process (with its reaped children) and of every live
    descendant, by pid."""
    me = psutil.Process()
    t = me.cpu_times()
    cpu = {me.pid: t.user + t.system + t.children_user + t.children_system}
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            c = child.cpu_times()
            cpu[child.pid] = c.user + c.system
    return cpu


@contextlib.contextmanager
def _timed() -> Iterator[dict[str, float]]:
    """Yields a dict that gets 'seconds' (wall) and 'cpu' (this process tree) on exit."""
    result: dict[str, float] = {}
    before = _cpu_by_process()
    start = time.perf_counter()
    yield result
    result["seconds"] = time.perf_counter() - start
    after = _cpu_by_process()
    result["cpu"] = sum(v - before.get(pid, 0.0) for pid, v in after.items())


def write_config(
    path: Path,
    photos: Path,
    output: Path,
    draft: bool,
    n_jobs: int,
    backend: str,
    samples_per_shard: int | None = SAMPLES_PER_SHARD,
) -> Path:
    """A pipeline.yaml with the bare loop's stages; `samples_per_shard` None is the default
    shard_size (256MiB)."""
    shards = "" if samples_per_shard is None else f"  samples_per_shard: {samples_per_shard}\n"
    path.write_text(
        "source:\n"
        "  kind: folder\n"
        f"  path: {json.dumps(str(photos))}\n"
        "stages:\n"
        "  - decode: {mode: RGB}\n"
        f"  - resize: {{size: [{HEIGHT}, {WIDTH}], mode: center_crop, filter: bilinear, "
        f"draft: {str(draft).lower()}}}\n"
        "output:\n"
        f"  dir: {json.dumps(str(output))}\n"
        f"{shards}"
        f"run: {{n_jobs: {n_jobs}, backend: {backend}}}\n"
    )
    return path


def run_pipeline(
    photos: Path, work: Path, name: str, n_jobs: int, backend: str, draft: bool
) -> tuple[dict[str, float], Path]:
    """One `etl.run.pipeline.run` into a fresh output folder -> (timing, output folder)."""
    output = work / f"out-{name}"
    shutil.rmtree(output, ignore_errors=True)
    config = load_config(
        write_config(work / f"{name}.yaml", photos, output, draft, n_jobs, backend)
    )
    with _timed() as timing:
        report = pipeline.run(config)
    if report.rejected or not report.committed:
        raise RuntimeError(f"{name}: {report.rejected} rejected, committed={report.committed}")
    timing["images"] = report.packed_new
    return timing, output


def read_packed(output: Path, sources: Sequence[str]) -> Photos:
    """The packed samples in the order of `sources`, through the manifest."""
    manifest = read_manifest(output)
    rows = {r["source"]: (r["shard"], r["row"]) for r in manifest.samples.to_pylist()}
    shards: dict[str, NDArray[np.uint8]] = {}
    out = np.empty((len(sources), HEIGHT, WIDTH, 3), np.uint8)
    for i, source in enumerate(sources):
        shard, row = rows[source]
        if shard not in shards:
            shards[shard] = np.load(output / shard, mmap_mode="r")
        out[i] = shards[shard][row]
    return out


# --- memory -------------------------------------------------------------------------------------


@dataclass
class MemoryResult:
    images: int
    samples_per_shard: int | None
    """None: the default shard_size, 256MiB."""
    seconds: float
    parent_peak: int
    """Peak RSS of the `etl run` process, bytes."""
    worker_peak: int
    """Largest peak RSS of any process it started (loky workers), bytes."""
    total_peak: int
    """Largest sampled sum of RSS over the process tree, bytes."""
    workers_seen: int


def measure_memory(
    photos: Path, work: Path, images: int, n_jobs: int, samples_per_shard: int | None
) -> MemoryResult:
    """Run `python -m etl run` cold on `photos` and sample its process tree every 20 ms."""
    name = f"memory-{images}-{samples_per_shard or 'default'}"
    output = work / f"out-{name}"
    shutil.rmtree(output, ignore_errors=True)
    config = write_config(
        work / f"{name}.yaml", photos, output, False, n_jobs, "loky", samples_per_shard
    )
    command = [sys.executable, "-m", "etl", "run", str(config)]
    peaks: dict[int, int] = {}
    total = 0
    start = time.perf_counter()
    proc = subprocess.Popen([*command, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    parent = psutil.Process(proc.pid)

    def sample() -> None:
        nonlocal total
        while proc.poll() is None:
            try:
                tree = [parent, *parent.children(recursive=True)]
            except psutil.Error:
                break
            now = 0
            for p in tree:
                with contextlib.suppress(psutil.Error):
                    rss = p.memory_info().rss
                    now += rss
                    peaks[p.pid] = max(peaks.get(p.pid, 0), rss, peak_rss(p.pid))
            total = max(total, now)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    seconds = time.perf_counter() - start
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}): {stderr.decode()}")
    report = json.loads(stdout)
    if report["packed_new"] != images:
        raise RuntimeError(f"memory run packed {report['packed_new']} of {images} photos")
    shutil.rmtree(output, ignore_errors=True)
    workers = {pid: rss for pid, rss in peaks.items() if pid != proc.pid}
    return MemoryResult(
        images=images,
        samples_per_shard=samples_per_shard,
        seconds=seconds,
        parent_peak=peaks.get(proc.pid, 0),
        worker_peak=max(workers.values(), default=0),
        total_peak=total,
        workers_seen=len(workers),
    )


# --- fixed cost ---------------------------------------------------------------------------------

FIXED_IMAGES = 300
FIXED_REPEATS = 3


@dataclass
class FixedCost:
    """Cold `python -m etl run` on FIXED_IMAGES photos, 2 jobs: medians over FIXED_REPEATS."""

    images: int
    wall: float
    """Seconds from starting the process to its exit."""
    run: float
    """Seconds inside `pipeline.run` (the report's `seconds`)."""
    phases: dict[str, float]
    """The report's phases (list, hash, plan, pack, commit), seconds."""


def measure_fixed_cost(photos: Path, work: Path, repeats: int = FIXED_REPEATS) -> FixedCost:
    """Time cold `python -m etl run --json` processes on `photos`, each into a fresh folder."""
    walls, runs, phases = [], [], []
    config = write_config(work / "fixed.yaml", photos, work / "out-fixed", False, 2, "loky")
    for _ in range(repeats):
        shutil.rmtree(work / "out-fixed", ignore_errors=True)
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "etl", "run", str(config), "--json"],
            capture_output=True,
            text=True,
        )
        walls.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise RuntimeError(f"fixed-cost run failed ({proc.returncode}): {proc.stderr}")
        report = json.loads(proc.stdout)
        runs.append(report["seconds"])
        phases.append(report["phases"])
    shutil.rmtree(work / "out-fixed", ignore_errors=True)
    return FixedCost(
        images=len(list_photos(photos)),
        wall=statistics.median(walls),
        run=statistics.median(runs),
        phases={k: statistics.median(p[k] for p in phases) for k in phases[0]},
    )


# --- the benchmark ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    run: Callable[[], dict[str, float]]


@dataclass
class Results:
    settings: dict[str, Any]
    machine: dict[str, Any]
    rounds: list[dict[str, dict[str, float]]] = field(default_factory=list)
    identical: dict[str, int] = field(default_factory=dict)
    pixel_diff: dict[str, float] = field(default_factory=dict)
    memory: list[MemoryResult] = field(default_factory=list)
    fixed: FixedCost | None = None

    def rate(self, key: str) -> float:
        return statistics.median(r[key]["images"] / r[key]["seconds"] for r in self.rounds)

    def cpu_ms(self, key: str) -> float:
        return statistics.median(1e3 * r[key]["cpu"] / r[key]["images"] for r in self.rounds)

    def ratio(self, a: str, b: str, per: float = 1.0) -> float:
        """Median over rounds of (images/s of a) / (per * images/s of b)."""
        return statistics.median(
            (r[a]["images"] / r[a]["seconds"]) / (per * r[b]["images"] / r[b]["seconds"])
            for r in self.rounds
        )


def machine_info() -> dict[str, Any]:
    model = cpu_model()
    return {
        "cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "cpu": model,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "pillow": package_version("pillow"),
        "numpy": np.__version__,
        "joblib": package_version("joblib"),
        "date": datetime.date.today().isoformat(),
        "load_before": os.getloadavg()[0],
    }


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


def _speed_rounds(photos: Path, runs: Path, repeats: int, results: Results) -> None:
    """The interleaved rounds; also checks every pipeline output against the bare loop's pixels
    and measures draft against full decode."""
    paths = list_photos(photos)
    files = [str(p) for p in paths]
    sources = [p.relative_to(photos).as_posix() for p in paths]
    images = len(files)
    full = np.empty((images, HEIGHT, WIDTH, 3), np.uint8)
    drafted = np.empty_like(full)

    def bare(draft: bool) -> Callable[[], dict[str, float]]:
        def go() -> dict[str, float]:
            with _timed() as timing:
                bare_loop(files, draft, drafted if draft else full)
            return {**timing, "images": images}

        return go

    def bare_two() -> dict[str, float]:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(2, mp_context=context) as pool:
            list(pool.map(_bare_worker, [files[:2], files[2:4]], [False, False]))  # warm up
            with _timed() as timing:
                halves = [files[0::2], files[1::2]]
                done = sum(pool.map(_bare_worker, halves, [False, False]))
        return {**timing, "images": done}

    outputs: dict[str, Path] = {}

    def naive() -> dict[str, float]:
        out = runs / "naive.npy"
        with _timed() as timing:
            done = naive_writer(files, out)
        outputs["naive"] = out
        return {**timing, "images": done}

    def pipe(key: str, n_jobs: int, backend: str, draft: bool) -> Callable[[], dict[str, float]]:
        def go() -> dict[str, float]:
            timing, output = run_pipeline(photos, runs, key, n_jobs, backend, draft)
            outputs[key] = output
            return timing

        return go

    variants = [
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
            for key in list(outputs):
                reference = (drafted if "draft" in key else full).reshape(images, -1)
                if key == "naive":  # one array, in the order of `files`
                    packed = np.load(outputs[key], mmap_mode="r").reshape(images, -1)
                else:
                    packed = read_packed(outputs[key], sources).reshape(images, -1)
                results.identical[key] = int(np.all(packed == reference, axis=1).sum())
                del packed
                _remove(outputs.pop(key))

    per_image = np.abs(full.astype(np.int16) - drafted).reshape(images, -1).mean(axis=1)
    results.pixel_diff = {
        "mean": float(per_image.mean()),
        "p99_image": float(np.percentile(per_image, 99)),
        "max_image": float(per_image.max()),
    }


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


# --- the report ---------------------------------------------------------------------------------


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def markdown(results: Results) -> str:
    """The README section: settings, the speed table, the goals, draft's error, memory."""
    s, m = results.settings, results.machine
    labels: dict[str, str] = s["labels"]
    lines = [
        f"Packing {s['images']:,} photos (random crops of scikit-image's photographs, 300-640 px "
        f"a side, mean {s['mean_kb']:.0f} KB, {s['mean_pixels'] / 1e3:.0f} kpixels) into "
        f"{HEIGHT}x{WIDTH} RGB (center_crop, bilinear), {SAMPLES_PER_SHARD} samples a shard; "
        f"median of {s['repeats']} interleaved rounds in one run "
        "(`python -m benchmarks.pack.throughput`).",
        "",
        f"Machine: {m['cores']} cores, {m['cpu']}, {m['os']}; Python {m['python']}, "
        f"Pillow {m['pillow']}, numpy {m['numpy']}, joblib {m['joblib']}; {m['date']}; "
        f"load average {m['load_before']:.1f} before, {m['load_after']:.1f} after.",
        "",
        "| run | images/s | CPU ms/image | vs bare loop | output = bare loop's |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, label in labels.items():
        same = results.identical.get(key)
        identical = "" if same is None else f"{same:,}/{s['images']:,}"
        lines.append(
            f"| {label} | {results.rate(key):.0f} | {results.cpu_ms(key):.2f} | "
            f"{results.ratio(key, 'bare'):.2f} | {identical} |"
        )
    vs_naive = results.ratio("loky2", "naive")
    vs_bare2 = results.ratio("loky2", "bare_x2")
    draft_vs_naive = results.ratio("loky2_draft", "naive")
    overhead = 1 - results.ratio("seq", "bare")
    overhead2 = 1 - results.ratio("loky2", "bare", per=2)
    cpu_overhead = results.cpu_ms("seq") / results.cpu_ms("bare") - 1
    speedup = results.ratio("loky2", "seq")
    ceiling = results.ratio("bare_x2", "bare")
    draft1 = results.ratio("seq_draft", "bare")
    draft2 = results.ratio("loky2_draft", "bare")

    lines += [
        "",
        "CPU ms/image is the CPU time of the whole process tree (parent and workers) per image: "
        "unlike images/s it hardly changes when other programs take turns on the cores. "
        "A pipeline with `n_jobs: 1` runs in the calling process whatever the backend (joblib "
        "does not start a pool for one job), so `sequential` is also the loky 1-job figure.",
        "",
        "| goal | measured | target | met |",
        "|---|---:|---:|:-:|",
        f"| full decode, pipeline 2 jobs / naive writer | {vs_naive:.2f}x | >= 1.2x | "
        f"{yes(vs_naive >= 1.2)} |",
        f"| full decode, pipeline 2 jobs / bare loop in 2 processes | {vs_bare2:.0%} | >= 90% | "
        f"{yes(vs_bare2 >= 0.9)} |",
        f"| draft, pipeline 2 jobs / naive writer at full decode | {draft_vs_naive:.2f}x | "
        f">= 1.5x | {yes(draft_vs_naive >= 1.5)} |",
        f"| per-core overhead, 1 - (pipeline 1 job / bare loop), images/s | {overhead:.1%} | "
        f"< 10% | {yes(overhead < 0.10)} |",
        f"| the same in CPU time, pipeline / bare loop - 1 | {cpu_overhead:.1%} | (info) | |",
        f"| per-core overhead at 2 jobs, 1 - (pipeline 2 jobs / 2 / bare loop) | {overhead2:.1%} "
        "| (info) | |",
        f"| speedup, pipeline 2 jobs / 1 job | {speedup:.2f}x | >= 1.8x | {yes(speedup >= 1.8)} |",
        f"| what the machine allowed: bare loop in 2 processes / 1 process | {ceiling:.2f}x | "
        "(info) | |",
        f"| draft, pipeline 1 job / bare full-decode loop | {draft1:.2f}x | > 1 | "
        f"{yes(draft1 > 1)} |",
        f"| draft, pipeline 2 jobs / bare full-decode loop | {draft2:.2f}x | > 1 | "
        f"{yes(draft2 > 1)} |",
        *_fixed_cost_rows(results),
        *_memory_goal_rows(results),
        "",
        *_fixed_cost_text(results),
        f"Draft against full decode on these photos, after the {HEIGHT}x{WIDTH} resize, in 0-255 "
        f"levels: mean absolute difference {results.pixel_diff['mean']:.2f}; the per-image mean "
        f"is at most {results.pixel_diff['p99_image']:.2f} for 99% of the photos, "
        f"{results.pixel_diff['max_image']:.2f} for the worst.",
        "",
        "Peak resident memory of a cold `python -m etl run` with `n_jobs: 2` (the kernel's VmHWM "
        "per process; the whole tree sampled every 20 ms):",
        "",
        "| photos | shards of | wall | parent | largest worker | whole tree |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for mem in results.memory:
        shard = (
            f"{mem.samples_per_shard} samples"
            if mem.samples_per_shard is not None
            else "256 MiB (default)"
        )
        lines.append(
            f"| {mem.images:,} | {shard} | {mem.seconds:.1f} s | {_mib(mem.parent_peak)} | "
            f"{_mib(mem.worker_peak)} | {_mib(mem.total_peak)} |"
        )
    return "\n".join(lines)


MEMORY_GOAL = 425e6
"""Bytes: the whole process tree's peak in the run that issue #12 measured (2 jobs)."""


def _fixed(results: Results) -> float | None:
    """Seconds of a cold run on FIXED_IMAGES photos beyond what the steady 2-job rate needs."""
    fixed = results.fixed
    return None if fixed is None else fixed.wall - fixed.images / results.rate("loky2")


def _fixed_cost_rows(results: Results) -> list[str]:
    seconds = _fixed(results)
    if seconds is None or results.fixed is None:
        return []
    return [
        f"| fixed cost of a cold `etl run` on {results.fixed.images} photos: wall - photos / "
        f"(2-job rate) | {seconds:.2f} s | < 1 s | {yes(seconds < 1)} |"
    ]


def _memory_goal_rows(results: Results) -> list[str]:
    if not results.memory:
        return []
    peak = results.memory[0].total_peak
    return [
        f"| peak memory of the whole process tree, {results.memory[0].images:,} photos | "
        f"{peak / 1e6:.0f} MB | <= 425 MB | {yes(peak <= MEMORY_GOAL)} |"
    ]


def _fixed_cost_text(results: Results) -> list[str]:
    fixed, seconds = results.fixed, _fixed(results)
    if fixed is None or seconds is None:
        return []
    steady = fixed.images / results.rate("loky2")
    phases = ", ".join(f"{name} {value:.2f} s" for name, value in fixed.phases.items())
    return [
        f"Fixed cost: a cold `python -m etl run` on {fixed.images} photos took {fixed.wall:.2f} s "
        f"(median of {FIXED_REPEATS}), of which {steady:.2f} s is what its photos take at the "
        f"steady 2-job rate. Inside the run ({fixed.run:.2f} s): {phases}; the hash phase "
        "includes starting the two worker processes. Outside it "
        f"({fixed.wall - fixed.run:.2f} s): starting Python, imports and exit.",
        "",
    ]


def yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


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
