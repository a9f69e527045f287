"""Tiny packed datasets for the loaders tests, written with the real format layer.

Samples are random uint8 images; sources are named `<class>/<n>.png` and sorted, and shards
are filled class by class (`etl run` fills them in a hash order of the paths, `plan.pack_order`;
class-sorted shards are the harder case for a shuffle). Shards have uneven sizes, classes
uneven counts, and the last shard holds an orphan row that no sample references (as after a
deletion). Everything the tests compare against is kept here, independent of the code under test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from numpy.typing import NDArray

from etl.format.checksums import digest
from etl.format.codecs import encode
from etl.format.commit import commit
from etl.format.flat import sides_of
from etl.format.manifest import RECORDED_FILES, table_from_rows
from etl.format.record import write_record
from etl.format.schema import REJECTS_SCHEMA, SAMPLES_SCHEMA, SHARDS_SCHEMA, ManifestMeta
from etl.format.shards import ShardInfo, ShardWriter

CHECKSUM = "xxh3_64"


@dataclass
class Packed:
    """A committed dataset and what was written, in manifest (source) order."""

    root: Path
    images: NDArray[np.uint8]
    labels: NDArray[np.int64]
    splits: list[str]
    sample_ids: list[str]
    shards: list[str]
    """Shard name of each sample."""
    rows: list[int]
    classes: tuple[str, ...]
    sample_shape: tuple[int, ...]
    layout: str

    def shard_path(self, name: str) -> Path:
        return self.root / name

    def indices(self, split: str | None = None) -> list[int]:
        return [i for i, s in enumerate(self.splits) if split is None or s == split]


def make_packed(
    root: Path,
    shard_sizes: tuple[int, ...] = (7, 5, 9, 3, 6),
    sample_shape: tuple[int, ...] = (6, 5, 3),
    classes: tuple[str, ...] = ("ant", "bee", "cat"),
    layout: str = "HWC",
    seed: int = 0,
    orphans: int = 1,
    split_of: Callable[[int], str] | None = None,
    codec: str = "raw",
) -> Packed:
    """Write shards and commit version 1 of a dataset under `root`; sample i's split is
    `split_of(i)` (default: every fourth "val", the rest "train"). A `codec` other than raw
    stores every sample encoded with it (format version 3; random pixels do not compress, so
    no sample falls back to raw here, as `etl run`'s `min_ratio` would have it)."""
    rng = np.random.default_rng(seed)
    n = sum(shard_sizes)
    labels = np.sort(rng.integers(0, len(classes), n))
    labels[: len(classes)] = np.arange(len(classes))  # every class present
    labels = np.sort(labels)
    images = rng.integers(0, 256, size=(n, *sample_shape), dtype=np.uint8)
    splits = [split_of(i) if split_of else "val" if i % 4 == 1 else "train" for i in range(n)]
    sources = [f"{classes[label]}/{i:04d}.png" for i, label in enumerate(labels)]
    sample_rows, shard_rows, shards, rows = [], [], [], []
    i = 0
    for k, size in enumerate(shard_sizes):
        name = f"shards/v000001-{k:05d}.npy"
        extra = orphans if k == len(shard_sizes) - 1 else 0
        stored_shape = sample_shape if codec == "raw" else (0,)
        with ShardWriter(root, name, size + extra, stored_shape, CHECKSUM) as writer:
            for _ in range(size):
                data = images[i] if codec == "raw" else encode(images[i], codec, 90, 0, layout)[1]
                row, checksum = writer.append(data)
                assert checksum == digest(np.ascontiguousarray(data), CHECKSUM)
                placed = {} if codec == "raw" else _placed(writer, row, sample_shape, layout, codec)
                sample_rows.append(
                    {
                        "sample_id": f"id-{i:04d}",
                        "source": sources[i],
                        "source_size": 100 + i,
                        "source_mtime_ns": 1_000 + i,
                        "source_hash": f"h{i}",
                        "source_height": 10,
                        "source_width": 12,
                        "label": int(labels[i]),
                        "class_name": classes[labels[i]],
                        "split": splits[i],
                        "shard": name,
                        "row": row,
                        "checksum": checksum,
                        **placed,
                    }
                )
                shards.append(name)
                rows.append(row)
                i += 1
            for _ in range(extra):
                orphan = rng.integers(0, 256, size=sample_shape, dtype=np.uint8)
                writer.append(orphan if codec == "raw" else orphan.reshape(-1))
            info = writer.finish()
        assert info is not None
        shard_rows.append(shard_row(info))
    meta = ManifestMeta(
        version=1,
        sample_shape=sample_shape,
        layout=layout,
        classes=classes,
        checksum=CHECKSUM,
        config_digest="test",
        config={"output": {"layout": layout}},
        tool_version="test",
        format_version=1 if codec == "raw" else 3,
        codec=None if codec == "raw" else {"kind": codec, "min_ratio": 1.0},
    )
    commit(
        root,
        meta,
        table_from_rows(sample_rows, SAMPLES_SCHEMA),
        table_from_rows(shard_rows, SHARDS_SCHEMA),
        table_from_rows([], REJECTS_SCHEMA),
    )
    return Packed(
        root=root,
        images=images,
        labels=labels.astype(np.int64),
        splits=splits,
        sample_ids=[r["sample_id"] for r in sample_rows],
        shards=shards,
        rows=rows,
        classes=classes,
        sample_shape=sample_shape,
        layout=layout,
    )


def shard_row(info: ShardInfo) -> dict[str, object]:
    """A finished shard as its row of the shards table."""
    return {
        "shard": info.name,
        "rows": info.rows,
        "bytes": info.bytes,
        "checksum": info.checksum,
        "blake3": info.blake3,
    }


def _placed(
    writer: ShardWriter, row: int, sample_shape: tuple[int, ...], layout: str, codec: str
) -> dict[str, object]:
    """The `sample_*` columns of a sample just written encoded (format version 3)."""
    offset, shape = writer.placed[row]
    height, width = sides_of(sample_shape, layout)
    return {
        "sample_offset": offset,
        "sample_height": height,
        "sample_width": width,
        "sample_codec": codec,
        "sample_bytes": shape[0],
    }


def commit_subset(packed: Packed, keep: list[int], version: int) -> None:
    """Commit `version` referencing only samples `keep` of version 1 (same shards)."""
    from etl.format.manifest import read_manifest

    first = read_manifest(packed.root, 1)
    samples = first.samples.take(keep)
    meta = ManifestMeta(**{**first.meta.__dict__, "version": version})
    commit(packed.root, meta, samples, first.shards, first.rejects)


def rewrite_sealed(path: Path, table: pa.Table) -> None:
    """Replace one Arrow file of a version and write a matching commit record, as a deliberate
    editor (or a bug in a writer) would: the record no longer tells, so the checks behind it
    must. Without the reseal, `read_manifest` refuses the file before looking inside."""
    path.unlink()
    with ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)
    version = int(path.parent.name[1:])
    write_record(path.parent, version, RECORDED_FILES)
