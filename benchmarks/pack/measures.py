"""What `benchmarks.pack.throughput` measures beside its speed rounds, and where it keeps every
figure: peak memory of a cold `python -m etl run` (its process tree sampled every 20 ms), the
fixed cost of a cold run on a few photos, and the `Results` of the whole benchmark.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import peak_rss
from benchmarks.pack.contenders import write_config
from benchmarks.photos import list_photos

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
