"""Mixtures: several datasets or views read as one, each sample's source drawn by weight, with
every guarantee of a single dataset's loader (batched gathers, workers, pinned memory, exact
and elastic resume, DDP shares).

NOTE [ mixture order ]: an epoch of the mixture is `samples_per_epoch` positions (by default
the members' sizes summed). Each position's member is a uniform draw from (seed, epoch, the
position's block) against the weights in effect at its global step (`schedule`), so each
batch's composition and order is a pure function of (members' sizes, schedule, seed, epoch,
step), recomputed anywhere as the other orders are; and a draw never depends on where a run
started, only the weights it meets do. Each member is read as its own stream of epochs:
permutations of its indices drawn from (seed, member, member epoch), consumed in turn
(`replacement=False`: within a member's epoch no sample repeats and none is skipped), or
independent draws (`replacement=True`). A member's epoch is not the mixture's: a member of
weight 0.5 and a tenth of the samples goes through its own epoch about five times per mixture
epoch, one of weight 0.1 and half the samples a fifth of one.

NOTE [ resuming a mixture ]: where each member's stream stands is counted from the draws
(epoch 0 on, one pass over the positions before the one asked for), and a resume state records
it at the state's global position (`cursors`). The resumed order goes on from those cursors
under the resumed run's schedule (an `Anchor`): with the same schedule that is exactly the
uninterrupted order; with another one (other weights, a new phase, members appended at the
end) it takes effect from the resumed step, and no member's sample is repeated or skipped
because of the change. Positions before the anchor read as if run from the start under the
new schedule; only padding (a rank short of its share) can use them.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from torch.utils.data import Dataset

from etl.format.ragged import channels_of, sides_of
from etl.format.rowsums import RowChecksums
from loaders.batches import (
    SIZE_COLUMNS,
    AnyBatch,
    BatchMemory,
    ColumnBatch,
    Columns,
    IndexedBatch,
    Samples,
)
from loaders.catalog import ShardSet
from loaders.dataset import PackedDataset
from loaders.orders import Order
from loaders.reader import ShardReader
from loaders.resume import State
from loaders.rowchecks import shared, unseen
from loaders.samplers import OrderSampler

_MIX = 0x6D6978  # "mix": keeps these draws apart from every other order's

_BLOCK = 1 << 16
"""Positions whose uniform draws come from one generator (so any stretch is cheap to redo)."""

Weights = NDArray[np.float64]
Schedule = tuple[tuple[int, Weights], ...]
"""(first step, weights) pairs, steps ascending, the first at step 0: the weights in effect
from each step on."""


def schedule_of(
    weights: Sequence[float], changes: Mapping[int, Sequence[float]] | None
) -> Schedule:
    """The schedule of `weights` from step 0 and `changes` ({step: weights}), each weight
    vector checked (>= 0, not all 0) and normalised. A later vector may be longer: members
    appended since start with weight 0 until then."""
    entries = {0: weights, **(changes or {})}
    found: list[tuple[int, Weights]] = []
    width = 0
    for step in sorted(entries):
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"a schedule's steps are ints >= 0, got {step!r}")
        vector = np.asarray(entries[step], dtype=np.float64)
        if vector.ndim != 1 or not np.isfinite(vector).all() or (vector < 0).any():
            raise ValueError(
                f"weights must be numbers >= 0, got {list(entries[step])} at step {step}"
            )
        if vector.sum() <= 0:
            raise ValueError(f"weights at step {step} are all 0")
        width = max(width, len(vector))
        found.append((step, vector / vector.sum()))
    return tuple((step, np.pad(w, (0, width - len(w)))) for step, w in found)


def draw_members(
    schedule: Schedule, seed: int, epoch: int, start: int, stop: int, per_epoch: int, step_size: int
) -> Order:
    """The member of each position `start` .. `stop` of a mixture epoch: a uniform draw per
    position from (seed, epoch, its block), against the weights in effect at its step (a
    global batch of `step_size` positions). A position's draw never depends on where a run
    started or resumed: only the weights it meets do."""
    if stop <= start:
        return np.zeros(0, dtype=np.int64)
    positions = np.arange(start, stop, dtype=np.int64)
    uniform = np.empty(len(positions))
    for block in range(start // _BLOCK, (stop - 1) // _BLOCK + 1):
        rng = np.random.default_rng([seed, epoch, block, _MIX])
        lo, hi = max(start, block * _BLOCK), min(stop, (block + 1) * _BLOCK)
        drawn = rng.random(hi - block * _BLOCK)  # a prefix of the block's draws: the same
        uniform[lo - start : hi - start] = drawn[lo - block * _BLOCK : hi - block * _BLOCK]
    steps = (epoch * per_epoch + positions) // step_size
    firsts = np.array([first for first, _ in schedule])
    which = np.searchsorted(firsts, steps, side="right") - 1
    members = np.empty(len(positions), dtype=np.int64)
    for k in np.unique(which).tolist():
        here = which == k
        bounds = np.cumsum(schedule[k][1])
        bounds[-1] = 1.0  # rounding never leaves a draw past the last member
        members[here] = np.searchsorted(bounds, uniform[here], side="right")
    return members


def member_stream(
    size: int, member: int, seed: int, start: int, count: int, replacement: bool
) -> Order:
    """Positions `start` .. `start + count` of member `member`'s stream of local indices:
    its epochs' permutations end to end, or (`replacement`) independent draws in blocks."""
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    positions = np.arange(start, start + count, dtype=np.int64)
    block = size if not replacement else _BLOCK
    found = np.empty(count, dtype=np.int64)
    for part in np.unique(positions // block):
        rng = np.random.default_rng([seed, member, int(part), _MIX, int(replacement)])
        drawn = rng.integers(0, size, block) if replacement else rng.permutation(size)
        here = positions // block == part
        found[here] = drawn[positions[here] % block]
    return found


@dataclass(frozen=True)
class Anchor:
    """Where each member's stream stood at one global position of one mixture epoch (what a
    resume state records): the order after it continues from there, whatever the weights
    were before it."""

    epoch: int = 0
    position: int = 0
    cursors: tuple[int, ...] = ()


class MixtureOrder:
    """The mixture's global orders (NOTE [ mixture order ]), epoch by epoch, from an anchor."""

    def __init__(
        self,
        sizes: Sequence[int],
        schedule: Schedule,
        per_epoch: int,
        step_size: int,
        seed: int,
        replacement: bool = False,
    ) -> None:
        self.sizes = tuple(int(s) for s in sizes)
        self.schedule = schedule
        self.per_epoch, self.step_size = int(per_epoch), int(step_size)
        self.seed, self.replacement = int(seed), bool(replacement)
        self.anchor = Anchor(cursors=(0,) * len(self.sizes))
        self._starts: dict[int, Order] = {}
        """Cursors at the start of each epoch after the anchor's, as computed."""

    def counts(self, epoch: int, start: int, stop: int) -> Order:
        members = self._members(epoch, start, stop)
        return np.bincount(members, minlength=len(self.sizes)).astype(np.int64)

    def _members(self, epoch: int, start: int, stop: int) -> Order:
        return draw_members(
            self.schedule, self.seed, epoch, start, stop, self.per_epoch, self.step_size
        )

    def _fresh(self) -> MixtureOrder:
        """The same order without an anchor: as if run from the start with this schedule."""
        return MixtureOrder(
            self.sizes, self.schedule, self.per_epoch, self.step_size, self.seed, self.replacement
        )

    def cursors(self, epoch: int, position: int) -> Order:
        """Where each member's stream stands at `position` of `epoch` (before the anchor: as
        if run from the start with this schedule, as `order` has it)."""
        a = self.anchor
        if (epoch, position) < (a.epoch, a.position):
            return self._fresh().cursors(epoch, position)
        at_anchor = np.asarray(a.cursors, dtype=np.int64)
        if epoch == a.epoch:
            return at_anchor + self.counts(epoch, a.position, position)
        if epoch not in self._starts:
            # NOTE: a loop, not a recursion, from the latest epoch start known
            known = [e for e in self._starts if e < epoch]
            if known:
                last = max(known)
                start = self._starts[last] + self.counts(last, 0, self.per_epoch)
            else:
                last = a.epoch
                start = at_anchor + self.counts(last, a.position, self.per_epoch)
            for between in range(last + 1, epoch):
                start = start + self.counts(between, 0, self.per_epoch)
            self._starts = {epoch: start}  # one kept: epochs are asked for in order
        return self._starts[epoch] + self.counts(epoch, 0, position)

    def order(self, epoch: int) -> Order:
        """The global order of `epoch`: indices into the members' concatenation. Positions
        before the anchor (in its epoch) are the order as if run from the start with this
        schedule: only padding can use them."""
        a = self.anchor
        offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        pieces = []
        if epoch < a.epoch or (epoch == a.epoch and a.position > 0):
            stop = self.per_epoch if epoch < a.epoch else a.position
            pieces.append((0, stop, self._fresh().cursors(epoch, 0)))
        if epoch >= a.epoch:
            first = a.position if epoch == a.epoch else 0
            pieces.append((first, self.per_epoch, self.cursors(epoch, first)))
        found = np.empty(self.per_epoch, dtype=np.int64)
        for start, stop, cursors in pieces:
            members = self._members(epoch, start, stop)
            for m, size in enumerate(self.sizes):
                at = np.flatnonzero(members == m)
                stream = member_stream(
                    size, m, self.seed, int(cursors[m]), len(at), self.replacement
                )
                found[start + at] = offsets[m] + stream
        return found


def mixture_order(
    sizes: Sequence[int],
    weights: Sequence[float],
    total: int,
    seed: int,
    epoch: int,
    replacement: bool = False,
) -> Order:
    """The global order of a mixture epoch of `total` positions with fixed `weights`: indices
    into the members' concatenation (member m's local index i is `sum(sizes[:m]) + i`)."""
    schedule = schedule_of(weights, None)
    return MixtureOrder(sizes, schedule, total, total, seed, replacement).order(epoch)


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


class Mixture(Dataset[tuple[Any, ...]]):
    """Datasets (or views opened as datasets) read as one by weight: give it to `make_loader`
    as a dataset, and its order is the mixture's (`MixtureSampler`).

    Members must store one layout and channel count. Members of several sample sizes are
    padded into one batch (the largest of each side) that says each sample's own size
    (`SIZE_COLUMNS`), which `DeviceLoader`'s crops draw from. Labels are renumbered into
    `classes`, the members' class lists merged in order, so one label means one class name
    across members. `member_of(indices)` says which member each sample of a batch came from
    (`with_indices=True`).

    `schedule` ({step: weights}) changes the weights from a global step on (a step is a
    global batch: batch_size x world size samples): a curriculum, an annealing phase. A run
    resumed with another schedule, other weights, or members appended at the end goes on
    from where each member's stream stood, under the new weights from the resumed step."""

    def __init__(
        self,
        members: Sequence[PackedDataset],
        weights: Sequence[float],
        samples_per_epoch: int | None = None,
        replacement: bool = False,
        schedule: Mapping[int, Sequence[float]] | None = None,
    ) -> None:
        if len(members) < 1 or len(members) != len(weights):
            raise ValueError(
                f"a mixture needs one weight per member: {len(members)} members, "
                f"{len(weights)} weights"
            )
        self.schedule = schedule_of(weights, schedule)
        for step, vector in self.schedule:
            if len(vector) > len(members):
                raise ValueError(
                    f"weights at step {step} name {len(vector)} members of {len(members)}"
                )
            empty = [i for i, m in enumerate(members) if len(m) == 0 and vector[i] > 0]
            if empty:
                raise ValueError(f"member {empty[0]} has no sample but a weight above 0")
        layouts = {m.layout for m in members}
        channels = {channels_of(m.sample_shape, m.layout) for m in members}
        if len(layouts) > 1 or len(channels) > 1:
            raise ValueError(
                f"members store {sorted(layouts)} samples of {sorted(channels)} channels: a "
                "batch holds one layout and one channel count; pack them alike"
            )
        ragged = any(m.selection.places is not None for m in members)
        self.sizes_differ = ragged or len({m.sample_shape for m in members}) > 1
        """Members store samples of several sizes (several shapes, or samples that keep their
        aspect ratio): batches are padded to the largest, or hold them back to back, and carry
        each sample's size (see `gather`)."""
        self._shape = tuple(int(d) for d in np.max([m.sample_shape for m in members], axis=0))
        self.members = tuple(members)
        self.weights = self.schedule[0][1]
        self.sizes = tuple(len(m) for m in members)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.samples_per_epoch = int(samples_per_epoch or sum(self.sizes))
        if self.samples_per_epoch < 1:
            raise ValueError(f"samples_per_epoch must be >= 1, got {samples_per_epoch}")
        self.replacement = bool(replacement)
        classes = list(dict.fromkeys(c for m in members for c in m.classes))
        self.classes = tuple(classes)
        self._labels = [
            np.asarray([classes.index(c) for c in m.classes], dtype=np.int64) for m in members
        ]
        self._joined = _joined(self.members, self._labels)
        self.memory = BatchMemory()
        self.with_indices = False

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The members' sample shape; with several sizes, the largest of each side (the
        padded batch's)."""
        return self._shape

    @property
    def layout(self) -> str:
        return self.members[0].layout

    def sampler(
        self,
        seed: int,
        rank: int | None,
        world_size: int | None,
        drop_last: bool,
        batch_size: int = 1,
    ) -> MixtureSampler:
        """The mixture's order for a loader of `batch_size` a rank."""
        return MixtureSampler(
            self.sizes,
            self.schedule,
            self.samples_per_epoch,
            batch_size,
            self.replacement,
            seed,
            rank,
            world_size,
            drop_last,
            tuple(self.member_prints()),
        )

    def member_prints(self) -> list[str]:
        """Each member's version and selection (and view) fingerprint: a state is refused by
        a mixture whose members differ, but may have members appended."""
        return [
            hashlib.blake2b(
                f"{m.selection.version}:{m.selection.fingerprint}:{m.selection.view}".encode(),
                digest_size=6,
            ).hexdigest()
            for m in self.members
        ]

    def preview(self, steps: int, batch_size: int = 256, seed: int = 0) -> dict[str, Any]:
        """What the first `steps` global batches of `batch_size` would hold, before training:
        each member's share (and its weight at step 0), and samples per member and class.
        Computed from the order alone: no pixel is read."""
        sampler = self.sampler(seed, 0, 1, False, batch_size)
        wanted, epoch, have = steps * batch_size, 0, 0
        taken: list[Order] = []
        while have < wanted:
            taken.append(sampler.global_order(epoch)[: wanted - have])
            have += len(taken[-1])
            epoch += 1
        order = np.concatenate(taken) if taken else np.zeros(0, dtype=np.int64)
        member = self.member_of(order)
        counts: list[dict[str, int]] = []
        for m, dataset in enumerate(self.members):
            local = order[member == m] - self.offsets[m]
            labels = dataset.selection.labels[local]
            found = np.bincount(labels, minlength=len(dataset.classes))
            counts.append({c: int(n) for c, n in zip(dataset.classes, found, strict=True) if n})
        shares = np.bincount(member, minlength=len(self.members)) / max(len(order), 1)
        return {
            "samples": len(order),
            "share": [float(s) for s in shares],
            "weight": [float(w) for w in self.weights],
            "counts": counts,
        }

    def sheet(self, batches: int = 2, batch_size: int = 8, seed: int = 0) -> Any:
        """A contact sheet of the first `batches` batches (`etl.explore.drawing`, which needs
        Pillow: the `etl` extra), each cell captioned with its member and class."""
        from etl.explore.drawing import Cell, draw_sheet  # NOTE: Pillow, here only
        from etl.explore.view import to_image

        order = self.sampler(seed, 0, 1, False, batch_size).global_order(0)
        chosen = order[: batches * batch_size]
        batch = self.with_memory(BatchMemory(), with_indices=True).gather(chosen)
        assert isinstance(batch, IndexedBatch | ColumnBatch), "asked with_indices"
        cells = [
            Cell(
                image=to_image(batch.images[i].numpy(), self.layout),
                caption=(f"member {m}", self.classes[int(batch.labels[i])]),
                info={"member": m, "index": int(batch.indices[i])},
            )
            for i, m in enumerate(self.member_of(batch.indices).tolist())
        ]
        return draw_sheet(cells, columns=batch_size, title=f"{batches} batches of {batch_size}")

    def member_of(self, indices: Any) -> NDArray[np.int64]:
        """The member each mixture index belongs to."""
        index = np.asarray(indices, dtype=np.int64)
        return np.searchsorted(self.offsets[1:], index, side="right").astype(np.int64)

    def with_memory(self, memory: BatchMemory, with_indices: bool = False) -> Mixture:
        twin = copy.copy(self)
        twin.memory = memory
        twin.with_indices = with_indices
        return twin

    def __getitems__(self, indices: Sequence[int]) -> Samples:
        return Samples(self.gather(indices))

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return Samples(self.gather([index]))[0]

    def gather(self, indices: Sequence[int] | NDArray[np.integer]) -> AnyBatch:
        """A batch of mixture indices in one buffer: in their order with one gather across
        every member's shards (`_Joined`), or, where members cannot share a reader (in object
        storage, `verify="rows"`, other reader settings), grouped by member, one gather each
        (the order within a member kept)."""
        index = np.asarray(indices, dtype=np.int64)
        if len(index) and (index.min() < 0 or index.max() >= len(self)):
            raise IndexError(f"index out of range for a mixture of {len(self)} samples")
        given = index if self.with_indices else None
        joined = self._joined
        if joined is not None:
            shard_idx, rows = joined.shard_idx[index], joined.rows[index]
            write = partial(joined.reader.gather, shard_idx, rows)
            shape: tuple[int, ...] = (len(index), *self.sample_shape)
            return self.memory.batch(shape, joined.labels[index], write, given)
        member = self.member_of(index)
        grouped = np.argsort(member, kind="stable")
        index, member = index[grouped], member[grouped]
        bounds = np.searchsorted(member, np.arange(len(self.members) + 1))
        labels = np.empty(len(index), dtype=np.int64)
        parts: list[_Part] = []
        for m, (start, stop) in enumerate(pairwise(bounds)):
            if start == stop:
                continue
            local = index[start:stop] - self.offsets[m]
            sel = self.members[m].selection
            labels[start:stop] = self._labels[m][sel.labels[local]]
            places = sel.places[local] if sel.places is not None else None
            parts.append((m, int(start), int(stop), sel.shard_idx[local], sel.rows[local], places))

        shape = (len(index), *self.sample_shape)
        if not self.sizes_differ:
            given = index if self.with_indices else None
            return self.memory.batch(shape, labels, partial(self._fill_rows, parts), given)
        heights, widths = (np.asarray(v, dtype=np.int64)[member] for v in self._sides())
        for _, start, stop, _, _, places in parts:
            if places is not None:
                heights[start:stop], widths[start:stop] = places[:, 1], places[:, 2]
        sizes: Columns = {SIZE_COLUMNS[0]: heights, SIZE_COLUMNS[1]: widths}
        if self.memory.back_to_back:
            channels = channels_of(self.sample_shape, self.layout)
            ends = np.concatenate([[0], np.cumsum(heights * widths * channels)])
            shape = (int(ends[-1]),)
            fill = partial(self._fill_back_to_back, parts, ends)
        else:
            fill = partial(self._fill_padded, parts)
        return self.memory.batch(shape, labels, fill, index, sizes)

    def _fill_rows(self, parts: list[_Part], out: NDArray[np.uint8]) -> None:
        """Each member's samples of a batch into their rows of `out` (members of one shape)."""
        for m, start, stop, shard_idx, rows, _ in parts:
            self.members[m].reader.gather(shard_idx, rows, out[start:stop])

    def _fill_padded(self, parts: list[_Part], out: NDArray[np.uint8]) -> None:
        """Each member's samples of a batch into their rows of `out`, padded to its shape."""
        for m, start, stop, shard_idx, rows, places in parts:
            reader = self.members[m].reader
            if places is not None:  # samples of their own size: padded where they go
                reader.gather_ragged(shard_idx, rows, places, self.layout, out[start:stop])
                continue
            own = np.empty((stop - start, *self.members[m].sample_shape), dtype=np.uint8)
            reader.gather(shard_idx, rows, own)
            padded = out[start:stop]
            padded.fill(0)
            padded[tuple(slice(0, d) for d in (stop - start, *own.shape[1:]))] = own

    def _fill_back_to_back(
        self, parts: list[_Part], ends: NDArray[np.int64], out: NDArray[np.uint8]
    ) -> None:
        """Each member's samples of a batch into 1-d `out`, one after another, sample k's
        bytes ending at `ends[k + 1]`."""
        for m, start, stop, shard_idx, rows, places in parts:
            reader = self.members[m].reader
            bytes_of = out[int(ends[start]) : int(ends[stop])]
            if places is not None:
                reader.gather_ragged(shard_idx, rows, places, self.layout, bytes_of)
            else:
                own = bytes_of.reshape(stop - start, *self.members[m].sample_shape)
                reader.gather(shard_idx, rows, own)

    def _sides(self) -> tuple[list[int], list[int]]:
        """Each member's stored height and width."""
        sides = [sides_of(m.sample_shape, m.layout) for m in self.members]
        return [h for h, _ in sides], [w for _, w in sides]

    def prefetch(self, indices: Sequence[int] | NDArray[np.integer]) -> None:
        index = np.asarray(indices, dtype=np.int64)
        if not len(index) or index.min() < 0 or index.max() >= len(self):
            return
        if self._joined is not None:
            j = self._joined
            j.reader.prefetch(j.shard_idx[index], j.rows[index])
            return
        member = self.member_of(index)
        for m in np.unique(member).tolist():
            self.members[m].prefetch(index[member == m] - self.offsets[m])


_Part = tuple[int, int, int, NDArray[np.int32], NDArray[np.int64], NDArray[np.int64] | None]
"""One member's samples of a batch: (member, start, stop in the batch, shard_idx, rows, places
or None where the member's samples are of one stored shape)."""


@dataclass(frozen=True, eq=False)
class _Joined:
    """Every member's shards in one `ShardSet` read by one `ShardReader` (the same files
    mapped once, whichever members select from them), and each mixture index's shard, row
    and label in it: a mixture batch is then one gather, as a single dataset's is."""

    reader: ShardReader
    shard_idx: NDArray[np.int32]
    rows: NDArray[np.int32]
    labels: NDArray[np.int64]


def checked_rows_of(
    joined: ShardSet, sets: Sequence[ShardSet], remaps: Sequence[NDArray[np.int32]]
) -> ShardSet:
    """`joined` with its members' row checksums (`sets`, each numbered by `remaps` into the
    joined shards), one entry a row read by several members, and flags of its own with
    `verify="once"`."""
    keys, digests, known = [], [], []
    for shards, remap in zip(sets, remaps, strict=True):
        assert shards.row_sums is not None
        member_keys, member_digests = shards.row_sums.arrays()
        shard = remap[member_keys >> 32].astype(np.int64)
        keys.append((shard << 32) | (member_keys & 0xFFFFFFFF))
        digests.append(member_digests)
        member_known = shards.row_sums.known
        known.append(np.ones(len(member_keys), bool) if member_known is None else member_known)
    merged, first = np.unique(np.concatenate(keys), return_index=True)
    all_known = np.concatenate(known)[first]
    sums = shared(
        RowChecksums(
            merged,
            np.concatenate(digests)[first],
            joined.algorithm,
            None if all_known.all() else all_known,
        )
    )
    return replace(
        joined,
        row_sums=sums,
        seen_rows=None if sets[0].seen_rows is None else unseen(len(merged)),
    )


def _joined(members: Sequence[PackedDataset], labels: Sequence[Order]) -> _Joined | None:
    """The joined reader of `members`, or None where they cannot share one: shards read
    through a bounded cache or by ranged GETs, rows checked by some members and not others
    (or "rows" and "once"), another checksum algorithm, or readers set up otherwise."""
    sets = [m.selection.shards for m in members]
    settings = {(m.reader.verify, m.reader.release_every, m.reader.readahead,
                 m.reader.drop_behind) for m in members}  # fmt: skip
    if len(settings) > 1 or len({s.algorithm for s in sets}) > 1:
        return None
    if len({s.sample_shape for s in sets}) > 1 or any(s.ragged for s in sets):
        return None  # a reader reads one sample shape
    if any(s.cache is not None or s.ranged is not None for s in sets):
        return None
    if len({(s.row_sums is None, s.seen_rows is None) for s in sets}) > 1:
        return None
    at: dict[tuple[Path, str], int] = {}
    names: list[str] = []
    roots: list[Path] = []
    versions: list[int] = []
    rows: list[int] = []
    sums: list[str] = []
    probes: list[tuple[int, str] | None] = []
    sizes: list[int | None] = []
    remaps = []
    for shards in sets:
        remap = []
        for i, name in enumerate(shards.names):
            key = (shards.root, name)
            if key not in at:
                at[key] = len(names)
                names.append(name)
                roots.append(shards.root)
                versions.append(shards.version)
                rows.append(int(shards.rows[i]))
                sums.append(shards.checksums[i])
                probes.append(shards.probes[i] if shards.probes else None)
                sizes.append(shards.sizes[i] if shards.sizes else None)
            remap.append(at[key])
        remaps.append(np.asarray(remap, dtype=np.int32))
    first = sets[0]
    joined = replace(
        first,
        names=tuple(names),
        rows=np.asarray(rows, dtype=np.int64),
        checksums=tuple(sums),
        probes=tuple(p for p in probes if p is not None) if all(probes) else (),
        sizes=tuple(s for s in sizes if s is not None) if all(s is not None for s in sizes)
        else (),
        roots=tuple(roots),
        versions=tuple(versions),
    )  # fmt: skip
    if first.row_sums is not None:
        joined = checked_rows_of(joined, sets, remaps)
    reader = ShardReader(
        joined, members[0].reader.verify, members[0].reader.release_every,
        members[0].reader.readahead, members[0].reader.drop_behind,
    )  # fmt: skip
    selections = [m.selection for m in members]
    return _Joined(
        reader,
        np.concatenate([r[s.shard_idx] for r, s in zip(remaps, selections, strict=True)]),
        np.concatenate([s.rows for s in selections]),
        np.concatenate([lab[s.labels] for lab, s in zip(labels, selections, strict=True)]),
    )
