"""Two real processes (gloo on CPU): ranks read disjoint, equal parts whose union is the split."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from loaders import PackedDataset, make_loader
from loaders.order.world import rank_and_world
from tests.helpers.packed import make_packed

WORLD = 2


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def positions_read(ds: PackedDataset, images: torch.Tensor) -> list[int]:
    """Manifest position of each image, found by content: checks what was actually read."""
    everything = ds.gather(list(range(len(ds)))).images.reshape(len(ds), -1)
    found = []
    for row in images.reshape(len(images), -1):
        index = int(torch.nonzero((everything == row).all(dim=1))[0])
        found.append(int(ds.selection.positions[index]))
    return found


def write_gathered(out: str, value: object) -> None:
    """Every rank's `value`, gathered and written by rank 0 as a JSON list in rank order."""
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(gathered))


def run_rank(rank: int, root: str, port: int, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    try:
        assert rank_and_world() == (rank, WORLD)
        ds = PackedDataset.open(root, split="train")
        seen = {}
        for drop_last in (False, True):
            loader = make_loader(ds, batch_size=4, shuffle=True, seed=7, drop_last=drop_last)
            loader.set_epoch(1)
            seen[str(drop_last)] = [p for b in loader for p in positions_read(ds, b.images)]
        write_gathered(out, seen)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_split_the_data(tmp_path: Path) -> None:
    packed = make_packed(tmp_path / "ds", shard_sizes=(9, 6, 12))
    out = tmp_path / "seen.json"
    mp.spawn(run_rank, args=(str(packed.root), free_port(), str(out)), nprocs=WORLD)
    ranks = json.loads(out.read_text())
    train = set(packed.indices("train"))
    n = len(train)

    padded = [r["False"] for r in ranks]
    assert len(padded[0]) == len(padded[1]) == -(-n // WORLD), "equal parts keep DDP in step"
    assert set(padded[0]) | set(padded[1]) == train
    assert len(set(padded[0]) & set(padded[1])) == WORLD * len(padded[0]) - n  # the padding

    dropped = [r["True"] for r in ranks]
    assert len(dropped[0]) == len(dropped[1]) == n // WORLD // 4 * 4  # whole batches only
    assert not set(dropped[0]) & set(dropped[1])
    assert set(dropped[0]) | set(dropped[1]) <= train
