"""Batched augmentation on the device: random resized crop + horizontal flip for training, resize
+ centre crop for evaluation, each a few tensor ops per batch (one `grid_sample`), never a Python
loop over samples. Their random parameters are `loaders.augment.draws`' pure functions of
(seed, epoch, dataset index), drawn with numpy on the CPU (a few numbers per sample); only the
resampling runs on the device.

NOTE [ resampling ]: output pixel i of a crop (top, h) resized to `size` samples the source at
top + (i + 0.5) * h / size - 0.5, clamped to the crop, with bilinear weights: exactly what
`F.interpolate(crop, size, mode="bilinear", align_corners=False)` computes (torchvision's
`resized_crop(..., antialias=False)`), checked per sample by the tests. torchvision's default
for tensors is antialias=True, which low-pass filters before downscaling; the difference is
measured and reported by benchmarks/load/augment.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from numpy.typing import NDArray

from loaders.augment.draws import crop_boxes, flips
from loaders.batch.ragged import RaggedImages

Augment = Callable[[torch.Tensor, "torch.Tensor | None", int], torch.Tensor]
"""(NCHW uint8 images on the device, their dataset indices or None, epoch) -> float NCHW in the
images' 0-255 range: what `DeviceLoader(augment=...)` calls for each batch. Samples of several
sizes come padded with `sizes=`, or, to an augmentation whose `takes_ragged` is true (those
here), as `RaggedImages` (`loaders.batch.ragged`)."""

Images = torch.Tensor | RaggedImages
"""A batch an augmentation here takes: NCHW uint8 (padded where `sizes` says so), or samples of
several sizes back to back."""

Sizes = tuple[NDArray[np.integer], NDArray[np.integer]]
"""Each sample's (heights, widths) in a batch of samples of several sizes, padded."""


def _sample(images: Images, ys: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
    """Bilinear samples of NCHW `images` at source pixel coordinates: ys [B, oh], xs [B, ow]
    (already clamped to where each sample may read) -> float [B, C, oh, ow]."""
    if isinstance(images, RaggedImages):
        return images.bilinear(ys, xs)
    _, _, height, width = images.shape
    gy = (2 * ys + 1) / height - 1  # grid_sample's align_corners=False pixel convention
    gx = (2 * xs + 1) / width - 1
    grid = torch.stack(torch.broadcast_tensors(gx[:, None, :], gy[:, :, None]), dim=-1)
    source = images if images.is_floating_point() else images.float()
    return F.grid_sample(source, grid, "bilinear", padding_mode="border", align_corners=False)


def _each(images: Images) -> list[torch.Tensor] | torch.Tensor:
    """The batch's samples, each [C, H, W] (padded ones with their padding)."""
    return images.images() if isinstance(images, RaggedImages) else images


def _channels(images: Images) -> int:
    return images.channels if isinstance(images, RaggedImages) else int(images.shape[1])


def resized_crop(
    images: Images,
    boxes: torch.Tensor,
    flip: torch.Tensor,
    size: tuple[int, int],
    batched: bool | None = None,
) -> torch.Tensor:
    """Crop boxes (top, left, h, w) of NCHW `images`, resized to `size`, mirrored where `flip`:
    float32 [B, C, *size] in the input's value range (see NOTE [ resampling ]).

    NOTE [ batched or not ]: `batched` (default: on CUDA) resamples the whole batch with one
    `grid_sample`, a kernel launch or two per batch instead of a few per sample. On the CPU a
    loop of `F.interpolate` over the crops computes the same values faster (its separable
    bilinear kernel against grid_sample's general one: 2.2x in benchmarks/load/augment.py), so
    the CPU takes the loop; both are tested against each other.
    """
    if batched is None:
        batched = images.device.type == "cuda"
    if not batched:
        out = []
        for image, (top, left, h, w), mirror in zip(
            _each(images), boxes.tolist(), flip.tolist(), strict=True
        ):
            crop = image[None, :, top : top + h, left : left + w].float()
            one = F.interpolate(crop, size=size, mode="bilinear", align_corners=False)[0]
            out.append(one.flip(-1) if mirror else one)
        if out:
            return torch.stack(out)
        return torch.empty((0, _channels(images), *size), dtype=torch.float32, device=images.device)
    oh, ow = size
    box = boxes.to(images.device, torch.float32)
    top, left, h, w = box.unbind(dim=1)
    i = torch.arange(oh, device=images.device, dtype=torch.float32)
    j = torch.arange(ow, device=images.device, dtype=torch.float32)
    ys = top[:, None] + (i[None, :] + 0.5) * (h / oh)[:, None] - 0.5
    xs = left[:, None] + (j[None, :] + 0.5) * (w / ow)[:, None] - 0.5
    ys = torch.minimum(torch.maximum(ys, top[:, None]), (top + h - 1)[:, None])
    xs = torch.minimum(torch.maximum(xs, left[:, None]), (left + w - 1)[:, None])
    xs = torch.where(flip.to(images.device)[:, None], xs.flip(1), xs)
    return _sample(images, ys, xs)


def resize_center_crop(images: torch.Tensor, resize: int, size: tuple[int, int]) -> torch.Tensor:
    """torchvision's `Resize(resize)` (shorter side, antialias=False) then `CenterCrop(size)`:
    float32 [B, C, *size]. One batched `F.interpolate`, as every image has the same size."""
    _, _, height, width = images.shape
    rh, rw = resized_sides(height, width, resize)
    oh, ow = size
    if oh > rh or ow > rw:
        raise ValueError(f"a centre crop of {size} does not fit in a resize to {(rh, rw)}")
    top, left = round((rh - oh) / 2.0), round((rw - ow) / 2.0)
    resized = F.interpolate(images.float(), (rh, rw), mode="bilinear", align_corners=False)
    return resized[:, :, top : top + oh, left : left + ow]


def resized_sides(height: int, width: int, resize: int) -> tuple[int, int]:
    """torchvision's `Resize(resize)` of an image of (height, width): the shorter side to
    `resize`, the longer truncated to keep the ratio."""
    if height <= width:
        return resize, int(resize * width / height)
    return int(resize * height / width), resize


def center_crops(
    images: Images,
    heights: NDArray[np.integer],
    widths: NDArray[np.integer],
    resize: int,
    size: tuple[int, int],
) -> torch.Tensor:
    """`resize_center_crop` of each sample of a padded NCHW batch at its own size, all at once
    (one `grid_sample`): output pixel i of sample k samples its source at
    (top + i + 0.5) * h / rh - 0.5, clamped to its own image, which is `F.interpolate` to
    (rh, rw) (align_corners=False) followed by the crop, without the resized image."""
    oh, ow = size
    sides = [
        resized_sides(h, w, resize) for h, w in zip(heights.tolist(), widths.tolist(), strict=True)
    ]
    rh = np.array([s[0] for s in sides], np.float64)
    rw = np.array([s[1] for s in sides], np.float64)
    if (rh < oh).any() or (rw < ow).any():
        raise ValueError(f"a centre crop of {size} does not fit in a resize to {resize}")
    top, left = np.round((rh - oh) / 2.0), np.round((rw - ow) / 2.0)
    h, w = np.asarray(heights, np.float64), np.asarray(widths, np.float64)
    ys = (top[:, None] + np.arange(oh)[None, :] + 0.5) * (h / rh)[:, None] - 0.5
    xs = (left[:, None] + np.arange(ow)[None, :] + 0.5) * (w / rw)[:, None] - 0.5
    ys = np.clip(ys, 0, (h - 1)[:, None])
    xs = np.clip(xs, 0, (w - 1)[:, None])
    device = images.device
    return _sample(
        images,
        torch.from_numpy(ys).to(device, torch.float32),
        torch.from_numpy(xs).to(device, torch.float32),
    )


@dataclass(frozen=True)
class RandomResizedCrop:
    """Training augmentation for `DeviceLoader(augment=...)`: torchvision's RandomResizedCrop
    (bilinear) and RandomHorizontalFlip(p=flip), one batch at a time, parameters a pure function
    of (seed, epoch, dataset index)."""

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.5
    seed: int = 0
    takes_ragged: ClassVar[bool] = True

    def __call__(
        self,
        images: Images,
        index: torch.Tensor | None,
        epoch: int,
        sizes: Sizes | None = None,
    ) -> torch.Tensor:
        """`sizes`: each sample's (heights, widths) where samples of several sizes are padded
        into one batch (a `Mixture` of several shapes): each crop is drawn from its sample's
        own image, never the padding."""
        if index is None:
            raise TypeError(
                "RandomResizedCrop draws each sample's crop from its dataset index: build the "
                "loader with with_indices=True"
            )
        where = index.cpu().numpy()
        heights, widths = own_sides(images, sizes)
        boxes = crop_boxes(self.seed, epoch, where, heights, widths, self.scale, self.ratio)
        mirrored = flips(self.seed, epoch, where, self.flip)
        batched = images.device.type == "cuda"
        box, flip = _params_on(images.device if batched else None, boxes, mirrored)
        return resized_crop(images, box, flip, _pair(self.size), batched)


def _params_on(
    device: torch.device | None, boxes: NDArray[np.int64], mirrored: NDArray[np.bool_]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Crop boxes and flips as tensors on `device` (None: the CPU), sent as one pinned tensor
    with one non-blocking copy.

    NOTE: a blocking copy of a pageable tensor waits for all the work queued on the stream,
    which in `DeviceLoader` includes the next batch's image copy just issued: two such copies
    a batch held the host for the whole image copy, and a training step that syncs
    (`loss.item()`) then left the GPU idle for it every step.
    """
    params = torch.from_numpy(np.concatenate([boxes, mirrored[:, None].astype(np.int64)], 1))
    if device is not None:
        params = params.pin_memory().to(device, non_blocking=True)
    return params[:, :4], params[:, 4].bool()


@dataclass(frozen=True)
class CenterCrop:
    """Evaluation counterpart: resize the shorter side to `resize`, take the centre `size`."""

    size: int | tuple[int, int]
    resize: int | None = None
    """Shorter side before cropping; default: the crop's shorter side (a plain resize)."""
    takes_ragged: ClassVar[bool] = True

    def __call__(
        self,
        images: Images,
        index: torch.Tensor | None,
        epoch: int,
        sizes: Sizes | None = None,
    ) -> torch.Tensor:
        """`sizes`: as for `RandomResizedCrop`. On CUDA the batch is resampled at once (one
        `grid_sample`, `center_crops`); on the CPU the samples of each size are resized
        together (one `F.interpolate` a size), which computes the same values."""
        size = _pair(self.size)
        resize = self.resize or min(size)
        if sizes is None and not isinstance(images, RaggedImages):
            return resize_center_crop(images, resize, size)
        heights, widths = own_sides(images, sizes)
        if images.device.type == "cuda":
            return center_crops(images, heights, widths, resize, size)
        shape = (len(images), _channels(images), *size)
        out = torch.empty(shape, dtype=torch.float32, device=images.device)
        for h, w in sorted(set(zip(heights.tolist(), widths.tolist(), strict=True))):
            chosen = np.flatnonzero((heights == h) & (widths == w))
            alike = _alike(images, chosen, h, w)
            out[torch.from_numpy(chosen).to(images.device)] = resize_center_crop(
                alike, resize, size
            )
        return out


def _alike(images: Images, chosen: NDArray[np.intp], height: int, width: int) -> torch.Tensor:
    """The `chosen` samples of a batch, all `height` x `width`, as one NCHW tensor."""
    if isinstance(images, RaggedImages):
        return torch.stack([images.image(int(k)) for k in chosen])
    at = torch.from_numpy(chosen).to(images.device)
    return images[at][:, :, :height, :width]


def own_sides(images: Images, sizes: Sizes | None) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Each sample's (heights, widths): `sizes` of a padded batch, else the batch's own."""
    if isinstance(images, RaggedImages):
        return images.heights, images.widths
    if sizes is not None:
        return np.asarray(sizes[0], np.int64), np.asarray(sizes[1], np.int64)
    n, _, height, width = images.shape
    return np.full(n, height, np.int64), np.full(n, width, np.int64)


def resize_whole(
    images: Images, sizes: Sizes | None, size: tuple[int, int], flip: NDArray[np.bool_]
) -> torch.Tensor:
    """Each sample of an NCHW batch, whole (its own size where `sizes` says it is padded),
    resized to `size` and mirrored where `flip`: one `grid_sample` on CUDA, a loop of
    `F.interpolate` on the CPU (`resized_crop` with boxes of whole images)."""
    n = len(images)
    heights, widths = own_sides(images, sizes)
    boxes = np.stack([np.zeros(n, np.int64), np.zeros(n, np.int64), heights, widths], axis=1)
    batched = images.device.type == "cuda"
    box, mirrored = _params_on(images.device if batched else None, boxes, flip)
    return resized_crop(images, box, mirrored, size, batched)


@dataclass(frozen=True)
class Resize:
    """A plain resize of each whole sample to `size` (its aspect ratio not kept), also of a
    padded batch of samples of several sizes: for evaluation, or a model that wants whole
    pictures."""

    size: int | tuple[int, int]
    takes_ragged: ClassVar[bool] = True

    def __call__(
        self,
        images: Images,
        index: torch.Tensor | None,
        epoch: int,
        sizes: Sizes | None = None,
    ) -> torch.Tensor:
        return resize_whole(images, sizes, _pair(self.size), np.zeros(len(images), bool))


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    height, width = size
    return int(height), int(width)
