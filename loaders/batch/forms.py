"""A batch's form: how the images of a batch with samples of several sizes (or still encoded)
lie in its memory. Batches of one shape are `Batch`, `IndexedBatch` or `ColumnBatch`; these are
`ColumnBatch`es too (same fields, same columns), of a type that says the form:

- `PaddedBatch`: each sample at the top-left of [B, *largest], the rest zero;
- `BackToBackBatch`: one sample after another in 1-d `images`, each in the stored layout
  (NOTE [ back to back ] in `loaders.batch.ragged`);
- `EncodedBatch`: each sample's stored bytes after another in 1-d `images`, still encoded.

Every one carries each sample's size in `SIZE_COLUMNS` (and an encoded one its stored bytes and
codec in `STORED_COLUMNS`), which users read as columns. The read layer says which form a batch
takes (`loaders.read.batch_plan.batch_reads`), the memory layer makes it, and `DeviceLoader`
dispatches on the type; no one else reads those columns back to learn the form.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from loaders.batch.types import SIZE_COLUMNS, STORED_COLUMNS, ColumnBatch


def _numbers(value: torch.Tensor | list[Any]) -> NDArray[np.int64]:
    if isinstance(value, torch.Tensor):
        return value.cpu().numpy().astype(np.int64, copy=False)
    return np.asarray(value, dtype=np.int64)


class SizedBatch(ColumnBatch):
    """A batch of samples of several sizes, each one's own (height, width) in `SIZE_COLUMNS`."""

    __slots__ = ()

    @property
    def sizes(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Each sample's (heights, widths), int64 on the CPU."""
        height, width = (self.columns[name] for name in SIZE_COLUMNS)
        return _numbers(height), _numbers(width)

    def other_columns(self) -> dict[str, torch.Tensor | list[Any]] | None:
        """The batch's columns but those that make its form (None: it has no others)."""
        form = {*SIZE_COLUMNS, *STORED_COLUMNS}
        return {k: v for k, v in self.columns.items() if k not in form} or None


class PaddedBatch(SizedBatch):
    """Samples of several sizes, each at the top-left of [B, *largest sides], the rest zero."""

    __slots__ = ()


class BackToBackBatch(SizedBatch):
    """Samples of several sizes one after another in 1-d uint8 `images`, each in the stored
    layout, the first at byte 0 (`loaders.batch.ragged.RaggedImages` reads them)."""

    __slots__ = ()


class EncodedBatch(SizedBatch):
    """Samples still encoded, their stored bytes one after another in 1-d uint8 `images`, for
    the device to decode (`DeviceLoader(decode="device")`)."""

    __slots__ = ()

    @property
    def stored(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Each sample's (stored bytes, codec) (`etl.format.codecs.CODECS`), on the CPU."""
        nbytes, codecs = (self.columns[name] for name in STORED_COLUMNS)
        return _numbers(nbytes), _numbers(codecs)
