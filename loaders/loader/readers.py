"""Who reads a loader: trainers whose handling of a batch would change what it means.

NOTE [ Keras reads a third field as sample_weight ]: Keras' `fit`, `evaluate` and `predict`
unpack every batch as `(x, y, sample_weight)` (`keras.utils.unpack_x_y_sample_weight`), so an
`IndexedBatch` (`with_indices=True`) would weight each sample's loss by its dataset index: a
loss a hundred times too large, and no error. Keras calls nothing of a DataLoader but `len` and
`iter`, so a pass checks once, at its start, whether Keras' code is reading it (a module of
`keras` among the callers' frames) and refuses in one line.
"""

from __future__ import annotations

import sys

CALLERS_LOOKED_AT = 16
"""Frames above a pass's start that are looked at (Keras' epoch iterator is 1-3 up, more
through a wrapper such as `DeviceLoader`)."""


def keras_is_reading() -> bool:
    """Whether a Keras trainer is among the callers (NOTE [ Keras reads a third field as
    sample_weight ])."""
    if "keras" not in sys.modules:
        return False
    frame = sys._getframe(1)
    for _ in range(CALLERS_LOOKED_AT):
        if frame is None:
            return False
        if str(frame.f_globals.get("__name__", "")).startswith("keras."):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def refuse_indices_for_keras() -> None:
    """Raise where Keras would read a batch's indices as sample weights."""
    if keras_is_reading():
        raise ValueError(
            "Keras reads a batch's third field as sample_weight, so with_indices=True would "
            "weight each sample's loss by its index: build the loader for model.fit, evaluate "
            "and predict with with_indices=False"
        )
