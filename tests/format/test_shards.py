from __future__ import annotations

import hashlib
import os
from pathlib import Path

import blake3
import numpy as np
import pytest
import xxhash

from etl.errors import ShardError
from etl.format.shards import HEADER_BYTES, ShardWriter, open_shard

SHAPE = (4, 5, 3)


def samples(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, *SHAPE), dtype=np.uint8)


def test_written_shard_is_plain_npy_and_shrinks_to_rows(tmp_path: Path) -> None:
    data = samples(3)
    with ShardWriter(tmp_path, "shards/a.npy", 10, SHAPE, "xxh3_64") as writer:
        results = [writer.append(x) for x in data]
        info = writer.finish()
    assert info is not None and info.rows == 3
    path = tmp_path / "shards/a.npy"
    loaded = np.load(path, mmap_mode="r")  # no code of ours
    assert loaded.shape == (3, *SHAPE) and loaded.dtype == np.uint8
    np.testing.assert_array_equal(loaded, data)
    assert path.stat().st_size == HEADER_BYTES + data.nbytes == info.bytes
    assert [r for r, _ in results] == [0, 1, 2]
    assert [c for _, c in results] == [xxhash.xxh3_64_hexdigest(x.tobytes()) for x in data]
    assert info.checksum == xxhash.xxh3_64_hexdigest(path.read_bytes())
    assert not list((tmp_path / "shards").glob(".tmp-*"))


def test_failure_leaves_no_shard_under_its_name(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError),
        ShardWriter(tmp_path, "shards/b.npy", 4, SHAPE, "xxh3_64") as w,
    ):
        w.append(samples(1)[0])
        raise RuntimeError("killed")
    assert not list((tmp_path / "shards").iterdir())


def test_empty_shard_is_not_published(tmp_path: Path) -> None:
    with ShardWriter(tmp_path, "shards/c.npy", 4, SHAPE, "xxh3_64") as writer:
        assert writer.finish() is None
    assert not list((tmp_path / "shards").iterdir())


def test_wrong_sample_and_overflow_are_refused(tmp_path: Path) -> None:
    with ShardWriter(tmp_path, "shards/d.npy", 1, SHAPE, "xxh3_64") as writer:
        with pytest.raises(ValueError, match="does not fit"):
            writer.append(np.zeros((4, 5, 1), np.uint8))
        writer.append(samples(1)[0])
        with pytest.raises(ValueError, match="full"):
            writer.append(samples(1)[0])


def test_open_shard_checks_shape_and_size(tmp_path: Path) -> None:
    with ShardWriter(tmp_path, "shards/e.npy", 5, SHAPE, "xxh3_64") as writer:
        for x in samples(5):
            writer.append(x)
        writer.finish()
    path = tmp_path / "shards/e.npy"
    assert open_shard(path, SHAPE, 5).shape == (5, *SHAPE)
    with pytest.raises(ShardError, match="shape"):
        open_shard(path, SHAPE, 6)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 1)
    with pytest.raises(ShardError, match="truncated"):
        open_shard(path, SHAPE, 5)
    with pytest.raises(ShardError, match="missing"):
        open_shard(tmp_path / "shards/none.npy", SHAPE, 5)
    (tmp_path / "bad.npy").write_bytes(b"not numpy at all")
    with pytest.raises(ShardError, match="not a valid"):
        open_shard(tmp_path / "bad.npy", SHAPE, 1)
    np.save(tmp_path / "f.npy", np.zeros((2, *SHAPE), np.float32))
    with pytest.raises(ShardError, match="dtype"):
        open_shard(tmp_path / "f.npy", SHAPE, 2)


@pytest.mark.parametrize("rows", [6, 4], ids=["full: digests while writing", "short: re-read"])
@pytest.mark.parametrize("algorithm", ["xxh3_64", "sha256"])
def test_shard_digests_are_those_of_the_file_on_disk(
    tmp_path: Path, rows: int, algorithm: str
) -> None:
    data = samples(rows, seed=rows)
    with ShardWriter(tmp_path, "shards/d.npy", 6, SHAPE, algorithm) as writer:
        for x in data:
            writer.append(x)
        info = writer.finish()
    assert info is not None
    raw = (tmp_path / "shards/d.npy").read_bytes()
    expected = hashlib.sha256(raw).hexdigest() if algorithm == "sha256" else None
    assert info.checksum == (expected or xxhash.xxh3_64_hexdigest(raw))
    assert info.blake3 == blake3.blake3(raw).hexdigest()
    np.testing.assert_array_equal(np.load(tmp_path / "shards/d.npy"), data)


@pytest.mark.parametrize("durable", [True, False])
def test_durable_false_leaves_every_fsync_to_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    with ShardWriter(tmp_path, "shards/e.npy", 2, SHAPE, "xxh3_64", durable) as writer:
        writer.append(samples(1)[0])
        assert writer.finish() is not None
    assert len(synced) == (2 if durable else 0)  # the file, then the folder holding its name
