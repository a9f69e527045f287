"""The resume state a training job saves: what it belongs to, where the epoch stands, its checks.

A state is a flat dict of plain ints and strings (it survives `json`, and `torch.save` without
pickling any of our types). Identity fields say what the state belongs to: loading it into a
loader that differs in one of them is refused with one line naming the field, never applied to
other data. Progress fields say how far the epoch got.

NOTE [ elastic resume ]: ranks step together (DDP), so when a state is saved every rank has
delivered the same `position` samples of its part of the epoch's order. Rank r's part of the
segment of the global order that starts at `start` is every world_size-th index from r
(`loaders.order.orders.partition`), so the first `start + position * world_size` indices of the
global order were delivered, by some rank, and no others. A loader with another world size
resumes with the rest of the global order from there, partitioned among its own ranks: each
sample of the epoch is seen exactly once (padding aside, which repeats samples of the last
segment as `partition` does). With the same world size the state resumes each rank's part
where it stopped, which is the same set and keeps the order of an uninterrupted epoch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

State = dict[str, int | str]
"""A loader or sampler state: plain ints and strings."""

HINTS = {
    "dataset_version": "open the same version (PackedDataset.open(..., version=N))",
    "selection": "select the same split, classes and where= as the saved loader",
    "order": "build the loader with the same shuffle= (and block, window, num_samples)",
    "seed": "pass the saved seed= (the order of every epoch depends on it)",
    "batch_size": "use the saved batch_size",
    "drop_last": "use the saved drop_last",
    "workers": "use the saved num_workers (a stream's order depends on it)",
    "world_size": "resume a stream with the world size it was saved with",
    "view": "open the view the state was saved with (a changed predicate or version is "
    "another view; `etl view FILE` prints a view's fingerprint)",
}
"""What to do about a mismatch in each identity field."""


def check_state(state: Any, expected: Mapping[str, int | str], progress: tuple[str, ...]) -> None:
    """Refuse `state` unless its identity fields equal `expected` and it has every field.

    `progress` fields must be ints >= 0. Raises TypeError for a state that is not a mapping,
    ValueError naming the first missing, mistyped or mismatched field.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"a loader state is a dict (from state_dict()), got {type(state).__name__}")
    for key, value in expected.items():
        if key in state and state[key] != value:
            raise ValueError(
                f"loader state is for {key} {state[key]!r}, this loader has {value!r}: "
                f"{HINTS.get(key, 'build the loader as the saved one was built')}"
            )
    missing = [key for key in (*expected, *progress) if key not in state]
    if missing:
        raise ValueError(
            f"loader state has no {missing[0]!r} (it has {sorted(state)}); save it with "
            "loader.state_dict() of this version of loaders"
        )
    for key in progress:
        value = state[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"loader state field {key!r} must be an int >= 0, got {value!r}")


def resume_point(
    start: int, position: int, saved_world: int, world_size: int, length: int
) -> tuple[int, int]:
    """(segment start, position in this rank's part) to resume with, see NOTE [ elastic resume ].

    `length` is the global order's length for the epoch.
    """
    if saved_world == world_size:
        return start, position
    return min(start + position * saved_world, length), 0


def check_global_batch(state: Mapping[str, Any], batch_size: int, world_size: int) -> None:
    """Refuse a state of another global batch: with the same world size, another batch size;
    with another, a per-rank batch size that does not keep batch size x world size."""
    saved, ranks = state["batch_size"], state["world_size"]
    if saved * ranks != batch_size * world_size:
        raise ValueError(
            f"loader state is for batch_size {saved} on {ranks} rank(s) (a global batch of "
            f"{saved * ranks}), this loader has {batch_size} on {world_size} "
            f"({batch_size * world_size}): use batch_size={saved * ranks // world_size} per rank"
        )
