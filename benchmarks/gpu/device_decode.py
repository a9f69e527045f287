"""Which library decodes a batch's JPEGs where the batch goes (`DeviceLoader(decode="device")`,
#58): torchvision's `decode_jpeg` against NVIDIA nvImageCodec, beside libjpeg-turbo in the
training process, over the same stored bytes, in one run.

    python -m benchmarks.gpu.device_decode [--photos 2000] [--epochs 4] [--device cuda|cpu]
        [--json FILE]

The photos are `benchmarks.photos` (300-640 px JPEGs), packed once by `etl run` as JPEG with the
aspect kept (shorter side 256, longer 512). Every stored sample is read back as bytes (numpy and
pyarrow), then each contender decodes all of them in batches of 256 onto `--device` (default:
CUDA where present), one epoch after another, as `loaders.device.decode.jpeg_decoder` makes it:

- **samples/s**: the median epoch after the first (the first pays the library's start), with a
  device sync at each epoch's end;
- **of simplejpeg**: against libjpeg-turbo decoding one sample after another in this process
  and copying each to the device (`decoder=None` without CUDA);
- **largest difference** from Pillow's decode of the first 64 samples (0-255 levels; the
  loader state names the decoder, since another may give pixels a level or two apart);
- **memory**: on CUDA, torch's peak allocation in each epoch and the device's used memory
  after it (`torch.cuda.mem_get_info`: nvImageCodec allocates outside torch's allocator). Both
  flat over the epochs, or the decoder leaks (a known failure of GPU decoders).

On the CPU, nvImageCodec runs its CPU backend (libjpeg-turbo) and torchvision its CPU decode:
the same code path as on CUDA, so the script is checked without a GPU (`gpu_check.sh
--dry-run`). A library that is not installed, or cannot decode on the device, is a row saying
so. No result is asserted: benchmarks/README.md records the figures with the machine and date.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import cpu_model
from benchmarks.formats.encoded import RESIZES, _stored_jpegs, pack
from benchmarks.photos import make_photos

BATCH = 256
CHECKED = 64
"""Samples whose pixels are compared with Pillow's."""


def _simplejpeg(device: Any) -> Callable[[Sequence[Any], int], list[Any]]:
    """libjpeg-turbo in this process, one sample after another, each copied to `device`."""
    import simplejpeg
    import torch

    def decode(datas: Sequence[Any], channels: int) -> list[Any]:
        made = []
        for data in datas:
            pixels = simplejpeg.decode_jpeg(data.numpy(), "RGB" if channels == 3 else "Gray")
            made.append(torch.from_numpy(pixels).permute(2, 0, 1).to(device, non_blocking=True))
        return made

    return decode


def contenders(device: Any) -> dict[str, tuple[Any, str]]:
    """name -> (decoder or None, what it is or why it is missing)."""
    from loaders.device.decode import LIBRARIES, jpeg_decoder

    found: dict[str, tuple[Any, str]] = {
        "simplejpeg, this process": (_simplejpeg(device), "libjpeg-turbo, sample by sample")
    }
    for library in LIBRARIES:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            decoder, name = jpeg_decoder(device, library)
        if decoder is None:
            said = (str(w.message).removeprefix("DeviceLoader(decode='device'): ") for w in caught)
            found[library] = (None, f"not run: {'; '.join(said) or name}")
        else:
            found[library] = (decoder, name)
    return found


def _pillow(blob: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(blob)) as image:
        return np.asarray(image.convert("RGB")).transpose(2, 0, 1)


def measure(decoder: Any, blobs: list[bytes], device: Any, epochs: int) -> dict[str, Any]:
    """Samples/s per epoch, memory after each, and the largest difference from Pillow."""
    import torch

    on_gpu = device.type == "cuda"
    datas = [torch.frombuffer(bytearray(blob), dtype=torch.uint8) for blob in blobs]
    first = decoder(datas[:CHECKED], 3)
    largest = max(
        int(np.abs(pixels.cpu().numpy().astype(np.int16) - _pillow(blob)).max())
        for pixels, blob in zip(first, blobs[:CHECKED], strict=True)
    )
    del first
    rates, peaks, used = [], [], []
    for _ in range(epochs):
        if on_gpu:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        for at in range(0, len(datas), BATCH):
            decoded = decoder(datas[at : at + BATCH], 3)
            del decoded
        if on_gpu:
            torch.cuda.synchronize(device)
        rates.append(len(datas) / (time.perf_counter() - start))
        if on_gpu:
            free, total = torch.cuda.mem_get_info(device)
            peaks.append(torch.cuda.max_memory_allocated(device) / 2**20)
            used.append((total - free) / 2**20)
    return {
        "samples_per_s": statistics.median(rates[1:] or rates),
        "largest_difference": largest,
        "peak_mib": peaks,
        "used_mib": used,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda where present")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "etl-memmap"
    photos = cache / f"bench-photos-{args.photos}"
    make_photos(photos, args.photos)
    with tempfile.TemporaryDirectory(prefix="bench-device-decode-") as tmp:
        folder = Path(tmp) / "jpeg"
        pack(folder, photos, "jpeg", RESIZES["aspect 256/512"])
        blobs = _stored_jpegs(folder / "out")
    results: dict[str, Any] = {
        "photos": len(blobs),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model(),
        "cores": os.cpu_count(),
        "stored_bytes_per_sample": sum(map(len, blobs)) / len(blobs),
        "rows": {},
    }
    for name, (decoder, what) in contenders(device).items():
        row = {"what": what}
        if decoder is not None:
            row |= measure(decoder, blobs, device, args.epochs)
        results["rows"][name] = row
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def print_table(results: dict[str, Any]) -> None:
    print(
        f"{results['photos']} stored JPEGs (aspect kept, shorter 256 / longer 512, "
        f"{results['stored_bytes_per_sample'] / 1024:.1f} KiB a sample), {results['device']}, "
        f"{results['cores']} cores"
    )
    print(
        "| decoder | samples/s | of simplejpeg | largest difference from Pillow | "
        "torch peak MiB per epoch | device used MiB after each epoch | what |"
    )
    print("|---|---:|---:|---:|---|---|---|")
    rows = results["rows"]
    base = rows["simplejpeg, this process"]["samples_per_s"]
    for name, row in rows.items():
        if "samples_per_s" not in row:
            print(f"| {name} | | | | | | {row['what']} |")
            continue
        peaks = ", ".join(f"{p:.0f}" for p in row["peak_mib"]) or "-"
        used = ", ".join(f"{u:.0f}" for u in row["used_mib"]) or "-"
        print(
            f"| {name} | {row['samples_per_s']:,.0f} | {row['samples_per_s'] / base:.2f}x | "
            f"{row['largest_difference']} | {peaks} | {used} | {row['what']} |"
        )


if __name__ == "__main__":
    main()
