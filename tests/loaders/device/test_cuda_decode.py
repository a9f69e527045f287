"""Samples stored as JPEG, decoded on the GPU (`DeviceLoader(decode="device")`: torchvision's
`decode_jpeg` on CUDA, the default, and NVIDIA nvImageCodec's with `decoder="nvimgcodec"`, where
installed: `loaders.device.decode`). Skipped without CUDA.

As in tests/loaders/device/test_cuda.py, `--break-mechanism NAME` removes one mechanism (`BREAKS`)
and runs only the tests guarding it, which must then fail. The oracle is the workers' decode
(libjpeg-turbo) of the same stored bytes, and Pillow's of them read with numpy.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import loaders.device.loader
from loaders import DeviceLoader, PackedDataset, RandomResizedCrop, make_loader
from loaders.device.decode import _cpu_name
from tests.helpers.codecs import pack_photos
from tests.helpers.cuda import batches_without_a_sync

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

BREAKS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "decoded_on_gpu": lambda mp: mp.setattr(
        loaders.device.loader, "jpeg_decoder", lambda device, library=None: (None, _cpu_name())
    ),
}


@pytest.fixture(scope="module")
def jpeg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    resize = "mode: keep_aspect, shorter: 96, longer: 160"
    return pack_photos(tmp_path_factory.mktemp("gpu-jpeg"), "jpeg", 40, resize, (200, 260))


def _has_nvimgcodec() -> bool:
    try:
        import nvidia.nvimgcodec  # noqa: F401
    except ImportError:
        return False
    return True


DECODERS = [
    pytest.param(None, id="torchvision"),
    pytest.param(
        "nvimgcodec",
        marks=pytest.mark.skipif(not _has_nvimgcodec(), reason="nvImageCodec is not installed"),
    ),
]
NAMES = {None: "torchvision ", "nvimgcodec": "nvImageCodec "}


def _epoch(
    ds: PackedDataset, decode: str, epoch: int = 0, workers: int = 2, decoder: str | None = None
) -> list[torch.Tensor]:
    loader = make_loader(
        ds,
        batch_size=8,
        shuffle=True,
        num_workers=workers,
        workers_as="processes",
        with_indices=True,
    )
    loader.set_epoch(epoch)
    crop = RandomResizedCrop(64, seed=1)
    device = DeviceLoader(loader, augment=crop, decode=decode, decoder=decoder)
    return [images.clone() for images, _, _ in device]


@pytest.mark.guards("decoded_on_gpu")
@pytest.mark.parametrize("decoder", DECODERS)
def test_gpu_decode_matches_the_workers_decode(jpeg: Path, decoder: str | None) -> None:
    """Crops of samples decoded on the GPU are those of the same samples decoded by the
    workers' libjpeg-turbo, within the two decoders' IDCT differences (PSNR above 40 dB), and
    the decoder named in the state is the library asked for, on CUDA."""
    ds = PackedDataset.open(jpeg)
    loader = make_loader(ds, batch_size=8, num_workers=0, with_indices=True)
    crop = RandomResizedCrop(64, seed=1)
    device = DeviceLoader(loader, augment=crop, decode="device", decoder=decoder)
    assert device.decoder_name.startswith(NAMES[decoder]) and "cuda" in device.decoder_name
    on_gpu, in_workers = _epoch(ds, "device", decoder=decoder), _epoch(ds, "workers")
    for a, b in zip(on_gpu, in_workers, strict=True):
        assert a.is_cuda and a.shape == b.shape
        error = torch.mean((a.float() - b.float()) ** 2).item() * 255**2
        assert error == 0 or 10 * np.log10(255**2 / error) > 40


@pytest.mark.parametrize("decoder", DECODERS)
def test_an_epoch_decoded_on_the_gpu_never_blocks_the_host(jpeg: Path, decoder: str | None) -> None:
    """The workers' stored bytes decoded, then cropped, on the GPU: no call of the feed that
    torch sees waits for the device (a host sync would stall the copy queued ahead behind
    the training step)."""
    ds = PackedDataset.open(jpeg)
    loader = make_loader(ds, batch_size=8, shuffle=True, with_indices=True)
    crop = RandomResizedCrop(64, seed=1)
    device = DeviceLoader(loader, augment=crop, decode="device", decoder=decoder)
    assert device.decoder_name.startswith(NAMES[decoder]) and "cuda" in device.decoder_name
    assert batches_without_a_sync(device) == len(loader)


GPU_LARGEST = 24
"""The largest difference (0-255 levels) allowed between a GPU decode and Pillow's of the same
bytes: nvJPEG's IDCT and chroma upsampling are not libjpeg-turbo's (gpu.device_decode prints
the measured one beside each library)."""


@pytest.mark.parametrize("decoder", DECODERS)
def test_gpu_decode_is_pillows_within_a_stated_difference(jpeg: Path, decoder: str | None) -> None:
    """Each stored sample (read with pyarrow and numpy) decoded on the GPU by the library, in
    CHW at its row's size, against Pillow's decode of the same bytes: within GPU_LARGEST
    levels, and a mean difference under one level."""
    from loaders.device.decode import jpeg_decoder
    from tests.helpers.codecs import pixels_of, read_plainly, stored_of

    decode, name = jpeg_decoder(torch.device("cuda"), decoder)
    assert decode is not None and name.startswith(NAMES[decoder]), name
    _, rows = read_plainly(jpeg)
    datas = [torch.frombuffer(bytearray(stored_of(jpeg, row)), dtype=torch.uint8) for row in rows]
    largest, total, count = 0, 0.0, 0
    for row, pixels in zip(rows, decode(datas, 3), strict=True):
        assert pixels.is_cuda
        expected = pixels_of(jpeg, row).transpose(2, 0, 1).astype(np.int16)
        assert tuple(pixels.shape) == expected.shape
        difference = np.abs(pixels.cpu().numpy().astype(np.int16) - expected)
        largest, total, count = (
            max(largest, int(difference.max())),
            total + difference.sum(),
            count + difference.size,
        )
    assert largest <= GPU_LARGEST and total / count < 1.0, (name, largest, total / count)


@pytest.mark.parametrize("decoder", DECODERS)
def test_gpu_memory_is_flat_over_epochs(jpeg: Path, decoder: str | None) -> None:
    """Five epochs decoded on the GPU: the memory allocated after each is what it was after
    the first (a known failure of GPU decoders is memory that grows per epoch until OOM), the
    allocator reserves no more after the second, and the device's used memory (which sees a
    library's own allocations, outside torch's) grows by no more than 16 MiB after it."""
    ds = PackedDataset.open(jpeg)
    allocated, reserved, used = [], [], []
    for epoch in range(5):
        images = _epoch(ds, "device", epoch, workers=0, decoder=decoder)
        del images
        gc.collect()
        torch.cuda.synchronize()
        allocated.append(torch.cuda.memory_allocated())
        reserved.append(torch.cuda.memory_reserved())
        free, total = torch.cuda.mem_get_info()
        used.append(total - free)
    assert max(allocated[1:]) <= allocated[0] + (1 << 20), allocated
    assert max(reserved[2:]) <= reserved[1] + (8 << 20), reserved
    assert max(used[2:]) <= used[1] + (16 << 20), used


@pytest.mark.parametrize("decoder", DECODERS)
def test_a_damaged_jpeg_is_named_not_a_crash_on_the_gpu(
    jpeg: Path, tmp_path: Path, decoder: str | None
) -> None:
    """Unchecked (verify=False) bytes with a garbage scan reach nvJPEG: the batch decodes to
    something or is one ShardError, never a crash of the process or a wrong-sized sample."""
    from etl.errors import ShardError
    from tests.helpers.codecs import zeroed_copy

    root = tmp_path / "ds"
    zeroed_copy(jpeg, root, 0, 20, -2)  # a garbage scan between its headers and its end
    ds = PackedDataset.open(root, verify=False)
    try:
        for images in _epoch(ds, "device", workers=0, decoder=decoder):
            assert images.shape[1:] == (3, 64, 64)
    except ShardError as exc:
        assert "does not decode" in str(exc) or "decodes to" in str(exc)
