"""A crop's resize where a batch is gathered (OpenCV's `INTER_LINEAR`, NOTE [ resampling in a
worker ]) against two independent computations of the same box: torch's float
`F.interpolate(..., "bilinear", align_corners=False)`, the device path's formula (within 1
level everywhere), and Pillow's `BILINEAR` resize of the box (within 1 level inside the box
where it is enlarged; Pillow reads past the box's edge and antialiases what it shrinks, so
there only its mean is bounded: measured on 100 photos, 0.21-0.22 enlarged, 1.4 shrunk)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from etl.format.codecs import RAW
from loaders.augment.crops import CenterCrop, RandomResizedCrop
from loaders.augment.worker_crop import WorkerCrop, crop_sample
from tests.helpers.codecs import write_photos


def _float_resize(image: np.ndarray, box: tuple[int, int, int, int], size: tuple[int, int]):
    top, left, h, w = box
    part = torch.from_numpy(image[top : top + h, left : left + w].copy()).permute(2, 0, 1)
    made = F.interpolate(part[None].double(), size, mode="bilinear", align_corners=False)
    return made[0].permute(1, 2, 0).numpy()


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_a_random_crop_is_the_float_resize_of_its_box(channels: int, layout: str) -> None:
    """Random pixels (the hardest case for rounding), boxes that enlarge and that shrink (by
    up to 4x), flipped or not: every level within 1 of torch's float resize of that box, in
    the layout asked for, every slot of the output written."""
    rng = np.random.default_rng(channels)
    height, width = 61, 83
    image = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    stored = image if layout == "HWC" else np.ascontiguousarray(image.transpose(2, 0, 1))
    crop = WorkerCrop(RandomResizedCrop((17, 23), seed=0))
    for trial in range(40):
        h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
        flip = bool(trial % 2)
        shape = (17, 23, channels) if layout == "HWC" else (channels, 17, 23)
        out = np.full(shape, 7, np.uint8)
        box = np.array([top, left, h, w], np.float64)
        crop_sample(stored.reshape(-1), RAW, height, width, channels, layout, box, None, flip,
                    crop, out)  # fmt: skip
        want = _float_resize(image, (top, left, h, w), (17, 23))
        want = want[:, ::-1] if flip else want
        hwc = out if layout == "HWC" else out.transpose(1, 2, 0)
        assert np.abs(hwc - want).max() <= 1.0001, (trial, (top, left, h, w), flip)


def test_a_centre_crop_is_the_middle_of_the_float_resize() -> None:
    """CenterCrop(9, resize=11) of a 40x30 image: the middle 9x9 of torch's float resize of
    the whole image to the resized sides, within 1 level."""
    rng = np.random.default_rng(5)
    image = rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)
    crop = WorkerCrop(CenterCrop(9, resize=11))
    _, _, sides = crop.boxes(0, np.array([0]), np.array([40]), np.array([30]))
    assert sides is not None
    rh, rw = (int(v) for v in sides[0])
    out = np.empty((9, 9, 3), np.uint8)
    crop_sample(image.reshape(-1), RAW, 40, 30, 3, "HWC", np.zeros(4), sides[0], False, crop,
                out)  # fmt: skip
    whole = _float_resize(image, (0, 0, 40, 30), (rh, rw))
    top, left = round((rh - 9) / 2), round((rw - 9) / 2)
    assert np.abs(out - whole[top : top + 9, left : left + 9]).max() <= 1.0001


def test_random_crops_of_photos_are_pillows_bilinear_inside_the_box(tmp_path) -> None:
    """Photos cropped by RandomResizedCrop(32)'s own boxes: against Pillow's BILINEAR resize
    of the same box, within 1 level two pixels in from the edge where the box is enlarged,
    and a mean difference under 2 where it is shrunk (Pillow antialiases there)."""
    write_photos(tmp_path, count=16, sides=(48, 64))
    crop = WorkerCrop(RandomResizedCrop(32, seed=3, flip=0.0))
    enlarged = shrunk = 0
    for k, path in enumerate(sorted(tmp_path.rglob("*.png"))):
        photo = Image.open(path).convert("RGB")
        image = np.asarray(photo)
        height, width = image.shape[:2]
        boxes, _, _ = crop.boxes(0, np.array([k]), np.array([height]), np.array([width]))
        out = np.empty((32, 32, 3), np.uint8)
        crop_sample(image.reshape(-1), RAW, height, width, 3, "HWC", boxes[0], None, False,
                    crop, out)  # fmt: skip
        top, left, h, w = (int(v) for v in boxes[0])
        pillow = np.asarray(
            photo.resize((32, 32), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
        )
        diff = np.abs(out.astype(np.int64) - pillow)
        if h <= 32 and w <= 32:
            enlarged += 1
            assert diff[2:-2, 2:-2].max() <= 1, (k, (top, left, h, w))
        else:
            shrunk += 1
            assert diff.mean() < 2, (k, (top, left, h, w))
    assert enlarged and shrunk
