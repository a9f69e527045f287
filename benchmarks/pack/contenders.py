"""What `benchmarks.pack.throughput` times `etl run` against, and how it runs and reads back the
pipeline for them: the bare Pillow loop (the least a packer must do per file, with or without a
reduced JPEG decode), the naive writer (joblib chunks into one `np.memmap`), the pipeline with
the bare loop's stages, and the CPU time of a process tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import psutil
from joblib import Parallel, delayed
from joblib.parallel import LokyBackend
from numpy.typing import NDArray
from PIL import Image, ImageOps

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


def bare_worker(paths: Sequence[str], draft: bool) -> int:
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
def timed() -> Iterator[dict[str, float]]:
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
    with timed() as timing:
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
