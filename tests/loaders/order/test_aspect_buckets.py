"""Aspect-ratio buckets (`loaders.order.aspect_buckets`): every batch of every rank holds one
bucket's samples, each resized whole to the bucket's shape; deterministic, equal shares, exact
resume. The oracle: each sample's own image (read by its index) through a plain `F.interpolate`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders import (
    AspectBuckets,
    DeviceLoader,
    PackedDataset,
    PackedLoader,
    ResizeToBucket,
    make_loader,
)
from loaders.batch.types import SIZE_COLUMNS
from loaders.order.aspect_buckets import BucketSampler, bucket_order
from loaders.order.orders import partition
from tests.helpers.aspect import pack_aspect

pytestmark = pytest.mark.timeout(180)


@settings(max_examples=200, deadline=None)
@given(
    buckets=st.lists(st.integers(0, 4), min_size=0, max_size=80),
    batch=st.integers(1, 7),
    world=st.integers(1, 4),
    drop_last=st.booleans(),
    seed=st.integers(0, 3),
)
def test_every_batch_of_every_rank_is_one_bucket(
    buckets: list[int], batch: int, world: int, drop_last: bool, seed: int
) -> None:
    of = np.array(buckets, np.int64)
    order = bucket_order(of, seed, 0, batch, world, drop_last)
    assert len(order) % (batch * world) == 0
    assert np.array_equal(order, bucket_order(of, seed, 0, batch, world, drop_last))
    parts = [partition(order, r, world, drop_last) for r in range(world)]
    assert len({len(p) for p in parts}) == 1  # equal shares
    for part in parts:
        for start in range(0, len(part), batch):
            assert len(set(of[part[start : start + batch]].tolist())) == 1
    counts = np.bincount(of, minlength=5) if len(of) else np.zeros(5, np.int64)
    for bucket, n in enumerate(counts.tolist()):
        mine = order[of[order] == bucket] if len(order) else order
        if drop_last:  # whole groups only, no repeats
            assert len(mine) == n - n % (batch * world) and len(set(mine.tolist())) == len(mine)
        else:  # everyone, the last group topped up from the bucket itself
            assert set(mine.tolist()) == set(np.flatnonzero(of == bucket).tolist())


def test_buckets_of_sizes() -> None:
    sizes = np.array([[100, 200], [200, 100], [100, 100], [90, 180], [120, 100]])
    buckets = AspectBuckets.of(sizes, count=3, area=224 * 224)
    assert buckets.ratios == (0.5, 1.0, 2.0)
    assert buckets.bucket_of(sizes[:, 0], sizes[:, 1]).tolist() == [2, 0, 1, 2, 1]
    for k in range(3):
        height, width = buckets.shape(k)
        assert height % 8 == 0 and width % 8 == 0
        assert abs(height * width - 224 * 224) <= 224 * 224 * 0.05
        assert abs(width / height - buckets.ratios[k]) < 0.05
    with pytest.raises(ValueError, match="ascending"):
        AspectBuckets((2.0, 1.0), 100)


@pytest.fixture(scope="module")
def aspect(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 PNGs of random aspects packed with `etl run` (keep_aspect, 24 / 40)."""
    return pack_aspect(tmp_path_factory.mktemp("aspect"), count=30, seed=11)


def test_bucket_batches_resize_each_sample_whole(aspect: Path) -> None:
    dataset = PackedDataset.open(aspect)
    buckets = AspectBuckets.of(dataset.sample_sizes, count=3, area=24 * 24)
    resize = ResizeToBucket(buckets)
    seen: list[int] = []
    for rank in (0, 1):
        loader = make_loader(
            dataset, batch_size=4, shuffle=buckets, seed=3, rank=rank, world_size=2,
            with_indices=True, pin_memory=False,
        )  # fmt: skip
        assert isinstance(loader.order, BucketSampler)
        batches = list(DeviceLoader(loader, device="cpu", dtype=torch.float32, augment=resize))
        assert len(batches) == len(loader)
        for images, labels, indices in batches:
            assert len(labels) == 4
            sides = dataset.sample_sizes[indices.numpy()]
            (bucket,) = set(buckets.bucket_of(sides[:, 0], sides[:, 1]).tolist())
            assert images.shape[2:] == buckets.shape(bucket)
            for j, index in enumerate(indices.tolist()):
                own = dataset[index][0].permute(2, 0, 1)[None].float()
                want = F.interpolate(own, buckets.shape(bucket), mode="bilinear") / 255
                torch.testing.assert_close(images[j], want[0], atol=1e-4, rtol=0)
            seen += indices.tolist()
    assert set(seen) == set(range(len(dataset)))


def test_bucket_batches_resume_exactly(aspect: Path) -> None:
    dataset = PackedDataset.open(aspect)

    def loader(world: int = 1, rank: int = 0) -> PackedLoader:
        return make_loader(
            dataset, batch_size=3 // world, shuffle="buckets", seed=5, rank=rank,
            world_size=world, with_indices=True, pin_memory=False,
        )  # fmt: skip

    whole = [batch.indices.tolist() for batch in loader()]
    first = loader()
    taken = []
    for i, batch in enumerate(first):
        taken.append(batch.indices.tolist())
        if i == 2:
            break
    state = first.state_dict()
    second = loader()
    second.load_state_dict(state)
    rest = [batch.indices.tolist() for batch in second]
    assert taken + rest == whole
    # The same global batch on 3 ranks: each step's three batches of one are the rest's.
    ranks = []
    for rank in range(3):
        one = loader(world=3, rank=rank)
        one.load_state_dict(state)
        ranks.append([batch.indices.tolist() for batch in one])
    sizes = dataset.sample_sizes
    buckets = AspectBuckets.of(sizes).bucket_of(sizes[:, 0], sizes[:, 1])
    for step, expected in enumerate(rest):
        got = [ranks[r][step][0] for r in range(3)]
        assert sorted(got) == sorted(expected)
        assert len(set(buckets[got].tolist())) == 1


def test_a_batch_of_several_buckets_is_refused(aspect: Path) -> None:
    dataset = PackedDataset.open(aspect)
    buckets = AspectBuckets.of(dataset.sample_sizes, count=3)
    batch = dataset.with_memory(dataset.memory, with_indices=True).gather(list(range(10)))
    sizes = tuple(batch.columns[name].numpy() for name in SIZE_COLUMNS)
    with pytest.raises(ValueError, match="buckets"):
        ResizeToBucket(buckets)(batch.images.permute(0, 3, 1, 2), batch.indices, 0, sizes)


def test_unknown_shuffle_names_buckets(aspect: Path) -> None:
    with pytest.raises(ValueError, match="buckets"):
        make_loader(PackedDataset.open(aspect), shuffle="bucket", pin_memory=False)
