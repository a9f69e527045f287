"""How fast `etl audit` verifies page-cached shards, against `sha256sum` of the same files.

    python -m benchmarks.maintain.audit [--mib 384] [--shard-mib 32] [--repeat 3] [--dir PATH]

Writes a dataset of random uint8 samples (64x64x3, 12 KiB each) with the real `ShardWriter` and
`etl.format.commit.commit`, reads every shard once to put it in the page cache, then times in the
same run: `sha256sum` over the shard files (one process, and two with `xargs -P 2`), and the
`etl.maintenance.audit.audit` library call with 1 and 2 jobs in the default, deep, fast and 1 %
sample modes. The cases run in interleaved rounds and each figure is the best round; the first
round is shown too (its first 2-job call starts the loky workers). Throughput is the shard bytes
divided by the wall time of the whole call (manifest checks, scheduling and results included), and
by the CPU seconds of every process involved, which a busy machine inflates less. Prints a markdown
table."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from importlib.metadata import version
from pathlib import Path

import numpy as np
import psutil

from benchmarks.common import cpu_model
from etl.maintenance.audit import AuditOptions, audit
from tests.helpers.random_dataset import write_random_dataset

SHAPE = (64, 64, 3)
CHECKSUM = "xxh3_64"


def make_dataset(root: Path, total_mib: int, shard_mib: int, seed: int = 0) -> list[Path]:
    """Random samples in shards of about `shard_mib`, committed as version 1
    (`tests.helpers.random_dataset`)."""
    sample_bytes = int(np.prod(SHAPE))
    per_shard = max(1, shard_mib * 2**20 // sample_bytes)
    count = total_mib * 2**20 // sample_bytes
    return write_random_dataset(root, count, SHAPE, per_shard, ("noise",), seed)


def warm(files: list[Path]) -> None:
    for path in files:
        with open(path, "rb") as f:
            while f.read(16 << 20):
                pass


def _checked_audit(root: Path, options: AuditOptions) -> None:
    report = audit(root, options)
    assert report.clean, report.counts()


def machine() -> str:
    cpu = cpu_model()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    sha = subprocess.run(["sha256sum", "--version"], capture_output=True, text=True, check=True)
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM; Linux {platform.release()}; "
        f"Python {platform.python_version()}, numpy {version('numpy')}, xxhash "
        f"{version('xxhash')}, blake3 {version('blake3')}, joblib {version('joblib')}; "
        f"{sha.stdout.splitlines()[0]}"
    )


def _cases(root: Path, names: list[str]) -> list[tuple[str, int, Callable[[], object]]]:
    """(label, jobs, call) of every case timed: `sha256sum` of the shard files in one and two
    processes, and the audit in each mode with 1 and 2 jobs."""

    def sha256sum() -> None:
        subprocess.run(["sha256sum", *names], capture_output=True, check=True)

    def sha256sum_2() -> None:
        subprocess.run(
            ["xargs", "-P", "2", "-n", str(max(1, len(names) // 8)), "sha256sum"],
            input="\n".join(names),
            capture_output=True,
            text=True,
            check=True,
        )

    cases: list[tuple[str, int, Callable[[], object]]] = [
        ("`sha256sum` (one process)", 1, sha256sum),
        ("`sha256sum` (`xargs -P 2`)", 2, sha256sum_2),
    ]
    for label, options in [
        ("audit (default): xxh3 per shard and per sample", AuditOptions()),
        ("audit `--deep`: the default + blake3 per shard", AuditOptions(deep=True)),
        ("audit `--fast`: xxh3 per shard", AuditOptions(fast=True)),
        ("audit `--sample-rate 0.01` (effective)", AuditOptions(sample_rate=0.01, seed=0)),
    ]:
        for jobs in (1, 2):
            cases.append((label, jobs, partial(_checked_audit, root, replace(options, jobs=jobs))))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=384, help="dataset size (MiB)")
    parser.add_argument("--shard-mib", type=int, default=32, help="shard size (MiB)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="where to write (default: a temp folder)")
    args = parser.parse_args()

    base = args.dir or Path(tempfile.mkdtemp(prefix="bench-audit-"))
    root = base / "dataset"
    shutil.rmtree(root, ignore_errors=True)
    try:
        files = make_dataset(root, args.mib, args.shard_mib)
        size = sum(p.stat().st_size for p in files)
        warm(files)
        cases = _cases(root, [str(p) for p in files])
        # NOTE: rounds interleave every case, so a neighbour's load hits them all alike.
        wall: list[list[float]] = [[] for _ in cases]
        cpu: list[list[float]] = [[] for _ in cases]
        for _ in range(args.repeat):
            for i, (_, _, fn) in enumerate(cases):
                cpu_before, started = cpu_seconds(), time.perf_counter()
                fn()
                wall[i].append(time.perf_counter() - started)
                cpu[i].append(cpu_seconds() - cpu_before)
        rows = [
            Row(label, jobs, w[0], min(w), min(c))
            for (label, jobs, _), w, c in zip(cases, wall, cpu, strict=True)
        ]
        load = f"load average {os.getloadavg()[0]:.2f} (1 min) when done"
        print_table(rows, size, len(files), args, f"{machine()}; {load}")
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


@dataclass(frozen=True)
class Row:
    label: str
    jobs: int
    first: float
    wall: float
    cpu: float


def cpu_seconds() -> float:
    """CPU time of this process, its finished children (sha256sum) and its live ones (loky
    workers): a measure a busy neighbour does not inflate the way it inflates wall time."""
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            c = child.cpu_times()
            total += c.user + c.system
    return total


def print_table(
    rows: list[Row], size: int, shards: int, args: argparse.Namespace, info: str
) -> None:
    gib = size / 2**30
    sha = rows[0]
    print(f"### `etl audit` throughput, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
    print(f"{info}\n")
    print(
        f"{size / 2**20:.0f} MiB in {shards} shards of {args.shard_mib} MiB, 64x64x3 samples, "
        f"page-cached; best of {args.repeat} interleaved rounds (wall: first round in brackets, "
        "its first 2-job call starts the loky workers). CPU: user + system seconds of every "
        "process involved.\n"
    )
    print(
        "| what | jobs | wall s | GiB/s | vs `sha256sum` | CPU s | GiB per CPU s | vs `sha256sum` |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.label} | {r.jobs} | {r.wall:.3f} ({r.first:.3f}) | {gib / r.wall:.2f} "
            f"| {sha.wall / r.wall:.1f}x | {r.cpu:.3f} | {gib / r.cpu:.2f} "
            f"| {sha.cpu / r.cpu:.1f}x |"
        )


if __name__ == "__main__":
    main()
