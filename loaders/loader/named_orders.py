"""Sample orders by name: what `make_loader(shuffle=...)` accepts (`SHUFFLES`), each built as a
distributed-aware, resumable order sampler (`loaders.order.samplers`) from the loader's options."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Sampler

from loaders.datasets.mixture import Mixture
from loaders.datasets.packed import PackedDataset
from loaders.order.aspect_buckets import AspectBuckets, BucketSampler
from loaders.order.samplers import (
    BlockShuffleSampler,
    ClassBalancedSampler,
    OrderSampler,
    ShardGroupSampler,
    ShuffleSampler,
)


@dataclass(frozen=True)
class OrderOptions:
    """What a named order may depend on, besides the dataset's labels and shards."""

    batch_size: int
    seed: int
    rank: int | None
    world_size: int | None
    drop_last: bool

    def common(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
        }


def _blocks(ds: PackedDataset, o: OrderOptions) -> OrderSampler:
    # NOTE: a window mixes window / block blocks from random places. Measured on the sample
    # data (class-sorted shards, 6 classes, batch 256), batches reach a full shuffle's class mix
    # once the window holds about a batch's worth of blocks: class_mix_distance 0.105 with a
    # 1024 window against 0.057 for a random order, 0.044 against 0.068 with 4096.
    block = 16
    return BlockShuffleSampler(ds.shard_idx, block, max(4096, block * o.batch_size), **o.common())


SHUFFLES: dict[str, Callable[[PackedDataset, OrderOptions], OrderSampler]] = {
    "sequential": lambda ds, o: ShuffleSampler(len(ds), False, **o.common()),
    "random": lambda ds, o: ShuffleSampler(len(ds), True, **o.common()),
    "blocks": _blocks,
    "shards": lambda ds, o: ShardGroupSampler(ds.shard_idx, 2, **o.common()),
    "balanced": lambda ds, o: ClassBalancedSampler(ds.labels, **o.common()),
}
"""Sample orders by name; see `loaders.order.orders` for what each one does."""


def _buckets(given: AspectBuckets | None) -> Callable[[PackedDataset, OrderOptions], OrderSampler]:
    def make(ds: PackedDataset, o: OrderOptions) -> OrderSampler:
        sizes = ds.sample_sizes
        buckets = given or AspectBuckets.of(sizes)
        of = buckets.bucket_of(sizes[:, 0], sizes[:, 1])
        return BucketSampler(of, o.batch_size, **o.common())

    return make


def named_order(
    shuffle: bool | str | AspectBuckets,
) -> Callable[[PackedDataset, OrderOptions], OrderSampler]:
    """The factory of an order: a `SHUFFLES` name or a bool; or "buckets" (the default
    `AspectBuckets.of` the dataset's sizes) or an `AspectBuckets`: batches of one bucket."""
    if isinstance(shuffle, AspectBuckets) or shuffle == "buckets":
        return _buckets(shuffle if isinstance(shuffle, AspectBuckets) else None)
    name = ("random" if shuffle else "sequential") if isinstance(shuffle, bool) else shuffle
    factory = SHUFFLES.get(name)
    if factory is None:
        choices = [*SHUFFLES, "buckets"]
        raise ValueError(f"unknown shuffle {shuffle!r}; expected a bool or one of {choices}")
    return factory


def order_seed(seed: int | None, generator: torch.Generator | None) -> int:
    """The seed of a loader's order: `seed`, else one drawn from `generator`, else 0."""
    if generator is None:
        return 0 if seed is None else int(seed)
    if seed is not None:
        raise ValueError(
            "pass seed= or generator=, not both: the sample order comes from one of them"
        )
    return int(torch.randint(0, 2**62, (), generator=generator))


def map_batching(
    dataset: PackedDataset | Mixture,
    batch_size: int | None,
    shuffle: bool | str | AspectBuckets | None,
    sampler: Sampler[int] | None,
    batch_sampler: Sampler[Any] | None,
    drop_last: bool,
    options_of: Callable[[], OrderOptions],
) -> tuple[dict[str, Any], OrderSampler | None]:
    """How a `PackedLoader` of a map-style dataset batches: DataLoader's keywords for it (the
    batch sampler given; or batch size, drop_last and the sampler: the one given, a
    `Mixture`'s own, or the `shuffle` order by name), and the order of ours it reads in, which
    the loader then batches through a `RunBatchSampler` (None: a batch sampler or a torch
    sampler given). `options_of` is called only for an order of ours: it may draw a seed from
    a generator."""
    if sampler is not None and shuffle:
        raise ValueError("pass either sampler= or shuffle=, not both (as with DataLoader)")
    if isinstance(dataset, Mixture):
        if sampler is not None or batch_sampler is not None or shuffle not in (None, True):
            raise ValueError(
                "a Mixture's order is its own (weights, seed): pass no shuffle=, sampler= "
                "or batch_sampler="
            )
        options = options_of()
        sampler = dataset.sampler(
            options.seed, options.rank, options.world_size, drop_last, batch_size or 1
        )
    elif batch_sampler is not None:
        return {"batch_sampler": batch_sampler}, None
    elif sampler is None:
        if batch_size is None:
            raise ValueError("PackedLoader batches: batch_size=None is for a PackedStream")
        made = named_order(shuffle or False)(dataset, options_of())
        if isinstance(shuffle, bool | str | None):  # what a run's record rebuilds it from
            made.named = shuffle or False
        sampler = made
    batching = {"batch_size": batch_size, "sampler": sampler, "drop_last": drop_last}
    return batching, sampler if isinstance(sampler, OrderSampler) else None
