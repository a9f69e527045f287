"""FFCV's half of `benchmarks.load.against_ffcv`, run by the interpreter of FFCV's own venv
(`benchmarks/load/ffcv_setup.sh`): it imports numpy and FFCV only, never this project.

    python ffcv_side.py write PIXELS SIZES LABELS OUT.beton (raw | jpg) MAX_SIDE
    python ffcv_side.py read OUT.beton THREADS EPOCHS CROP

`write` takes the very pixels our pack stored (decoded by the caller: a flat uint8 .npy, each
sample's (height, width), its label) and writes them with FFCV's own `DatasetWriter`, raw or
as JPEG at quality 90 (FFCV's default, and ours). `read` prints one JSON line: [seconds of the
epoch, seconds to its first batch] for each of EPOCHS epochs of a fresh `Loader` (batches of
256, random order, the OS page cache, the short last batch kept), decoded to the stored size
(CROP 0) or `RandomResizedCrop`ped to CROP x CROP.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


class _Stored:
    """The caller's samples as FFCV's writer asks for them: (image HWC, label) by index."""

    def __init__(self, pixels: str, sizes: str, labels: str) -> None:
        self.pixels = np.load(pixels, mmap_mode="r")
        self.sizes = np.load(sizes)
        self.labels = np.load(labels)
        lengths = self.sizes[:, 0] * self.sizes[:, 1] * 3
        self.starts = np.concatenate([[0], np.cumsum(lengths)])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        height, width = (int(v) for v in self.sizes[i])
        flat = self.pixels[self.starts[i] : self.starts[i + 1]]
        return np.ascontiguousarray(flat).reshape(height, width, 3), int(self.labels[i])


def write(pixels: str, sizes: str, labels: str, out: str, mode: str, max_side: int) -> None:
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    image = RGBImageField(write_mode=mode, max_resolution=max_side, jpeg_quality=90)
    writer = DatasetWriter(out, {"image": image, "label": IntField()}, num_workers=2)
    writer.from_indexed_dataset(_Stored(pixels, sizes, labels))


def read(beton: str, threads: int, epochs: int, crop: int) -> list[list[float]]:
    from ffcv.fields.decoders import (
        IntDecoder,
        RandomResizedCropRGBImageDecoder,
        SimpleRGBImageDecoder,
    )
    from ffcv.loader import Loader, OrderOption

    decoder = RandomResizedCropRGBImageDecoder((crop, crop)) if crop else SimpleRGBImageDecoder()
    loader = Loader(
        beton, batch_size=256, num_workers=threads, order=OrderOption.RANDOM, os_cache=True,
        drop_last=False, pipelines={"image": [decoder], "label": [IntDecoder()]},
    )  # fmt: skip
    results = []
    for _ in range(epochs):
        start = time.perf_counter()
        first = None
        for _images, _labels in loader:
            if first is None:
                first = time.perf_counter() - start
        results.append([time.perf_counter() - start, first or 0.0])
    return results


if __name__ == "__main__":
    verb, *args = sys.argv[1:]
    if verb == "write":
        write(*args[:5], int(args[5]))
    else:
        print(json.dumps(read(args[0], int(args[1]), int(args[2]), int(args[3]))))
