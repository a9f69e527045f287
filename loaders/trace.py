"""Which samples a run read at step N, and at which steps it read a sample: answered from the
loader states a run saved, without replaying it.

NOTE [ a run's history ]: a loader's orders are pure functions of (seed, epoch), so what rank r
read at its k-th batch of an iteration is the k-th batch of `partition(global_order(epoch)
[start:], r, world_size, drop_last)[position:]`, for the segment the iteration began at. The
loader records an entry per iteration (`Segment`: the global step it began at, its epoch,
segment start, position, world size and batch size) and carries them from state to state
(`state_dict()["history"]`, a compact string: states stay plain ints and strings). A step is
the loader's global batch index across epochs, counting the batches that reached the training
loop, as `state_dict` counts them. An iteration resumed from a state (with another world size
too), or one after an epoch cut short, begins a new entry; whole epochs read one after another
are one entry (`Segment.epochs`), so a long run is a few entries. A question about any step
before the state was saved is answered exactly, in the time it takes to draw that one epoch's
order. At most `HISTORY_LIMIT` entries are kept (the oldest go first); a step before them is
refused, never guessed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import astuple, dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from etl.errors import EtlError
from etl.progress import Progress
from loaders.orders import partition

HISTORY_LIMIT = 4096
"""Entries a state remembers (about 25 bytes each): one per iteration that did not begin a
whole epoch right after whole epochs (a resume, an epoch cut short, a new world size)."""


@dataclass(frozen=True)
class Segment:
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


def encode(segments: list[Segment]) -> str:
    """Segments as the state carries them: "step:epoch:start:position:world:batch;...", with
    ":epochs:span" after an entry that stands for several whole epochs."""
    return ";".join(
        ":".join(str(v) for v in astuple(s)[: 8 if s.epochs > 1 else 6])
        for s in segments[-HISTORY_LIMIT:]
    )


def decode(text: object) -> list[Segment]:
    """The segments a state's "history" field holds (none for a state saved without one).
    ValueError naming the field for anything that is not what `encode` writes."""
    if text in (None, ""):
        return []
    try:
        assert isinstance(text, str)
        segments = [Segment(*(int(v) for v in part.split(":"))) for part in text.split(";")]
    except (AssertionError, TypeError, ValueError):
        raise ValueError("loader state field 'history' is damaged: not a run's history") from None
    if any(
        min(astuple(s)) < 0 or min(s.world_size, s.batch_size, s.epochs) < 1
        or (s.epochs > 1 and s.span < 1) for s in segments
    ):  # fmt: skip
        raise ValueError("loader state field 'history' is damaged: a negative or zero field")
    return segments


def samples_at(loader: Any, state: Mapping[str, Any], step: int, rank: int = 0) -> NDArray[Any]:
    """The dataset indices rank `rank` read at global step `step` of the run whose loader state
    is `state`, with `loader` built as the run built it (dataset, shuffle=, seed=, drop_last).
    `loader.dataset.manifest_rows(indices)` names the samples. ValueError for a step the state
    cannot answer (before its history, not yet read when it was saved) or a rank the segment
    did not have."""
    order, segments, end = _run_of(loader, state)
    if not 0 <= step < end:
        raise ValueError(f"step {step} was not read: the state was saved after step {end - 1}")
    index = max((i for i, s in enumerate(segments) if s.step <= step), default=None)
    if index is None:
        raise ValueError(
            f"step {step} is before the state's history (from step {segments[0].step})"
        )
    segment = segments[index]
    if not 0 <= rank < segment.world_size:
        raise ValueError(f"rank {rank} is not in a world of {segment.world_size} at step {step}")
    epoch, k = segment.epoch_at(step)
    first = k * segment.batch_size
    return _part(order, segment, rank, epoch)[first : first + segment.batch_size]


def crops_at(
    loader: Any, state: Mapping[str, Any], step: int, indices: NDArray[Any]
) -> list[dict[str, Any]] | None:
    """Each sample's crop at global step `step` where the run's record names a crop made as
    batches were gathered (`PackedDataset.with_crop`): for a random crop its box (top, left,
    height, width in the stored sample's pixels) and flip, for a centre crop the size it
    resized to; a pure function of (seed, epoch, index), drawn again here. None where the
    record names none: a crop on the device (`DeviceLoader(augment=...)`) is not recorded."""
    from loaders.augment.crops import CenterCrop, RandomResizedCrop
    from loaders.augment.worker_crop import WorkerCrop

    run = json.loads(state.get("run") or "{}")
    recorded = run.get("crop")
    if not isinstance(recorded, dict):
        return None
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items()}
    kinds: dict[str, Any] = {"RandomResizedCrop": RandomResizedCrop, "CenterCrop": CenterCrop}
    kind = kinds[str(fields.pop("kind"))]
    crop = WorkerCrop(kind(**fields), float(run.get("reducing_gap", 2.0)))
    _, segments, _ = _run_of(loader, state)
    segment = max((s for s in segments if s.step <= step), key=lambda s: s.step)
    epoch, _ = segment.epoch_at(step)
    at = np.asarray(indices, np.int64)
    sides = loader.dataset.sample_sizes[at]
    boxes, flips, resized = crop.boxes(epoch, at, sides[:, 0], sides[:, 1])
    if resized is not None:
        return [{"resized": [int(h), int(w)], "size": list(crop.size)} for h, w in resized]
    return [
        {"box": [int(v) for v in box], "flip": bool(flip), "size": list(crop.size)}
        for box, flip in zip(boxes, flips, strict=True)
    ]


def steps_of(
    loader: Any, state: Mapping[str, Any], sample: int, progress: Progress | None = None
) -> list[tuple[int, int]]:
    """Every (step, rank) at which the run read dataset index `sample`, up to the step the
    state was saved at: one order drawn per epoch the history covers (`progress` counts
    them: phase "trace")."""
    order, segments, end = _run_of(loader, state)
    covered = []
    for i, segment in enumerate(segments):
        stop = segments[i + 1].step if i + 1 < len(segments) else end
        for e in range(segment.epochs):
            if segment.step + e * segment.span >= stop:
                break
            covered.append((segment, e, stop))
    progress = progress or Progress()
    progress.start("trace", len(covered))
    found: list[tuple[int, int]] = []
    try:
        for segment, e, stop in covered:
            found += _read_in(order, segment, e, stop, sample)
            progress.advance(1)
    finally:
        progress.stop()
    return sorted(found)


def _read_in(order: Any, segment: Segment, e: int, stop: int, sample: int) -> list[tuple[int, int]]:
    """The (step, rank) pairs of epoch `segment.epoch + e` of `segment` that read `sample`."""
    found = []
    first = segment.step + e * segment.span
    for rank in range(segment.world_size):
        hits = np.flatnonzero(_part(order, segment, rank, segment.epoch + e) == sample)
        for k in sorted(set((hits // segment.batch_size).tolist())):
            if first + k < stop:
                found.append((first + k, rank))
    return found


class _Run:
    """A saved run's orders: the loader's order sampler, and for a mixture the contexts its
    entries began under (NOTE [ tracing a mixture ])."""

    def __init__(self, order: Any, contexts: Mapping[int, str]) -> None:
        self.order, self.contexts = order, dict(contexts)
        self.drop_last = order.drop_last
        self._mixtures: dict[tuple[str, int], Any] = {}

    def global_order(self, segment: Segment, epoch: int) -> NDArray[Any]:
        if not self.contexts:
            return np.asarray(self.order.global_order(epoch))
        from loaders.mixture_trace import order_of

        at = max((k for k in self.contexts if k <= segment.step), default=None)
        if at is None:
            raise ValueError(f"the loader state records no mixture for step {segment.step}")
        key = (self.contexts[at], segment.batch_size * segment.world_size)
        if key not in self._mixtures:
            self._mixtures[key] = order_of(key[0], self.order.seed, key[1])
        return np.asarray(self._mixtures[key].order(epoch))


def _run_of(loader: Any, state: Mapping[str, Any]) -> tuple[_Run, list[Segment], int]:
    """(the run's orders, the state's segments, the steps read) or ValueError."""
    from loaders import mixture_trace
    from loaders.samplers import MixtureSampler

    order = getattr(loader, "order", None)
    if order is None:
        raise ValueError(
            "tracing answers for a loader over a dataset, view or mixture with one of the "
            "loaders' orders (shuffle=); a stream or a torch sampler is not traced"
        )
    segments = decode(state.get("history"))
    end = state.get("step")
    if not segments or not isinstance(end, int):
        raise ValueError("the loader state has no history: save it with this version of loaders")
    contexts = mixture_trace.decode(state.get("mixtures"))
    if isinstance(order, MixtureSampler) != bool(contexts):
        old = not contexts and "cursors" in state
        raise ValueError(
            "the loader state records no mixture's orders: save it with this version of loaders"
            if old
            else "the loader state is a mixture's and the loader is not, or the other way round"
        )
    return _Run(order, contexts), segments, end


def _part(order: _Run, segment: Segment, rank: int, epoch: int) -> NDArray[Any]:
    """Rank `rank`'s samples of `segment`'s iteration of `epoch`, in the order read."""
    segmented = order.global_order(segment, epoch)[segment.start :]
    part = partition(segmented, rank, segment.world_size, order.drop_last)[segment.position :]
    if order.drop_last:  # DataLoader drops the last batch short of batch_size too
        part = part[: len(part) - len(part) % segment.batch_size]
    return np.asarray(part)


class RunSteps:
    """A loader's count of the steps it delivered in earlier iterations, and the segment each
    iteration began at (NOTE [ a run's history ]); `PackedLoader` keeps one."""

    def __init__(self) -> None:
        self.before = 0
        self.segments: list[Segment] = []
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
        last = self.segments[-1] if self.segments else None
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
            self.segments[-1] = replace(last, epochs=last.epochs + 1, span=span)
            return
        self.segments.append(Segment(self.before, epoch, start, position, world, batch))
        del self.segments[:-HISTORY_LIMIT]
        if context is not None and context != self._context_at(self.before):
            self.mixtures[self.before] = context
        first = self.segments[0].step
        kept = self._context_at(first)
        self.mixtures = {k: v for k, v in self.mixtures.items() if k > first}
        if kept is not None:
            self.mixtures[first] = kept

    @staticmethod
    def _context(order: Any) -> str | None:
        from loaders.samplers import MixtureSampler

        if not isinstance(order, MixtureSampler):
            return None
        from loaders.mixture_trace import context_of

        return context_of(order)

    def _context_at(self, step: int) -> str | None:
        """The mixture context in effect at `step` (None: not a mixture's run)."""
        at = max((k for k in self.mixtures if k <= step), default=None)
        return None if at is None else self.mixtures[at]

    def fields(self, delivered: int, loader: Any) -> dict[str, int | str]:
        """A state's "step" (the iteration in progress delivered `delivered`), "history" and
        "run": what `rebuilt` opens the run's dataset and order from."""
        from loaders import mixture_trace

        step = self.before + delivered
        fields: dict[str, int | str] = {
            "step": step,
            "history": encode(self.segments),
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
        from loaders import mixture_trace

        self.segments = decode(state.get("history"))
        self.mixtures = mixture_trace.decode(state.get("mixtures"))
        self.before = step


def describe(loader: Any) -> str:
    """The run's record (JSON, a few hundred bytes): the dataset as opened (path or URL,
    version, split, classes, where=; or a view's chain of predicates; for a mixture each
    member's, its samples per epoch and replacement: its weights are in the state's
    "mixtures") and the order (shuffle=, seed, batch size, drop_last); "" where the loader
    cannot be rebuilt from it (a sampler of your own, a predicate that is code)."""
    from loaders.samplers import MixtureSampler

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


def rebuilt(state: Mapping[str, Any], store: Any = None) -> Any:
    """A loader over the run's dataset (or mixture), in the run's order, made from
    `state["run"]`, checked to be the run's (dataset version, selection, order and seed, or a
    mixture's members, as the state records them). ValueError in one line where the state has
    no record or the record does not rebuild it."""
    from loaders.factories import make_loader
    from loaders.mixture import Mixture

    text = state.get("run")
    if not isinstance(text, str) or not text:
        raise ValueError(
            "the loader state records no run to rebuild (a sampler of your own, a predicate "
            "that is code, or saved before runs were recorded): build the loader yourself"
        )
    try:
        run = json.loads(text)
        if "mixture" in run:
            mixture = run["mixture"]
            members = [_opened(m, store) for m in mixture["members"]]
            dataset: Any = Mixture(
                members,
                weights=[1] * len(members),
                replacement=mixture["replacement"],
                samples_per_epoch=mixture["samples_per_epoch"],
            )  # fmt: skip  (the weights of each stretch are in the state's "mixtures")
        else:
            dataset = _opened(run, store)
        loader = make_loader(
            dataset, batch_size=run["batch_size"], shuffle=run["shuffle"], seed=run["seed"],
            drop_last=run["drop_last"], rank=0, world_size=1, num_workers=0, pin_memory=False,
        )  # fmt: skip
    except (KeyError, TypeError, ValueError, EtlError) as exc:
        raise ValueError(f"the loader state's run record does not rebuild it ({exc})") from None
    mine = loader.state_dict()
    keys = ("dataset_version", "selection", "view", "order", "seed", "drop_last")
    for key in ("members", "order", "seed", "drop_last") if "mixture" in run else keys:
        if mine.get(key) != state.get(key):
            raise ValueError(
                f"the run's dataset and order, opened again, differ in {key} "
                f"({state.get(key)!r} then, {mine.get(key)!r} now): not traced"
            )
    return loader


def _opened(record: Mapping[str, Any], store: Any) -> Any:
    """A dataset (or view) as a run's record says it was opened."""
    from loaders.dataset import PackedDataset

    if "view" in record:
        return PackedDataset.open(_view_of(record["view"]), verify=False, store=store)
    return PackedDataset.open(
        record["dataset"], split=record["split"], classes=record["classes"],
        where=record["where"], version=record["version"], verify=False, store=store,
    )  # fmt: skip


def _view_of(record: Mapping[str, Any]) -> Any:
    """The view a run's record describes: its chain of predicates, from the first base."""
    from etl.format.views import View

    view = None
    for predicate in record["chain"]:
        if view is None:
            view = View(dataset=record["dataset"], version=record["version"], **predicate)
        else:
            view = View(base=view, **predicate)
    return view
