"""Aspect-ratio buckets: batches whose samples share one shape, uncropped (what diffusion and
detection trainers each rebuild), for datasets whose samples keep their aspect ratio.

`AspectBuckets` divides aspect ratios (width / height) into a few buckets, each with one shape
of about the same area. `bucket_order` orders a dataset so that every batch of every rank
holds samples of one bucket (`make_loader(..., shuffle=buckets)`), and `ResizeToBucket`
resizes each sample of such a batch, whole, to its bucket's shape (`DeviceLoader(augment=)`):
one batched resample on CUDA, as `RandomResizedCrop`.

NOTE [ bucket order ]: a rank's batches are consecutive runs of `batch_size` in its part of
the order, and its part is every `world_size`-th index (`loaders.order.orders.partition`). So the
order is made of groups of `world_size * batch_size` indices of one bucket: striding a group
gives each rank one batch of it. A bucket's last, partial group is padded with its own samples
drawn again (or dropped with `drop_last`), so every group is whole and every rank gets the
same number of batches; groups are shuffled. A pure function of (seed, epoch), like every order
here: resume and DDP need nothing more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from numpy.typing import NDArray

from loaders.augment.crops import Images, Sizes, own_sides, resize_whole
from loaders.augment.draws import flips
from loaders.order.orders import Order, seeded_rng
from loaders.order.samplers import OrderSampler


@dataclass(frozen=True)
class AspectBuckets:
    """Aspect ratios (width / height), ascending: a sample belongs to the bucket whose ratio is
    nearest its own on a log scale. Each bucket's shape has about `area` pixels, its sides
    multiples of `multiple`."""

    ratios: tuple[float, ...]
    area: int
    multiple: int = 8

    def __post_init__(self) -> None:
        if (
            not self.ratios
            or any(r <= 0 for r in self.ratios)
            or list(self.ratios) != sorted(set(self.ratios))
        ):
            raise ValueError(f"ratios must be ascending, distinct and positive: {self.ratios}")
        if self.area < 1 or self.multiple < 1:
            raise ValueError(f"area and multiple must be >= 1, got {self.area}, {self.multiple}")

    @classmethod
    def of(
        cls, sizes: NDArray[np.integer], count: int = 5, area: int | None = None, multiple: int = 8
    ) -> AspectBuckets:
        """`count` buckets spread evenly (in log ratio) over the ratios of `sizes` ([n, 2]
        heights and widths, e.g. `PackedDataset.sample_sizes`): the same for the same data.
        `area` defaults to the median sample's."""
        sides = np.asarray(sizes, dtype=np.float64).reshape(-1, 2)
        if not len(sides) or count < 1:
            raise ValueError("buckets need samples and a count >= 1")
        logs = np.log(sides[:, 1] / sides[:, 0])
        low, high = float(logs.min()), float(logs.max())
        centres = np.linspace(low, high, count) if count > 1 and high > low else [(low + high) / 2]
        ratios = tuple(sorted({round(math.exp(c), 6) for c in centres}))
        median_area = int(np.median(sides[:, 0] * sides[:, 1]))
        return cls(ratios, area or median_area, multiple)

    def bucket_of(self, heights: NDArray[np.integer], widths: NDArray[np.integer]) -> Order:
        """The bucket of each sample of these sizes."""
        logs = np.log(np.asarray(widths, np.float64) / np.asarray(heights, np.float64))
        centres = np.log(np.asarray(self.ratios))
        return np.abs(logs[:, None] - centres[None, :]).argmin(axis=1).astype(np.int64)

    def shape(self, bucket: int) -> tuple[int, int]:
        """(height, width) of a bucket: its ratio, about `area` pixels, multiples of
        `multiple` (at least one multiple a side)."""
        ratio = self.ratios[bucket]
        height = math.sqrt(self.area / ratio)
        width = height * ratio
        m = self.multiple
        return max(m, round(height / m) * m), max(m, round(width / m) * m)


def bucket_order(
    buckets: NDArray[np.integer],
    seed: int,
    epoch: int,
    batch_size: int,
    world_size: int = 1,
    drop_last: bool = False,
) -> Order:
    """Indices in groups of `world_size * batch_size` of one bucket each (NOTE [ bucket
    order ]): every batch of every rank holds one bucket's samples."""
    if batch_size < 1 or world_size < 1:
        raise ValueError(f"batch_size and world_size must be >= 1: {batch_size}, {world_size}")
    buckets = np.asarray(buckets, dtype=np.int64)
    rng = seeded_rng(seed, epoch)
    group = batch_size * world_size
    groups: list[Order] = []
    for bucket in np.unique(buckets).tolist():
        members = rng.permutation(np.flatnonzero(buckets == bucket)).astype(np.int64)
        short = -len(members) % group
        if short and drop_last:
            members = members[: len(members) - len(members) % group]
        elif short:
            members = np.concatenate([members, rng.choice(members, short)])
        groups += np.split(members, len(members) // group) if len(members) else []
    if not groups:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([groups[i] for i in rng.permutation(len(groups))])


def bucket_length(buckets: NDArray[np.integer], group: int, drop_last: bool) -> int:
    """The length of `bucket_order`: each bucket's samples rounded to whole groups."""
    counts = np.bincount(np.asarray(buckets, np.int64)) if len(buckets) else np.zeros(0)
    whole = counts // group if drop_last else -(-counts // group)
    return int(whole.sum()) * group


class BucketSampler(OrderSampler):
    """Batches of one aspect bucket each, on every rank (`bucket_order`): what
    `make_loader(dataset, batch_size, shuffle=AspectBuckets...)` uses.

    The order depends on the global batch (world_size x batch_size: its groups), not on how
    it is split: a state resumes on any number of ranks with the same global batch, as every
    loader state does (NOTE [ elastic resume ] in `loaders.order.resume`), and each rank's batches
    stay one bucket's (a resumed segment starts at a group's start)."""

    def __init__(
        self,
        buckets: NDArray[np.integer],
        batch_size: int,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(seed, rank, world_size, drop_last)
        self.buckets = np.asarray(buckets, np.int64)
        self.batch_size = int(batch_size)

    def global_length(self) -> int:
        return bucket_length(self.buckets, self.batch_size * self.world_size, self.drop_last)

    def global_order(self, epoch: int) -> Order:
        return bucket_order(
            self.buckets, self.seed, epoch, self.batch_size, self.world_size, self.drop_last
        )

    def describe(self) -> str:
        counts = ",".join(str(n) for n in np.bincount(self.buckets).tolist())
        group = self.batch_size * self.world_size
        return f"buckets(n={len(self.buckets)}, global_batch={group}, counts={counts})"


@dataclass(frozen=True)
class ResizeToBucket:
    """`DeviceLoader(augment=...)` for batches of one aspect bucket (`bucket_order`): each
    sample, whole (never cropped), resized to its bucket's shape; flipped horizontally with
    probability `flip` (a pure function of seed, epoch and index). A batch of samples of
    several buckets is an error: order the loader with the same buckets."""

    buckets: AspectBuckets
    flip: float = 0.0
    seed: int = 0
    takes_ragged: ClassVar[bool] = True

    def __call__(
        self,
        images: Images,
        index: torch.Tensor | None,
        epoch: int,
        sizes: Sizes | None = None,
    ) -> torch.Tensor:
        heights, widths = own_sides(images, sizes)
        found = np.unique(self.buckets.bucket_of(heights, widths))
        if len(found) != 1:
            raise ValueError(
                f"a batch holds samples of buckets {found.tolist()}: order the loader with "
                "the same AspectBuckets (make_loader(..., shuffle=buckets))"
            )
        mirrored = np.zeros(len(images), bool)
        if self.flip:
            if index is None:
                raise TypeError("a flip is drawn from each sample's index: with_indices=True")
            mirrored = flips(self.seed, epoch, index.cpu().numpy(), self.flip)
        shape = self.buckets.shape(int(found[0]))
        return resize_whole(images, (heights, widths), shape, mirrored)
