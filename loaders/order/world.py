"""Rank and world size: explicit values win, then an initialised torch.distributed, then (0, 1).

A process that torchrun started (WORLD_SIZE > 1 in its environment) but that has not called
`init_process_group` yet is refused rather than read as rank 0 of 1: every rank would then
read the whole split.
"""

from __future__ import annotations

import os

import torch.distributed as dist


def rank_and_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size) for partitioning samples; checked to be a valid pair."""
    initialised = dist.is_available() and dist.is_initialized()
    if not initialised and (rank is None or world_size is None):
        launched = os.environ.get("WORLD_SIZE", "1")
        if launched.isdigit() and int(launched) > 1:
            raise RuntimeError(
                f"this process was launched as rank {os.environ.get('RANK', '?')} of {launched} "
                "(WORLD_SIZE is set, as torchrun does) but torch.distributed is not initialised: "
                "call init_process_group before building loaders, or pass rank= and world_size="
            )
    if world_size is None:
        world_size = dist.get_world_size() if initialised else 1
    if rank is None:
        rank = dist.get_rank() if initialised else 0
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in range for world size {world_size}")
    return rank, world_size
