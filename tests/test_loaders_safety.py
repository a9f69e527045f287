"""Opening refuses what it cannot trust: tampered manifests, escaping paths, bad shards."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from packed import Packed, make_packed

import loaders.reader
from etl.errors import ManifestError, ShardError
from loaders import PackedDataset, PackedStream, make_loader, open_catalog

MANIFEST = Path("versions/v000001/manifest.arrow")
SHARDS = Path("versions/v000001/shards.arrow")


@pytest.fixture
def packed(tmp_path: Path) -> Packed:
    return make_packed(tmp_path / "ds")


def rewrite(path: Path, table: pa.Table) -> None:
    os.unlink(path)
    with ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)


def replace_column(path: Path, name: str, values: list[object]) -> None:
    table = ipc.open_file(path).read_all()
    column = pa.array(values, table.schema.field(name).type)
    rewrite(path, table.set_column(table.schema.get_field_index(name), name, column))


def test_unknown_format_version_is_refused(packed: Packed) -> None:
    path = packed.root / MANIFEST
    table = ipc.open_file(path).read_all()
    metadata = {**table.schema.metadata, b"etl.format_version": b"2"}
    rewrite(path, table.replace_schema_metadata(metadata))
    with pytest.raises(ManifestError, match="format version 2"):
        PackedDataset.open(packed.root)


@pytest.mark.parametrize(
    "bad", ["/etc/passwd.npy", "shards/../../outside.npy", "../shards/x.npy", "shards/x.bin"]
)
def test_shard_paths_must_stay_inside_the_dataset(packed: Packed, bad: str) -> None:
    table = ipc.open_file(packed.root / SHARDS).read_all()
    names = table.column("shard").to_pylist()
    replace_column(packed.root / SHARDS, "shard", [bad, *names[1:]])
    samples = ipc.open_file(packed.root / MANIFEST).read_all()
    fixed = [bad if s == names[0] else s for s in samples.column("shard").to_pylist()]
    replace_column(packed.root / MANIFEST, "shard", fixed)
    with pytest.raises(ManifestError, match="not of the form"):
        PackedDataset.open(packed.root)
    with pytest.raises(ManifestError, match="not of the form"):
        open_catalog(packed.root / MANIFEST)


def test_a_row_past_the_end_of_its_shard_is_refused(packed: Packed) -> None:
    samples = ipc.open_file(packed.root / MANIFEST).read_all()
    rows = samples.column("row").to_pylist()
    replace_column(packed.root / MANIFEST, "row", [99, *rows[1:]])
    with pytest.raises(ManifestError, match="outside shard"):
        PackedDataset.open(packed.root)


def truncate(path: Path, nbytes: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - nbytes)


def test_truncated_shard_raises_shard_error_naming_it(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    victim = packed.root / ds.selection.shards.names[1]
    truncate(victim, 7)
    first = int(np.flatnonzero(ds.selection.shard_idx == 1)[0])
    ds[0]  # other shards still read
    with pytest.raises(ShardError, match=rf"{victim}.*bytes on disk"):
        ds[first]
    with pytest.raises(ShardError, match=str(victim)):
        ds.__getitems__(list(range(len(ds))))


def test_shard_with_a_different_shape_is_refused(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    victim = packed.root / ds.selection.shards.names[0]
    np.save(victim, np.zeros((7, 5, 6, 3), dtype=np.uint8))  # same byte count, other shape
    with pytest.raises(ShardError, match="shape"):
        ds[0]


def test_missing_shard_is_a_shard_error_in_workers_too(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    (packed.root / ds.selection.shards.names[2]).unlink()
    loader = make_loader(ds, batch_size=4, num_workers=1, pin_memory=False)
    with pytest.raises(ShardError, match="missing"):
        list(loader)


def flip_a_byte(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))


def test_verify_catches_changed_bytes_of_the_shards_opened(packed: Packed) -> None:
    names = open_catalog(packed.root).select().shards.names
    flip_a_byte(packed.root / names[-1])
    ds = PackedDataset.open(packed.root, verify=True)
    ds[0]  # an intact shard
    last = len(ds) - 1
    with pytest.raises(ShardError, match="does not match the manifest"):
        ds[last]
    unverified = PackedDataset.open(packed.root)
    assert unverified[last][0].shape == packed.sample_shape  # same size: only verify can tell
    stream = PackedStream(open_catalog(packed.root).select(), verify=True, shuffle=False)
    with pytest.raises(ShardError, match="does not match the manifest"):
        list(stream)


def test_verify_hashes_each_shard_once_per_process(
    packed: Packed, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    real = loaders.reader.file_digests

    def counting(path: Path, algorithms: tuple[str, ...]) -> tuple[str, ...]:
        calls.append(Path(path))
        return real(path, algorithms)

    monkeypatch.setattr(loaders.reader, "file_digests", counting)
    ds = PackedDataset.open(packed.root, verify=True)
    ds.__getitems__(list(range(len(ds))))
    again = PackedDataset.open(packed.root, verify=True)
    again.__getitems__(list(range(len(ds))))
    assert sorted(calls) == sorted({packed.root / n for n in ds.selection.shards.names})
