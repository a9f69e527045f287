"""How opening and selecting a manifest grows with its row count (issue #13's manifest part).

    python -m benchmarks.formats.scale [--rows 1000000 4000000 10000000] [--work DIR] [--tiny]

For each size, writes a synthetic version 1 through the project's own commit path
(`etl.format.commit.commit_version`; 1,000 classes, 90 % train / 10 % val, 10,000 rows per
shard record, no shard files: nothing here reads pixels), then runs each operation in a fresh
interpreter (the median of --repeat runs) and reports the wall time of the operation itself
(imports excluded) and the process's peak RSS (VmHWM):

    open      loaders.read.catalog.open_catalog(root)            (checks the commit record)
    select    PackedDataset.open(root, split="train", classes=<half>)
    inspect   etl inspect root --json                          (the whole command, wall and
    versions  etl versions root --json                          its peak RSS, imports included;
    diff      etl diff root 1 2                                 run after version 2 is written:
                                                                1 % repacked, 0.5 % removed,
                                                                0.5 % added)

Every count is checked: the rows opened and selected, and what diff reports.

Prints a markdown table, with time and memory per million rows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.common import cpu_model, run_measured
from etl.format.coherence import ENCODED_COLUMNS, RAGGED_COLUMNS
from etl.format.commit import commit_version
from etl.format.manifest import read_manifest
from etl.format.schema import REJECTS_SCHEMA, SAMPLES_SCHEMA, SHARDS_SCHEMA, ManifestMeta
from etl.format.shards import ShardInfo, shard_name

ADDED_LATER = (*RAGGED_COLUMNS, *ENCODED_COLUMNS)
"""The nullable columns of format versions 2 and 3: null in a version 1 manifest."""
CLASSES = 1000
OPS = ("open", "select", "inspect", "versions", "diff")
ROWS_PER_SHARD = 10_000
SHAPE = (64, 64, 3)

CHILD = """
import json, os, sys, time
from benchmarks.common import peak_rss
root, op, n_classes = sys.argv[1], sys.argv[2], int(sys.argv[3])
from loaders import PackedDataset
from loaders.read.catalog import open_catalog
try:  # pyarrow imports pandas, when installed, on its first conversion: an import, excluded too
    import pandas
except ImportError:
    pass
start = time.perf_counter()
if op == "open":
    n = len(open_catalog(root))
else:
    classes = [f"c{i:04d}" for i in range(0, n_classes, 2)]
    n = len(PackedDataset.open(root, split="train", classes=classes))
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "rss": peak_rss(os.getpid()), "n": n}))
"""


def hex16(values: np.ndarray) -> pa.Array:
    """Unique-looking 16-digit hex strings of uint64 values, built without a Python loop."""
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    shifts = np.arange(60, -4, -4, dtype=np.uint64)
    nibbles = (values[:, None] >> shifts) & np.uint64(15)
    chars = digits[nibbles.astype(np.intp)].reshape(-1)
    offsets = np.arange(0, 16 * (len(values) + 1), 16, dtype=np.int32)
    return pa.StringArray.from_buffers(len(values), pa.py_buffer(offsets), pa.py_buffer(chars))


def synthetic_samples(n: int, seed: int = 0, first: int = 0) -> pa.Table:
    """n manifest rows (numbered from `first`), sorted by source, coherent enough for
    `read_manifest`."""
    rng = np.random.default_rng(seed)
    index = np.arange(first, first + n, dtype=np.int64)
    label = (index % CLASSES).astype(np.int32)
    class_name = pa.array([f"c{i:04d}" for i in range(CLASSES)]).take(pa.array(label))
    number = pa.array(index).cast(pa.string())
    source = pa.compute.binary_join_element_wise(class_name, number, "/")
    split = pa.array(np.where(rng.random(n) < 0.1, "val", "train"))
    shard_names = pa.array([shard_name(1, s) for s in range(-(-n // ROWS_PER_SHARD))])
    table = pa.table(
        {
            "sample_id": hex16(rng.permutation(np.uint64(2**63) + index.astype(np.uint64))),
            "source": source,
            "source_size": rng.integers(20_000, 200_000, n),
            "source_mtime_ns": np.full(n, 1_700_000_000_000_000_000),
            "source_ctime_ns": np.full(n, 1_700_000_000_000_000_000),
            "source_inode": index.astype(np.uint64) + 1,
            "source_hash": hex16(rng.integers(0, 2**63, n, dtype=np.uint64)),
            "source_height": np.full(n, 375, np.int32),
            "source_width": np.full(n, 500, np.int32),
            "label": label,
            "class_name": class_name,
            "split": split,
            "shard": shard_names.take(pa.array((index - first) // ROWS_PER_SHARD)),
            "row": (index - first) % ROWS_PER_SHARD,
            "checksum": hex16(rng.integers(0, 2**63, n, dtype=np.uint64)),
            **{f.name: pa.nulls(n, f.type) for f in SAMPLES_SCHEMA if f.name in ADDED_LATER},
        },
        schema=SAMPLES_SCHEMA,
    )
    return table.sort_by("source")


def write_version(root: Path, n: int) -> int:
    """Commit n synthetic rows as version 1 of `root`; returns how many `select` must keep."""
    samples = synthetic_samples(n)
    train = np.asarray(samples.column("split").to_numpy(zero_copy_only=False) == "train")
    even = samples.column("label").to_numpy() % 2 == 0
    shards = sorted(set(samples.column("shard").unique().to_pylist()))
    rows = {s: min(ROWS_PER_SHARD, n - i * ROWS_PER_SHARD) for i, s in enumerate(shards)}
    records = pa.table(
        {
            "shard": shards,
            "rows": [rows[s] for s in shards],
            "bytes": [rows[s] * int(np.prod(SHAPE)) + 128 for s in shards],
            "checksum": ["0" * 16] * len(shards),
            "blake3": ["0" * 64] * len(shards),
        },
        schema=SHARDS_SCHEMA,
    )
    meta = ManifestMeta(
        version=1,
        sample_shape=SHAPE,
        layout="HWC",
        classes=tuple(f"c{i:04d}" for i in range(CLASSES)),
        checksum="xxh3_64",
        config_digest="0" * 16,
        config={},
    )
    commit_version(root, meta, samples, REJECTS_SCHEMA.empty_table(), [], records)
    return int((train & even).sum())


def write_next_version(root: Path, seed: int = 1) -> int:
    """Commit version 2 of `root`: 1 % of the rows repacked (new checksum), 0.5 % removed and
    as many added (new sources in a new shard). Returns how many rows `etl diff` must report."""
    old = read_manifest(root, 1)
    samples, n = old.samples, old.samples.num_rows
    rng = np.random.default_rng(seed)
    fate = rng.random(n)
    changed, removed = fate < 0.01, (fate >= 0.01) & (fate < 0.015)
    checksums = hex16(rng.integers(0, 2**63, n, dtype=np.uint64))
    column = pc.if_else(pa.array(changed), checksums, samples.column("checksum"))
    kept = samples.set_column(samples.schema.get_field_index("checksum"), "checksum", column)
    kept = kept.filter(pa.array(~removed))
    n_added = int(removed.sum())
    added = synthetic_samples(n_added, seed=seed, first=n)
    shard = shard_name(2, 0)
    added = added.set_column(
        added.schema.get_field_index("shard"), "shard", pa.array([shard] * n_added)
    )
    added = added.set_column(
        added.schema.get_field_index("row"), "row", pa.array(np.arange(n_added))
    )
    record = ShardInfo(
        name=shard,
        rows=n_added,
        bytes=n_added * int(np.prod(SHAPE)) + 128,
        checksum="0" * 16,
        blake3="0" * 64,
    )
    meta = replace(old.meta, version=2)
    both = pa.concat_tables([kept.cast(SAMPLES_SCHEMA), added.cast(SAMPLES_SCHEMA)])
    both = both.sort_by("source")
    commit_version(root, meta, both, REJECTS_SCHEMA.empty_table(), [record], old.shards)
    return int(changed.sum()) + 2 * n_added


def measure(root: Path, op: str) -> dict[str, float]:
    """One operation in a fresh interpreter: seconds, peak RSS and (open, select, diff) the
    number of rows it found."""
    if op in ("open", "select"):
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(root), op, str(CLASSES)],
            capture_output=True,
            text=True,
            check=True,
        )
        result: dict[str, float] = json.loads(proc.stdout)
        return result
    command = ["diff", str(root), "1", "2"] if op == "diff" else [op, str(root), "--json"]
    seconds, rss, status, printed = run_measured("etl", *command)
    if status:
        raise RuntimeError(f"etl {' '.join(command)} failed (status {status})")
    found = {"seconds": seconds, "rss": rss}
    if op == "diff":  # "version 1 -> 2: A added, R removed, C changed"
        counts = re.search(r"(\d+) added, (\d+) removed, (\d+) changed", printed)
        found["n"] = sum(int(c) for c in counts.groups()) if counts else -1
    return found


def median_of(root: Path, op: str, repeat: int, expected: int | None) -> dict[str, float]:
    """The run with the median time of `repeat` runs (the machine is shared and noisy), after
    checking each run found the expected number of rows."""
    runs = []
    for _ in range(repeat):
        m = measure(root, op)
        if expected is not None and m["n"] != expected:
            raise SystemExit(f"{op} at {root.name} found {m['n']:,} rows, not {expected:,}")
        runs.append(m)
    return sorted(runs, key=lambda m: m["seconds"])[len(runs) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 4_000_000, 10_000_000])
    parser.add_argument("--work", type=Path, default=None, help="where the manifests go")
    parser.add_argument("--repeat", type=int, default=3, help="runs per operation (median)")
    parser.add_argument("--tiny", action="store_true", help="20k and 40k rows: a smoke test")
    args = parser.parse_args()
    sizes = [20_000, 40_000] if args.tiny else args.rows
    repeat = 1 if args.tiny else args.repeat
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=args.work))
    print(f"# formats.scale, {datetime.now(UTC):%Y-%m-%d}, {cpu_model()}, {os.cpu_count()} cores")
    print(f"# median of {repeat} fresh processes per cell: seconds / peak RSS\n")
    print("| rows | write v1 | " + " | ".join(OPS) + " |")
    print("|---:|---:|" + "---:|" * len(OPS))
    try:
        for n in sizes:
            root = work / f"rows-{n}"
            started = time.perf_counter()
            expected = {"open": n, "select": write_version(root, n)}
            wrote = time.perf_counter() - started
            cells = {}
            for op in OPS:
                if op == "versions":
                    expected["diff"] = write_next_version(root)
                cells[op] = median_of(root, op, repeat, expected.get(op))
            shown = (f"{m['seconds']:.2f} s / {m['rss'] / 2**20:,.0f} MiB" for m in cells.values())
            print(f"| {n:,} | {wrote:.1f} s | " + " | ".join(shown) + " |", flush=True)
            shutil.rmtree(root)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
