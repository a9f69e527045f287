"""The naive writer as a command of its own, so a benchmark times it as it times `etl run`: a
cold process, its imports and its worker start-up included.

    python -m benchmarks.pack.naive PHOTOS OUT.npy [--jobs 2]

What one writes without a packing tool: joblib decodes chunks of 64 photos in worker processes
(open, decode, EXIF orientation, RGB, `ImageOps.fit` to 224x224 bilinear), the pixels travel
back pickled, and this process copies them into one `.npy` opened with
`np.lib.format.open_memmap`, flushed at the end. No hashing, checksums, validation, manifest or
fsync. Imports only numpy, Pillow and joblib.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from joblib import Parallel, delayed
from PIL import Image, ImageOps

HEIGHT, WIDTH = 224, 224
CHUNK = 64


def decode(paths: Sequence[str]) -> np.ndarray:
    out = np.empty((len(paths), HEIGHT, WIDTH, 3), np.uint8)
    for i, path in enumerate(paths):
        with Image.open(path) as image:
            image.load()
            ImageOps.exif_transpose(image, in_place=True)
            rgb = image if image.mode == "RGB" else image.convert("RGB")
            out[i] = np.asarray(ImageOps.fit(rgb, (WIDTH, HEIGHT), Image.Resampling.BILINEAR))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("photos", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    paths = sorted(str(p) for p in args.photos.glob("*/*.jpg"))
    array = np.lib.format.open_memmap(args.out, "w+", np.uint8, (len(paths), HEIGHT, WIDTH, 3))
    chunks = [paths[i : i + CHUNK] for i in range(0, len(paths), CHUNK)]
    at = 0
    for pixels in Parallel(n_jobs=args.jobs, return_as="generator")(
        delayed(decode)(chunk) for chunk in chunks
    ):
        array[at : at + len(pixels)] = pixels
        at += len(pixels)
    array.flush()
    print(at)
    return 0


if __name__ == "__main__":
    sys.exit(main())
