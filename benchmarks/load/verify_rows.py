"""What `verify="rows"` and `verify="once"` cost: an epoch of random batches with each row
checked against its sample's checksum (with "once", two epochs: rows are checked in the first
only), against the same epoch unchecked, page-cached, interleaved in one run.

    python -m benchmarks.load.verify_rows [--samples 4000] [--size 224] [--rounds 5]

Samples/s of each, median over rounds; nothing is asserted.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from benchmarks.common import loader_rate, synthetic_options
from benchmarks.load.throughput import write_synthetic


def epoch(root: Path, verify: bool | str, epochs: int = 1) -> list[float]:
    """Samples/s of each of `epochs` epochs of one loader (verify="once" checks rows in the
    first only)."""
    from loaders import PackedDataset, make_loader

    ds = PackedDataset.open(root, verify=verify)  # type: ignore[arg-type]
    loader = make_loader(ds, batch_size=256, shuffle=True, seed=1, pin_memory=False)
    rates = []
    for n in range(epochs):
        loader.set_epoch(n)
        rates.append(loader_rate(loader))
    return rates


def main() -> None:
    args = synthetic_options(__doc__ or "", samples=4000, size=224, rounds=5)
    warnings.filterwarnings("ignore")
    shape = (args.size, args.size, 3)
    root = Path(tempfile.mkdtemp(prefix="bench-verify-rows-"))
    write_synthetic(root, args.samples * shape[0] * shape[1] * 3, shape)
    epoch(root, False)  # into the page cache
    names = ("unchecked", "rows", "once", "unchecked, epoch 2", "once, epoch 2")
    rates: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.rounds):
        first, second = epoch(root, False, epochs=2)
        rates["unchecked"].append(first)
        rates["unchecked, epoch 2"].append(second)
        rates["rows"].append(epoch(root, "rows")[0])
        first, second = epoch(root, "once", epochs=2)
        rates["once"].append(first)
        rates["once, epoch 2"].append(second)
    median = {k: statistics.median(v) for k, v in rates.items()}
    print(
        f"# load.verify_rows, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, "
        f"{args.samples} samples of {shape}, batches of 256, page-cached, median of "
        f"{args.rounds} rounds"
    )
    for name, rate in median.items():  # a second epoch of one loader against the same
        base = median["unchecked, epoch 2" if "epoch 2" in name else "unchecked"]
        print(f"{name:>18}: {rate:,.0f} samples/s ({rate / base:.2f}x)")


if __name__ == "__main__":
    main()
