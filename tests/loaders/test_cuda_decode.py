"""Samples stored as JPEG, decoded on the GPU (`DeviceLoader(decode="device")`, torchvision's
`decode_jpeg` on CUDA: `loaders.device_decode`). Skipped without CUDA.

As in tests/loaders/test_cuda.py, `--break-mechanism NAME` removes one mechanism (`BREAKS`)
and runs only the tests guarding it, which must then fail. The oracle is the workers' decode
(libjpeg-turbo) of the same stored bytes, and Pillow's of them read with numpy.
"""

from __future__ import annotations

import gc
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import loaders.device
from etl.config import load_config
from etl.run import pipeline
from loaders import DeviceLoader, PackedDataset, RandomResizedCrop, make_loader
from loaders.device_decode import _cpu_name
from tests.helpers.codecs import write_config, write_photos

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

BREAKS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "decoded_on_gpu": lambda mp: mp.setattr(
        loaders.device, "jpeg_decoder", lambda device: (None, _cpu_name())
    ),
}


@pytest.fixture(scope="module")
def jpeg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gpu-jpeg")
    write_photos(folder / "images", count=40, sides=(200, 260))
    config = write_config(folder, "jpeg", resize="mode: keep_aspect, shorter: 96, longer: 160")
    assert pipeline.run(load_config(config)).committed
    return folder / "out"


def _epoch(ds: PackedDataset, decode: str, epoch: int = 0, workers: int = 2) -> list[torch.Tensor]:
    loader = make_loader(ds, batch_size=8, shuffle=True, num_workers=workers, with_indices=True)
    loader.set_epoch(epoch)
    device = DeviceLoader(loader, augment=RandomResizedCrop(64, seed=1), decode=decode)
    return [images.clone() for images, _, _ in device]


@pytest.mark.guards("decoded_on_gpu")
def test_gpu_decode_matches_the_workers_decode(jpeg: Path) -> None:
    """Crops of samples decoded on the GPU are those of the same samples decoded by the
    workers' libjpeg-turbo, within the two decoders' IDCT differences (PSNR above 40 dB), and
    the decoder named in the state is torchvision's on CUDA."""
    ds = PackedDataset.open(jpeg)
    loader = make_loader(ds, batch_size=8, num_workers=0, with_indices=True)
    device = DeviceLoader(loader, augment=RandomResizedCrop(64, seed=1), decode="device")
    assert device.decoder_name.startswith("torchvision ") and "cuda" in device.decoder_name
    on_gpu, in_workers = _epoch(ds, "device"), _epoch(ds, "workers")
    for a, b in zip(on_gpu, in_workers, strict=True):
        assert a.is_cuda and a.shape == b.shape
        error = torch.mean((a.float() - b.float()) ** 2).item() * 255**2
        assert error == 0 or 10 * np.log10(255**2 / error) > 40


def test_gpu_memory_is_flat_over_epochs(jpeg: Path) -> None:
    """Five epochs decoded on the GPU: the memory allocated after each is what it was after
    the first (a known failure of GPU decoders is memory that grows per epoch until OOM), and
    the allocator reserves no more after the second."""
    ds = PackedDataset.open(jpeg)
    allocated, reserved = [], []
    for epoch in range(5):
        images = _epoch(ds, "device", epoch, workers=0)
        del images
        gc.collect()
        torch.cuda.synchronize()
        allocated.append(torch.cuda.memory_allocated())
        reserved.append(torch.cuda.memory_reserved())
    assert max(allocated[1:]) <= allocated[0] + (1 << 20), allocated
    assert max(reserved[2:]) <= reserved[1] + (8 << 20), reserved


def test_a_damaged_jpeg_is_named_not_a_crash_on_the_gpu(jpeg: Path, tmp_path: Path) -> None:
    """Unchecked (verify=False) bytes with a garbage scan reach nvJPEG: the batch decodes to
    something or is one ShardError, never a crash of the process or a wrong-sized sample."""
    from etl.errors import ShardError
    from tests.helpers.codecs import read_plainly

    root = tmp_path / "ds"
    shutil.copytree(jpeg, root)
    _, rows = read_plainly(root)
    victim = rows[0]
    path = root / victim["shard"]
    data = bytearray(path.read_bytes())
    start = 128 + victim["sample_offset"]
    data[start + 20 : start + victim["sample_bytes"] - 2] = bytes(victim["sample_bytes"] - 22)
    path.write_bytes(bytes(data))
    ds = PackedDataset.open(root, verify=False)
    try:
        for images in _epoch(ds, "device", workers=0):
            assert images.shape[1:] == (3, 64, 64)
    except ShardError as exc:
        assert "does not decode" in str(exc) or "decodes to" in str(exc)
