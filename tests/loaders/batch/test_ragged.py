"""Samples of several sizes sent back to back (`loaders.batch.ragged`, NOTE [ back to back ]): the
bytes a loader sends `DeviceLoader`, and the crops read from them. Oracles: plain numpy reads
of the shards (docs/FORMAT.md), and torch's own `grid_sample` / `F.interpolate` of each sample
alone, never a padded batch of ours."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders import (
    AspectBuckets,
    CenterCrop,
    DeviceLoader,
    Mixture,
    PackedDataset,
    PackedStream,
    RandomResizedCrop,
    Resize,
    ResizeToBucket,
    make_loader,
    stream_loader,
)
from loaders.augment.crops import resized_crop
from loaders.batch.ragged import RaggedImages
from loaders.batch.types import SIZE_COLUMNS
from loaders.read.catalog import open_catalog
from tests.helpers.aspect import pack_aspect, read_plainly

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module", params=["HWC", "CHW"])
def aspect_kept(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack_aspect(tmp_path_factory.mktemp("aspect"), count=23, seed=11, layout=request.param)


def _ragged(
    sides: list[tuple[int, int]], channels: int, layout: str, seed: int = 0
) -> tuple[RaggedImages, list[torch.Tensor]]:
    """Random samples back to back, and each alone as [C, H, W]."""
    rng = np.random.default_rng(seed)
    alone, flat = [], []
    for height, width in sides:
        hwc = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
        alone.append(torch.from_numpy(hwc).permute(2, 0, 1))
        stored = hwc if layout == "HWC" else hwc.transpose(2, 0, 1)
        flat.append(np.ascontiguousarray(stored).ravel())
    data = torch.from_numpy(np.concatenate(flat) if flat else np.zeros(0, np.uint8))
    heights = np.array([h for h, _ in sides], np.int64)
    widths = np.array([w for _, w in sides], np.int64)
    return RaggedImages(data, heights, widths, channels, layout), alone


@settings(max_examples=60, deadline=None)
@given(
    sides=st.lists(st.tuples(st.integers(1, 17), st.integers(1, 17)), min_size=1, max_size=6),
    channels=st.sampled_from([1, 3]),
    layout=st.sampled_from(["HWC", "CHW"]),
    out=st.tuples(st.integers(1, 9), st.integers(1, 9)),
    seed=st.integers(0, 2**16),
)
def test_bilinear_reads_each_sample_alone(
    sides: list[tuple[int, int]],
    channels: int,
    layout: str,
    out: tuple[int, int],
    seed: int,
) -> None:
    """Any coordinates within each sample's own image, edges included: the values torch's
    grid_sample gives of that sample alone (align_corners=False), so no neighbour past a
    sample's edge is read from the next one."""
    ragged, alone = _ragged(sides, channels, layout, seed)
    rng = np.random.default_rng(seed)
    ys, xs = [], []
    for height, width in sides:
        y = rng.uniform(0, height - 1, out[0])
        x = rng.uniform(0, width - 1, out[1])
        y[0], x[-1] = height - 1, width - 1  # the last row and column exactly
        ys.append(y)
        xs.append(x)
    got = ragged.bilinear(torch.tensor(np.array(ys), dtype=torch.float32),
                          torch.tensor(np.array(xs), dtype=torch.float32))  # fmt: skip
    assert got.shape == (len(sides), channels, *out) and got.dtype == torch.float32
    for k, image in enumerate(alone):
        height, width = image.shape[1:]
        gy = (2 * torch.tensor(ys[k], dtype=torch.float32) + 1) / height - 1
        gx = (2 * torch.tensor(xs[k], dtype=torch.float32) + 1) / width - 1
        grid = torch.stack(torch.broadcast_tensors(gx[None, :], gy[:, None]), dim=-1)[None]
        want = F.grid_sample(image[None].float(), grid, "bilinear", "border", align_corners=False)
        torch.testing.assert_close(got[k], want[0], atol=2e-3, rtol=0)


def test_a_batched_crop_of_samples_back_to_back_is_each_crop_alone() -> None:
    """`resized_crop` batched (CUDA's path, run here on the CPU) and the per-sample loop over
    samples back to back: F.interpolate of each crop of each sample alone."""
    sides = [(5, 9), (17, 4), (1, 1), (12, 12), (3, 30)]
    for layout in ("HWC", "CHW"):
        ragged, alone = _ragged(sides, 3, layout, seed=4)
        boxes = torch.tensor(
            [[1, 2, 3, 6], [0, 0, 17, 4], [0, 0, 1, 1], [4, 3, 8, 5], [0, 7, 3, 20]]
        )
        flip = torch.tensor([False, True, False, True, False])
        for batched in (True, False):
            got = resized_crop(ragged, boxes, flip, (6, 7), batched=batched)
            for k, (top, left, h, w) in enumerate(boxes.tolist()):
                crop = alone[k][None, :, top : top + h, left : left + w].float()
                want = F.interpolate(crop, (6, 7), mode="bilinear", align_corners=False)[0]
                want = want.flip(-1) if flip[k] else want
                torch.testing.assert_close(got[k], want, atol=2e-3, rtol=0)


def test_samples_back_to_back_that_do_not_add_up_are_refused() -> None:
    data = torch.zeros(2 * 3 * 3 + 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match="19 bytes given"):
        RaggedImages(data, np.array([2]), np.array([3]), 3, "HWC")
    with pytest.raises(ValueError, match="at least 1"):
        RaggedImages(data[:0], np.array([0]), np.array([3]), 3, "HWC")
    with pytest.raises(ValueError, match="1-d uint8"):
        RaggedImages(data.float(), np.array([2]), np.array([3]), 3, "HWC")
    with pytest.raises(ValueError, match="layout"):
        RaggedImages(data[:18], np.array([2]), np.array([3]), 3, "WHC")


def _samples_plainly(out: Path) -> dict[str, np.ndarray]:
    """Each sample's stored bytes by source, as docs/FORMAT.md reads them (in the stored
    layout, flat)."""
    meta, rows = read_plainly(out)
    layout = meta[b"etl.layout"].decode().strip('"')
    by_source = {}
    for row in rows:
        pixels = row["pixels"] if layout == "HWC" else row["pixels"].transpose(2, 0, 1)
        by_source[row["source"]] = np.ascontiguousarray(pixels).ravel()
    return by_source


def _check_back_to_back(batch: Any, sources: list[str], plainly: dict[str, np.ndarray]) -> None:
    """A batch's 1-d images are its samples' stored bytes one after another, in its order."""
    assert batch.images.dim() == 1
    want = np.concatenate([plainly[sources[i]] for i in batch.indices.tolist()])
    assert np.array_equal(batch.images.numpy(), want)
    heights, widths = (batch.columns[name].numpy() for name in SIZE_COLUMNS)
    sizes = [plainly[sources[i]].size for i in batch.indices.tolist()]
    channels = 3
    assert (heights * widths * channels).tolist() == sizes


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_sends_its_samples_back_to_back(aspect_kept: Path, workers: int) -> None:
    """`send_back_to_back`: every sample of an epoch arrives once, its bytes those np.load
    finds, with 0 and 2 workers; a stream's batches alike."""
    plainly = _samples_plainly(aspect_kept)
    dataset = PackedDataset.open(aspect_kept)
    sources = dataset.manifest_rows(np.arange(len(dataset))).column("source").to_pylist()
    loader = make_loader(
        dataset, batch_size=4, shuffle=True, num_workers=workers, workers_as="processes"
    )
    assert loader.send_back_to_back()
    seen = []
    for batch in loader:
        _check_back_to_back(batch, sources, plainly)
        seen += batch.indices.tolist()
    assert sorted(seen) == list(range(len(dataset)))
    selection = open_catalog(aspect_kept).select()
    by_position = open_catalog(aspect_kept).table.column("source").to_pylist()
    stream_sources = [by_position[int(p)] for p in selection.positions]
    streamed = stream_loader(PackedStream(selection, batch_size=5, window=2), num_workers=workers)
    assert streamed.send_back_to_back()
    seen = []
    for batch in streamed:
        _check_back_to_back(batch, stream_sources, plainly)
        seen += batch.indices.tolist()
    assert set(seen) == set(range(len(selection)))  # slots of workers padded alike


def test_a_mixture_sends_its_samples_back_to_back(aspect_kept: Path, tmp_path: Path) -> None:
    """A Mixture of the aspect-kept dataset and a fixed-size one (the same dataset cut to one
    size by a view would not do: members of several shapes): each sample's bytes, back to back
    in the batch's order, whichever member it comes from."""
    from tests.helpers.packed import make_packed

    layout = PackedDataset.open(aspect_kept).layout
    shape = (9, 11, 3) if layout == "HWC" else (3, 9, 11)
    fixed = make_packed(tmp_path / "fixed", shard_sizes=(7, 6), sample_shape=shape, layout=layout)
    members = [PackedDataset.open(aspect_kept), PackedDataset.open(fixed.root)]
    mix = Mixture(members, weights=[1, 1])
    loader = make_loader(mix, batch_size=6, seed=3, num_workers=2, workers_as="processes")
    assert loader.send_back_to_back()
    plainly = _samples_plainly(aspect_kept)
    sources = members[0].manifest_rows(np.arange(len(members[0]))).column("source").to_pylist()
    for batch in loader:
        m = mix.member_of(batch.indices.numpy())
        want = []
        for j, index in enumerate(batch.indices.tolist()):
            local = index - int(mix.offsets[int(m[j])])
            if m[j] == 0:
                want.append(plainly[sources[local]])
            else:
                position = members[1].selection.positions[local]
                want.append(fixed.images[position].ravel())
        assert batch.images.dim() == 1
        assert np.array_equal(batch.images.numpy(), np.concatenate(want))


def _own(dataset: PackedDataset, index: int) -> torch.Tensor:
    """Sample `index` at its own size, [C, H, W]."""
    image = dataset[index][0]
    return image.permute(2, 0, 1) if dataset.layout == "HWC" else image


@pytest.mark.parametrize("workers", [0, 2])
def test_device_loader_crops_samples_back_to_back_from_each_whole_image(
    aspect_kept: Path, workers: int
) -> None:
    """`DeviceLoader(augment=...)` asks for samples back to back and each augmentation gives,
    per sample, what torch computes of that sample alone: F.interpolate of its crop (boxes as
    RandomResizedCrop draws them for the index), of its resize then centre, of its whole
    image; ResizeToBucket over bucket batches."""
    dataset = PackedDataset.open(aspect_kept)
    buckets = AspectBuckets.of(dataset.sample_sizes, count=3, area=12 * 12)
    crop = RandomResizedCrop(10, seed=3)
    cases: list[tuple[Any, Any]] = [
        (crop, True), (CenterCrop(8, resize=10), True), (Resize((9, 7)), True),
        (ResizeToBucket(buckets), buckets),
    ]  # fmt: skip
    for augment, shuffle in cases:
        loader = make_loader(
            dataset,
            batch_size=4,
            shuffle=shuffle,
            seed=2,
            num_workers=workers,
            workers_as="processes",
            with_indices=True,
        )
        feed = DeviceLoader(loader, "cpu", dtype=torch.float32, augment=augment)
        seen: set[int] = set()
        for batch in feed:
            assert batch.images.dtype == torch.float32
            for j, index in enumerate(batch.indices.tolist()):
                own = _own(dataset, index)[None].float()
                h, w = own.shape[2:]
                if augment is crop:
                    alone = crop(own.to(torch.uint8), torch.tensor([index]), 0)[0]
                elif isinstance(augment, CenterCrop):
                    rh, rw = (10, int(10 * w / h)) if h <= w else (int(10 * h / w), 10)
                    whole = F.interpolate(own, (rh, rw), mode="bilinear", align_corners=False)
                    top, left = round((rh - 8) / 2), round((rw - 8) / 2)
                    alone = whole[0, :, top : top + 8, left : left + 8]
                else:
                    shape = (9, 7) if isinstance(augment, Resize) else batch.images.shape[2:]
                    whole = F.interpolate(own, tuple(shape), mode="bilinear", align_corners=False)
                    alone = whole[0]
                torch.testing.assert_close(batch.images[j] * 255, alone, atol=2e-3, rtol=0)
            seen.update(batch.indices.tolist())
        assert seen == set(range(len(dataset)))  # (buckets pad a group with its own samples)
        assert next(iter(loader)).images.dim() == 1, "the loader was not asked for them"


def test_an_augmentation_of_padded_batches_gets_them_padded(aspect_kept: Path) -> None:
    """An augmentation written for padded NCHW batches (no `takes_ragged`) still gets one,
    padded with zeros, and the sizes: the loader's back-to-back bytes are padded after the
    copy, never handed to it flat."""
    dataset = PackedDataset.open(aspect_kept)
    calls = []

    def mean_of_each(images: torch.Tensor, index: Any, epoch: int, sizes: Any = None) -> Any:
        calls.append(images.shape)
        heights, widths = sizes
        for j, i in enumerate(index.tolist()):
            h, w = int(heights[j]), int(widths[j])
            assert torch.equal(images[j, :, :h, :w], _own(dataset, i))
            assert not images[j, :, h:].any() and not images[j, :, :, w:].any()
        return images[:, :, :2, :2].float()

    loader = make_loader(dataset, batch_size=5, shuffle=True, num_workers=2, workers_as="processes")
    batches = list(DeviceLoader(loader, "cpu", augment=mean_of_each))
    assert len(calls) == len(batches) == len(loader)
    assert all(len(shape) == 4 for shape in calls)


def test_another_collate_or_running_workers_keep_padded_batches(aspect_kept: Path) -> None:
    """A `collate_fn` of the user's gets samples, so its loader never sends them back to back;
    persistent workers started before `DeviceLoader` asked keep padding, and the crops are the
    same either way."""
    dataset = PackedDataset.open(aspect_kept)
    collated = make_loader(dataset, batch_size=4, collate_fn=lambda samples: len(samples))
    assert not collated.send_back_to_back()
    assert sum(collated) == len(dataset)
    crop = RandomResizedCrop(8, seed=1)
    results = []
    for started in (False, True):
        loader = make_loader(
            dataset,
            batch_size=4,
            shuffle=True,
            num_workers=2,
            workers_as="processes",
            persistent_workers=True,
        )
        if started:
            padded = next(iter(loader))
            assert padded.images.dim() == 4
        feed = DeviceLoader(loader, "cpu", dtype=torch.float32, augment=crop)
        results.append(torch.cat([batch.images for batch in feed]))
    torch.testing.assert_close(results[0], results[1], atol=2e-3, rtol=0)
