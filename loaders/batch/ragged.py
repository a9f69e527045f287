"""A batch of images of several sizes stored back to back in one flat uint8 tensor: how a loader
sends samples that keep their aspect ratio to `DeviceLoader`, and what its crops read.

NOTE [ back to back ]: a batch padded to its largest height and width moves far more bytes than
its samples hold: a portrait and a landscape photo capped at 256x512 pad each other to 512x512,
2x the bytes of either, and 4x a 256x256 batch. Every byte goes through the workers' shared
memory, DataLoader's pin thread and the host-to-device copy, so on a GPU loading ran at 0.53x of
fixed 256x256 storage (benchmarks/README.md, `formats.aspect`). Back to back a batch moves its
own bytes (1.3x a 256x256 batch for the benchmark's 4:3 photos), and the crops read each sample
where it lies: one gather of the four bilinear neighbours of every output pixel, a few kernels
a batch and none per sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from numpy.typing import NDArray


@dataclass(frozen=True)
class RaggedImages:
    """Samples one after another in `data`, sample k `heights[k]` x `widths[k]` x `channels` in
    `layout` ("HWC" or "CHW"), the first at byte 0."""

    data: torch.Tensor
    """uint8 [sum of the samples' bytes], on the CPU or the device."""
    heights: NDArray[np.int64]
    widths: NDArray[np.int64]
    channels: int
    layout: str

    def __post_init__(self) -> None:
        if self.layout not in ("HWC", "CHW"):
            raise ValueError(f"unknown layout {self.layout!r}; expected 'HWC' or 'CHW'")
        if self.data.dim() != 1 or self.data.dtype != torch.uint8:
            raise ValueError(f"samples back to back are 1-d uint8, got {self.data.dtype} "
                             f"{tuple(self.data.shape)}")  # fmt: skip
        if (
            len(self.heights) != len(self.widths)
            or (self.heights < 1).any()
            or (self.widths < 1).any()
        ):
            raise ValueError("each sample needs a height and a width of at least 1")
        total = int(self.ends[-1]) if len(self) else 0
        if total != self.data.numel():
            raise ValueError(
                f"{len(self)} samples of {total} bytes in all, but {self.data.numel()} bytes given"
            )

    def __len__(self) -> int:
        return len(self.heights)

    @property
    def device(self) -> torch.device:
        return self.data.device

    @cached_property
    def ends(self) -> NDArray[np.int64]:
        """Where each sample's bytes end (worked out once: `image(k)` asks for each k)."""
        return np.cumsum(self.heights * self.widths * self.channels)

    def image(self, k: int) -> torch.Tensor:
        """Sample k as a uint8 [C, H, W] view of `data` (no copy)."""
        height, width = int(self.heights[k]), int(self.widths[k])
        end = int(self.ends[k])
        flat = self.data[end - height * width * self.channels : end]
        if self.layout == "HWC":
            return flat.view(height, width, self.channels).permute(2, 0, 1)
        return flat.view(self.channels, height, width)

    def images(self) -> list[torch.Tensor]:
        """Every sample as a [C, H, W] view."""
        return [self.image(k) for k in range(len(self))]

    def one_size(self) -> bool:
        """Whether every sample has the same height and width (then `padded` pads nothing)."""
        return len({*self.heights.tolist()}) == 1 and len({*self.widths.tolist()}) == 1

    def padded(self) -> torch.Tensor:
        """uint8 [B, C, H, W], each sample in the top-left corner of its row and zeros around:
        the padded batch an augmentation written for one takes (one copy a sample)."""
        height = int(self.heights.max(initial=1))
        width = int(self.widths.max(initial=1))
        out = torch.zeros((len(self), self.channels, height, width), dtype=torch.uint8,
                          device=self.device)  # fmt: skip
        for k, image in enumerate(self.images()):
            out[k, :, : image.shape[1], : image.shape[2]] = image
        return out

    def bilinear(self, ys: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
        """Bilinear samples of each image at source pixel coordinates: ys [B, oh], xs [B, ow]
        (float, within each sample's own image) -> float32 [B, C, oh, ow]. The values of
        `grid_sample` over the padded batch (align_corners=False, border padding) at the same
        coordinates, read from where each sample lies: a pixel's right or lower neighbour
        past its sample's edge has weight 0 and is clamped to the edge, never read from the
        next sample."""
        device = self.data.device
        starts = self.ends - self.heights * self.widths * self.channels
        sides = torch.from_numpy(np.stack([starts, self.heights, self.widths]))
        if device.type == "cuda":  # see NOTE in augment._params_on: a pageable copy waits
            sides = sides.pin_memory()
        start, height, width = sides.to(device, non_blocking=True)
        if self.layout == "HWC":
            row, column = width * self.channels, torch.full_like(width, self.channels)
            plane = torch.ones_like(width)
        else:
            row, column, plane = width, torch.ones_like(width), height * width
        channel = torch.arange(self.channels, device=device)
        base = (start[:, None] + channel[None, :] * plane[:, None])[:, :, None, None]  # B,C,1,1
        y0f, x0f = ys.floor(), xs.floor()
        wy = (ys - y0f)[:, None, :, None]
        wx = (xs - x0f)[:, None, None, :]
        y0, x0 = y0f.long(), x0f.long()
        y1 = torch.minimum(y0 + 1, (height - 1)[:, None])
        x1 = torch.minimum(x0 + 1, (width - 1)[:, None])
        rows = [(y * row[:, None])[:, None, :, None] for y in (y0, y1)]  # B,1,oh,1
        columns = [(x * column[:, None])[:, None, None, :] for x in (x0, x1)]  # B,1,1,ow

        def at(r: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
            return self.data[base + r + c].float()

        top = torch.lerp(at(rows[0], columns[0]), at(rows[0], columns[1]), wx)
        bottom = torch.lerp(at(rows[1], columns[0]), at(rows[1], columns[1]), wx)
        return torch.lerp(top, bottom, wy)
