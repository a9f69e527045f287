"""Loader epochs with and without workers, ImageNet-sized samples, page-cached; two code trees
side by side in one run.

    python -m benchmarks.bench_workers [--samples 5000] [--size 224] [--rounds 5] [--baseline DIR]

A synthetic dataset of `--samples` random 224x224x3 uint8 samples (147 KiB; `--size 64` for
the sample data's 12 KiB; shards of 1,000) is
read in random batches of 256, one whole epoch per measurement, workers not persistent (a fresh
pair each epoch, as DataLoader's default) and persistent: samples/s over the whole epoch (its
start included), the time to the first batch, and the rate after it. Beside them, a
single-threaded per-row copy of the same rows from `np.load(mmap_mode="r")`.

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
HERE = Path(__file__).resolve().parents[1]
CONTENDERS = ("0 workers", "2 workers", "2 workers, persistent")


def measure(data: Path, rounds: int, size: int) -> dict[str, list[list[float]]]:
    """[epoch seconds, seconds to the first batch] per round, for each contender and the
    per-row copy; run in a fresh process whose `sys.path` starts with the tree measured."""
    import torch

    from loaders import PackedDataset, make_loader

    warnings.filterwarnings("ignore", "CUDA is not available", RuntimeWarning)
    torch.set_num_threads(1)
    ds = PackedDataset.open(data)
    results: dict[str, list[list[float]]] = {}
    loaders = {
        name: make_loader(
            ds,
            batch_size=BATCH,
            shuffle=True,
            num_workers=0 if name.startswith("0") else 2,
            persistent_workers=name.endswith("persistent"),
        )
        for name in CONTENDERS
    }
    for loader in loaders.values():  # warm up: pages mapped, persistent workers started
        for _ in loader:
            pass
    shards = [np.load(p, mmap_mode="r") for p in sorted((data / "shards").glob("*.npy"))]
    sizes = np.array([len(s) for s in shards])
    starts = np.cumsum(sizes) - sizes
    for epoch in range(1, rounds + 1):
        for name, loader in loaders.items():
            loader.set_epoch(epoch)
            start = time.perf_counter()
            first = None
            for _ in loader:
                if first is None:
                    first = time.perf_counter() - start
            results.setdefault(name, []).append([time.perf_counter() - start, first or 0.0])
        order = np.random.default_rng(epoch).permutation(len(ds))
        out = np.empty((BATCH, size, size, 3), dtype=np.uint8)
        start = time.perf_counter()
        for b in range(0, len(order), BATCH):
            for k, i in enumerate(order[b : b + BATCH]):
                s = int(np.searchsorted(starts, i, "right") - 1)
                out[k] = shards[s][i - starts[s]]
        results.setdefault("per-row copy, 1 thread", []).append([time.perf_counter() - start, 0.0])
    return results


def run_tree(tree: Path, data: Path, rounds: int, size: int) -> dict[str, list[list[float]]]:
    # This file's `measure`, run against `tree`'s loaders (first on sys.path).
    code = (
        f"import sys, json, runpy; sys.path.insert(0, {str(tree)!r}); import loaders;"
        f"assert loaders.__file__.startswith({str(tree)!r}), loaders.__file__;"
        f"measure = runpy.run_path({__file__!r})['measure'];"
        "from pathlib import Path;"
        f"print(json.dumps(measure(Path({str(data)!r}), {rounds}, {size})))"
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
    args = parser.parse_args()
    from benchmarks.bench_loaders import write_synthetic

    trees = {"this": HERE} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        data = Path(tmp) / "ds"
        shape = (args.size, args.size, 3)
        write_synthetic(data, args.samples * int(np.prod(shape)), shape)
        print(
            f"# loader epochs with workers: {args.samples} samples of {shape} uint8, page-cached,"
            f" random batches of {BATCH}; {os.cpu_count()} CPUs; {args.rounds} rounds\n"
        )
        runs: dict[str, list[dict[str, list[list[float]]]]] = {name: [] for name in trees}
        for _ in range(2):  # two fresh processes per tree, interleaved
            for name, tree in trees.items():
                runs[name].append(run_tree(tree, data, args.rounds, args.size))
    print(report(runs, args.samples))


def report(runs: dict[str, list[dict[str, list[list[float]]]]], n: int) -> str:
    header = "| tree | contender | samples/s (epoch) | first batch | samples/s after it |"
    lines = [header, "|---|---|---:|---:|---:|"]
    for tree, results in runs.items():
        names = list(results[0])
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
