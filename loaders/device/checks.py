"""What `DeviceLoader` takes: a batch refused, with what to do instead, unless its images are
what the conversion expects; and how many channels its batches must have.

A refusal here happens before any copy, so a wrong batch costs nothing on the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from loaders.batch.forms import BackToBackBatch, EncodedBatch
from loaders.batch.types import ColumnBatch


def checked_batch(
    batch: Any,
    channels: int | None,
    layout: str,
    dtype: torch.dtype | None,
    device: torch.device,
) -> Any:
    """`batch` itself, refused unless it is (images, labels[, indices]) or a `ColumnBatch`
    whose images are 4-d with `channels` where `layout` puts them, in CPU memory or on
    `device`, and uint8 when a `dtype` is asked for (a float image's range is unknown: /255
    may be wrong); or samples back to back (`loaders.batch.forms`), whose channels must be
    known."""
    if not isinstance(batch, ColumnBatch) and (
        not isinstance(batch, tuple | list) or len(batch) not in (2, 3)
    ):
        raise TypeError(
            f"DeviceLoader takes batches of (images, labels[, indices]), got "
            f"{type(batch).__name__}; move what another collate_fn returns yourself"
        )
    if isinstance(batch, BackToBackBatch | EncodedBatch):
        if channels is None:
            raise ValueError(
                "DeviceLoader got samples back to back and cannot tell their channels: "
                "give it mean=/std= or a loader over a PackedDataset"
            )
        return batch
    images, labels = batch[0], batch[1]
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images)
        raise ValueError(f"DeviceLoader takes images as one [B, ...] 4-d tensor, got {shape}")
    for name, tensor in (("images", images), ("labels", labels)):
        where = getattr(tensor, "device", None)
        if where is not None and where.type != "cpu" and where != device:
            raise ValueError(
                f"DeviceLoader on {device} takes batches in CPU memory or on {device}; got "
                f"{name} on {where}"
            )
    found = images.shape[-1] if layout == "HWC" else images.shape[1]
    if channels is not None and found != channels:
        other = "CHW" if layout == "HWC" else "HWC"
        raise ValueError(
            f"batch images of shape {tuple(images.shape)} do not have {channels} channels "
            f"where layout {layout!r} puts them; a transform that returns {other} needs "
            f"DeviceLoader(..., layout={other!r})"
        )
    if dtype is not None and images.dtype != torch.uint8:
        raise TypeError(
            f"DeviceLoader(dtype=...) converts uint8 images (0-255) and got {images.dtype}; "
            "leave the float conversion to it, or pass dtype=None and normalise yourself"
        )
    return batch


def batch_channels(
    dataset: Any, layout: str, mean: Sequence[float] | None, std: Sequence[float] | None
) -> int | None:
    """Channels of the batches: as many as mean/std values, else the stored sample's."""
    for given in (mean, std):
        if given is not None:
            return len(given)
    shape = getattr(dataset, "sample_shape", None)
    if shape is None:
        return None
    return int(shape[-1] if getattr(dataset, "layout", layout) == "HWC" else shape[0])
