"""Batches onto the device: non-blocking copies from pinned memory, the next batch prefetched on
a side CUDA stream, uint8 -> float, mean/std normalisation and channels_last done on the device.

The same code runs on the CPU with `stream = None` (no side stream, `.to()` is a no-op), so the
conversion logic is tested here even without a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from loaders.batches import Batch


def prepare_images(
    images: torch.Tensor,
    layout: str,
    dtype: torch.dtype | None = None,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    channels_last: bool = False,
) -> torch.Tensor:
    """uint8 [B, H, W, C] (HWC) or [B, C, H, W] (CHW) -> [B, C, H, W] for a model.

    With `dtype`, values become `x * scale - shift` (per channel, shape [1, C, 1, 1]); see
    `DeviceLoader` for how scale and shift encode /255 and mean/std.

    NOTE: the layout change happens on uint8, before the float conversion, so it moves a
    quarter of the bytes; and an HWC batch permuted to NCHW already has channels_last strides,
    so with `channels_last` it is not copied at all. The float ops run in place, which keeps
    the memory format.
    """
    if layout not in ("HWC", "CHW"):
        raise ValueError(f"unknown layout {layout!r}; expected 'HWC' or 'CHW'")
    x = images.permute(0, 3, 1, 2) if layout == "HWC" else images
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = x.contiguous(memory_format=fmt)
    if dtype is None:
        return x
    x = x.to(dtype)
    if scale is not None:
        x.mul_(scale)
    if shift is not None:
        x.sub_(shift)
    return x


class DeviceLoader:
    """Iterate `loader` with each batch on `device`, the next batch's copy already under way.

    `dtype` (e.g. torch.float32) converts images to [0, 1] floats; `mean` and `std` (per
    channel, in [0, 1] units, torchvision's convention) then normalise them. Images come out as
    [B, C, H, W], in channels_last memory format if asked. `device` defaults to CUDA when
    present. `layout` defaults to the loader's dataset layout.
    """

    def __init__(
        self,
        loader: Iterable[Batch],
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        channels_last: bool = False,
        layout: str | None = None,
    ) -> None:
        if (mean is not None or std is not None) and dtype is None:
            raise ValueError("mean/std normalisation needs a float dtype, e.g. torch.float32")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.loader = loader
        self.device = torch.device(device)
        self.dtype = dtype
        self.channels_last = channels_last
        dataset = getattr(loader, "dataset", None)
        self.layout = layout or getattr(dataset, "layout", None) or "CHW"
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.scale: torch.Tensor | None = None
        self.shift: torch.Tensor | None = None
        if dtype is not None:
            channels = _channels(dataset, self.layout, mean, std)
            m = torch.tensor(mean if mean is not None else [0.0] * channels, dtype=torch.float64)
            s = torch.tensor(std if std is not None else [1.0] * channels, dtype=torch.float64)
            if len(m) != len(s):
                raise ValueError(f"mean has {len(m)} values and std {len(s)}")
            # (x / 255 - mean) / std == x * (1 / (255 std)) - mean / std: two in-place ops.
            self.scale = (1 / (255 * s)).view(1, -1, 1, 1).to(self.device, dtype)
            self.shift = (m / s).view(1, -1, 1, 1).to(self.device, dtype)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # set_epoch, state_dict, load_state_dict, dataset: those of the wrapped loader.
        if name in ("set_epoch", "state_dict", "load_state_dict", "dataset", "sampler"):
            return getattr(self.loader, name)
        raise AttributeError(name)

    def __iter__(self) -> Iterator[Batch]:
        if self.stream is not None:
            # The side stream must see what was queued before: scale/shift, the caller's work.
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        batches = iter(self.loader)
        ready = self._send(next(batches, None))
        while ready is not None:
            if self.stream is not None:
                # NOTE [ side stream ]: the compute stream waits for the copies issued so far
                # on the side stream; record_stream tells the caching allocator that these
                # tensors, allocated on the side stream, are used on the compute stream, so
                # their memory is not reused before that work is done.
                current = torch.cuda.current_stream(self.device)
                current.wait_stream(self.stream)
                for tensor in ready:
                    tensor.record_stream(current)
            batch, ready = ready, self._send(next(batches, None))
            yield batch

    def _send(self, batch: Batch | None) -> Batch | None:
        """Issue the copy and conversion of one batch (on the side stream when there is one)."""
        if batch is None:
            return None
        images, labels = batch
        context = torch.cuda.stream(self.stream) if self.stream else contextlib.nullcontext()
        with context:
            images = images.to(self.device, non_blocking=True)
            labels = labels.to(self.device, non_blocking=True)
            images = prepare_images(
                images, self.layout, self.dtype, self.scale, self.shift, self.channels_last
            )
        return Batch(images, labels)


def _channels(
    dataset: Any, layout: str, mean: Sequence[float] | None, std: Sequence[float] | None
) -> int:
    for given in (mean, std):
        if given is not None:
            return len(given)
    shape = getattr(dataset, "sample_shape", None)
    if shape is None:
        return 1  # broadcasts over any number of channels
    return int(shape[-1] if layout == "HWC" else shape[0])
