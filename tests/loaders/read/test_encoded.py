"""The loaders over samples stored encoded (format version 3): every read path decodes to the
pixels that were packed. Oracles: the arrays `make_packed` encoded (zlib is exact), Pillow's
decode of the stored JPEG bytes read with numpy, and a raw pack of the same photos."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from etl.config import load_config
from etl.errors import ShardError
from etl.run import pipeline
from etl.storage.location import StoreOptions
from loaders import (
    CenterCrop,
    DeviceLoader,
    Mixture,
    PackedDataset,
    PackedStream,
    RandomResizedCrop,
    make_loader,
    stream_loader,
)
from tests.helpers.cli import cli
from tests.helpers.codecs import pixels_of, read_plainly, write_config, write_photos
from tests.helpers.packed import Packed, make_packed

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:CUDA is not available:RuntimeWarning"),
]


@pytest.fixture(scope="module", params=["HWC", "CHW"])
def zlib_packed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Packed:
    shape = (6, 5, 3) if request.param == "HWC" else (3, 6, 5)
    root = tmp_path_factory.mktemp("zlib") / "ds"
    return make_packed(root, codec="zlib", layout=request.param, sample_shape=shape)


def _by_index(loader: Any) -> dict[int, np.ndarray]:
    seen = {}
    for batch in loader:
        images, _, indices = batch[0], batch[1], batch[2]
        for i, image in zip(indices.tolist(), images.numpy(), strict=True):
            seen[i] = image
    return seen


@pytest.mark.parametrize("workers", [0, 2])
def test_every_read_path_decodes_to_the_packed_pixels(zlib_packed: Packed, workers: int) -> None:
    """`dataset[i]`, batches of the map-style loader (in workers too) and of the stream: each
    sample is the array that was packed, byte for byte, with its label; batches are of the
    fixed shape, (images, labels) as with raw rows."""
    packed = zlib_packed
    ds = PackedDataset.open(packed.root)
    positions = ds.selection.positions
    assert not ds.ragged and len(ds) == len(packed.images)
    for i in range(len(ds)):
        image, label = ds[i]
        np.testing.assert_array_equal(image.numpy(), packed.images[positions[i]])
        assert label == packed.labels[positions[i]]
    plain = make_loader(ds, batch_size=4, shuffle=True, num_workers=workers, workers_as="processes")
    first = next(iter(plain))
    assert len(first) == 2 and tuple(first[0].shape[1:]) == packed.sample_shape
    loader = make_loader(
        ds,
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        workers_as="processes",
        with_indices=True,
    )
    seen = _by_index(loader)
    assert sorted(seen) == list(range(len(ds)))
    for i, image in seen.items():
        np.testing.assert_array_equal(image, packed.images[positions[i]])
    stream = stream_loader(
        PackedStream(ds.selection, batch_size=3, window=2), num_workers=workers, with_indices=True
    )
    for i, image in _by_index(stream).items():
        np.testing.assert_array_equal(image, packed.images[positions[i]])


def test_a_changed_stored_byte_is_named_before_any_decode(
    zlib_packed: Packed, tmp_path: Path
) -> None:
    """One byte of sample 1's zlib stream changed: the default `verify="once"` names the shard
    and the row (and the repair) before decoding it; with verification off the damaged stream
    is one ShardError naming the shard and row, never a crash in the decoder or wrong pixels."""
    root = tmp_path / "ds"
    shutil.copytree(zlib_packed.root, root)
    _, rows = read_plainly(root)
    victim = next(r for r in rows if r["sample_id"] == zlib_packed.sample_ids[1])
    path = root / victim["shard"]
    data = bytearray(path.read_bytes())
    data[128 + victim["sample_offset"] + victim["sample_bytes"] // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    ds = PackedDataset.open(root)
    at = int(np.flatnonzero(ds.selection.positions == 1)[0])
    with pytest.raises(ShardError, match=r"v000001-00000\.npy: row 1 does not match.*repair"):
        ds[at]
    with pytest.raises(ShardError, match=r"v000001-00000\.npy: row 1 does not decode \(zlib"):
        PackedDataset.open(root, verify=False)[at]
    with pytest.raises(ShardError, match=r"row 1 does not decode"):
        list(
            make_loader(
                PackedDataset.open(root, verify=False),
                batch_size=4,
                num_workers=2,
                workers_as="processes",
            )
        )


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same photos packed twice, with the aspect kept: raw, and as JPEG (out dirs)."""
    folder = tmp_path_factory.mktemp("photos")
    write_photos(folder / "jpeg" / "images", count=10)
    shutil.copytree(folder / "jpeg" / "images", folder / "raw" / "images")
    resize = "mode: keep_aspect, shorter: 24, longer: 40"
    for codec in ("jpeg", "raw"):
        config = write_config(folder / codec, codec, resize=resize)
        assert pipeline.run(load_config(config)).committed
    return folder / "jpeg" / "out", folder / "raw" / "out"


def test_jpeg_samples_of_their_own_size_decode_as_pillow_does(photos: tuple[Path, Path]) -> None:
    """Each sample at its own size, as Pillow decodes its stored bytes (read with numpy): the
    loaders' libjpeg-turbo decode differs from it by at most 1 level (both are libjpeg-turbo's
    accurate integer IDCT; measured 0 here); padded batches carry each one's size."""
    jpeg, _ = photos
    ds = PackedDataset.open(jpeg)
    _, rows = read_plainly(jpeg)
    by_id = {r["sample_id"]: r for r in rows}
    assert ds.ragged
    ids = ds.manifest_rows(range(len(ds))).column("sample_id").to_pylist()
    for i, sample_id in enumerate(ids):
        expected = pixels_of(jpeg, by_id[sample_id])
        image = ds[i][0].numpy()
        assert image.shape == expected.shape
        assert np.abs(image.astype(np.int16) - expected).max() <= 1
    batch = next(iter(make_loader(ds, batch_size=4, num_workers=0)))
    images, _, index, columns = batch
    for j, i in enumerate(index.tolist()):
        h, w = int(columns["sample.height"][j]), int(columns["sample.width"][j])
        np.testing.assert_array_equal(images[j, :h, :w].numpy(), ds[i][0].numpy())


def test_a_mixture_of_raw_and_jpeg_members_and_device_crops(photos: tuple[Path, Path]) -> None:
    """A mixture of the raw pack and the JPEG pack of the same photos: each batch holds both
    members' samples, each as its member reads it alone; `DeviceLoader` with a seeded crop
    takes the JPEG member's batches as it takes raw ones (CPU here), the crops within JPEG
    q90's error of the raw member's."""
    jpeg, raw = photos
    jpeg_ds, raw_ds = PackedDataset.open(jpeg), PackedDataset.open(raw)
    members = [raw_ds, jpeg_ds]
    mixture = Mixture(members, weights=[1, 1])
    loader = make_loader(
        mixture, batch_size=6, num_workers=2, workers_as="processes", with_indices=True
    )
    seen = set()
    for images, _, index, columns in loader:
        for j, i in enumerate(index.tolist()):
            m = int(mixture.member_of([i])[0])
            h, w = int(columns["sample.height"][j]), int(columns["sample.width"][j])
            alone = members[m][i - int(mixture.offsets[m])][0].numpy()
            np.testing.assert_array_equal(images[j, :h, :w].numpy(), alone)
            seen.add(m)
    assert seen == {0, 1}
    crop = RandomResizedCrop(16, seed=3)
    crops = []
    for ds in (raw_ds, jpeg_ds):
        device = DeviceLoader(
            make_loader(ds, batch_size=5, num_workers=0),
            dtype=torch.float32,
            augment=crop,
        )
        crops.append(torch.cat([images for images, *_ in device]))
    assert crops[0].shape == crops[1].shape
    error = torch.mean((crops[0] - crops[1]) ** 2).item()
    assert 10 * np.log10(255**2 / error) > 28


def test_a_jpeg_dataset_in_a_bucket_reads_with_ranged_gets(
    photos: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Published to a real S3-compatible server (moto, 127.0.0.1) and read by ranged GETs and
    through the cache: the samples the local copy gives."""
    pytest.importorskip("moto.server")
    from tests.helpers.emulators import emulator

    jpeg, _ = photos
    local = PackedDataset.open(jpeg)
    with emulator("s3") as store:
        store.new_bucket("photos")
        url = store.url("photos/jpeg")
        store.fs().put(str(jpeg), "photos/jpeg", recursive=True)
        for ranged in (True, False):
            options = StoreOptions(
                cache_dir=tmp_path / f"cache-{ranged}",
                storage_options=store.options,
                ranged=ranged,
            )
            remote = PackedDataset.open(url, store=options)
            assert len(remote) == len(local)
            for i in range(len(local)):
                np.testing.assert_array_equal(remote[i][0].numpy(), local[i][0].numpy())


def test_etl_show_draws_encoded_samples(
    photos: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`etl show` decodes stored JPEG samples for the contact sheet as it reads raw ones."""
    jpeg, _ = photos
    sheet = tmp_path / "sheet.png"
    code, _, err = cli(["show", str(jpeg), "--out", str(sheet), "-n", "6"], capsys)
    assert code == 0, err
    from PIL import Image

    with Image.open(sheet) as image:
        assert image.width > 50 and image.height > 20


# --- crops made in the workers ---------------------------------------------------------------


def _crops(ds: PackedDataset, crop: Any, epoch: int, workers: int, **options: Any) -> np.ndarray:
    """One epoch of `ds.with_crop(crop)` in index order, as an NCHW float array."""
    loader = make_loader(
        ds.with_crop(crop), batch_size=5, shuffle=False, num_workers=workers,
        workers_as="processes", with_indices=True,
        **options,
    )  # fmt: skip
    loader.set_epoch(epoch)
    seen = _by_index(loader)
    stacked = np.stack([seen[i] for i in range(len(ds))])
    return stacked.transpose(0, 3, 1, 2) if ds.layout == "HWC" else stacked


def _on_device(ds: PackedDataset, crop: Any, epoch: int) -> np.ndarray:
    """The same crops made by `DeviceLoader(augment=crop)` (CPU here), in the 0-255 range."""
    loader = make_loader(ds, batch_size=5, shuffle=False, num_workers=0, with_indices=True)
    loader.set_epoch(epoch)
    device = DeviceLoader(loader, dtype=torch.float32, augment=crop)
    return np.concatenate([images.numpy() for images, *_ in device]) * 255


@pytest.mark.parametrize("crop", [RandomResizedCrop((4, 3), seed=5), CenterCrop(4, resize=5)])
def test_worker_crops_are_the_device_crops(zlib_packed: Packed, crop: Any) -> None:
    """Crops made in 2 workers from zlib-stored samples: uint8 batches of the crop's size, in
    the stored layout, each within 1 level of the crop `DeviceLoader` makes of the same
    sample (the same boxes, drawn per seed, epoch and index; the worker rounds to uint8)."""
    ds = PackedDataset.open(zlib_packed.root)
    for epoch in (0, 3):
        made = _crops(ds, crop, epoch, workers=2)
        assert made.shape == (len(ds), 3, 4, 3 if isinstance(crop, RandomResizedCrop) else 4)
        assert np.abs(made.astype(np.float64) - _on_device(ds, crop, epoch)).max() <= 1.0001


def test_worker_crops_follow_the_epoch_in_persistent_workers(photos: tuple[Path, Path]) -> None:
    """JPEG samples of their own size cropped to 16x16 in persistent workers: the same epoch
    gives the same pixels in a fresh loader (a pure function of seed, epoch and index), the
    next epoch other boxes (the epoch reaches workers started before it); a run's record says
    which crop and decoder made them."""
    jpeg, _ = photos
    ds = PackedDataset.open(jpeg)
    crop = RandomResizedCrop(16, seed=7)
    loader = make_loader(
        ds.with_crop(crop), batch_size=4, shuffle=True, num_workers=2,
        workers_as="processes", with_indices=True,
        persistent_workers=True,
    )  # fmt: skip
    epochs = []
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        seen = _by_index(loader)
        epochs.append(np.stack([seen[i] for i in range(len(ds))]))
    assert epochs[0].shape == (len(ds), 16, 16, 3)
    assert not np.array_equal(epochs[0], epochs[1])
    np.testing.assert_array_equal(_crops(ds, crop, 1, workers=0).transpose(0, 2, 3, 1), epochs[1])
    record = json.loads(loader.state_dict()["run"])
    assert record["crop"]["kind"] == "RandomResizedCrop" and record["crop"]["seed"] == 7
    assert record["decoder"].startswith("simplejpeg ")


def test_reduced_scale_decode_is_no_worse_than_a_full_decode(tmp_path: Path) -> None:
    """Large JPEG samples (shorter side 128) centre-cropped to 16-32 px: where the resize is at
    least 4x, they are decoded at 1/2-1/4 scale (`reducing_gap` 2) and resampled the rest of the
    way. Against Pillow's antialiased resize of each full sample (the oracle), the crops are
    within 1.5 dB PSNR of those made from a full decode (`reducing_gap` so large nothing is
    reduced; measured: 3 dB better at 16 px, where a full decode's bilinear step aliases, 0.4
    and 1.2 dB worse at 24 and 32), and they differ from them: the reduction did happen."""
    write_photos(tmp_path / "images", count=8, sides=(300, 400))
    config = write_config(tmp_path, "jpeg", resize="mode: keep_aspect, shorter: 128, longer: 200")
    assert pipeline.run(load_config(config)).committed
    ds = PackedDataset.open(tmp_path / "out")
    for size in (16, 24, 32):
        oracle = np.stack([_pillow_center_crop(ds[i][0].numpy(), size) for i in range(len(ds))])
        reduced = _crops(ds, CenterCrop(size), 0, workers=0).transpose(0, 2, 3, 1)
        loader = make_loader(ds.with_crop(CenterCrop(size), reducing_gap=1e9), batch_size=4,
                             shuffle=False, num_workers=0, with_indices=True)  # fmt: skip
        full = _by_index(loader)
        exact = np.stack([full[i] for i in range(len(ds))])
        assert not np.array_equal(reduced, exact)
        assert _psnr(reduced, oracle) > _psnr(exact, oracle) - 1.5, size


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(255**2 / np.mean((a.astype(np.float64) - b) ** 2)))


def _pillow_center_crop(image: np.ndarray, size: int) -> np.ndarray:
    """torchvision's Resize(size) then CenterCrop(size), by Pillow (antialiased bilinear)."""
    from PIL import Image

    height, width = image.shape[:2]
    rh, rw = (
        (size, int(size * width / height))
        if height <= width
        else (int(size * height / width), size)
    )
    resized = np.asarray(Image.fromarray(image).resize((rw, rh), Image.Resampling.BILINEAR))
    top, left = round((rh - size) / 2), round((rw - size) / 2)
    return resized[top : top + size, left : left + size].astype(np.float64)


def test_a_damaged_sample_under_a_worker_crop_is_named(zlib_packed: Packed, tmp_path: Path) -> None:
    """Unchecked (verify=False) damaged bytes reach the crop's decoder: one ShardError naming
    the shard and row, in a worker too."""
    root = tmp_path / "ds"
    shutil.copytree(zlib_packed.root, root)
    _, rows = read_plainly(root)
    victim = next(r for r in rows if r["sample_id"] == zlib_packed.sample_ids[2])
    path = root / victim["shard"]
    data = bytearray(path.read_bytes())
    data[128 + victim["sample_offset"] + 2] ^= 0xFF
    path.write_bytes(bytes(data))
    ds = PackedDataset.open(root, verify=False).with_crop(CenterCrop(4))
    with pytest.raises(ShardError, match=r"v000001-00000\.npy: row 2 does not decode"):
        list(make_loader(ds, batch_size=4, num_workers=2, workers_as="processes"))
