from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from loaders import PackedDataset
from loaders.datasets.packed import collate_batch
from loaders.order.orders import balanced_order, block_order, partition, random_order
from loaders.order.quality import class_mix_distance, shuffle_quality
from loaders.order.samplers import BlockShuffleSampler, ClassBalancedSampler, ShuffleSampler
from tests.helpers.packed import Packed, make_packed


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    return make_packed(tmp_path_factory.mktemp("ds"))


# --- pure orders ---------------------------------------------------------------------------


def is_permutation(order: np.ndarray, n: int) -> bool:
    return order.dtype == np.int64 and sorted(order.tolist()) == list(range(n))


def test_random_order_is_a_pure_function_of_seed_and_epoch() -> None:
    a = random_order(100, seed=3, epoch=0)
    assert is_permutation(a, 100)
    assert np.array_equal(a, random_order(100, seed=3, epoch=0))
    assert not np.array_equal(a, random_order(100, seed=3, epoch=1))
    assert not np.array_equal(a, random_order(100, seed=4, epoch=0))
    with pytest.raises(ValueError, match="seed and epoch"):
        random_order(3, seed=-1, epoch=0)


def shard_runs(sizes: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(sizes)), sizes)


def expected_blocks(sizes: list[int], block: int) -> dict[int, int]:
    """start -> end of every block, computed independently: each shard cut every `block` rows."""
    blocks, start = {}, 0
    for size in sizes:
        for a in range(start, start + size, block):
            blocks[a] = min(a + block, start + size)
        start += size
    return blocks


@pytest.mark.parametrize(("block", "window"), [(1, 1), (4, 1), (4, 16), (7, 3), (50, 200)])
def test_block_order_reads_whole_blocks_of_one_shard(block: int, window: int) -> None:
    sizes = [10, 3, 25, 1, 9]
    shard = shard_runs(sizes)
    blocks = block_order(shard, seed=1, epoch=2, block=block, window=1)
    assert is_permutation(blocks, len(shard))
    expected, p = expected_blocks(sizes, block), 0
    while p < len(blocks):
        start = int(blocks[p])
        end = expected.pop(start)  # KeyError: not the start of a block
        assert blocks[p : p + end - start].tolist() == list(range(start, end))
        p += end - start
    assert not expected
    order = block_order(shard, seed=1, epoch=2, block=block, window=window)
    assert np.array_equal(order, block_order(shard, 1, 2, block, window))
    for a in range(0, len(order), max(window, 1)):
        w = max(window, 1)
        assert sorted(order[a : a + w].tolist()) == sorted(blocks[a : a + w].tolist())


def test_block_order_of_block_one_and_empty() -> None:
    assert block_order(np.zeros(0, dtype=np.int32), 0, 0).size == 0
    shard = shard_runs([5, 5])
    assert is_permutation(block_order(shard, 0, 0, block=1, window=1), 10)


def test_balanced_order_gives_classes_equal_shares() -> None:
    labels = np.array([0] * 50 + [1] * 7 + [2] * 3 + [4] * 20)
    order = balanced_order(labels, seed=0, epoch=0)
    assert len(order) == len(labels)
    counts = Counter(labels[order].tolist())
    assert set(counts) == {0, 1, 2, 4}
    assert max(counts.values()) - min(counts.values()) <= 1
    # A small class cycles through all of its members before repeating one.
    threes = Counter(order[labels[order] == 2].tolist())
    assert max(threes.values()) - min(threes.values()) <= 1
    # A large class is subsampled without repeats.
    assert max(Counter(order[labels[order] == 0].tolist()).values()) == 1
    assert len(balanced_order(labels, 0, 0, num_samples=9)) == 9
    assert not np.array_equal(order, balanced_order(labels, seed=0, epoch=1))


@pytest.mark.parametrize(
    ("n", "world", "drop_last"),
    list(itertools.product([0, 1, 5, 7, 8, 13, 64], [1, 2, 3, 4, 8], [False, True])),
)
def test_partition_is_disjoint_equal_and_covers(n: int, world: int, drop_last: bool) -> None:
    order = random_order(n, seed=0, epoch=0)
    parts = [partition(order, r, world, drop_last) for r in range(world)]
    lengths = {len(p) for p in parts}
    assert len(lengths) == 1, "every rank gets the same number of samples"
    length = lengths.pop()
    if drop_last:
        assert length == n // world
        union = np.concatenate(parts)
        assert len(set(union.tolist())) == len(union), "disjoint"
        assert set(union.tolist()) <= set(range(n))
    else:
        assert length == -(-n // world)
        union = set(np.concatenate(parts).tolist())
        assert union == set(range(n)), "padding repeats; the union is the whole split"
        total = length * world
        assert total - n < world, "pads fewer than world_size samples"
    with pytest.raises(ValueError):
        partition(order, world, world)


# --- sampler classes -----------------------------------------------------------------------


def test_shuffle_sampler_is_distributed_sampler_like() -> None:
    ranks = [ShuffleSampler(10, seed=1, rank=r, world_size=3) for r in range(3)]
    seen = [list(s) for s in ranks]
    assert [len(s) for s in ranks] == [4, 4, 4]
    assert set(itertools.chain(*seen)) == set(range(10))
    first = list(ranks[0])
    ranks[0].set_epoch(1)
    assert list(ranks[0]) != first
    assert list(ShuffleSampler(5, shuffle=False)) == [0, 1, 2, 3, 4]


def test_sampler_resume_and_state_is_plain_ints() -> None:
    sampler = BlockShuffleSampler(shard_runs([9, 4, 12]), block=3, window=6, seed=5)
    sampler.set_epoch(2)
    full = list(sampler)
    sampler.resume(epoch=2, position=10)
    state = json.loads(json.dumps(sampler.state_dict()))
    assert state == {
        "order": "blocks(n=25, block=3, window=6)",
        "seed": 5,
        "drop_last": 0,
        "epoch": 2,
        "start": 0,
        "position": 10,
        "rank": 0,
        "world_size": 1,
    }
    other = BlockShuffleSampler(shard_runs([9, 4, 12]), block=3, window=6, seed=5)
    other.load_state_dict(state)
    assert len(other) == len(full) and other.left() == len(full) - 10
    assert list(other) == full[10:]
    assert list(other) == full, "a resume point applies to one iteration"
    with pytest.raises(ValueError, match="loader state is for seed 5, this loader has 0"):
        BlockShuffleSampler(shard_runs([9, 4, 12]), block=3, window=6).load_state_dict(state)
    with pytest.raises(ValueError, match="loader state is for order 'blocks"):
        ShuffleSampler(25, seed=5, rank=1, world_size=2).load_state_dict(state)


def test_class_balanced_sampler(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    sampler = ClassBalancedSampler(ds.labels, num_samples=300, seed=2)
    counts = Counter(ds.labels[list(sampler)].tolist())
    assert sorted(counts.values()) == [100, 100, 100]


# --- every torch sampler works with the dataset -------------------------------------------


class Recording(Sampler[int]):
    """Remembers the indices a wrapped sampler gave out, to check what the loader returned."""

    def __init__(self, inner: Sampler[int]) -> None:
        self.inner = inner
        self.given: list[int] = []

    def __iter__(self) -> Iterator[int]:
        for i in self.inner:
            self.given.append(int(i))
            yield i

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]


def check_batches(ds: PackedDataset, packed: Packed, batches: list, indices: list[int]) -> None:
    images = torch.cat([b[0] for b in batches])
    labels = torch.cat([b[1] for b in batches])
    assert len(images) == len(indices)
    positions = ds.selection.positions[indices]
    np.testing.assert_array_equal(images.numpy(), packed.images[positions])
    np.testing.assert_array_equal(labels.numpy(), packed.labels[positions])


def torch_samplers(ds: PackedDataset) -> dict[str, Sampler[int]]:
    g = torch.Generator().manual_seed(0)
    weights = torch.tensor(np.where(ds.labels == 2, 5.0, 1.0))
    return {
        "sequential": SequentialSampler(ds),
        "random": RandomSampler(ds, generator=g),
        "random-replacement": RandomSampler(ds, replacement=True, num_samples=50, generator=g),
        "subset": SubsetRandomSampler([1, 4, 9, 16], generator=g),
        "weighted": WeightedRandomSampler(weights, num_samples=40, generator=g),
        "distributed": DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3),
        "shuffle": ShuffleSampler(len(ds), seed=1),
        "blocks": BlockShuffleSampler(ds.shard_idx, block=4, window=8),
        "balanced": ClassBalancedSampler(ds.labels),
    }


@pytest.mark.parametrize(
    "name",
    [
        "sequential", "random", "random-replacement", "subset", "weighted", "distributed",
        "shuffle", "blocks", "balanced",
    ],
)  # fmt: skip
def test_every_sampler_feeds_the_dataset(packed: Packed, name: str) -> None:
    ds = PackedDataset.open(packed.root)
    sampler = Recording(torch_samplers(ds)[name])
    batched = DataLoader(ds, batch_size=8, sampler=sampler, collate_fn=collate_batch)
    check_batches(ds, packed, list(batched), sampler.given)
    # One sample per __getitem__ (no auto-batching) also works.
    single = Recording(torch_samplers(ds)[name])
    items = list(DataLoader(ds, batch_size=None, sampler=single))
    expected = packed.labels[ds.selection.positions[single.given]]
    assert [label for _, label in items] == expected.tolist()


def test_batch_sampler_feeds_the_dataset(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root, split="train")
    inner = Recording(RandomSampler(ds, generator=torch.Generator().manual_seed(1)))
    batch_sampler = BatchSampler(inner, batch_size=5, drop_last=True)
    loader = DataLoader(ds, batch_sampler=batch_sampler, collate_fn=collate_batch)
    batches = list(loader)
    assert all(len(b.labels) == 5 for b in batches)
    check_batches(ds, packed, batches, inner.given[: 5 * len(batches)])


# --- shuffle quality -----------------------------------------------------------------------


def test_class_mix_distance_by_hand() -> None:
    labels = np.array([0, 0, 1, 1])
    assert class_mix_distance(np.array([0, 2, 1, 3]), labels, 2) == 0.0
    assert class_mix_distance(np.array([0, 1, 2, 3]), labels, 2) == 0.5
    assert np.isnan(class_mix_distance(np.array([0]), labels, 2))


def test_block_shuffle_mixes_class_sorted_shards_nearly_like_random() -> None:
    # 6 classes, 3000 samples in class-sorted shards of 300: what `etl run` produces.
    labels = np.repeat(np.arange(6), 500)
    shard = np.arange(3000) // 300
    order = block_order(shard, seed=0, epoch=0, block=16, window=1024)
    mine, random = shuffle_quality(order, labels, batch_size=64)
    sequential = class_mix_distance(np.arange(3000), labels, 64)
    assert sequential > 0.8
    assert mine < 2 * random


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_order_samplers_are_distributed_samplers_by_torch_meaning(
    packed: Packed, world_size: int, drop_last: bool
) -> None:
    """Trainers read DistributedSampler's attributes: each must mean what torch says."""
    n = len(packed.labels)
    for rank in range(world_size):
        for sampler in (
            ShuffleSampler(n, seed=3, rank=rank, world_size=world_size, drop_last=drop_last),
            BlockShuffleSampler(np.arange(n) // 5, 3, 9, 1, rank, world_size, drop_last),
            ClassBalancedSampler(packed.labels, 23, 2, rank, world_size, drop_last),
        ):
            assert isinstance(sampler, DistributedSampler)
            assert (sampler.rank, sampler.num_replicas) == (rank, world_size)
            total = sampler.global_length()
            per_rank = total // world_size if drop_last else -(-total // world_size)
            assert sampler.num_samples == len(list(sampler)) == per_rank > 0
            assert sampler.total_size == per_rank * world_size
    assert ShuffleSampler(n, shuffle=False).shuffle is False


@pytest.mark.parametrize("group", [1, 2, 3])
def test_shard_group_order_reads_a_few_shards_at_a_time(group: int) -> None:
    """Every index once; the shards come one group after another (each group's rows
    together, a shard never met again once its group is over); two epochs differ."""
    from loaders.order.orders import shard_group_order

    sizes = [7, 12, 5, 9, 11, 8, 10]
    shard_idx = np.repeat(np.arange(len(sizes)), sizes)
    first = shard_group_order(shard_idx, seed=3, epoch=0, group=group)
    assert sorted(first.tolist()) == list(range(len(shard_idx)))
    seen = shard_idx[first]
    groups = [set(chunk.tolist()) for chunk in _runs_of_groups(seen, sizes, group)]
    assert all(len(g) <= group for g in groups)
    assert set().union(*groups) == set(range(len(sizes)))
    assert sum(len(g) for g in groups) == len(sizes)  # no shard in two groups
    again = shard_group_order(shard_idx, seed=3, epoch=0, group=group)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, shard_group_order(shard_idx, seed=3, epoch=1, group=group))


def _runs_of_groups(seen: np.ndarray, sizes: list[int], group: int) -> list[np.ndarray]:
    """`seen` cut where a group of shards ends: each group's rows are contiguous."""
    cuts, start, shards = [], 0, []
    for shard in seen.tolist():
        if shard not in shards:
            if len(shards) == group:
                length = sum(sizes[s] for s in shards)
                cuts.append(seen[start : start + length])
                start, shards = start + length, []
            shards.append(shard)
    cuts.append(seen[start:])
    return cuts
