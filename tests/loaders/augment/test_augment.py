"""Batched augmentation against per-sample references: torchvision's documented get_params
algorithm transcribed sample by sample, and `F.interpolate` of each crop (what torchvision's
`resized_crop(..., antialias=False)` computes)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from loaders import DeviceLoader, PackedDataset, make_loader
from loaders.augment.crops import CenterCrop, RandomResizedCrop, resize_center_crop, resized_crop
from loaders.augment.draws import crop_boxes, flips, uniforms
from tests.helpers.packed import Packed, make_packed


@pytest.fixture(autouse=True)
def _quiet_cpu_note() -> None:
    warnings.filterwarnings("ignore", "CUDA is not available", RuntimeWarning)


def test_uniforms_are_a_pure_function_of_seed_epoch_index() -> None:
    index = np.arange(5000)
    u = uniforms(3, 1, index, 4)
    assert u.shape == (5000, 4) and u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    np.testing.assert_array_equal(uniforms(3, 1, index[[7, 4000]], 4), u[[7, 4000]])
    assert not np.array_equal(uniforms(3, 2, index, 4), u), "another epoch, other draws"
    assert not np.array_equal(uniforms(4, 1, index, 4), u), "another seed, other draws"
    assert abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 0.05


def reference_box(
    u: np.ndarray, height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float]
) -> tuple[int, int, int, int]:
    """torchvision.transforms.RandomResizedCrop.get_params, fed from the same draws."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    draws = u.reshape(4, -1)
    for attempt in range(draws.shape[1]):
        target_area = area * (scale[0] + (scale[1] - scale[0]) * draws[0, attempt])
        aspect = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * draws[1, attempt])
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(draws[2, attempt] * (height - h + 1))
            left = int(draws[3, attempt] * (width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        h, w = height, round(height * max(ratio))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


@pytest.mark.parametrize(
    ("height", "width", "scale", "ratio"),
    [
        (256, 256, (0.08, 1.0), (3 / 4, 4 / 3)),
        (37, 90, (0.08, 1.0), (3 / 4, 4 / 3)),
        (90, 37, (0.5, 1.0), (1.0, 1.0)),
        (20, 100, (0.9, 1.0), (0.2, 0.3)),  # rarely fits: the fallback
    ],
)
def test_crop_boxes_follow_torchvision_get_params(
    height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float]
) -> None:
    index = np.arange(400)
    boxes = crop_boxes(5, 2, index, height, width, scale, ratio)
    u = uniforms(5, 2, index, 40)
    expected = [reference_box(u[i], height, width, scale, ratio) for i in index]
    assert boxes.tolist() == [list(b) for b in expected]
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (h >= 1).all() and (w >= 1).all()
    assert (top + h <= height).all() and (left + w <= width).all()


def test_flips_are_about_half_and_independent_of_the_box() -> None:
    index = np.arange(4000)
    mirrored = flips(0, 0, index)
    assert 0.45 < mirrored.mean() < 0.55
    assert not flips(0, 0, index, p=0.0).any() and flips(0, 0, index, p=1.0).all()


def per_sample_crop(image: torch.Tensor, box: list[int], flip: bool, size: int) -> torch.Tensor:
    top, left, h, w = box
    crop = image[None, :, top : top + h, left : left + w].float()
    out = F.interpolate(crop, size=(size, size), mode="bilinear", align_corners=False)[0]
    return out.flip(-1) if flip else out


@pytest.mark.parametrize("batched", [True, False], ids=["grid_sample", "loop"])
@pytest.mark.parametrize("size", [8, 24])
def test_resized_crop_equals_interpolate_of_each_crop(size: int, batched: bool) -> None:
    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, (32, 3, 37, 29), dtype=np.uint8))
    boxes = crop_boxes(1, 0, np.arange(32), 37, 29)
    boxes[0] = [0, 0, 37, 29]  # the whole image
    boxes[1] = [36, 28, 1, 1]  # one pixel, the far corner
    mirrored = flips(1, 0, np.arange(32))
    out = resized_crop(
        images, torch.from_numpy(boxes), torch.from_numpy(mirrored), (size, size), batched
    )
    assert out.shape == (32, 3, size, size) and out.dtype == torch.float32
    for i in range(32):
        expected = per_sample_crop(images[i], boxes[i].tolist(), bool(mirrored[i]), size)
        torch.testing.assert_close(out[i], expected, atol=2e-3, rtol=0)


def test_resize_center_crop_equals_torchvision_resize_then_center_crop() -> None:
    rng = np.random.default_rng(1)
    for height, width in ((40, 64), (64, 40), (50, 50)):
        images = torch.from_numpy(rng.integers(0, 256, (4, 3, height, width), dtype=np.uint8))
        out = resize_center_crop(images, 36, (32, 32))
        short, long = min(height, width), max(height, width)
        resized = (36, int(36 * long / short))
        if height > width:
            resized = resized[::-1]
        full = F.interpolate(images.float(), size=resized, mode="bilinear", align_corners=False)
        top = round((resized[0] - 32) / 2.0)
        left = round((resized[1] - 32) / 2.0)
        expected = full[:, :, top : top + 32, left : left + 32]
        torch.testing.assert_close(out, expected, atol=2e-3, rtol=0)
    with pytest.raises(ValueError, match="does not fit"):
        resize_center_crop(images, 20, (32, 32))


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    return make_packed(
        tmp_path_factory.mktemp("ds"), shard_sizes=(30, 25, 19), sample_shape=(20, 24, 3)
    )


def augmented(packed: Packed, num_workers: int, epoch: int) -> dict[int, torch.Tensor]:
    """Each sample's augmented image in one epoch, by dataset index."""
    ds = PackedDataset.open(packed.root)
    loader = make_loader(
        ds,
        batch_size=8,
        shuffle=True,
        seed=num_workers,
        num_workers=num_workers,
        workers_as="processes",
        with_indices=True,
    )
    loader.set_epoch(epoch)
    crop = RandomResizedCrop(16, seed=9)
    device = DeviceLoader(loader, device="cpu", augment=crop)
    return {
        int(i): image
        for images, _, indices in device
        for image, i in zip(images, indices, strict=True)
    }


def test_device_loader_augments_each_sample_the_same_whoever_reads_it(packed: Packed) -> None:
    alone = augmented(packed, 0, epoch=1)
    with_workers = augmented(packed, 2, epoch=1)  # another order too: seed=2
    assert alone.keys() == with_workers.keys()
    for index, image in alone.items():
        assert image.shape == (3, 16, 16) and image.dtype == torch.float32
        torch.testing.assert_close(with_workers[index], image, atol=0, rtol=0)
    other_epoch = augmented(packed, 0, epoch=2)
    assert any(not torch.equal(other_epoch[i], alone[i]) for i in alone)

    ds = PackedDataset.open(packed.root)
    stored = ds.gather(list(alone)).images.permute(0, 3, 1, 2)  # independent: the raw bytes
    boxes = crop_boxes(9, 1, np.array(list(alone)), 20, 24)
    mirrored = flips(9, 1, np.array(list(alone)))
    for k, index in enumerate(alone):
        expected = per_sample_crop(stored[k], boxes[k].tolist(), bool(mirrored[k]), 16) / 255
        torch.testing.assert_close(alone[index], expected, atol=2e-5, rtol=0)


def test_eval_center_crop_and_the_index_requirement(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    device = DeviceLoader(
        make_loader(ds, batch_size=8),
        device="cpu",
        augment=CenterCrop(16, resize=18),
        mean=(0.5,) * 3,
        std=(0.25,) * 3,
        channels_last=True,
    )
    images, _ = next(iter(device))
    assert images.shape == (8, 3, 16, 16)
    assert images.is_contiguous(memory_format=torch.channels_last)
    raw = ds.gather(list(range(8))).images.permute(0, 3, 1, 2)
    expected = (resize_center_crop(raw, 18, (16, 16)) / 255 - 0.5) / 0.25
    torch.testing.assert_close(images, expected, atol=1e-4, rtol=0)
    without = DeviceLoader(make_loader(ds, batch_size=8), "cpu", augment=RandomResizedCrop(16))
    with pytest.raises(TypeError, match="with_indices=True"):
        next(iter(without))
