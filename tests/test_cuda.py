"""The CUDA path on a real GPU: pinned batches, non-blocking copies on DeviceLoader's side
stream, batched augmentation on the device. Skipped without CUDA; the same code runs on the CPU
in the other tests, and here each result is compared with the CPU's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from packed import Packed, make_packed

from loaders import DeviceLoader, PackedDataset, PackedLoader, make_loader
from loaders.augment import RandomResizedCrop, crop_boxes, flips, resized_crop

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.3)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    return make_packed(
        tmp_path_factory.mktemp("ds"), shard_sizes=(40, 33, 51), sample_shape=(32, 40, 3)
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_are_pinned_and_arrive_intact(packed: Packed, num_workers: int) -> None:
    ds = PackedDataset.open(packed.root)

    def loader() -> PackedLoader:
        made = make_loader(ds, batch_size=16, shuffle=True, num_workers=num_workers)
        made.set_epoch(1)
        return made

    host = [(b.images.clone(), b.labels.clone()) for b in loader()]
    assert all(images.is_pinned() for images, _ in loader()), "pinned by default with CUDA"
    device = DeviceLoader(loader(), dtype=torch.float32, mean=MEAN, std=STD, channels_last=True)
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    for (images, labels), (raw, raw_labels) in zip(device, host, strict=True):
        assert images.is_cuda and images.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(labels.cpu(), raw_labels)
        expected = (raw.permute(0, 3, 1, 2).double() / 255 - mean) / std
        torch.testing.assert_close(images.cpu().double(), expected, atol=1e-5, rtol=0)


def test_side_stream_copies_survive_a_slow_consumer(packed: Packed) -> None:
    """Batches held while the next copy runs must not be overwritten (record_stream)."""
    ds = PackedDataset.open(packed.root)
    loader = make_loader(ds, batch_size=8, shuffle=True)
    kept = []
    busy = torch.randn(2048, 2048, device="cuda")
    for images, _ in DeviceLoader(loader):
        for _ in range(4):
            busy = busy @ busy / 2048  # keep the compute stream busy while the next copy runs
        kept.append(images)
    expected = [b.images.permute(0, 3, 1, 2) for b in make_loader(ds, batch_size=8, shuffle=True)]
    for got, want in zip(kept, expected, strict=True):
        assert torch.equal(got.cpu(), want)


def test_batched_augmentation_on_cuda_equals_the_cpu_loop() -> None:
    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, (64, 3, 48, 40), dtype=np.uint8))
    index = np.arange(64)
    boxes, mirrored = crop_boxes(2, 1, index, 48, 40), flips(2, 1, index)
    on_cpu = resized_crop(images, torch.from_numpy(boxes), torch.from_numpy(mirrored), (32, 32))
    on_gpu = RandomResizedCrop(32, seed=2)(images.cuda(), torch.from_numpy(index), 1)
    assert on_gpu.is_cuda
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, atol=2e-3, rtol=0)


def test_resume_and_memory_through_device_loader_on_cuda(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    loader = make_loader(ds, batch_size=8, shuffle=True, with_indices=True)
    device = DeviceLoader(loader, augment=RandomResizedCrop(24), mean=MEAN, std=STD)
    device.set_epoch(0)
    for step, _ in enumerate(device, start=1):
        if step == 3:
            assert device.state_dict()["position"] == 24, "the batch prepared ahead is not counted"
            break
    torch.cuda.synchronize()
    after = []
    for epoch in (1, 2, 3):
        device.set_epoch(epoch)
        for _ in device:
            pass
        torch.cuda.synchronize()
        after.append(torch.cuda.memory_allocated())
    assert after[2] <= after[1] <= after[0] + (8 << 20), f"GPU memory grows: {after}"
