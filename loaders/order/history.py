"""A run's history: the iterations a loader began, carried from state to state, so that
which samples any step read can be drawn again (`loaders.loader.trace` asks it).

NOTE [ a run's history ]: a loader's orders are pure functions of (seed, epoch), so what rank r
read at its k-th batch of an iteration is the k-th batch of `partition(global_order(epoch)
[start:], r, world_size, drop_last)[position:]`, for the segment the iteration began at. The
loader records an entry per iteration (`HistoryEntry`: the global step it began at, its epoch,
segment start, position, world size and batch size) and carries them from state to state
(`state_dict()["history"]`, a compact string: states stay plain ints and strings). A step is
the loader's global batch index across epochs, counting the batches that reached the training
loop, as `state_dict` counts them. An iteration resumed from a state (with another world size
too), or one after an epoch cut short, begins a new entry; whole epochs read one after another
are one entry (`HistoryEntry.epochs`), so a long run is a few entries. A question about any step
before the state was saved is answered exactly, in the time it takes to draw that one epoch's
order. At most `HISTORY_LIMIT` entries are kept (the oldest go first); a step before them is
refused, never guessed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import astuple, dataclass, replace
from itertools import pairwise
from typing import Any

HISTORY_LIMIT = 4096
"""Entries a state remembers (about 25 bytes each): one per iteration that did not begin a
whole epoch right after whole epochs (a resume, an epoch cut short, a new world size)."""


@dataclass(frozen=True)
class HistoryEntry:
    """One iteration of a loader: where in the run and in its epoch's order it began."""

    step: int
    """The global step of its first batch."""
    epoch: int
    start: int
    """Where its segment begins in the epoch's global order (after an elastic resume)."""
    position: int
    """Samples of each rank's part of the segment that an earlier iteration delivered."""
    world_size: int
    batch_size: int
    epochs: int = 1
    """Whole epochs it stands for, one after another from `epoch`, each read from its start
    (a run that only calls `set_epoch` and reads each epoch through is one entry)."""
    span: int = 0
    """Steps of each of those epochs (when `epochs` > 1)."""

    def epoch_at(self, step: int) -> tuple[int, int]:
        """(the epoch, the step within its iteration) of a step this entry covers."""
        k = step - self.step
        if self.epochs == 1:
            return self.epoch, k
        return self.epoch + k // self.span, k % self.span


def encode(entries: list[HistoryEntry]) -> str:
    """Segments as the state carries them: "step:epoch:start:position:world:batch;...", with
    ":epochs:span" after an entry that stands for several whole epochs."""
    return ";".join(
        ":".join(str(v) for v in astuple(s)[: 8 if s.epochs > 1 else 6])
        for s in entries[-HISTORY_LIMIT:]
    )


def decode(text: object) -> list[HistoryEntry]:
    """The entries a state's "history" field holds (none for a state saved without one).
    ValueError naming the field for anything that is not what `encode` writes."""
    if text in (None, ""):
        return []
    if (
        not isinstance(text, str)
        or len(text) > HISTORY_LIMIT * 160
        or text.count(";") >= HISTORY_LIMIT
    ):
        raise ValueError(
            f"loader state field 'history' is damaged: more than {HISTORY_LIMIT} entries"
        )
    try:
        entries = [HistoryEntry(*(int(v) for v in part.split(":"))) for part in text.split(";")]
    except (TypeError, ValueError):
        raise ValueError("loader state field 'history' is damaged: not a run's history") from None
    if any(
        min(astuple(s)) < 0 or min(s.world_size, s.batch_size, s.epochs) < 1
        or (s.epochs > 1 and s.span < 1) for s in entries
    ):  # fmt: skip
        raise ValueError("loader state field 'history' is damaged: a negative or zero field")
    for before, after in pairwise(entries):
        if before.step + (before.epochs - 1) * before.span > after.step:
            raise ValueError(
                "loader state field 'history' is damaged: an entry's epochs run past the next "
                f"entry's step {after.step}"
            )
    return entries


class RunHistory:
    """A loader's count of the steps it delivered in earlier iterations, and the segment each
    iteration began at (NOTE [ a run's history ]); `PackedLoader` keeps one."""

    def __init__(self) -> None:
        self.before = 0
        self.entries: list[HistoryEntry] = []
        self.mixtures: dict[int, str] = {}
        """A mixture's context at each entry that began under a new one (NOTE [ tracing a
        mixture ]), by the entry's step."""

    def ended(self, delivered: int) -> None:
        """An iteration ended (or was left) having handed `delivered` batches to the loop."""
        self.before += delivered

    def began(self, epoch: int, start: int, position: int, order: Any, batch: int) -> None:
        """An iteration of `order` began; a whole fresh epoch right after the whole fresh
        epochs of the last entry extends it instead of adding one."""
        world, whole = order.world_size, order.num_samples
        span = whole // batch if order.drop_last else -(-whole // batch)
        last = self.entries[-1] if self.entries else None
        fresh = start == position == 0
        context = self._context(order)
        if (
            last is not None and fresh and last.start == last.position == 0
            and context == self._context_at(last.step)
            and (last.world_size, last.batch_size) == (world, batch)
            and epoch == last.epoch + last.epochs
            and self.before == last.step + last.epochs * span
            and (last.epochs == 1 or last.span == span)
        ):  # fmt: skip
            self.entries[-1] = replace(last, epochs=last.epochs + 1, span=span)
            return
        self.entries.append(HistoryEntry(self.before, epoch, start, position, world, batch))
        del self.entries[:-HISTORY_LIMIT]
        if context is not None and context != self._context_at(self.before):
            self.mixtures[self.before] = context
        first = self.entries[0].step
        kept = self._context_at(first)
        self.mixtures = {k: v for k, v in self.mixtures.items() if k > first}
        if kept is not None:
            self.mixtures[first] = kept

    @staticmethod
    def _context(order: Any) -> str | None:
        from loaders.order.samplers import MixtureSampler

        if not isinstance(order, MixtureSampler):
            return None
        from loaders.order.mixture_trace import context_of

        return context_of(order)

    def _context_at(self, step: int) -> str | None:
        """The mixture context in effect at `step` (None: not a mixture's run)."""
        at = max((k for k in self.mixtures if k <= step), default=None)
        return None if at is None else self.mixtures[at]

    def fields(self, delivered: int, loader: Any) -> dict[str, int | str]:
        """A state's "step" (the iteration in progress delivered `delivered`), "history" and
        "run": what `rebuilt` opens the run's dataset and order from."""
        from loaders.order import mixture_trace

        step = self.before + delivered
        fields: dict[str, int | str] = {
            "step": step,
            "history": encode(self.entries),
            "run": describe(loader),
        }
        if self.mixtures:
            fields["mixtures"] = mixture_trace.encode(self.mixtures)
        return fields

    def load(self, state: Mapping[str, Any]) -> None:
        """Carry a loaded state's steps and history on (a state without them starts both)."""
        step = state.get("step", 0)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"loader state field 'step' must be an int >= 0, got {step!r}")
        from loaders.order import mixture_trace

        self.entries = decode(state.get("history"))
        self.mixtures = mixture_trace.decode(state.get("mixtures"))
        self.before = step


def describe(loader: Any) -> str:
    """The run's record (JSON, a few hundred bytes): the dataset as opened (path or URL,
    version, split, classes, where=; or a view's chain of predicates; for a mixture each
    member's, its samples per epoch and replacement: its weights are in the state's
    "mixtures") and the order (shuffle=, seed, batch size, drop_last); "" where the loader
    cannot be rebuilt from it (a sampler of your own, a predicate that is code)."""
    from loaders.order.samplers import MixtureSampler

    order = getattr(loader, "order", None)
    if isinstance(order, MixtureSampler):
        members = [getattr(m, "opened", None) for m in loader.dataset.members]
        if any(m is None for m in members):
            return ""
        mixture = {
            "members": members,
            "samples_per_epoch": order.samples_per_epoch,
            "replacement": order.replacement,
        }
        run: dict[str, Any] = {"mixture": mixture, "shuffle": None}
    else:
        opened = getattr(loader.dataset, "opened", None)
        named = getattr(order, "named", None)
        if opened is None or order is None or named is None:
            return ""
        run = {**opened, "shuffle": named}
    run.update(seed=order.seed, drop_last=bool(order.drop_last))
    return json.dumps({**run, "batch_size": loader._batch_size()}, sort_keys=True)
