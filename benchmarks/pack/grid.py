"""Packing throughput over dataset sizes x shard sizes x jobs: cold `etl run` processes against
the naive writer (`benchmarks.pack.naive`), both timed as whole commands, start-up included.

    python -m benchmarks.pack.grid [--sizes 300,1000,5000,20000]
        [--shards 16,64,256,1024] [--jobs 2] [--rounds 3] [--work data/bench] [--no-loky]

Rounds interleave every variant (the order rotates each round) on the same page-cached photos;
each ratio is the median of the per-round ratios against the naive writer of the same round,
size and job count. The etl variants run the default backend ('auto'), and one more
`backend: loky` (processes only) at the default shard size. Also printed: each size's phases
at the default shard size (list, hash, plan, pack, commit, and the process outside
`pipeline.run`), to show which grow with the photos, and, with several job counts, the scaling
curve of both. The last output is Markdown for benchmarks/README.md.
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
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import machine_info
from benchmarks.photos import make_photos

DEFAULT_SHARD_MIB = 256
"""`output.shard_size`'s default (etl.config.pipeline.SHARD_BYTES), in MiB."""
LOKY = "loky"
"""The variant with `backend: loky` (processes only, no head start) at the default shard
size; every other etl variant runs the default backend, 'auto'."""


@dataclass
class Grid:
    sizes: list[int]
    shards: list[int]
    jobs: list[int]
    rounds: int
    machine: dict[str, Any]
    ceilings: list[dict[str, float]] = field(default_factory=list)
    """Per round and job count (key: jobs), the decode-only rate (`decode_rate`)."""
    runs: list[dict[str, Any]] = field(default_factory=list)
    """One per timed command: round, size, jobs, variant ('naive' or shard MiB), seconds,
    images, and for etl its report's phases and seconds."""

    def seconds(self, size: int, jobs: int, variant: str) -> list[float]:
        return [
            r["seconds"]
            for r in self.runs
            if (r["size"], r["jobs"], r["variant"]) == (size, jobs, variant)
        ]

    def rate(self, size: int, jobs: int, variant: str) -> float:
        return size / statistics.median(self.seconds(size, jobs, variant))

    def ratio(self, size: int, jobs: int, variant: str, against: str = "naive") -> float:
        """Median over rounds of (rate of `variant`) / (rate of `against`), same round."""
        mine, theirs = self.seconds(size, jobs, variant), self.seconds(size, jobs, against)
        return statistics.median(t / m for m, t in zip(mine, theirs, strict=True))

    def phases(self, size: int, jobs: int, variant: str) -> dict[str, float]:
        found = [
            r for r in self.runs if (r["size"], r["jobs"], r["variant"]) == (size, jobs, variant)
        ]
        names = list(found[0]["phases"])
        medians = {n: statistics.median(r["phases"][n] for r in found) for n in names}
        medians["outside run"] = statistics.median(r["seconds"] - r["run"] for r in found)
        return medians


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_config(
    path: Path,
    photos: Path | str,
    output: Path | str,
    shard_mib: int,
    jobs: int,
    backend: str = "auto",
) -> Path:
    """The bare loop's stages (decode RGB, centre crop 224x224 bilinear), `shard_mib` MiB."""
    path.write_text(
        f"source: {{kind: folder, path: {json.dumps(str(photos))}}}\n"
        "stages:\n"
        "  - decode: {mode: RGB}\n"
        "  - resize: {size: [224, 224], mode: center_crop, filter: bilinear}\n"
        f"output: {{dir: {json.dumps(str(output))}, shard_size: {shard_mib}MiB}}\n"
        f"run: {{n_jobs: {jobs}, backend: {backend}}}\n"
    )
    return path


def timed(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr}")
    return seconds, done.stdout


def run_variant(variant: str, photos: Path, work: Path, size: int, jobs: int) -> dict[str, Any]:
    out = work / f"out-{variant}"
    shutil.rmtree(out, ignore_errors=True)
    out.unlink(missing_ok=True)
    if variant == "naive":
        command = [sys.executable, "-m", "benchmarks.pack.naive", str(photos), str(out)]
        seconds, stdout = timed([*command, "--jobs", str(jobs)])
        result: dict[str, Any] = {"seconds": seconds, "images": int(stdout.strip())}
    else:
        loky = variant == LOKY
        shard_mib, backend = (DEFAULT_SHARD_MIB, "loky") if loky else (int(variant), "auto")
        config = write_config(work / f"{variant}.yaml", photos, out, shard_mib, jobs, backend)
        seconds, stdout = timed([sys.executable, "-m", "etl", "run", str(config), "--json"])
        report = json.loads(stdout)
        result = {
            "seconds": seconds,
            "images": report["packed_new"],
            "run": report["seconds"],
            "phases": report["phases"],
            "shards": report["shards_written"],
        }
    if result["images"] != size:
        raise RuntimeError(f"{variant}: packed {result['images']} of {size} photos")
    shutil.rmtree(out, ignore_errors=True)
    out.unlink(missing_ok=True)
    return result


def decode_rate(folder: Path, jobs: int, count: int = 1200) -> float:
    """Photos/s of `jobs` processes doing nothing but the naive writer's decode (open, EXIF,
    RGB, fit to 224x224 bilinear) of `count` page-cached photos, each its share, nothing sent
    back: the work any writer of these pixels does, so no writer's rate exceeds it."""
    from multiprocessing import Pool

    from benchmarks.pack.naive import decode

    paths = sorted(str(p) for p in folder.glob("*/*.jpg"))[:count]
    with Pool(jobs) as pool:
        pool.map(decode, [paths[:2]] * jobs)  # started and imported
        start = time.perf_counter()
        pool.map(decode, [paths[i::jobs] for i in range(jobs)])
        return len(paths) / (time.perf_counter() - start)


def warm(paths: Sequence[Path]) -> None:
    """Read every photo once, so that every variant meets them in the page cache."""
    for path in paths:
        path.read_bytes()


def benchmark(
    sizes: list[int],
    shards: list[int],
    jobs: list[int],
    rounds: int,
    work: Path,
    seed: int,
    loky: bool = True,
) -> Grid:
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    grid = Grid(sizes, shards, jobs, rounds, machine_info())
    largest = work / f"photos-{max(sizes)}-s{seed}"
    log(f"photos: {max(sizes)} in {largest}")
    make_photos(largest, max(sizes), seed)
    folders = {}
    for size in sizes:
        folder = work / f"photos-{size}-s{seed}"
        warm(make_photos(folder, size, seed, like=largest))
        folders[size] = folder
    runs = Path(tempfile.mkdtemp(prefix=".grid-", dir=work))
    variants = ["naive", *(str(s) for s in shards), *([LOKY] if loky else [])]
    try:
        for round_ in range(rounds):
            grid.ceilings.append({str(n): decode_rate(folders[max(sizes)], n) for n in jobs})
            log(f"round {round_ + 1}/{rounds}  decode only: {grid.ceilings[-1]} photos/s")
            for size in sizes:
                for n_jobs in jobs:
                    turn = round_ % len(variants)
                    order = variants[turn:] + variants[:turn]
                    for variant in order:
                        result = run_variant(variant, folders[size], runs, size, n_jobs)
                        result.update(round=round_, size=size, jobs=n_jobs, variant=variant)
                        grid.runs.append(result)
                        rate = size / result["seconds"]
                        log(
                            f"round {round_ + 1}/{rounds}  {size:>6} photos  {n_jobs:>2} jobs  "
                            f"{variant:>6}  {rate:7.1f} photos/s"
                        )
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    grid.machine["load_after"] = os.getloadavg()[0]
    return grid


def markdown(grid: Grid) -> str:
    """The README section: the machine, then each shard size's rate against the naive writer,
    against the default shard size, 'auto' against 'loky', scaling with jobs, and phases."""
    m = grid.machine
    default = str(DEFAULT_SHARD_MIB) if DEFAULT_SHARD_MIB in grid.shards else None
    lines = [
        f"Machine: {m['cores']} cores, {m['cpu']}, Python {m['python']}, {m['date']}; load "
        f"average {m['load_before']:.1f} before, {m['load_after']:.1f} after. Median of "
        f"{grid.rounds} interleaved rounds; whole cold commands.",
        "",
        "| photos | jobs | naive photos/s | "
        + " | ".join(f"etl {s} MiB: photos/s, x naive" for s in grid.shards)
        + " |",
        "|---:|---:|---:|" + "---:|" * len(grid.shards),
    ]
    for size in grid.sizes:
        for jobs in grid.jobs:
            cells = [
                f"{grid.rate(size, jobs, str(s)):.0f}, **{grid.ratio(size, jobs, str(s)):.2f}x**"
                for s in grid.shards
            ]
            naive = grid.rate(size, jobs, "naive")
            lines.append(f"| {size:,} | {jobs} | {naive:.0f} | " + " | ".join(cells) + " |")
    if default is not None:
        lines += _against_default(grid, default)
    if any(r["variant"] == LOKY for r in grid.runs) and default is not None:
        lines += _auto_against_loky(grid, default)
    shard = default or str(grid.shards[0])
    if len(grid.jobs) > 1:
        lines += _scaling(grid, shard)
    return "\n".join(lines + _phases(grid, shard))


def _against_default(grid: Grid, default: str) -> list[str]:
    lines = ["", "Each shard size against the default (256 MiB), same round:", ""]
    lines += ["| photos | jobs | " + " | ".join(f"{s} MiB" for s in grid.shards) + " |"]
    lines += ["|---:|---:|" + "---:|" * len(grid.shards)]
    for size in grid.sizes:
        for jobs in grid.jobs:
            cells = [f"{grid.ratio(size, jobs, str(s), default):.2f}x" for s in grid.shards]
            lines.append(f"| {size:,} | {jobs} | " + " | ".join(cells) + " |")
    return lines


def _auto_against_loky(grid: Grid, default: str) -> list[str]:
    lines = [
        "",
        f"Backend 'auto' (the default) against 'loky' (processes only), {default} MiB "
        "shards, same round:",
        "",
        "| photos | jobs | loky photos/s, x naive | auto photos/s, x naive | auto x loky |",
        "|---:|---:|---:|---:|---:|",
    ]
    for size in grid.sizes:
        for jobs in grid.jobs:
            lines.append(
                f"| {size:,} | {jobs} | {grid.rate(size, jobs, LOKY):.0f}, "
                f"{grid.ratio(size, jobs, LOKY):.2f}x | {grid.rate(size, jobs, default):.0f}, "
                f"{grid.ratio(size, jobs, default):.2f}x | "
                f"**{grid.ratio(size, jobs, default, LOKY):.2f}x** |"
            )
    return lines


def _scaling(grid: Grid, shard: str) -> list[str]:
    base = min(grid.jobs)
    lines = [
        "",
        f"Scaling with jobs ({shard} MiB shards), photos/s and speed-up over {base} job(s):",
        "",
        "| photos | jobs | naive | naive speed-up | etl | etl speed-up | etl x naive |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in grid.sizes:
        for jobs in grid.jobs:
            naive, etl = grid.rate(size, jobs, "naive"), grid.rate(size, jobs, shard)
            lines.append(
                f"| {size:,} | {jobs} | {naive:.0f} | "
                f"{naive / grid.rate(size, base, 'naive'):.2f}x | {etl:.0f} | "
                f"{etl / grid.rate(size, base, shard):.2f}x | "
                f"{grid.ratio(size, jobs, shard):.2f}x |"
            )
    return lines


def _phases(grid: Grid, shard: str) -> list[str]:
    jobs = grid.jobs[0]
    names = list(grid.phases(grid.sizes[0], jobs, shard))
    lines = [
        "",
        f"Phases of `etl run` ({shard} MiB shards, {jobs} jobs), median seconds:",
        "",
        "| photos | " + " | ".join(names) + " | whole command |",
        "|---:|" + "---:|" * (len(names) + 1),
    ]
    for size in grid.sizes:
        phases = grid.phases(size, jobs, shard)
        whole = statistics.median(grid.seconds(size, jobs, shard))
        lines.append(
            f"| {size:,} | " + " | ".join(f"{phases[n]:.2f}" for n in names) + f" | {whole:.2f} |"
        )
    return lines


def ceiling(grid: Grid) -> str:
    """Markdown: each job count's decode ceiling (the fastest round of `decode_rate`, the
    least disturbed) and how near the naive writer and `etl run` come to it."""
    lines = [
        "Decode ceiling: the same number of processes doing nothing but the naive writer's "
        "decode of 1,200 page-cached photos, each its share, no output (the fastest of "
        f"{len(grid.ceilings)} rounds). No writer of these pixels packs faster.",
        "",
        "| photos | jobs | decode only, photos/s | naive, of it | best etl, of it "
        "| 1.1x naive, of it |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for size in grid.sizes:
        for jobs in grid.jobs:
            top = max(c[str(jobs)] for c in grid.ceilings)
            naive = grid.rate(size, jobs, "naive")
            best = max(grid.rate(size, jobs, str(s)) for s in grid.shards)
            lines.append(
                f"| {size:,} | {jobs} | {top:.0f} | {naive / top:.0%} | {best / top:.0%} | "
                f"{1.1 * naive / top:.0%} |"
            )
    return "\n".join(lines)


def _numbers(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=_numbers, default=[300, 1000, 5000, 20000])
    parser.add_argument("--shards", type=_numbers, default=[16, 64, 256, 1024], help="MiB")
    parser.add_argument("--jobs", type=_numbers, default=[2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("data/bench"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the raw runs here")
    parser.add_argument(
        "--no-loky", dest="loky", action="store_false", help="skip the backend 'loky' variant"
    )
    args = parser.parse_args(argv)
    grid = benchmark(
        args.sizes, args.shards, args.jobs, args.rounds, args.work, args.seed, args.loky
    )
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(grid), indent=2))
    print(markdown(grid))
    print()
    print(ceiling(grid))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
