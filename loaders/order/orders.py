"""Sample orders as pure functions: (data, seed, epoch) -> int64 indices; then a rank's part.

Nothing here does I/O or holds state, so every order can be recomputed anywhere (on each rank,
after a restart) from plain integers. The torch `Sampler` classes in `loaders.order.samplers` are
thin wrappers. Random numbers come from `np.random.default_rng([seed, epoch])`: the same on every
machine and numpy version that keeps PCG64 and SeedSequence stable.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Order = NDArray[np.int64]


def seeded_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator behind every order: a pure function of (seed, epoch)."""
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got seed={seed} epoch={epoch}")
    return np.random.default_rng([seed, epoch])


def sequential_order(n: int) -> Order:
    """0, 1, ..., n-1: the (shard, row) order of a dataset, the fastest to read."""
    return np.arange(n, dtype=np.int64)


def random_order(n: int, seed: int, epoch: int) -> Order:
    """A uniformly random permutation of range(n)."""
    return seeded_rng(seed, epoch).permutation(n).astype(np.int64)


def block_order(
    shard_idx: NDArray[np.integer], seed: int, epoch: int, block: int = 16, window: int = 4096
) -> Order:
    """Shard-aware quasi-random order: shuffled blocks of `block` neighbouring rows, then a
    shuffle inside each run of `window` consecutive positions.

    `shard_idx[i]` is the shard of index i, and indices must be in (shard, row) order (as a
    `PackedDataset` is); a block never spans two shards. Reads stay local (a block is `block`
    rows of one file), while a window mixes window/block blocks from random places in the
    dataset. `block=1` is a random permutation; `window<=1` keeps blocks whole.
    """
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    shard = np.asarray(shard_idx)
    n = len(shard)
    rng = seeded_rng(seed, epoch)
    change = np.flatnonzero(np.diff(shard)) + 1
    run_starts = np.concatenate([[0], change]).astype(np.int64) if n else np.zeros(0, np.int64)
    run_ends = np.concatenate([change, [n]]).astype(np.int64) if n else np.zeros(0, np.int64)
    per_run = -(-(run_ends - run_starts) // block)
    first_block = np.cumsum(per_run) - per_run
    k = np.arange(per_run.sum(), dtype=np.int64) - np.repeat(first_block, per_run)
    starts = np.repeat(run_starts, per_run) + block * k
    ends = np.minimum(starts + block, np.repeat(run_ends, per_run))
    chosen = rng.permutation(len(starts))
    starts, sizes = starts[chosen], (ends - starts)[chosen]
    # Concatenate the ranges [start, start + size) without a Python loop.
    order = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes) + np.arange(n, dtype=np.int64)
    if window > 1 and n:
        keys = rng.random(n)
        order = order[np.lexsort((keys, np.arange(n) // window))]
    return order


def balanced_order(
    labels: NDArray[np.integer], seed: int, epoch: int, num_samples: int | None = None
) -> Order:
    """`num_samples` indices (default: len(labels)) with every present class equally often.

    Each class contributes floor or ceil of num_samples / classes indices; inside a class,
    indices cycle through fresh random permutations, so a small class repeats only after all of
    its samples were used and a large class is subsampled without repeats. The result is then
    shuffled.
    """
    labels = np.asarray(labels)
    total = len(labels) if num_samples is None else int(num_samples)
    if total < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    present = np.unique(labels)
    if total == 0 or len(present) == 0:
        return np.zeros(0, dtype=np.int64)
    rng = seeded_rng(seed, epoch)
    per_class = -(-total // len(present))
    columns = []
    for c in rng.permutation(present):
        members = np.flatnonzero(labels == c)
        cycles = -(-per_class // len(members))
        drawn = np.concatenate([rng.permutation(members) for _ in range(cycles)])
        columns.append(drawn[:per_class])
    # Round-robin over classes (in random class order), so truncating to `total` leaves counts
    # that differ by at most one.
    interleaved = np.stack(columns, axis=1).reshape(-1)[:total]
    return rng.permutation(interleaved).astype(np.int64)


def shard_group_order(
    shard_idx: NDArray[np.integer], seed: int, epoch: int, group: int = 2
) -> Order:
    """Shards in a random order, `group` at a time, each group's rows shuffled together.

    The order for a cache that holds a few shards (`PackedDataset.open(url, cache_limit=)`):
    a batch reads at most `group` shards (twice that where two groups meet), and a shard is
    done with once its group is, while every sample still moves between epochs. `shard_idx` is
    `PackedDataset.shard_idx` ((shard, row) order)."""
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    shard = np.asarray(shard_idx, dtype=np.int64)
    rng = seeded_rng(seed, epoch)
    shards = np.unique(shard)
    rank_of = np.empty(int(shards.max()) + 1 if len(shards) else 0, dtype=np.int64)
    rank_of[rng.permutation(shards)] = np.arange(len(shards))
    keys = rng.random(len(shard))
    return np.lexsort((keys, rank_of[shard] // group)).astype(np.int64)


def partition(order: Order, rank: int, world_size: int, drop_last: bool = False) -> Order:
    """Rank `rank`'s part of `order`: every world_size-th index, starting at `rank`.

    Parts are disjoint in position and equal in length. With `drop_last` the tail that does not
    divide evenly is dropped (the union is then a subset); otherwise the order is padded by
    repeating it from the start, as `DistributedSampler` does (the union is then all of it).
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in range for world size {world_size}")
    n = len(order)
    if drop_last:
        order = order[: n - n % world_size]
    elif n % world_size and n:
        pad = world_size - n % world_size
        order = np.concatenate([order, np.resize(order, pad)])
    return order[rank::world_size]
