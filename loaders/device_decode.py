"""Samples stored encoded, decoded where the batch goes (`DeviceLoader(decode="device")`): the
workers ship only the stored bytes (a tenth of a photo's pixels), and the device decodes them.

On CUDA the JPEGs of a batch are decoded together by torchvision's `decode_jpeg(device=...)`
(nvJPEG, with the hardware decoder where the card has one); a raw or zlib sample of the same
batch (a `min_ratio` dataset stores some raw) is made on the CPU and copied. Without CUDA, or
without torchvision, "device" decodes in this process with libjpeg-turbo (simplejpeg): the same
values a worker makes, so the plumbing is the same, tested without a GPU.

The decoded samples come out back to back in CHW, each its own size: `RaggedImages` that the
augmentations here crop from directly (NOTE [ back to back ] in `loaders.ragged`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
from numpy.typing import NDArray

from etl.errors import ShardError
from etl.format.codecs import JPEG, DecodeFailure, decode
from etl.format.ragged import shape_of

JpegDecoder = Callable[[Sequence[torch.Tensor], int], list[torch.Tensor]]
"""(encoded JPEGs as CPU uint8 tensors, channels) -> each decoded, CHW uint8, on the device."""


def jpeg_decoder(device: torch.device) -> tuple[JpegDecoder | None, str]:
    """The batch JPEG decoder for `device`, and its name (recorded beside a run's state):
    torchvision's nvJPEG decode on CUDA, else None: libjpeg-turbo in this process, as every
    other codec (`etl.format.codecs.decode`), with one warning where CUDA is there and
    torchvision is not."""
    if device.type == "cuda":
        try:
            from torchvision.io import ImageReadMode, decode_jpeg
            from torchvision.version import __version__ as version
        except ImportError:
            warnings.warn(
                "DeviceLoader(decode='device'): torchvision is not installed, so JPEGs are "
                "decoded on the CPU in the training process; pip install torchvision for "
                "decode_jpeg on the GPU, or decode in the workers (the default)",
                RuntimeWarning,
                stacklevel=3,
            )
        else:

            def on_gpu(datas: Sequence[torch.Tensor], channels: int) -> list[torch.Tensor]:
                mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
                decoded = decode_jpeg(list(datas), mode=mode, device=device)
                return list(decoded)

            return on_gpu, f"torchvision {version} decode_jpeg on {device}"
    return None, _cpu_name()


def _cpu_name() -> str:
    import simplejpeg

    return f"simplejpeg {simplejpeg.__version__} in the training process"


def decode_batch(
    data: torch.Tensor,
    nbytes: NDArray[np.int64],
    codecs: NDArray[np.int64],
    heights: NDArray[np.int64],
    widths: NDArray[np.int64],
    channels: int,
    layout: str,
    decoder: JpegDecoder | None,
    device: torch.device,
) -> torch.Tensor:
    """A batch of stored samples back to back in CPU `data` (each `nbytes` long, with its
    codec and size) decoded: 1-d uint8 on `device`, each sample's CHW pixels back to back. A
    sample that decodes to another size than its row's is a ShardError (its bytes were checked
    against their checksum in the worker, unless verification is off)."""
    parts = list(torch.split(data, nbytes.tolist()))
    on_device = (codecs == JPEG) if decoder is not None else np.zeros(len(parts), bool)
    jpegs = np.flatnonzero(on_device).tolist()
    decoded: list[torch.Tensor | None] = [None] * len(parts)
    try:
        if jpegs:
            assert decoder is not None
            for k, pixels in zip(jpegs, decoder([parts[k] for k in jpegs], channels), strict=True):
                decoded[k] = pixels
        for k in np.flatnonzero(~on_device).tolist():  # made on the CPU, then copied
            shape = shape_of(int(heights[k]), int(widths[k]), channels, layout)
            array = decode(parts[k].numpy(), int(codecs[k]), shape)
            pixels = torch.from_numpy(array if array.flags.writeable else array.copy())
            chw = pixels.permute(2, 0, 1) if layout == "HWC" else pixels
            decoded[k] = chw.to(device, non_blocking=True)
    except (DecodeFailure, RuntimeError) as exc:
        raise ShardError(f"a batch's stored samples do not decode on {device} ({exc})") from None
    flat = []
    for k, one in enumerate(decoded):
        assert one is not None
        pixels = one
        if tuple(pixels.shape) != (channels, int(heights[k]), int(widths[k])):
            raise ShardError(
                f"sample {k} of a batch decodes to {tuple(pixels.shape)}, its row says "
                f"{(channels, int(heights[k]), int(widths[k]))}"
            )
        flat.append(pixels.reshape(-1))
    if not flat:
        return torch.empty(0, dtype=torch.uint8, device=device)
    return torch.cat(flat)
