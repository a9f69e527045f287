"""Torch samplers over the pure orders of `loaders.order.orders`: distributed, epoch-aware,
resumable.

Each sampler yields this rank's part of a global order computed from (seed, epoch); the part is
`partition(order, rank, world_size, drop_last)`, so ranks never overlap and all have the same
length (padding by repetition unless `drop_last`). Rank and world size come from an initialised
torch.distributed unless given. State is plain ints and strings (see `loaders.order.resume`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray
from torch.utils.data import DistributedSampler

from loaders.order.mixture_orders import Anchor, MixtureOrder, Schedule
from loaders.order.orders import (
    Order,
    balanced_order,
    block_order,
    partition,
    random_order,
    sequential_order,
    shard_group_order,
)
from loaders.order.resume import State, check_state, resume_point
from loaders.order.world import rank_and_world


class OrderSampler(DistributedSampler[int]):
    """Base class: subclasses say how long the global order is, how to compute it, and what it
    is (`describe`, checked when a state is loaded).

    A `DistributedSampler` in what it promises (each rank an equal, disjoint part of every
    epoch, `set_epoch`, `num_replicas`, `rank`, `num_samples`), so trainers that put one
    under a loader that has none (Lightning) see that it has one. DistributedSampler's own
    constructor is not called: it needs a dataset and computes nothing used here.
    """

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
        self.num_replicas = self.world_size
        self.drop_last = drop_last
        self.shuffle = True
        """DistributedSampler's flag; an order that is not random sets it False."""
        self._start = 0
        """Where the epoch's segment begins in the global order (after an elastic resume)."""
        self._resume_at = 0
        self._pending = False
        """Whether a loaded state waits for the next iteration."""
        self.epoch_calls = 0
        """How many times an epoch was chosen (`set_epoch`, a loaded state): a batch sampler
        advances the epoch by itself only where none was chosen since its last pass."""
        self.named: bool | str | None = None
        """The `shuffle=` it was made from by name (`loaders.loader.named_orders`), for a run's
        record."""

    def global_length(self) -> int:
        raise NotImplementedError

    def global_order(self, epoch: int) -> Order:
        """The order of all ranks together for `epoch` (a pure function of seed and epoch)."""
        raise NotImplementedError

    def describe(self) -> str:
        """The order and its parameters, e.g. "random(n=1000)": a state must match it."""
        return f"{type(self).__name__}(n={self.global_length()})"

    def order(self) -> Order:
        """This rank's indices for the current epoch's segment, from its start."""
        segment = self.global_order(self.epoch)[self._start :]
        return partition(segment, self.rank, self.world_size, self.drop_last)

    def rank_length(self) -> int:
        """Samples per rank in the current epoch's segment (the whole epoch unless resumed)."""
        n, w = max(self.global_length() - self._start, 0), self.world_size
        return n // w if self.drop_last else -(-n // w)

    def left(self) -> int:
        """Samples the next iteration yields: the epoch's, less those a loaded state skips."""
        return self.rank_length() - self._resume_at

    @property
    def num_samples(self) -> int:  # type: ignore[override]
        """Samples per rank in a whole epoch (DistributedSampler's name)."""
        n, w = self.global_length(), self.world_size
        return n // w if self.drop_last else -(-n // w)

    @property
    def total_size(self) -> int:  # type: ignore[override]
        """Samples of all ranks in a whole epoch, padding included (DistributedSampler's name)."""
        return self.num_samples * self.world_size

    def __len__(self) -> int:
        """A whole epoch's samples on this rank, as DistributedSampler's: trainers size their
        epoch loops by it; an epoch resumed from a state yields the `left()` of them."""
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        return iter(self.remaining().tolist())

    def remaining(self) -> Order:
        """What the next iteration yields: this epoch's order from the resume point on.

        NOTE: a resume point applies to the next iteration only; the one after starts afresh.
        """
        order = self.order()[self._resume_at :]
        self._start = self._resume_at = 0
        self._pending = False
        return order

    def set_epoch(self, epoch: int) -> None:
        """Select the order of `epoch` (call before each epoch, as with DistributedSampler).

        A loaded state's epoch keeps its resume point, so `load_state_dict` then `set_epoch`
        (the usual loop) and the reverse order both resume; another epoch while a state waits
        mid-epoch is refused, since it would silently drop the resume point.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self.epoch_calls += 1
        if self._pending:
            if epoch == self.epoch:
                return
            if (self._resume_at or self._start) and self.left():
                raise ValueError(
                    f"a loaded state resumes epoch {self.epoch} at position {self._resume_at}; "
                    f"call set_epoch({self.epoch}) before iterating, or load no state to start "
                    f"epoch {epoch} afresh"
                )
        self.epoch = int(epoch)
        self._start = self._resume_at = 0
        self._pending = False

    def advance(self) -> None:
        """Go on to the next epoch, as after a whole pass with no `set_epoch` (NOTE [ epochs
        advance by themselves ] in `loaders.order.run_batches`); not a choice of epoch."""
        self.epoch += 1
        self._start = self._resume_at = 0
        self._pending = False

    def resume(self, epoch: int, position: int, start: int = 0) -> None:
        """Make the next iteration yield this rank's order for `epoch` from `position` on, in
        the segment of the global order that begins at `start`."""
        self._pending = False
        self.set_epoch(epoch)
        if not 0 <= start <= self.global_length():
            raise ValueError(f"start {start} is outside 0..{self.global_length()}")
        self._start = int(start)
        if not 0 <= position <= self.rank_length():
            self._start = 0
            raise ValueError(f"position {position} is outside 0..{self.rank_length()}")
        self._resume_at = int(position)
        self._pending = True

    def identity(self) -> dict[str, int | str]:
        """The fields a state must match to be loaded here (see `loaders.order.resume`)."""
        return {"order": self.describe(), "seed": self.seed, "drop_last": int(self.drop_last)}

    def state_dict(self) -> State:
        """Plain ints and strings; `position` is where the next iteration starts in this rank's
        part (see `PackedLoader` for the samples delivered so far)."""
        return {
            **self.identity(),
            "epoch": self.epoch,
            "start": self._start,
            "position": self._resume_at,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume `state`'s epoch where it stopped; from any rank's state, with any world size
        (see NOTE [ elastic resume ] in `loaders.order.resume`)."""
        check_state(state, self.identity(), PROGRESS)
        start, position = resume_point(
            state["start"],
            state["position"],
            state["world_size"],
            self.world_size,
            self.global_length(),
        )
        self.resume(state["epoch"], position, start)


PROGRESS = ("epoch", "start", "position", "rank", "world_size")
"""The progress fields of a sampler's state."""


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
        self.shuffle = bool(shuffle)

    def global_length(self) -> int:
        return self.n

    def global_order(self, epoch: int) -> Order:
        return random_order(self.n, self.seed, epoch) if self.shuffle else sequential_order(self.n)

    def describe(self) -> str:
        return f"{'random' if self.shuffle else 'sequential'}(n={self.n})"


class ShardGroupSampler(OrderSampler):
    """Shards in a random order, `group` at a time, rows shuffled within a group
    (`shard_group_order`): what a cache smaller than the dataset can follow."""

    def __init__(
        self,
        shard_idx: NDArray[np.integer],
        group: int = 2,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(seed, rank, world_size, drop_last)
        self.shard_idx = shard_idx
        self.group = group

    def global_length(self) -> int:
        return len(self.shard_idx)

    def global_order(self, epoch: int) -> Order:
        return shard_group_order(self.shard_idx, self.seed, epoch, self.group)

    def describe(self) -> str:
        return f"shard_groups(n={len(self.shard_idx)}, group={self.group})"


class BlockShuffleSampler(OrderSampler):
    """Quasi-random order that reads `block` neighbouring rows at a time (see `block_order`).

    `shard_idx` is `PackedDataset.shard_idx`. Pick `window` a few times the batch size:
    `loaders.order.quality.shuffle_quality` tells how close the batches' class mix is to random.
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

    def describe(self) -> str:
        return f"blocks(n={len(self.shard_idx)}, block={self.block}, window={self.window})"


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
        self.epoch_samples = len(labels) if num_samples is None else int(num_samples)
        """Samples of all ranks in an epoch (`num_samples` is, as for any
        DistributedSampler, this rank's)."""

    def global_length(self) -> int:
        return self.epoch_samples

    def global_order(self, epoch: int) -> Order:
        return balanced_order(self.labels, self.seed, epoch, self.epoch_samples)

    def describe(self) -> str:
        return f"balanced(n={len(self.labels)}, num_samples={self.epoch_samples})"


class MixtureSampler(OrderSampler):
    """The order of a `Mixture` (NOTE [ mixture order ]): distributed, epoch-aware and resumable
    as every order sampler here. Its state also records where each member's stream stands, so
    a run resumed with other weights, a changed schedule or members appended at the end goes
    on from there: no sample of a member's epoch is repeated or skipped because of it."""

    def __init__(
        self,
        sizes: Sequence[int],
        schedule: Schedule,
        samples_per_epoch: int,
        batch_size: int,
        replacement: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        members: tuple[str, ...] = (),
    ) -> None:
        super().__init__(seed, rank, world_size, drop_last)
        self.sizes = tuple(int(s) for s in sizes)
        self.members = members if members else tuple(f"size {n}" for n in self.sizes)
        """What a state must find again of each member (version, selection): a prefix."""
        self.samples_per_epoch = int(samples_per_epoch)
        self.replacement = bool(replacement)
        self.mix = MixtureOrder(
            self.sizes, schedule, samples_per_epoch, batch_size * self.world_size, self.seed,
            replacement,
        )  # fmt: skip

    def global_length(self) -> int:
        return self.samples_per_epoch

    def global_order(self, epoch: int) -> Order:
        return self.mix.order(epoch)

    def describe(self) -> str:
        return f"mixture(n={self.samples_per_epoch}, replacement={int(self.replacement)})"

    def state_dict(self) -> State:
        state = super().state_dict()
        state.update(self.progress(state))
        return state

    def progress(self, state: Mapping[str, Any]) -> dict[str, int | str]:
        """What a state adds for a mixture: each member's stream position at the state's
        global position, and the members' sizes (appending members is allowed, changing one
        is not)."""
        at = int(state["start"]) + int(state["position"]) * int(state["world_size"])
        at = min(at, self.samples_per_epoch)
        cursors = self.mix.cursors(int(state["epoch"]), at)
        return {"cursors": ",".join(map(str, cursors.tolist())), "members": ";".join(self.members)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for key in ("cursors", "members"):
            if key not in state:
                raise ValueError(f"loader state has no {key!r}: it is not a mixture's state")
        saved = str(state["members"]).split(";")
        if saved != list(self.members[: len(saved)]):
            raise ValueError(
                f"loader state is for mixture members {saved}, this mixture's are "
                f"{list(self.members)}: members may be appended, not changed or removed "
                "(each is its dataset version and selection)"
            )
        cursors = _numbers(state, "cursors")
        if len(cursors) != len(saved):
            raise ValueError(
                f"loader state field 'cursors' has {len(cursors)} values for {len(saved)} members"
            )
        super().load_state_dict(state)
        at = int(state["start"]) + int(state["position"]) * int(state["world_size"])
        padded = (*cursors, *([0] * (len(self.sizes) - len(cursors))))
        self.mix.anchor = Anchor(int(state["epoch"]), min(at, self.samples_per_epoch), padded)
        self.mix._starts = {}


def _numbers(state: Mapping[str, Any], key: str) -> list[int]:
    value = state.get(key)
    try:
        return [int(v) for v in str(value).split(",")] if value is not None else []
    except ValueError:
        raise ValueError(f"loader state field {key!r} is not numbers: {value!r}") from None
