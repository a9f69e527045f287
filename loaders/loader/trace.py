"""Which samples a run read at step N, and at which steps it read a sample: answered from the
loader states a run saved, without replaying it (NOTE [ a run's history ] in
`loaders.order.history`); and a run's loader rebuilt from its state's record.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from etl.errors import EtlError
from etl.progress import Progress
from loaders.order.history import HistoryEntry, decode
from loaders.order.orders import partition


def samples_at(loader: Any, state: Mapping[str, Any], step: int, rank: int = 0) -> NDArray[Any]:
    """The dataset indices rank `rank` read at global step `step` of the run whose loader state
    is `state`, with `loader` built as the run built it (dataset, shuffle=, seed=, drop_last).
    `loader.dataset.manifest_rows(indices)` names the samples. ValueError for a step the state
    cannot answer (before its history, not yet read when it was saved) or a rank the entry
    did not have."""
    order, entries, end = _run_of(loader, state)
    if not 0 <= step < end:
        raise ValueError(f"step {step} was not read: the state was saved after step {end - 1}")
    index = max((i for i, s in enumerate(entries) if s.step <= step), default=None)
    if index is None:
        raise ValueError(f"step {step} is before the state's history (from step {entries[0].step})")
    entry = entries[index]
    if not 0 <= rank < entry.world_size:
        raise ValueError(f"rank {rank} is not in a world of {entry.world_size} at step {step}")
    epoch, k = entry.epoch_at(step)
    first = k * entry.batch_size
    return _part(order, entry, rank, epoch)[first : first + entry.batch_size]


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
    try:  # NOTE: a state is someone's word: an unknown kind or key is its error, in one line
        kind = kinds[str(fields.pop("kind", None))]
        crop = WorkerCrop(kind(**fields), float(run.get("reducing_gap", 2.0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"the run record's crop {reprlib.repr(recorded)} is not one of the loaders' ({exc})"
        ) from None
    _, entries, _ = _run_of(loader, state)
    entry = max((s for s in entries if s.step <= step), key=lambda s: s.step)
    epoch, _ = entry.epoch_at(step)
    at = np.asarray(indices, np.int64)
    sides = loader.dataset.sample_sizes[at]
    boxes, flips, resized = crop.boxes(epoch, at, sides[:, 0], sides[:, 1])
    if resized is not None:
        return [{"resized": [int(h), int(w)], "size": list(crop.size)} for h, w in resized]
    return [
        {"box": [int(v) for v in box], "flip": bool(flip), "size": list(crop.size)}
        for box, flip in zip(boxes, flips, strict=True)
    ]


TRACE_EPOCHS = 100_000
"""Epochs `steps_of` draws at most unless asked for more (`etl trace --max-epochs`): each is
one order drawn, so a state's word cannot make it run for ever."""


def steps_of(
    loader: Any,
    state: Mapping[str, Any],
    sample: int,
    progress: Progress | None = None,
    max_epochs: int = TRACE_EPOCHS,
) -> list[tuple[int, int]]:
    """Every (step, rank) at which the run read dataset index `sample`, up to the step the
    state was saved at: one order drawn per epoch the history covers (`progress` counts
    them: phase "trace"). ValueError, before any is drawn, where they are more than
    `max_epochs`, or an entry's steps per epoch are not the rebuilt loader's."""
    order, entries, end = _run_of(loader, state)
    stops = [after.step for after in entries[1:]] + [end]
    counts = [_epochs_before(entry, stop) for entry, stop in zip(entries, stops, strict=True)]
    if sum(counts) > max_epochs:
        raise ValueError(
            f"the history covers {sum(counts):,} epochs, more than {max_epochs:,} to draw "
            "(--max-epochs raises it)"
        )
    for entry in entries:
        if entry.epochs > 1 and entry.span != _steps_per_epoch(order, entry):
            raise ValueError(
                f"the history's entry at step {entry.step} says {entry.span} steps an epoch; "
                f"the run's loader, opened again, has {_steps_per_epoch(order, entry)}"
            )
    progress = progress or Progress()
    progress.start("trace", sum(counts))
    found: list[tuple[int, int]] = []
    try:
        for entry, stop, count in zip(entries, stops, counts, strict=True):
            for e in range(count):
                found += _read_in(order, entry, e, stop, sample)
                progress.advance(1)
    finally:
        progress.stop()
    return sorted(found)


def _epochs_before(entry: HistoryEntry, stop: int) -> int:
    """How many of `entry`'s epochs begin before step `stop` (arithmetic, none drawn)."""
    if entry.step >= stop:
        return 0
    if entry.epochs == 1:
        return 1
    return min(entry.epochs, -(-(stop - entry.step) // entry.span))


def _steps_per_epoch(order: _Run, entry: HistoryEntry) -> int:
    """Steps of one whole epoch of `entry`'s iteration, from the rebuilt loader's order."""
    whole = len(_part(order, entry, 0, entry.epoch))
    return whole // entry.batch_size if order.drop_last else -(-whole // entry.batch_size)


def _read_in(
    order: Any, entry: HistoryEntry, e: int, stop: int, sample: int
) -> list[tuple[int, int]]:
    """The (step, rank) pairs of epoch `entry.epoch + e` of `entry` that read `sample`."""
    found = []
    first = entry.step + e * entry.span
    for rank in range(entry.world_size):
        hits = np.flatnonzero(_part(order, entry, rank, entry.epoch + e) == sample)
        for k in sorted(set((hits // entry.batch_size).tolist())):
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

    def global_order(self, entry: HistoryEntry, epoch: int) -> NDArray[Any]:
        if not self.contexts:
            return np.asarray(self.order.global_order(epoch))
        from loaders.order.mixture_trace import mixture_order_of

        at = max((k for k in self.contexts if k <= entry.step), default=None)
        if at is None:
            raise ValueError(f"the loader state records no mixture for step {entry.step}")
        key = (self.contexts[at], entry.batch_size * entry.world_size)
        if key not in self._mixtures:
            self._mixtures[key] = mixture_order_of(key[0], self.order.seed, key[1])
        return np.asarray(self._mixtures[key].order(epoch))


def _run_of(loader: Any, state: Mapping[str, Any]) -> tuple[_Run, list[HistoryEntry], int]:
    """(the run's orders, the state's entries, the steps read) or ValueError."""
    from loaders.order import mixture_trace
    from loaders.order.samplers import MixtureSampler

    order = getattr(loader, "order", None)
    if order is None:
        raise ValueError(
            "tracing answers for a loader over a dataset, view or mixture with one of the "
            "loaders' orders (shuffle=); a stream or a torch sampler is not traced"
        )
    entries = decode(state.get("history"))
    end = state.get("step")
    if not entries or not isinstance(end, int):
        raise ValueError("the loader state has no history: save it with this version of loaders")
    contexts = mixture_trace.decode(state.get("mixtures"))
    if isinstance(order, MixtureSampler) != bool(contexts):
        old = not contexts and "cursors" in state
        raise ValueError(
            "the loader state records no mixture's orders: save it with this version of loaders"
            if old
            else "the loader state is a mixture's and the loader is not, or the other way round"
        )
    return _Run(order, contexts), entries, end


def _part(order: _Run, entry: HistoryEntry, rank: int, epoch: int) -> NDArray[Any]:
    """Rank `rank`'s samples of `entry`'s iteration of `epoch`, in the order read."""
    ordered = order.global_order(entry, epoch)[entry.start :]
    part = partition(ordered, rank, entry.world_size, order.drop_last)[entry.position :]
    if order.drop_last:  # DataLoader drops the last batch short of batch_size too
        part = part[: len(part) - len(part) % entry.batch_size]
    return np.asarray(part)


def rebuilt(state: Mapping[str, Any], store: Any = None) -> Any:
    """A loader over the run's dataset (or mixture), in the run's order, made from
    `state["run"]`, checked to be the run's (dataset version, selection, order and seed, or a
    mixture's members, as the state records them). ValueError in one line where the state has
    no record or the record does not rebuild it."""
    from loaders.datasets.mixture import Mixture
    from loaders.loader.factories import make_loader

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


def datasets_named(state: Mapping[str, Any]) -> list[str]:
    """The datasets (paths or URLs) a state's run record would open, as written there (a
    mixture's members each): what `etl trace` says it opens and asks leave for, for a URL,
    before anything is opened. Empty for a state with no readable record."""
    try:
        run = json.loads(state.get("run") or "{}")
        records = run["mixture"]["members"] if "mixture" in run else [run]
        return [str(r.get("view", r)["dataset"]) for r in records]
    except (AttributeError, KeyError, TypeError, ValueError):
        return []


def _opened(record: Mapping[str, Any], store: Any) -> Any:
    """A dataset (or view) as a run's record says it was opened."""
    from loaders.datasets.packed import PackedDataset

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
