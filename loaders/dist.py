"""Rank and world size: explicit values win, then an initialised torch.distributed, then (0, 1)."""

from __future__ import annotations

import torch.distributed as dist


def rank_and_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size) for partitioning samples; checked to be a valid pair."""
    initialised = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if initialised else 1
    if rank is None:
        rank = dist.get_rank() if initialised else 0
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in range for world size {world_size}")
    return rank, world_size
