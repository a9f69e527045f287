"""The random parameters of the crops: boxes and flips as pure functions of (seed, epoch,
dataset index) through a counter-based hash, so the same sample gets the same crop in an epoch
whichever worker, rank or batch reads it, and a resumed run replays it exactly.

They follow torchvision's `RandomResizedCrop.get_params` and `RandomHorizontalFlip`, drawn with
numpy on the CPU (a few numbers per sample); `loaders.augment.crops` applies them on the device,
`loaders.augment.worker_crop` where batches are gathered.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """splitmix64's finaliser: a bijection of uint64 that scatters neighbouring inputs."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniforms(seed: int, epoch: int, index: NDArray[np.integer], draws: int) -> NDArray[np.float64]:
    """[len(index), draws] floats in [0, 1): a pure function of (seed, epoch, index, draw)."""
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got seed={seed} epoch={epoch}")
    with np.errstate(over="ignore"):
        key = _mix(_mix(np.asarray([seed], dtype=np.uint64)) ^ np.uint64(epoch))
        per_sample = _mix(key ^ np.asarray(index, dtype=np.int64).astype(np.uint64))
        counters = np.arange(draws, dtype=np.uint64)
        bits = _mix(per_sample[:, None] ^ _mix(counters)[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def crop_boxes(
    seed: int,
    epoch: int,
    index: NDArray[np.integer],
    height: int | NDArray[np.integer],
    width: int | NDArray[np.integer],
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    attempts: int = 10,
) -> NDArray[np.int64]:
    """[n, 4] crop boxes (top, left, h, w), torchvision's RandomResizedCrop.get_params per sample.

    Up to `attempts` draws of an area fraction in `scale` and a log-uniform aspect ratio in
    `ratio`; the first box that fits is placed uniformly. Where none fits, the centre crop of
    the whole image with the ratio clamped to `ratio`. `height` and `width` are the batch's,
    or each sample's (arrays: samples of several sizes padded into one batch).
    """
    if not 0 < scale[0] <= scale[1] or not 0 < ratio[0] <= ratio[1]:
        raise ValueError(f"scale and ratio must be increasing positive pairs: {scale}, {ratio}")
    n = len(index)
    per_sample = np.ndim(height) > 0
    heights = np.broadcast_to(np.asarray(height, dtype=np.int64), (n,))
    widths = np.broadcast_to(np.asarray(width, dtype=np.int64), (n,))
    u = uniforms(seed, epoch, np.asarray(index), 4 * attempts).reshape(n, 4, attempts)
    if per_sample:
        height, width = heights[:, None], widths[:, None]
    area = height * width * (scale[0] + (scale[1] - scale[0]) * u[:, 0])
    low, high = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(low + (high - low) * u[:, 1])
    w = np.round(np.sqrt(area * aspect)).astype(np.int64)  # round half to even, as round()
    h = np.round(np.sqrt(area / aspect)).astype(np.int64)
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.argmax(axis=1)
    rows = np.arange(n)
    h, w = h[rows, first], w[rows, first]
    top = np.floor(u[rows, 2, first] * (heights - h + 1)).astype(np.int64)
    left = np.floor(u[rows, 3, first] * (widths - w + 1)).astype(np.int64)
    boxes = np.stack([top, left, h, w], axis=1)
    for i in np.flatnonzero(~fits.any(axis=1)).tolist():
        boxes[i] = _fallback_box(int(heights[i]), int(widths[i]), ratio)
    return boxes


def _fallback_box(height: int, width: int, ratio: tuple[float, float]) -> NDArray[np.int64]:
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        w, h = width, height
    return np.array([(height - h) // 2, (width - w) // 2, h, w], dtype=np.int64)


def flips(seed: int, epoch: int, index: NDArray[np.integer], p: float = 0.5) -> NDArray[np.bool_]:
    """Whether each sample is flipped horizontally (probability `p`), independent of its box."""
    return uniforms(seed + 1, epoch, np.asarray(index), 1)[:, 0] < p
