"""Realistic benchmark photos: random crops of the photographs scikit-image bundles, as JPEGs.

Why not synthetic shapes: flat colours and hard edges compress to a few KB and decode far faster
than a camera picture, which flatters every decoder benchmark. These files look like an ImageNet
folder instead: 300..640 px a side at a random aspect, baseline JPEG with 4:2:0 chroma at quality
86..92, 40..125 KB (5th..95th percentile, mean 75 KB), mostly colour with a few greyscale ones,
no EXIF.

Each photo is drawn from a generator seeded by `(seed, index)`, so a file's bytes depend only on
those two values and the installed Pillow/libjpeg, not on `n` or on generation order: the first
`n` files of a larger set are the files of the smaller one. Only the photos scikit-image ships in
its wheel are used (no download); scikit-image is a benchmark-only dependency (`.[bench]`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from functools import cache
from io import BytesIO
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from PIL import Image, ImageEnhance

FORMAT_VERSION = 1
"""Bumped when the generator changes, so a cached folder of older photos is made again."""

MIN_SIDE, MAX_SIDE = 300, 640
"""Output width and height are drawn independently from this range, in pixels."""
MAX_UPSCALE = 1.6
"""A crop is at least 1/MAX_UPSCALE of the output size, so no photo is a blurry blow-up."""
GRAIN_SIGMA = (4.0, 8.0)
"""Luma noise (standard deviation in 8-bit levels): the grain of a camera file, which a
slightly upscaled bundled photo lacks; without it the JPEGs are half an ImageNet file's size."""
QUALITY = (86, 92)
"""JPEG quality range, inclusive."""
GREY_SHARE = 0.03
"""Share of photos stored as 8-bit greyscale JPEGs (ImageNet has a few percent of them)."""

_MARKER = ".photos.json"
"""Records how a folder was made; a dot-file, so the pipeline's folder source skips it."""


SOURCES_ENV = "BENCH_PHOTO_SOURCES"
"""A folder of `<class>.npy` arrays (`python -m benchmarks.photos --export DIR` writes them)
used instead of scikit-image: a machine without it (the lent GPU machine) makes the same
photos from a few MB carried there."""


def _stereo_left() -> NDArray[np.uint8]:
    from skimage import data

    left: NDArray[np.uint8] = data.stereo_motorcycle()[0]
    return left


def _loader(name: str) -> Callable[[], NDArray[np.uint8]]:
    def load() -> NDArray[np.uint8]:
        from skimage import data

        image: NDArray[np.uint8] = getattr(data, name)()
        return image

    return load


SOURCES: dict[str, Callable[[], NDArray[np.uint8]]] = {
    "astronaut": _loader("astronaut"),  # 512x512 portrait
    "cat": _loader("chelsea"),  # 451x300 pet photo
    "coffee": _loader("coffee"),  # 600x400 still life
    "rocket": _loader("rocket"),  # 640x427 outdoor scene
    "motorcycle": _stereo_left,  # 741x500 indoor scene
    "galaxies": _loader("hubble_deep_field"),  # 1000x872 telescope photo
    "tissue": _loader("immunohistochemistry"),  # 512x512 microscope photo
    "retina": _loader("retina"),  # 1411x1411 fundus photo
}
"""Class name -> bundled RGB photo; one class per source photo, in this (sorted) order."""

CLASSES: tuple[str, ...] = tuple(sorted(SOURCES))


def _bundled(name: str) -> NDArray[np.uint8]:
    exported = os.environ.get(SOURCES_ENV)
    if exported:
        array: NDArray[np.uint8] = np.load(Path(exported, f"{name}.npy"), allow_pickle=False)
        return array
    return SOURCES[name]()


@cache
def _source(name: str) -> Image.Image:
    """The bundled photo, upscaled (LANCZOS) so a MAX_SIDE crop needs at most MAX_UPSCALE."""
    image = Image.fromarray(np.ascontiguousarray(_bundled(name)[..., :3])).convert("RGB")
    if name == "retina":  # keep the lit disc, not the black frame around it
        w, h = image.size
        image = image.crop((w // 6, h // 6, w - w // 6, h - h // 6))
    need = MAX_SIDE / MAX_UPSCALE
    short = min(image.size)
    if short < need:
        scale = need / short
        image = image.resize(
            (round(image.width * scale), round(image.height * scale)), Image.Resampling.LANCZOS
        )
    return image


def photo(index: int, seed: int) -> tuple[str, bytes]:
    """(class name, JPEG bytes) of photo number `index`; a pure function of (index, seed)."""
    rng = np.random.default_rng([seed, index])
    name = CLASSES[int(rng.integers(len(CLASSES)))]
    source = _source(name)
    out_w, out_h = (int(v) for v in rng.integers(MIN_SIDE, MAX_SIDE + 1, size=2))
    # the crop box has the output's aspect, between the largest that fits and 1/MAX_UPSCALE
    # of the output size (or the whole source if that is smaller still)
    fit = min(source.width / out_w, source.height / out_h)
    low = min(fit, 1 / MAX_UPSCALE)
    scale = float(rng.uniform(low, fit))
    box_w, box_h = min(source.width, out_w * scale), min(source.height, out_h * scale)
    left = float(rng.uniform(0, source.width - box_w))
    top = float(rng.uniform(0, source.height - box_h))
    image = source.resize(
        (out_w, out_h),
        Image.Resampling.LANCZOS,
        box=(left, top, left + box_w, top + box_h),
    )
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    image = ImageEnhance.Brightness(image).enhance(float(rng.uniform(0.85, 1.15)))
    image = ImageEnhance.Contrast(image).enhance(float(rng.uniform(0.85, 1.15)))
    image = ImageEnhance.Color(image).enhance(float(rng.uniform(0.8, 1.2)))
    # sensor grain: a bundled photo upscaled a little is smoother than a camera file
    pixels = np.asarray(image, dtype=np.int16)
    sigma = float(rng.uniform(*GRAIN_SIGMA))
    grain = rng.standard_normal(size=(*pixels.shape[:2], 1), dtype=np.float32) * sigma
    pixels = np.clip(pixels + np.rint(grain).astype(np.int16), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    if rng.random() < GREY_SHARE:
        image = image.convert("L")
    quality = int(rng.integers(QUALITY[0], QUALITY[1] + 1))
    buffer = BytesIO()
    image.save(buffer, "JPEG", quality=quality, subsampling="4:2:0", optimize=False)
    return name, buffer.getvalue()


def _write(
    indices: Sequence[int],
    root: str,
    seed: int,
    make: Callable[[int, int], tuple[str, bytes]] = photo,
    prefix: str = "photo",
) -> int:
    total = 0
    for index in indices:
        name, data = make(index, seed)
        path = Path(root, name, f"{prefix}_{index:06d}.jpg")
        path.write_bytes(data)
        total += len(data)
    return total


def list_photos(root: Path) -> list[Path]:
    """The photos under `root`, sorted by path (the pipeline's order)."""
    return sorted(root.glob("*/photo_*.jpg"))


def _made_with(root: Path) -> dict[str, int] | None:
    try:
        made = json.loads((root / _MARKER).read_text())
    except (OSError, ValueError):
        return None
    return made if isinstance(made, dict) else None


def make_photos(
    root: Path | str,
    n: int,
    seed: int = 0,
    *,
    like: Path | str | None = None,
    n_jobs: int = -1,
) -> list[Path]:
    """Write `n` photos into `root/<class>/photo_<index>.jpg`, or reuse the folder if it already
    holds exactly these (same n, seed and FORMAT_VERSION). Returns the sorted paths.

    `like`: a folder made by this function with the same seed; its photos are hard-linked (or
    copied) instead of made again, since photo `i` does not depend on `n`.
    `n_jobs`: processes that generate the rest (joblib; -1 = every core), about 25 ms a photo.
    """
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    root = Path(root)
    wanted = {"n": n, "seed": seed, "version": FORMAT_VERSION}
    if _made_with(root) == wanted and len(list_photos(root)) == n:
        return list_photos(root)
    if root.exists():
        shutil.rmtree(root)
    for name in CLASSES:
        (root / name).mkdir(parents=True, exist_ok=True)

    todo = list(range(n))
    if like is not None:
        like = Path(like)
        made = _made_with(like)
        if made is not None and made["seed"] == seed and made["version"] == FORMAT_VERSION:
            existing = {path.name: path for path in list_photos(like)}
            todo = []
            for index in range(n):
                found = existing.get(f"photo_{index:06d}.jpg")
                if found is None:
                    todo.append(index)
                    continue
                target = root / found.parent.name / found.name
                try:
                    os.link(found, target)
                except OSError:
                    shutil.copyfile(found, target)

    if len(todo) < 100:  # starting worker processes would take longer
        _write(todo, str(root), seed)
    else:
        from joblib import Parallel, delayed

        workers = max(1, (os.cpu_count() or 1) + 1 + n_jobs) if n_jobs < 0 else n_jobs
        chunks = [todo[start :: workers * 4] for start in range(workers * 4)]
        Parallel(n_jobs=workers)(
            delayed(_write)(chunk, str(root), seed) for chunk in chunks if chunk
        )
    (root / _MARKER).write_text(json.dumps(wanted))
    return list_photos(root)


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Export the bundled photos for SOURCES_ENV.")
    parser.add_argument("--export", type=Path, required=True, help="folder to write <class>.npy")
    args = parser.parse_args()
    args.export.mkdir(parents=True, exist_ok=True)
    for name, load in SOURCES.items():
        np.save(args.export / f"{name}.npy", np.ascontiguousarray(load()), allow_pickle=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


CAMERA_SIZE = (4032, 3024)
"""A 12 MP phone photo's (width, height)."""


def camera_photo(index: int, seed: int) -> tuple[str, bytes]:
    """(class name, JPEG bytes) of a 12 MP camera-like photo: benchmark photo `index` upscaled
    (Lanczos) to 4032x3024 (or 3024x4032 for a portrait one), with sensor-like noise added at
    full resolution (luma sigma 3, chroma sigma 1.5, per pixel: what a camera's demosaiced
    file has and an upscale lacks), re-encoded as a quality-92 4:2:0 JPEG: 3-5 MB, as a phone
    writes. A pure function of (index, seed)."""
    name, data = photo(index, seed)
    rng = np.random.default_rng([seed, index, 12])
    with Image.open(BytesIO(data)) as small:
        image = small.convert("RGB")
    size = CAMERA_SIZE if image.width >= image.height else CAMERA_SIZE[::-1]
    big = np.asarray(image.resize(size, Image.Resampling.LANCZOS), dtype=np.float32)
    luma = rng.standard_normal(size=(*big.shape[:2], 1), dtype=np.float32) * 3.0
    chroma = rng.standard_normal(size=big.shape, dtype=np.float32) * 1.5
    pixels = np.clip(big + luma + chroma, 0, 255).astype(np.uint8)
    buffer = BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=92, subsampling="4:2:0")
    return name, buffer.getvalue()


def make_camera_photos(root: Path | str, n: int, seed: int = 0, n_jobs: int = -1) -> list[Path]:
    """Write `n` 12 MP photos (`camera_photo`) into `root/<class>/camera_<index>.jpg`, or reuse
    the folder if it holds exactly these; about 1 s a photo."""
    root = Path(root)
    wanted = {"n": n, "seed": seed, "version": FORMAT_VERSION, "kind": "camera"}
    found = sorted(root.glob("*/camera_*.jpg"))
    if _made_with(root) == wanted and len(found) == n:
        return found
    if root.exists():
        shutil.rmtree(root)
    for name in CLASSES:
        (root / name).mkdir(parents=True, exist_ok=True)
    from joblib import Parallel, delayed

    jobs = (os.cpu_count() or 1) if n_jobs == -1 else n_jobs
    parts = [list(range(n))[k::jobs] for k in range(jobs)]
    Parallel(n_jobs=jobs)(
        delayed(_write)(part, str(root), seed, camera_photo, "camera") for part in parts if part
    )
    (root / _MARKER).write_text(json.dumps(wanted))
    return sorted(root.glob("*/camera_*.jpg"))
