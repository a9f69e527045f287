"""Who reads a loader: trainers whose handling of a batch would change what it means.

NOTE [ Keras reads a third field as sample_weight ]: Keras' `fit`, `evaluate` and `predict`
unpack every batch as `(x, y, sample_weight)` (`keras.utils.unpack_x_y_sample_weight`), so an
`IndexedBatch` (`with_indices=True`) would weight each sample's loss by its dataset index: a
loss a hundred times too large, and no error. Keras calls nothing of a DataLoader but `len` and
`iter`, so a pass checks once, at its start, whether Keras' code is reading it (a module of
`keras` among the callers' frames) and refuses in one line.

NOTE [ wrappers that read ahead ]: Ray Train's `prepare_data_loader` wraps the loader in a
DataLoader (`_WrappedDataLoader`) that always holds the next batch, pulled before the loop asks,
to copy it to the device meanwhile, and never says so (`DeviceLoader` does: `hold_back`). A
pass a known wrapper reads counts that batch as held, as it counts `DeviceLoader`'s, until the
loader's last batch, after which the wrapper holds none.
"""

from __future__ import annotations

import sys

HELD_AHEAD = {"ray.train.torch.train_loop_utils": 1}
"""Batches a wrapper that reads ahead holds, by the module that defines it (NOTE [ wrappers
that read ahead ])."""

CALLERS_LOOKED_AT = 16
"""Frames above a pass's start that are looked at (Keras' epoch iterator is 1-3 up, more
through a wrapper such as `DeviceLoader`)."""


def _callers() -> list[str]:
    """The modules of the frames above the caller's caller, nearest first."""
    names, frame = [], sys._getframe(2)
    for _ in range(CALLERS_LOOKED_AT):
        if frame is None:
            break
        names.append(str(frame.f_globals.get("__name__", "")))
        frame = frame.f_back  # type: ignore[assignment]
    return names


def keras_is_reading() -> bool:
    """Whether a Keras trainer is among the callers (NOTE [ Keras reads a third field as
    sample_weight ])."""
    return "keras" in sys.modules and any(n.startswith("keras.") for n in _callers())


def held_ahead() -> int:
    """Batches the wrapper reading this pass holds ahead of the loop (NOTE [ wrappers that
    read ahead ]); 0 where none is known."""
    if not any(module.split(".")[0] in sys.modules for module in HELD_AHEAD):
        return 0
    return max((HELD_AHEAD.get(n, 0) for n in _callers()), default=0)


def refuse_indices_for_keras() -> None:
    """Raise where Keras would read a batch's indices as sample weights."""
    if keras_is_reading():
        raise ValueError(
            "Keras reads a batch's third field as sample_weight, so with_indices=True would "
            "weight each sample's loss by its index: build the loader for model.fit, evaluate "
            "and predict with with_indices=False"
        )
