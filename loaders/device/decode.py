"""Samples stored encoded, decoded where the batch goes (`DeviceLoader(decode="device")`): the
workers ship only the stored bytes (a tenth of a photo's pixels), and the device decodes them.

Two libraries decode the JPEGs of a batch together on CUDA (nvJPEG, with the hardware decoder
where the card has one): torchvision's `decode_jpeg(device=...)`, the default, since GPU
training images already carry torchvision; and NVIDIA nvImageCodec (`decoder="nvimgcodec"`,
the `gpu-decode` extra), whose CPU backend (libjpeg-turbo) also runs without CUDA, so its
plumbing is tested on every machine. A raw or zlib sample of the same batch (a `min_ratio`
dataset stores some raw) is made on the CPU and copied. Without CUDA, or without the library,
"device" decodes in this process with libjpeg-turbo (simplejpeg): the same values a worker
makes, with one warning where a library was asked for or CUDA is there and it is missing.

The decoded samples come out back to back in CHW, each its own size: `RaggedImages` that the
augmentations here crop from directly (NOTE [ back to back ] in `loaders.batch.ragged`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from etl.errors import ShardError, described
from etl.format.codecs import JPEG, DecodeFailure, decode
from etl.format.flat import shape_of

JpegDecoder = Callable[[Sequence[torch.Tensor], int], list[torch.Tensor]]
"""(encoded JPEGs as CPU uint8 tensors, channels) -> each decoded, CHW uint8, on the device."""


LIBRARIES = ("torchvision", "nvimgcodec")
"""The libraries `jpeg_decoder` can decode a batch's JPEGs with."""


def jpeg_decoder(
    device: torch.device, library: str | None = None
) -> tuple[JpegDecoder | None, str]:
    """The batch JPEG decoder for `device`, and its name (recorded beside a run's state).
    `library` None or "torchvision": torchvision's nvJPEG decode on CUDA; "nvimgcodec":
    nvImageCodec's, on CUDA or on its CPU backend. None as the decoder: libjpeg-turbo in this
    process, as every other codec (`etl.format.codecs.decode`), with one warning where the
    library was asked for (or CUDA is there) and is not installed."""
    if library not in (None, *LIBRARIES):
        raise ValueError(f"decoder is one of {', '.join(LIBRARIES)} (or None), got {library!r}")
    made = None
    if library == "nvimgcodec":
        made = _nvimgcodec(device)
    elif device.type == "cuda" or library == "torchvision":
        made = _torchvision(device)
    return made or (None, _cpu_name())


def _missing(package: str, install: str) -> None:
    warnings.warn(
        f"DeviceLoader(decode='device'): {package} is not installed, so JPEGs are decoded on "
        f"the CPU in the training process; pip install {install} to decode them on the GPU, "
        "or decode in the workers (the default)",
        RuntimeWarning,
        stacklevel=5,
    )


def _torchvision(device: torch.device) -> tuple[JpegDecoder, str] | None:
    """torchvision's batched `decode_jpeg` on `device` (CUDA: nvJPEG; CPU: libjpeg-turbo)."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
        from torchvision.version import __version__ as version
    except ImportError:
        _missing("torchvision", "torchvision")
        return None

    def decode(datas: Sequence[torch.Tensor], channels: int) -> list[torch.Tensor]:
        mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
        return list(decode_jpeg(list(datas), mode=mode, device=device))

    return decode, f"torchvision {version} decode_jpeg on {device}"


def _nvimgcodec(device: torch.device) -> tuple[JpegDecoder, str] | None:
    """nvImageCodec's batched decode: on CUDA by its GPU backends alone, into device memory on
    the current stream (the DeviceLoader's side stream), taken over by torch without a copy;
    elsewhere by its CPU backend. A sample it cannot decode comes back as None: a RuntimeError
    naming it. One tiny JPEG is decoded first, so a library that cannot decode here (on CUDA:
    no nvJPEG installed) is one warning and the CPU path, not an error at the first batch."""
    try:
        nvimgcodec = _quietly_imported()
    except ImportError:
        _missing("nvImageCodec", "'etl-memmap[gpu-decode]'")
        return None
    on_gpu = device.type == "cuda"
    if on_gpu:
        index = device.index if device.index is not None else torch.cuda.current_device()
        kinds: tuple[Any, ...] = (
            nvimgcodec.HW_GPU_ONLY, nvimgcodec.GPU_ONLY, nvimgcodec.HYBRID_CPU_GPU,
        )  # fmt: skip
    else:
        index, kinds = nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY, (nvimgcodec.CPU_ONLY,)
    where = str(device) if on_gpu else "the CPU backend (libjpeg-turbo)"
    try:
        backends = [nvimgcodec.Backend(kind) for kind in kinds]
        decoder = nvimgcodec.Decoder(device_id=index, backends=backends)
    except RuntimeError as exc:  # e.g. a CUDA failure as it starts
        _cannot(where, described(exc))
        return None
    params = {
        channels: nvimgcodec.DecodeParams(
            apply_exif_orientation=False,  # the stored bytes carry no EXIF: as written
            color_spec=nvimgcodec.GRAY if channels == 1 else nvimgcodec.SRGB,
            sample_format=nvimgcodec.P_Y if channels == 1 else nvimgcodec.P_RGB,  # CHW
        )
        for channels in (1, 3)
    }

    def decode(datas: Sequence[torch.Tensor], channels: int) -> list[torch.Tensor]:
        streams = [nvimgcodec.CodeStream(data.numpy()) for data in datas]
        cuda_stream = torch.cuda.current_stream(device).cuda_stream if on_gpu else 0
        images = decoder.decode(streams, params=params[channels], cuda_stream=cuda_stream)
        decoded = []
        for k, image in enumerate(images):
            if image is None:
                raise RuntimeError(f"nvImageCodec made no image of sample {k} of {len(datas)}")
            # The tensor holds the library's image, whose memory it is: no copy.
            pixels = torch.from_dlpack(image) if on_gpu else torch.from_numpy(np.asarray(image))
            decoded.append(pixels.to(device, non_blocking=True))
        return decoded

    if not _decodes(decode):
        _cannot(where, "on CUDA it needs nvJPEG: pip install 'etl-memmap[gpu-decode]'")
        return None
    return decode, f"nvImageCodec {nvimgcodec.__version__} on {where}"


def _cannot(where: str, why: str) -> None:
    warnings.warn(
        f"DeviceLoader(decode='device'): nvImageCodec cannot decode a JPEG on {where} ({why}), "
        "so JPEGs are decoded on the CPU in the training process",
        RuntimeWarning,
        stacklevel=5,
    )


def _decodes(decode: JpegDecoder) -> bool:
    """Whether `decode` makes the pixels of a small JPEG whose every pixel is one value."""
    import simplejpeg

    tiny = np.full((16, 16, 3), (40, 120, 200), np.uint8)
    data = torch.frombuffer(bytearray(simplejpeg.encode_jpeg(tiny, quality=95)), dtype=torch.uint8)
    try:
        pixels = decode([data], 3)[0].cpu().numpy()
    except RuntimeError:
        return False
    expected = tiny.transpose(2, 0, 1).astype(np.int16)
    return pixels.shape == expected.shape and int(np.abs(pixels - expected).max()) <= 3


IGNORED_ON_LOADING = ("Failed to load", "will not be registered", "it is enough to install")
"""What nvImageCodec prints on loading about the libraries of codecs it finds missing: JPEG 2000
and TIFF, which decoding JPEG never needs, and nvJPEG, which `_decodes` checks for."""


def _quietly_imported() -> Any:
    """nvImageCodec, imported with what its native code prints on loading kept back: lines
    about missing codec libraries (`IGNORED_ON_LOADING`) are dropped, anything else is written
    out as it came."""
    import os
    import sys
    import tempfile

    loaded = sys.modules.get("nvidia.nvimgcodec")
    if loaded is not None:  # printed what it had to say the first time
        return loaded
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as caught:
        try:
            saved = {fd: os.dup(fd) for fd in (1, 2)}
        except OSError:  # no standard output or error to keep back
            import nvidia.nvimgcodec as nvimgcodec

            return nvimgcodec
        try:
            for fd in saved:
                os.dup2(caught.fileno(), fd)
            import nvidia.nvimgcodec as nvimgcodec
        finally:
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
        caught.seek(0)
        said = caught.read().decode(errors="replace").splitlines()
    kept = [line for line in said if line and not any(x in line for x in IGNORED_ON_LOADING)]
    if kept:
        print("\n".join(kept), file=sys.stderr)
    return nvimgcodec


def _cpu_name() -> str:
    import simplejpeg

    return f"simplejpeg {simplejpeg.__version__} in the training process"


def in_batch(k: int) -> str:
    """The name of sample k of a batch, where nothing better is known."""
    return f"sample {k} of a batch"


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
    name: Callable[[int], str] = in_batch,
) -> torch.Tensor:
    """A batch of stored samples back to back in CPU `data` (each `nbytes` long, with its
    codec and size) decoded: 1-d uint8 on `device`, each sample's CHW pixels back to back.
    A sample that does not decode, or decodes to another size than its row's, is a
    ShardError with its `name(k)` (its bytes were checked against their checksum in the
    worker, unless verification is off)."""
    parts = list(torch.split(data, nbytes.tolist()))
    on_device = (codecs == JPEG) if decoder is not None else np.zeros(len(parts), bool)
    jpegs = np.flatnonzero(on_device).tolist()
    decoded: list[torch.Tensor | None] = [None] * len(parts)
    if jpegs:
        assert decoder is not None
        try:
            made = decoder([parts[k] for k in jpegs], channels)
        except RuntimeError:  # one by one, to name the sample that does not decode
            made = [_one(decoder, parts[k], channels, name(k), device) for k in jpegs]
        for k, pixels in zip(jpegs, made, strict=True):
            decoded[k] = pixels
    for k in np.flatnonzero(~on_device).tolist():  # made on the CPU, then copied
        shape = shape_of(int(heights[k]), int(widths[k]), channels, layout)
        try:
            array = decode(parts[k].numpy(), int(codecs[k]), shape)
        except DecodeFailure as exc:
            raise ShardError(f"{name(k)} does not decode ({exc})") from None
        pixels = torch.from_numpy(array if array.flags.writeable else array.copy())
        chw = pixels.permute(2, 0, 1) if layout == "HWC" else pixels
        decoded[k] = chw.to(device, non_blocking=True)
    flat = []
    for k, one in enumerate(decoded):
        assert one is not None
        if tuple(one.shape) != (channels, int(heights[k]), int(widths[k])):
            raise ShardError(
                f"{name(k)} decodes to {tuple(one.shape)}, its row says "
                f"{(channels, int(heights[k]), int(widths[k]))}"
            )
        flat.append(one.reshape(-1))
    if not flat:
        return torch.empty(0, dtype=torch.uint8, device=device)
    return torch.cat(flat)


def _one(
    decoder: JpegDecoder, data: torch.Tensor, channels: int, name: str, device: torch.device
) -> torch.Tensor:
    """One JPEG decoded alone, or a ShardError with its name."""
    try:
        return decoder([data], channels)[0]
    except RuntimeError as exc:
        raise ShardError(f"{name} does not decode on {device} ({exc})") from None
