"""A dataset of random uint8 samples, written shard by shard with the real `ShardWriter` and
committed as version 1: what the benchmarks read where the pixels do not matter, at any size
(a shard's samples are drawn, written and let go before the next shard's), and a dataset
`etl audit` finds whole (ids, hashes and sources as the format defines them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xxhash

from etl.format.commit import commit
from etl.format.manifest import table_from_rows
from etl.format.schema import REJECTS_SCHEMA, SAMPLES_SCHEMA, SHARDS_SCHEMA, ManifestMeta
from etl.format.shards import ShardWriter
from tests.helpers.packed import shard_row

CHECKSUM = "xxh3_64"
CLASSES = ("c0", "c1", "c2", "c3", "c4", "c5")


def write_random_dataset(
    root: Path,
    count: int,
    shape: tuple[int, ...],
    per_shard: int,
    classes: tuple[str, ...] = CLASSES,
    seed: int = 0,
) -> list[Path]:
    """`count` random samples of `shape` (HWC) in shards of `per_shard`, sample i of class
    `classes[i % len(classes)]`, its source named by its number (so sources ascend as the
    format asks); the shards' paths."""
    rng = np.random.default_rng(seed)
    samples, shards = [], []
    sample_bytes = int(np.prod(shape))
    for index, start in enumerate(range(0, count, per_shard)):
        rows = min(per_shard, count - start)
        name = f"shards/v000001-{index:05d}.npy"
        block = np.frombuffer(rng.bytes(rows * sample_bytes), np.uint8).reshape(rows, *shape)
        with ShardWriter(root, name, rows, shape, CHECKSUM) as writer:
            for r in range(rows):
                row, checksum = writer.append(block[r])
                samples.append(_sample_row(start + r, name, row, checksum, shape, classes))
            info = writer.finish()
        assert info is not None
        shards.append(shard_row(info))
    meta = ManifestMeta(
        version=1,
        sample_shape=shape,
        layout="HWC",
        classes=classes,
        checksum=CHECKSUM,
        config_digest="random",
        config={},
        tool_version="random",
    )
    commit(
        root,
        meta,
        table_from_rows(samples, SAMPLES_SCHEMA),
        table_from_rows(shards, SHARDS_SCHEMA),
        table_from_rows([], REJECTS_SCHEMA),
    )
    return sorted((root / "shards").glob("*.npy"))


def _sample_row(
    i: int, shard: str, row: int, checksum: str, shape: tuple[int, ...], classes: tuple[str, ...]
) -> dict[str, object]:
    label = i % len(classes)
    source = f"{i:08d}-{classes[label]}.png"
    return {
        "sample_id": xxhash.xxh3_64_hexdigest(source.encode()),
        "source": source,
        "source_size": 1,
        "source_mtime_ns": 0,
        "source_hash": f"{i:016x}",
        "source_height": shape[0],
        "source_width": shape[1],
        "label": label,
        "class_name": classes[label],
        "split": "train",
        "shard": shard,
        "row": row,
        "checksum": checksum,
    }
