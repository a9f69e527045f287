"""A batch's form is its type (`loaders.batch.forms`): what the read layer decides and the memory
layer makes, in process and through the workers' ring, and what `DeviceLoader` dispatches on.
Oracles: the manifest read with plain pyarrow (docs/FORMAT.md) and Pillow decodes of the JPEGs,
never our own readers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loaders import CenterCrop, DeviceLoader, PackedDataset, make_loader
from loaders.batch.forms import BackToBackBatch, EncodedBatch, PaddedBatch, SizedBatch
from loaders.batch.types import Batch, ColumnBatch
from tests.helpers.aspect import pack_aspect, read_plainly
from tests.helpers.codecs import pack_photos, pixels_of
from tests.helpers.codecs import read_plainly as read_encoded

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:CUDA is not available:RuntimeWarning"),
]


@pytest.fixture(scope="module")
def aspect_kept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack_aspect(tmp_path_factory.mktemp("aspect"), count=13, seed=5)


@pytest.fixture(scope="module")
def jpeg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Photos packed as JPEG with their aspect kept (the out dir)."""
    return pack_photos(tmp_path_factory.mktemp("photos"), "jpeg", count=9)


def _sides_by_source(out: Path) -> dict[str, tuple[int, int]]:
    _, rows = read_plainly(out)
    return {row["source"]: row["pixels"].shape[:2] for row in rows}


def _sizes_match(
    batch: SizedBatch, dataset: PackedDataset, sides: dict[str, tuple[int, int]]
) -> None:
    sources = dataset.manifest_rows(batch.indices).column("source").to_pylist()
    heights, widths = batch.sizes
    assert list(zip(heights.tolist(), widths.tolist(), strict=True)) == [sides[s] for s in sources]


@pytest.mark.parametrize("workers", [0, 2])
def test_samples_of_several_sizes_come_padded_or_back_to_back(
    aspect_kept: Path, workers: int
) -> None:
    """Padded by default, `BackToBackBatch` once a loader is asked to send them so; each
    sample's size is the manifest's, with 0 workers and through the ring of 2."""
    sides = _sides_by_source(aspect_kept)
    dataset = PackedDataset.open(aspect_kept)
    padded = make_loader(dataset, batch_size=5, num_workers=workers, workers_as="processes")
    for batch in padded:
        assert type(batch) is PaddedBatch and isinstance(batch, ColumnBatch)
        assert batch.images.dim() == 4
        _sizes_match(batch, dataset, sides)
        assert batch.other_columns() is None  # the sizes are all it carries
    loader = make_loader(
        PackedDataset.open(aspect_kept), batch_size=5, num_workers=workers, workers_as="processes"
    )
    assert loader.send_back_to_back()
    seen = 0
    for batch in loader:
        assert type(batch) is BackToBackBatch and batch.images.dim() == 1
        heights, widths = batch.sizes
        assert batch.images.numel() == int((heights * widths * 3).sum())
        _sizes_match(batch, loader.dataset, sides)
        seen += len(batch.labels)
    assert seen == len(sides)


@pytest.mark.parametrize("workers", [0, 2])
def test_samples_sent_encoded_are_an_encoded_batch(jpeg: Path, workers: int) -> None:
    """`send_encoded`: an `EncodedBatch` whose `stored` are each sample's bytes and codec as
    the manifest has them, and whose images are those bytes one after another."""
    _, rows = read_encoded(jpeg)
    by_source = {row["source"]: row for row in rows}
    loader = make_loader(
        PackedDataset.open(jpeg), batch_size=4, num_workers=workers, workers_as="processes"
    )
    assert loader.send_encoded()
    for batch in loader:
        assert type(batch) is EncodedBatch
        sources = loader.dataset.manifest_rows(batch.indices).column("source").to_pylist()
        nbytes, _ = batch.stored
        assert nbytes.tolist() == [by_source[s]["sample_bytes"] for s in sources]
        assert batch.images.numel() == int(nbytes.sum())


def test_the_device_loader_goes_by_the_type_not_the_column_names(jpeg: Path) -> None:
    """Decoded and cropped by its form: an `EncodedBatch` becomes a batch of 16x16 crops, the
    first sample's the centre of Pillow's decode of it; a `ColumnBatch` holding the same
    columns but of no form is not taken for one (it is refused as 1-d images)."""
    dataset = PackedDataset.open(jpeg)
    loader = make_loader(dataset, batch_size=4)
    device = DeviceLoader(loader, device="cpu", decode="device", augment=CenterCrop(16))
    _, rows = read_encoded(jpeg)
    by_source = {row["source"]: row for row in rows}
    for batch in device:
        assert type(batch) is Batch and batch.images.shape[1:] == (3, 16, 16)
    encoded = next(iter(loader))
    plain = ColumnBatch(*encoded)  # the same fields and columns, as no form
    with pytest.raises(ValueError, match="4-d tensor"):
        next(iter(DeviceLoader([plain], device="cpu", decode="workers")))
    source = dataset.manifest_rows(encoded.indices[:1]).column("source").to_pylist()[0]
    pixels = pixels_of(jpeg, by_source[source])
    h, w = pixels.shape[:2]
    top, left = (h - 16) // 2, (w - 16) // 2
    assert min(h, w) == 24  # packed so: a crop of 24 resized to 24 resamples nothing
    first = next(iter(DeviceLoader(loader, device="cpu", decode="device",
                                   augment=CenterCrop(16, resize=24))))  # fmt: skip
    want = torch.from_numpy(pixels[top : top + 16, left : left + 16].transpose(2, 0, 1).copy())
    assert (first.images[0].double() * 255 - want.double()).abs().max() <= 1.5
