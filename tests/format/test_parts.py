"""Sealing a shard that several tasks filled (etl.format.parts), against plain numpy and
plain hash reads of the published file."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import blake3
import numpy as np
import pytest
import xxhash

from etl.format import parts

SHAPE = (3, 4, 2)


def fill(root: Path, samples: np.ndarray, gaps: list[int], split: list[int]) -> str:
    """Write `samples` at their slots in tasks that start at `split`, skipping `gaps`, the
    tasks in reverse order (as workers may finish)."""
    temp = parts.temp_name("shards/v000001-00000.npy", "t")
    bounds = [*split, len(samples)]
    for start, stop in reversed(list(pairwise(bounds))):
        with parts.SlotWriter(root, "shards/v000001-00000.npy", temp, start, SHAPE, "xxh3_64") as w:
            for slot in range(start, stop):
                if slot in gaps:
                    w.skip()
                else:
                    assert w.append(samples[slot])[0] == slot
    return temp


@pytest.mark.parametrize(
    "gaps", [[], [0], [9], [0, 1, 2], [3, 4, 8, 9], [1, 3, 5, 7], list(range(1, 10))]
)
def test_seal_closes_gaps_and_hashes_what_it_publishes(
    tmp_path: Path, gaps: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(len(gaps))
    samples = rng.integers(0, 256, (10, *SHAPE), dtype=np.uint8)
    temp = fill(tmp_path, samples, gaps, [0, 4, 7])
    monkeypatch.setattr(parts, "MOVE_BYTES", 2 * int(np.prod(SHAPE)))  # runs cross a move's end
    info = parts.seal(
        tmp_path, "shards/v000001-00000.npy", temp, 10, np.array(gaps, np.int64), SHAPE, "xxh3_64"
    )
    path = tmp_path / "shards/v000001-00000.npy"
    kept = [i for i in range(10) if i not in gaps]
    assert info is not None and info.rows == len(kept)
    np.testing.assert_array_equal(np.load(path), samples[kept])
    data = path.read_bytes()
    assert info.bytes == len(data)
    assert info.checksum == xxhash.xxh3_64_hexdigest(data)
    assert info.blake3 == blake3.blake3(data).hexdigest()
    assert [p.name for p in (tmp_path / "shards").iterdir()] == [path.name]


def test_a_shard_of_gaps_publishes_nothing(tmp_path: Path) -> None:
    samples = np.zeros((4, *SHAPE), np.uint8)
    temp = fill(tmp_path, samples, [0, 1, 2, 3], [0, 2])
    gaps = np.arange(4, dtype=np.int64)
    name = "shards/v000001-00000.npy"
    assert parts.seal(tmp_path, name, temp, 4, gaps, SHAPE, "xxh3_64") is None
    assert not (tmp_path / "shards").exists() or not list((tmp_path / "shards").iterdir())


def test_a_row_missing_from_the_temp_file_is_an_error_not_a_zero_row(tmp_path: Path) -> None:
    samples = np.ones((6, *SHAPE), np.uint8)
    temp = fill(tmp_path, samples[:4], [], [0])  # slots 4 and 5 never written
    with pytest.raises(OSError, match="short of the rows"):
        parts.seal(
            tmp_path, "shards/v000001-00000.npy", temp, 6, np.zeros(0, np.int64), SHAPE, "xxh3_64"
        )
    assert not (tmp_path / "shards/v000001-00000.npy").exists()
