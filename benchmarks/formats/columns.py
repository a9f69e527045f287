"""What per-sample columns cost the loaders: an epoch of random batches that carry columns
(`columns=[...]`: a ColumnBatch) against the same epoch without, page-cached, interleaved in
one run, with 0 and 2 workers.

    python -m benchmarks.formats.columns [--samples 8000] [--size 64] [--rounds 3]

"dense": a float32 score and a 16-float embedding (tensors); "all": those and a caption
(text) and 0-3 boxes per sample (lists of Python values). Samples/s, median over rounds;
nothing is asserted.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks.common import loader_rate, synthetic_options
from benchmarks.load.throughput import write_synthetic

COLUMNS = {
    "dense": ["score", "embedding"],
    "all": ["score", "embedding", "caption", "boxes"],
}


def add_columns(root: Path) -> None:
    """Version 2: version 1's samples with the four columns (committed as a run would)."""
    from etl.format.commit import commit
    from etl.format.manifest import read_manifest

    manifest = read_manifest(root)
    n = manifest.samples.num_rows
    rng = np.random.default_rng(0)
    embedding = rng.standard_normal((n, 16)).astype(np.float32)
    columns = {
        "score": pa.array(rng.random(n).astype(np.float32)),
        "embedding": pa.FixedSizeListArray.from_arrays(embedding.reshape(-1), 16).cast(
            pa.list_(pa.float32())
        ),
        "caption": pa.array(
            [f"a synthetic picture, number {i}, of class c{i % 6}" for i in range(n)]
        ),
        "boxes": pa.array(
            [[[0.1, 0.2, 0.5, 0.6]] * (i % 4) for i in range(n)], pa.list_(pa.list_(pa.float32()))
        ),
    }
    samples = manifest.samples
    for name, values in columns.items():
        samples = samples.append_column(name, values)
    declared = (
        ("score", "float32"),
        ("embedding", "list<float32>"),
        ("caption", "string"),
        ("boxes", "list<list<float32>>"),
    )
    meta = replace(manifest.meta, version=2, columns=declared)
    commit(root, meta, samples, manifest.shards, manifest.rejects)


def epoch(root: Path, columns: list[str] | None, workers: int) -> float:
    from loaders import PackedDataset, make_loader

    ds = PackedDataset.open(root, columns=columns)
    return loader_rate(
        make_loader(ds, batch_size=256, shuffle=True, seed=1, pin_memory=False, num_workers=workers)
    )


def main() -> None:
    args = synthetic_options(__doc__ or "", samples=8000, size=64, rounds=3)
    warnings.filterwarnings("ignore")
    shape = (args.size, args.size, 3)
    root = Path(tempfile.mkdtemp(prefix="bench-columns-"))
    write_synthetic(root, args.samples * int(np.prod(shape)), shape)
    add_columns(root)
    print(
        f"# formats.columns, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, "
        f"{args.samples} samples of {shape}, batches of 256, page-cached, median of "
        f"{args.rounds} rounds"
    )
    for workers in (0, 2):
        epoch(root, None, workers)  # into the page cache, workers started once
        rates: dict[str, list[float]] = {"none": [], "dense": [], "all": []}
        for _ in range(args.rounds):
            rates["none"].append(epoch(root, None, workers))
            for name, names in COLUMNS.items():
                rates[name].append(epoch(root, names, workers))
        median = {k: statistics.median(v) for k, v in rates.items()}
        for name, rate in median.items():
            print(
                f"workers={workers} {name:>6}: {rate:,.0f} samples/s ({rate / median['none']:.2f}x)"
            )


if __name__ == "__main__":
    main()
