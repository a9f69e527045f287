"""The orders of a mixture, pure functions of (members' sizes, schedule, seed, epoch, step) as
`loaders.order.orders`' are: which member each position draws from, each member's stream of epochs,
and where those streams stand at a resume (`MixtureOrder`, `mixture_order`).

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from loaders.order.orders import Order

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
