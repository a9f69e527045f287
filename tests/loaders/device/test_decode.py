"""Samples stored encoded, decoded where the batch goes (`DeviceLoader(decode="device")`): on the
CPU here, by libjpeg-turbo in the training process (simplejpeg, the default) or by NVIDIA
nvImageCodec's CPU backend (`decoder="nvimgcodec"`, the same library and plumbing as on CUDA:
tests/loaders/device/test_cuda_decode.py runs both there). Oracles: the workers' decode of the same
stored bytes, and Pillow's decode of them read with pyarrow and numpy."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from etl.errors import ShardError
from loaders import CenterCrop, DeviceLoader, PackedDataset, RandomResizedCrop, make_loader
from loaders.device.decode import jpeg_decoder
from tests.helpers.codecs import (
    pack_photos,
    pixels_of,
    read_plainly,
    stored_of,
    zeroed_copy,
)
from tests.helpers.packed import Packed, make_packed

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:CUDA is not available:RuntimeWarning"),
]

DECODERS = [None, "nvimgcodec"]
"""`DeviceLoader(decoder=...)` on the CPU: None is simplejpeg in the training process."""

NAMES = {None: "simplejpeg ", "nvimgcodec": "nvImageCodec "}


@pytest.fixture(scope="module")
def jpeg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Photos packed as JPEG with their aspect kept (the out dir)."""
    return pack_photos(tmp_path_factory.mktemp("photos"), "jpeg", count=10)


@pytest.fixture(scope="module")
def zlib_packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    root = tmp_path_factory.mktemp("zlib") / "ds"
    return make_packed(root, codec="zlib", layout="HWC", sample_shape=(6, 5, 3))


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("workers", [0, 2])
def test_device_decode_makes_the_workers_pixels(
    jpeg: Path, workers: int, decoder: str | None
) -> None:
    """The loader ships the stored JPEG bytes (a tenth of the pixels) and they are decoded
    where the batch goes: the same crops as decoding in the workers, batch for batch, and the
    state names the decoder."""
    ds = PackedDataset.open(jpeg)
    crop = RandomResizedCrop(16, seed=4)
    made = {}
    for decode in ("workers", "device"):
        loader = make_loader(
            ds,
            batch_size=4,
            shuffle=True,
            num_workers=workers,
            workers_as="processes",
            with_indices=True,
        )
        chosen = decoder if decode == "device" else None
        device = DeviceLoader(
            loader, dtype=torch.float32, augment=crop, decode=decode, decoder=chosen
        )
        made[decode] = [(images.clone(), index.clone()) for images, _, index in device]
        if decode == "device":
            assert device.state_dict()["decoder"].startswith(NAMES[decoder])
    for (a, i), (b, j) in zip(made["workers"], made["device"], strict=True):
        assert torch.equal(i, j)
        torch.testing.assert_close(a, b)


def test_nvimgcodec_decodes_as_pillow_does(jpeg: Path) -> None:
    """nvImageCodec's decode of each stored sample (read with pyarrow and numpy) is Pillow's,
    within 1 level (both libjpeg-turbo's integer IDCT; measured 0), in CHW; a grey JPEG too."""
    decode, name = jpeg_decoder(torch.device("cpu"), "nvimgcodec")
    assert decode is not None and name.startswith("nvImageCodec ")
    _, rows = read_plainly(jpeg)
    datas = [torch.frombuffer(bytearray(stored_of(jpeg, row)), dtype=torch.uint8) for row in rows]
    for row, pixels in zip(rows, decode(datas, 3), strict=True):
        expected = pixels_of(jpeg, row).transpose(2, 0, 1)
        assert pixels.shape == expected.shape
        assert np.abs(pixels.numpy().astype(np.int16) - expected).max() <= 1
    grey = np.asarray(Image.open(io.BytesIO(stored_of(jpeg, rows[0]))).convert("L"))
    buffer = io.BytesIO()
    Image.fromarray(grey).save(buffer, "JPEG", quality=90)
    (pixels,) = decode([torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)], 1)
    with Image.open(buffer) as again:
        expected = np.asarray(again)[None]
    assert pixels.shape == expected.shape
    assert np.abs(pixels.numpy().astype(np.int16) - expected).max() <= 1


@pytest.mark.parametrize("decoder", DECODERS)
def test_a_damaged_jpeg_decoded_on_the_device_is_named(
    jpeg: Path, tmp_path: Path, decoder: str | None
) -> None:
    """A sample's stored JPEG cut short: with the default verification the worker names its
    shard and row before any decode; with verification off the device's decoder meets it, and
    it is one ShardError naming the shard and row, never a crash in the native decoder."""
    root, half = tmp_path / "out", read_plainly(jpeg)[1][3]["sample_bytes"] // 2
    victim = zeroed_copy(jpeg, root, 3, start=half)  # cut short: its second half zeroed
    shard = victim["shard"].replace(".", r"\.")
    for verify, says in (("once", "does not match"), (False, "does not decode")):
        ds = PackedDataset.open(root, verify=verify)
        loader = make_loader(ds, batch_size=5, num_workers=0, with_indices=True)
        device = DeviceLoader(loader, augment=CenterCrop(8), decode="device", decoder=decoder)
        with pytest.raises(ShardError, match=rf"{shard}: row {victim['row']}.*{says}"):
            list(device)


def test_device_decode_of_one_size_and_its_refusals(zlib_packed: Packed) -> None:
    """Samples stored encoded at one size, decoded on the device without an augmentation: the
    batches of decoding in the workers, (images, labels) as they were. `decode="device"` is
    refused with a crop made in the workers (the workers need the pixels there) and for a
    name it does not know; `decoder=` is refused without it and for a library it does not
    know."""
    ds = PackedDataset.open(zlib_packed.root)
    batches = {}
    for decode in ("workers", "device"):
        loader = make_loader(ds, batch_size=5, shuffle=False, num_workers=0)
        batches[decode] = list(DeviceLoader(loader, dtype=torch.float32, decode=decode))
    for a, b in zip(batches["workers"], batches["device"], strict=True):
        assert len(a) == len(b) == 2
        torch.testing.assert_close(a[0], b[0])
    cropped = make_loader(ds.with_crop(CenterCrop(4)), batch_size=5)
    with pytest.raises(ValueError, match="crops in its workers"):
        DeviceLoader(cropped, decode="device")
    with pytest.raises(ValueError, match="decode is 'workers' or 'device'"):
        DeviceLoader(make_loader(ds, batch_size=5), decode="gpu")
    with pytest.raises(ValueError, match="decoder= chooses the library of decode='device'"):
        DeviceLoader(make_loader(ds, batch_size=5), decoder="nvimgcodec")
    with pytest.raises(ValueError, match="decoder is one of torchvision, nvimgcodec"):
        DeviceLoader(make_loader(ds, batch_size=5), decode="device", decoder="nvjpeg")


def test_nvimgcodec_missing_is_one_warning_and_the_cpu_path(
    jpeg: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without nvImageCodec installed, `decoder="nvimgcodec"` says so once, with what to
    install, and decodes in the training process: the same crops as with it."""
    ds = PackedDataset.open(jpeg)
    crop = CenterCrop(12)

    def crops(**options: str) -> list[torch.Tensor]:
        loader = make_loader(ds, batch_size=4, num_workers=0)
        device = DeviceLoader(loader, augment=crop, decode="device", **options)
        return [images for images, _ in device]

    with_it = crops(decoder="nvimgcodec")
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        without = crops(decoder="nvimgcodec")
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    said = [s for s in said if "nvImageCodec" in s]
    assert len(said) == 1 and "etl-memmap[gpu-decode]" in said[0], said
    for a, b in zip(with_it, without, strict=True):
        torch.testing.assert_close(a, b)


def test_nvimgcodec_loads_without_lines_about_codecs_it_does_not_need() -> None:
    """On loading, nvImageCodec's native code prints a paragraph per codec library it finds
    missing (JPEG 2000, TIFF, and nvJPEG without a GPU): none of it reaches a training job's
    output, and the decoder it makes works."""
    code = (
        "import torch\nfrom loaders.device.decode import jpeg_decoder\n"
        "decode, name = jpeg_decoder(torch.device('cpu'), 'nvimgcodec')\n"
        "assert decode is not None, name\nprint(name)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("nvImageCodec ") and proc.stdout.count("\n") == 1
    assert proc.stderr == "", proc.stderr


def test_nvimgcodec_that_cannot_decode_here_is_one_warning_and_the_cpu_path(
    jpeg: Path, tmp_path: Path
) -> None:
    """nvImageCodec installed but without a JPEG decoder (its extensions folder empty, as on
    a GPU node without nvJPEG): one warning naming the line that asked for it, and the crops
    of the workers' decode, from the CPU path."""
    (tmp_path / "no-extensions").mkdir()
    code = f"""
import warnings, torch
from loaders import DeviceLoader, PackedDataset, RandomResizedCrop, make_loader
ds = PackedDataset.open({str(jpeg)!r})
crops = {{}}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for decode, decoder in (("workers", None), ("device", "nvimgcodec")):
        loader = make_loader(ds, batch_size=4, with_indices=True)
        device = DeviceLoader(loader, augment=RandomResizedCrop(16, seed=2), decode=decode,
                              decoder=decoder)
        crops[decode] = [images for images, _, _ in device]
said = [w for w in caught if "nvImageCodec cannot decode" in str(w.message)]
assert len(said) == 1 and said[0].lineno == 10, [(str(w.message), w.lineno) for w in caught]
assert device.decoder_name.startswith("simplejpeg "), device.decoder_name
for a, b in zip(crops["workers"], crops["device"], strict=True):
    torch.testing.assert_close(a, b)
print("ok")
"""
    env = {**os.environ, "NVIMGCODEC_EXTENSIONS_PATH": str(tmp_path / "no-extensions")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
