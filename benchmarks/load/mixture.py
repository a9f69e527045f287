"""What a mixture costs and whether it keeps its weights: a `Mixture` of 3 views over 2 packed
datasets against a plain shuffled loader over one of them (same sample size), page-cached,
interleaved in one run, with 0 and 2 workers; then each view's share of 10,000 steps of the
mixture's order against its weight.

    python -m benchmarks.load.mixture [--samples 8000] [--size 64] [--rounds 3] [--steps 10000]

Samples/s, median over rounds; the shares are counted from the sampler's own orders (what the
loader reads), with the binomial standard error of each. Nothing is asserted.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from benchmarks.common import loader_rate, synthetic_options
from benchmarks.load.throughput import write_synthetic

WEIGHTS = (0.5, 0.3, 0.2)
BATCH = 256


def mixture(a: Path, b: Path) -> object:
    from loaders import Mixture, PackedDataset, View

    views = [
        View(str(a), where="label % 2 = 0"),
        View(str(a), where="label % 2 = 1"),
        View(str(b)),
    ]
    return Mixture([PackedDataset.open(v) for v in views], weights=WEIGHTS)


def epoch(dataset: object, workers: int, shuffle: bool | None) -> float:
    from loaders import make_loader

    loader = make_loader(
        dataset,  # type: ignore[arg-type]
        batch_size=BATCH,
        shuffle=shuffle,
        seed=1,
        pin_memory=False,
        num_workers=workers,
    )
    return loader_rate(loader)


def shares(mix: object, steps: int) -> list[tuple[float, float]]:
    """(share, standard error) of each member over `steps` batches of the mixture's order."""
    sampler = mix.sampler(1, 0, 1, False)  # type: ignore[attr-defined]
    wanted, counts, epoch_no = steps * BATCH, np.zeros(len(WEIGHTS)), 0
    while counts.sum() < wanted:
        order = sampler.global_order(epoch_no)[: int(wanted - counts.sum())]
        members = mix.member_of(order)  # type: ignore[attr-defined]
        counts += np.bincount(members, minlength=len(WEIGHTS))
        epoch_no += 1
    found = counts / counts.sum()
    return [
        (float(s), float(np.sqrt(w * (1 - w) / wanted)))
        for s, w in zip(found, WEIGHTS, strict=True)
    ]


def main() -> None:
    args = synthetic_options(__doc__ or "", samples=8000, size=64, rounds=3)
    warnings.filterwarnings("ignore")
    from loaders import PackedDataset

    shape = (args.size, args.size, 3)
    work = Path(tempfile.mkdtemp(prefix="bench-mixture-"))
    for name in ("a", "b"):
        write_synthetic(work / name, args.samples * int(np.prod(shape)), shape)
    mix = mixture(work / "a", work / "b")
    plain = PackedDataset.open(work / "a")
    print(
        f"# load.mixture, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, 2 datasets of "
        f"{args.samples} samples of {shape}, 3 views weighted {WEIGHTS}, batches of {BATCH}, "
        f"page-cached, median of {args.rounds} rounds"
    )
    for workers in (0, 2):
        epoch(plain, workers, True)  # into the page cache
        epoch(mix, workers, None)
        rates: dict[str, list[float]] = {"plain": [], "mixture": []}
        for _ in range(args.rounds):
            rates["plain"].append(epoch(plain, workers, True))
            rates["mixture"].append(epoch(mix, workers, None))
        median = {k: statistics.median(v) for k, v in rates.items()}
        for name, rate in median.items():
            print(
                f"workers={workers} {name:>8}: {rate:,.0f} samples/s "
                f"({rate / median['plain']:.2f}x)"
            )
    for view, ((share, error), weight) in enumerate(
        zip(shares(mix, args.steps), WEIGHTS, strict=True)
    ):
        print(
            f"view {view}: {share:.4f} of {args.steps} steps, weight {weight} "
            f"({(share - weight) / error:+.1f} standard errors)"
        )


if __name__ == "__main__":
    main()
