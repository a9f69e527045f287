"""The CUDA path on a real GPU: pinned batches, non-blocking copies on DeviceLoader's side
stream, batches made on the device, the device index, batched augmentation. Skipped without
CUDA; the same code runs on the CPU in the other tests.

Each test that guards a mechanism says which (`@pytest.mark.guards`), and `BREAKS` says how to
remove it: `pytest -m cuda --break-mechanism NAME` runs only the tests guarding NAME with it
removed, and they must fail (benchmarks/gpu_check.sh checks that they do). Every batch is
compared with what `make_packed` wrote, never with another path of the loaders.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

import loaders.augment.crops
import loaders.device.loader
from loaders import DeviceLoader, PackedDataset, RandomResizedCrop, make_loader
from loaders.augment.crops import resized_crop
from loaders.augment.draws import crop_boxes, flips
from tests.helpers.cuda import batches_without_a_sync
from tests.helpers.packed import Packed, make_packed

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.3)
SLEEP = 20_000_000
"""`torch.cuda._sleep` cycles: ~10 ms at 2 GHz, far longer than a batch's copy here."""


def _blocking_params(device: Any, boxes: Any, mirrored: Any) -> tuple[torch.Tensor, torch.Tensor]:
    params = torch.from_numpy(np.concatenate([boxes, mirrored[:, None].astype(np.int64)], 1))
    if device is not None:
        params = params.to(device)  # pageable: the copy waits for the whole stream
    return params[:, :4], params[:, 4].bool()


BREAKS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "record_stream": lambda mp: mp.setattr(torch.Tensor, "record_stream", lambda t, s: None),
    "wait_stream": lambda mp: mp.setattr(torch.cuda.Stream, "wait_stream", lambda a, b: None),
    "pinned_output": lambda mp: mp.setattr(torch.Tensor, "pin_memory", lambda t, *a: t),
    "nonblocking_params": lambda mp: mp.setattr(
        loaders.augment.crops, "_params_on", _blocking_params
    ),
    "bound_device": lambda mp: mp.setattr(
        loaders.device.loader, "bound_device", lambda d: torch.device(d or "cuda")
    ),
}


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    return make_packed(
        tmp_path_factory.mktemp("ds"), shard_sizes=(40, 33, 51), sample_shape=(32, 40, 3)
    )


def written(packed: Packed, ds: PackedDataset, indices: torch.Tensor) -> torch.Tensor:
    """The images `make_packed` wrote for dataset indices, NCHW: the independent oracle."""
    positions = ds.selection.positions[indices.numpy()]
    return torch.from_numpy(packed.images[positions]).permute(0, 3, 1, 2)


@pytest.mark.guards("pinned_output")
@pytest.mark.parametrize("transform", [False, True], ids=["gathered", "per-sample transform"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_are_pinned_and_arrive_intact(
    packed: Packed, num_workers: int, transform: bool
) -> None:
    """Images and labels arrive pinned (a pageable label copy would wait for the image copy),
    with a per-sample transform too; on the device they equal what was written."""
    identity: Callable[[torch.Tensor], torch.Tensor] | None = (
        (lambda image: image.clone()) if transform else None
    )
    ds = PackedDataset.open(packed.root, transform=identity)
    loader = make_loader(
        ds, batch_size=16, shuffle=True, num_workers=num_workers, workers_as="processes"
    )
    assert loader.pin_memory
    batches = list(loader)
    assert batches and all(b.images.is_pinned() and b.labels.is_pinned() for b in batches)
    indexed = make_loader(ds, batch_size=16, shuffle=True, with_indices=True)
    device = DeviceLoader(indexed, dtype=torch.float32, mean=MEAN, std=STD, channels_last=True)
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    for images, labels, indices in device:
        assert images.is_cuda and images.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(labels.cpu(), torch.from_numpy(ds.labels[indices.numpy()]))
        expected = (written(packed, ds, indices).double() / 255 - mean) / std
        torch.testing.assert_close(images.cpu().double(), expected, atol=1e-5, rtol=0)


@pytest.mark.guards("record_stream")
def test_batches_dropped_while_the_consumer_still_reads_them_are_not_overwritten(
    packed: Packed,
) -> None:
    """The loop queues a long kernel, then a read of the batch, then drops the batch: its
    memory must not go to the next batch's copy (on the side stream) before the read ran."""
    ds = PackedDataset.open(packed.root)
    loader = make_loader(ds, batch_size=16, shuffle=True, with_indices=True)
    snapshots, expected = [], []
    for images, _, indices in DeviceLoader(loader):
        torch.cuda._sleep(SLEEP)  # the compute stream is busy: the read below waits
        snapshots.append(images.clone())
        expected.append(written(packed, ds, indices))
        del images  # the training step is done with the batch
    torch.cuda.synchronize()
    assert len(snapshots) == len(loader) > 2
    for got, want in zip(snapshots, expected, strict=True):
        assert torch.equal(got.cpu(), want)


@pytest.mark.guards("wait_stream")
def test_the_consumer_waits_for_the_side_streams_conversion(
    packed: Packed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow conversion on the side stream (a long kernel queued before it): the batch the
    loop reads at once must be the converted one, not memory the conversion has yet to fill."""
    convert = loaders.device.loader.prepare_images

    def slow(*args: Any, **kwargs: Any) -> torch.Tensor:
        torch.cuda._sleep(SLEEP)  # runs on the side stream: DeviceLoader's context
        return convert(*args, **kwargs)

    monkeypatch.setattr(loaders.device.loader, "prepare_images", slow)
    ds = PackedDataset.open(packed.root)
    loader = make_loader(ds, batch_size=16, shuffle=True, with_indices=True)
    for images, _, indices in DeviceLoader(loader):
        got = images.clone()  # on the compute stream, right away
        assert torch.equal(got.cpu(), written(packed, ds, indices))


@pytest.mark.guards("wait_stream")
def test_batches_made_on_the_device_are_read_after_they_are_made(packed: Packed) -> None:
    """A transform on the GPU makes the batch on the compute stream (here: a long kernel, then
    the copy); the side stream must wait for that before converting it."""
    ds = PackedDataset.open(packed.root)

    def made_on_the_gpu() -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        for images, labels, indices in make_loader(ds, batch_size=16, with_indices=True):
            there = torch.empty(images.shape, dtype=torch.uint8, device="cuda")
            torch.cuda._sleep(SLEEP)
            there.copy_(images, non_blocking=True)
            yield there, labels.cuda(), indices

    device = DeviceLoader(made_on_the_gpu(), dtype=torch.float32, layout="HWC")
    count = 0
    for images, _, indices in device:
        torch.testing.assert_close(images.cpu(), written(packed, ds, indices).float() / 255)
        count += 1
    assert count == -(-len(ds) // 16)


@pytest.mark.guards("nonblocking_params")
def test_an_augmented_epoch_never_blocks_the_host(packed: Packed) -> None:
    """No call of the feed waits for the GPU: the crop boxes and flips travel without a sync,
    so a copy queued ahead stays hidden behind the training step."""
    ds = PackedDataset.open(packed.root)
    loader = make_loader(ds, batch_size=16, shuffle=True, with_indices=True)
    device = DeviceLoader(loader, augment=RandomResizedCrop(24), mean=MEAN, std=STD)
    assert batches_without_a_sync(device) == len(loader)


def test_batched_augmentation_on_cuda_equals_the_cpu_loop(packed: Packed) -> None:
    """On the input DeviceLoader passes: an HWC batch permuted to NCHW (channels-last strides).
    The tolerance: float32 bilinear weights computed in another order, in 0-255 units."""
    ds = PackedDataset.open(packed.root)
    batch = ds.gather(np.arange(64))
    nhwc = batch.images  # [B, H, W, C] as stored
    index = np.arange(64)
    boxes, mirrored = crop_boxes(2, 1, index, 32, 40), flips(2, 1, index)
    reference = resized_crop(
        nhwc.permute(0, 3, 1, 2).contiguous(),
        torch.from_numpy(boxes),
        torch.from_numpy(mirrored),
        (24, 24),
        batched=False,
    )
    on_gpu = RandomResizedCrop(24, seed=2)(
        nhwc.cuda().permute(0, 3, 1, 2), torch.from_numpy(index), 1
    )
    assert on_gpu.is_cuda
    torch.testing.assert_close(on_gpu.cpu(), reference, atol=2e-3, rtol=0)


def test_a_padded_mixture_batch_is_cropped_on_cuda_as_on_the_cpu(
    packed: Packed, tmp_path: Any
) -> None:
    """A Mixture of two sample sizes through DeviceLoader on CUDA: each crop drawn from its
    sample's own size, the batched kernel equal to the CPU loop on the same padded batch."""
    from loaders import Mixture

    big = make_packed(tmp_path / "big", shard_sizes=(40,), sample_shape=(48, 36, 3), seed=5)
    mix = Mixture([PackedDataset.open(packed.root), PackedDataset.open(big.root)], weights=[1, 1])
    loader = make_loader(mix, batch_size=32, seed=1)
    crop = RandomResizedCrop(24, seed=3)
    on_gpu = list(DeviceLoader(loader, dtype=torch.float32, augment=crop))
    padded = make_loader(mix, batch_size=32, seed=1)  # the loader above sends them back to back
    for batch, cpu in zip(on_gpu, padded, strict=True):
        sizes = (cpu.columns["sample.height"].numpy(), cpu.columns["sample.width"].numpy())
        reference = crop(cpu.images.permute(0, 3, 1, 2), cpu.indices, 0, sizes=sizes)
        assert batch.images.is_cuda
        torch.testing.assert_close(batch.images.cpu() * 255, reference, atol=2e-3, rtol=0)


@pytest.mark.guards("bound_device")
def test_cuda_without_an_index_is_the_device_current_when_built(packed: Packed) -> None:
    """Built after `set_device(k)`, a loader keeps cuda:k whichever device is current when it
    is iterated (two GPUs: batches, stream and the waits all on the second)."""
    ds = PackedDataset.open(packed.root)
    last = torch.cuda.device_count() - 1
    with torch.cuda.device(last):
        device = DeviceLoader(make_loader(ds, batch_size=16, with_indices=True), "cuda")
    assert device.device == torch.device("cuda", last)
    with torch.cuda.device(0):
        for images, labels, indices in device:
            assert images.device == labels.device == torch.device("cuda", last)
            assert torch.equal(images.cpu(), written(packed, ds, indices))


def test_gpu_memory_is_flat_over_epochs_and_resume_counts_what_arrived(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    loader = make_loader(ds, batch_size=8, shuffle=True, with_indices=True)
    device = DeviceLoader(loader, augment=RandomResizedCrop(24), mean=MEAN, std=STD)
    device.set_epoch(0)
    for step, _ in enumerate(device, start=1):
        if step == 3:
            assert device.state_dict()["position"] == 24, "the batch prepared ahead is not counted"
            assert loader.state_dict() == device.state_dict()
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


@pytest.fixture(scope="module")
def aspect_kept(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A dataset of samples that keep their aspect ratio (format version 2), packed by etl."""
    from tests.helpers.aspect import pack_aspect

    return pack_aspect(tmp_path_factory.mktemp("aspect"), count=20, seed=7)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_samples_of_their_own_size_are_cropped_on_cuda_as_on_the_cpu(
    aspect_kept: Any, num_workers: int
) -> None:
    """Samples that keep their aspect ratio through DeviceLoader on CUDA, sent back to back
    (the loader's batches 1-d): RandomResizedCrop, CenterCrop, a plain Resize and bucket
    resizes (a few kernels a batch each) give what the CPU computes for the same batch padded;
    an augmentation of padded batches gets them padded on the device."""
    from loaders import AspectBuckets, CenterCrop, Resize, ResizeToBucket
    from loaders.batch.types import SIZE_COLUMNS

    ds = PackedDataset.open(aspect_kept)
    buckets = AspectBuckets.of(ds.sample_sizes, count=3, area=16 * 16)
    augments = [RandomResizedCrop(12, seed=3), CenterCrop(12, resize=16), Resize((10, 14))]

    def padded_only(images: torch.Tensor, index: Any, epoch: int, sizes: Any = None) -> Any:
        assert images.dim() == 4  # padded, on the device or (the reference) on the CPU
        return augments[0](images, index, epoch, sizes=sizes)

    cases = [*((a, True) for a in augments), (ResizeToBucket(buckets), buckets)]
    for augment, shuffle in [*cases, (padded_only, True)]:
        options: Any = {"batch_size": 4, "shuffle": shuffle, "seed": 1, "with_indices": True}
        loader = make_loader(ds, num_workers=num_workers, workers_as="processes", **options)
        on_gpu = list(DeviceLoader(loader, dtype=torch.float32, augment=augment))
        assert next(iter(loader)).images.dim() == 1, "not sent back to back"
        for batch, cpu in zip(on_gpu, make_loader(ds, **options), strict=True):
            sizes = tuple(cpu.columns[name].numpy() for name in SIZE_COLUMNS)
            assert cpu.images.dim() == 4
            reference = augment(cpu.images.permute(0, 3, 1, 2), cpu.indices, 0, sizes=sizes)
            assert batch.images.is_cuda and torch.equal(batch.indices, cpu.indices)
            torch.testing.assert_close(batch.images.cpu() * 255, reference, atol=3e-3, rtol=0)


@pytest.mark.guards("nonblocking_params")
def test_an_epoch_of_samples_back_to_back_never_blocks_the_host(aspect_kept: Any) -> None:
    """Cropping samples back to back waits for nothing on the host: their sizes travel to the
    device without a sync, as the crop boxes do."""
    ds = PackedDataset.open(aspect_kept)
    loader = make_loader(ds, batch_size=4, shuffle=True, with_indices=True)
    device = DeviceLoader(loader, augment=RandomResizedCrop(12), mean=MEAN, std=STD)
    assert batches_without_a_sync(device) == len(loader)
