"""Torch samplers over the pure orders of `loaders.orders`: distributed, epoch-aware, resumable.

Each sampler yields this rank's part of a global order computed from (seed, epoch); the part is
`partition(order, rank, world_size, drop_last)`, so ranks never overlap and all have the same
length (padding by repetition unless `drop_last`). Rank and world size come from an initialised
torch.distributed unless given. State is plain ints: {seed, epoch, position, rank, world_size}.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
from numpy.typing import NDArray
from torch.utils.data import Sampler

from loaders.dist import rank_and_world
from loaders.orders import (
    Order,
    balanced_order,
    block_order,
    partition,
    random_order,
    sequential_order,
)


class OrderSampler(Sampler[int]):
    """Base class: subclasses say how long the global order is and how to compute it."""

    def __init__(
        self,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        self.seed = int(seed)
        self.epoch = 0
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.drop_last = drop_last
        self._resume_at = 0

    def global_length(self) -> int:
        raise NotImplementedError

    def global_order(self, epoch: int) -> Order:
        """The order of all ranks together for `epoch` (a pure function of seed and epoch)."""
        raise NotImplementedError

    def order(self) -> Order:
        """This rank's indices for the current epoch, from the start."""
        return partition(self.global_order(self.epoch), self.rank, self.world_size, self.drop_last)

    def rank_length(self) -> int:
        """Samples per rank in a whole epoch."""
        n, w = self.global_length(), self.world_size
        return n // w if self.drop_last else -(-n // w)

    def __len__(self) -> int:
        return self.rank_length() - self._resume_at

    def __iter__(self) -> Iterator[int]:
        return iter(self.remaining().tolist())

    def remaining(self) -> Order:
        """What the next iteration yields: this epoch's order from the resume point on.

        NOTE: a resume point applies to the next iteration only; the one after starts afresh.
        """
        start, self._resume_at = self._resume_at, 0
        return self.order()[start:]

    def set_epoch(self, epoch: int) -> None:
        """Select the order of `epoch` (call before each epoch, as with DistributedSampler)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = int(epoch)
        self._resume_at = 0

    def resume(self, epoch: int, position: int) -> None:
        """Make the next iteration yield this rank's order for `epoch` from `position` on."""
        self.set_epoch(epoch)
        if not 0 <= position <= self.rank_length():
            raise ValueError(f"position {position} is outside 0..{self.rank_length()}")
        self._resume_at = int(position)

    def state_dict(self) -> dict[str, int]:
        """Plain ints; `position` is where the next iteration starts (see `PackedLoader`)."""
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self._resume_at,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        if (state["rank"], state["world_size"]) != (self.rank, self.world_size):
            raise ValueError(
                f"state is for rank {state['rank']} of {state['world_size']}, this sampler is "
                f"rank {self.rank} of {self.world_size}; resume with the same world size"
            )
        self.seed = int(state["seed"])
        self.resume(int(state["epoch"]), int(state["position"]))


class OrderBatches(Sampler[Order]):
    """A batch sampler over an `OrderSampler`: batches are slices of its order array.

    What `BatchSampler(sampler, batch_size, drop_last)` yields, as numpy arrays instead of
    lists built one int at a time: `__getitems__` takes them as they are, and with workers each
    travels to a worker as one small array.
    """

    def __init__(self, sampler: OrderSampler, batch_size: int, drop_last: bool = False) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[Order]:
        # NOTE: a generator, so nothing happens until the first batch is asked for: DataLoader
        # calls iter() on its batch sampler twice when it starts workers, and only the second
        # is used; an eager first call would spend the sampler's resume point.
        order, size = self.sampler.remaining(), self.batch_size
        end = len(order) - len(order) % size if self.drop_last else len(order)
        for start in range(0, end, size):
            yield order[start : start + size]

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class ShuffleSampler(OrderSampler):
    """A random permutation per epoch (or the sequential order): DistributedSampler's behaviour."""

    def __init__(
        self,
        n: int,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(seed, rank, world_size, drop_last)
        self.n = int(n)
        self.shuffle = shuffle

    def global_length(self) -> int:
        return self.n

    def global_order(self, epoch: int) -> Order:
        return random_order(self.n, self.seed, epoch) if self.shuffle else sequential_order(self.n)


class BlockShuffleSampler(OrderSampler):
    """Quasi-random order that reads `block` neighbouring rows at a time (see `block_order`).

    `shard_idx` is `PackedDataset.shard_idx`. Pick `window` a few times the batch size:
    `loaders.quality.shuffle_quality` tells how close the batches' class mix is to random.
    """

    def __init__(
        self,
        shard_idx: NDArray[np.integer],
        block: int = 16,
        window: int = 4096,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(seed, rank, world_size, drop_last)
        self.shard_idx = shard_idx
        self.block = block
        self.window = window

    def global_length(self) -> int:
        return len(self.shard_idx)

    def global_order(self, epoch: int) -> Order:
        return block_order(self.shard_idx, self.seed, epoch, self.block, self.window)


class ClassBalancedSampler(OrderSampler):
    """Every class equally often per epoch, from manifest labels (see `balanced_order`).

    `labels` is `PackedDataset.labels`; `num_samples` defaults to the dataset length.
    """

    def __init__(
        self,
        labels: NDArray[np.integer],
        num_samples: int | None = None,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(seed, rank, world_size, drop_last)
        self.labels = labels
        self.num_samples = len(labels) if num_samples is None else int(num_samples)

    def global_length(self) -> int:
        return self.num_samples

    def global_order(self, epoch: int) -> Order:
        return balanced_order(self.labels, self.seed, epoch, self.num_samples)
