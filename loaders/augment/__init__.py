"""Crops, flips and resizes: their random parameters drawn as pure functions of (seed, epoch,
index), applied as batched tensor ops on the device, or made where batches are gathered.

Modules:
- `crops`:       batched crops, flips and resizes on the device
- `draws`:       crop boxes and flips, pure functions of (seed, epoch, index)
- `worker_crop`: crops made where batches are gathered, decoded at a reduced scale
"""

from __future__ import annotations

from etl.deprecations import forwarding

FORMER_NAMES = {
    **dict.fromkeys(("RandomResizedCrop", "CenterCrop", "Resize"), "loaders"),
    **dict.fromkeys(
        ("Augment", "Images", "Sizes", "resized_crop", "resize_center_crop", "resized_sides",
         "center_crops", "own_sides", "resize_whole"),
        "loaders.augment.crops",
    ),
    **dict.fromkeys(("uniforms", "crop_boxes", "flips"), "loaders.augment.draws"),
}  # fmt: skip
"""What the module `loaders.augment` held before it became this room (#72), by where it is
now: `from loaders.augment import RandomResizedCrop` still works for a release, warning once."""


__getattr__ = forwarding("loaders.augment", FORMER_NAMES)
