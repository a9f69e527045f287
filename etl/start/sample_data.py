"""A small, deterministic class-per-folder image dataset for the quick start and the tests.

Why synthetic: the quick start must work offline and the tests must not depend on a download, yet
the pipeline should meet the mess real folders contain (mixed sizes, colour modes, extensions,
EXIF rotation, broken and junk files). Every image is drawn by numpy at its final size from a
generator seeded by `(seed, class_index, i)`, so a file's bytes depend only on those three values:
not on generation order, on `per_class`, on time or on the machine (given the same Pillow build).
"""

from __future__ import annotations

import io
import os
import shutil
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from PIL import Image

from etl.start.pictures import CLASSES, render

#: Stored image kinds and their share of images after the first `len(_FORCED_KINDS)` images.
_KIND_WEIGHTS: dict[str, float] = {
    "rgb_jpeg": 0.70,
    "rgb_png": 0.07,
    "l_jpeg": 0.05,
    "l_png": 0.03,
    "rgba_png": 0.04,
    "p_png": 0.04,
    "cmyk_jpeg": 0.02,
    "i16_png": 0.02,
    "bw_png": 0.01,
    "exif_jpeg": 0.02,
}
_KIND_NAMES = tuple(_KIND_WEIGHTS)
_KIND_P = np.array(list(_KIND_WEIGHTS.values())) / sum(_KIND_WEIGHTS.values())

# NOTE [ coverage at tiny sizes ]: images are numbered globally as g = i * len(CLASSES) + c
# (interleaved over classes) and the first images take these kinds in turn, so even
# `per_class=2` contains every colour mode. The order puts "exif_jpeg" at g = 3, an "hstripes"
# image, whose orientation a test can check after applying the EXIF rotation.
_FORCED_KINDS: tuple[str, ...] = (
    "l_jpeg",
    "rgba_png",
    "p_png",
    "exif_jpeg",
    "cmyk_jpeg",
    "i16_png",
    "bw_png",
    "l_png",
    "rgb_png",
)

_MIN_SIDE, _MAX_SIDE = 48, 480
_JPEG_EXTS, _JPEG_EXT_P = (".jpg", ".JPG", ".jpeg"), (0.8, 0.1, 0.1)
_PNG_EXTS, _PNG_EXT_P = (".png", ".PNG"), (0.95, 0.05)
_EXIF_ORIENTATION = 0x0112
# Random streams: ordinary images use (seed, class, i); edge files use (seed, _EDGE_STREAM, k).
_EDGE_STREAM = 1_000_003


@dataclass(frozen=True)
class SampleDataReport:
    """What `make_sample_data` wrote.

    `images` counts the valid images (`per_class` for each class); `broken` counts the extra
    deliberately broken, edge-case and junk files. `images + broken` is the number of files on disk.
    """

    root: Path
    images: int
    broken: int
    per_class: dict[str, int]


def make_sample_data(
    root: Path,
    per_class: int = 500,
    seed: int = 0,
    broken: bool = True,
    progress: Callable[[int], None] | None = None,
) -> SampleDataReport:
    """Write `per_class` images into `root/<class>/` for each of `CLASSES`, plus edge files.

    With `broken=True` about ten extra files are spread over the classes; their names start with
    `broken_` (cannot be decoded), `edge_` (decodable but needing a policy) or are `.DS_Store`.
    `progress(1)` is called after each valid image written (per_class x classes in all, so a
    progress bar knows its total). The tree is built in
    `root.parent/.<root.name>.partial-<pid>` and renamed to `root` at the end, so `root` never
    exists half-written; a killed run leaves only the `.partial-<pid>` folder behind.

    Raises FileExistsError if `root` exists and is not an empty directory, ValueError for
    `per_class < 1` or a negative `seed`.
    """
    if per_class < 1:
        raise ValueError(f"per_class must be >= 1, got {per_class}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    root = Path(root)
    _check_free(root)
    tmp = root.absolute().parent / f".{root.absolute().name}.partial-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)  # left by an earlier run of this very process; nobody else owns it
    tmp.mkdir(parents=True)
    counts = dict.fromkeys(CLASSES, 0)
    n_edge = 0
    try:
        for c, name in enumerate(CLASSES):
            (tmp / name).mkdir()
            for i in range(per_class):
                filename, data = sample_image(seed, c, i)
                (tmp / name / filename).write_bytes(data)
                counts[name] += 1
                if progress is not None:
                    progress(1)
        if broken:
            for c, filename, data in _edge_files(seed):
                (tmp / CLASSES[c] / filename).write_bytes(data)
                n_edge += 1
        _check_free(root)  # someone may have filled it while we were writing
        if root.exists():
            root.rmdir()
        tmp.rename(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return SampleDataReport(root=root, images=sum(counts.values()), broken=n_edge, per_class=counts)


def sample_image(seed: int, class_index: int, i: int) -> tuple[str, bytes]:
    """File name and encoded bytes of image `i` of class `class_index`; a pure function."""
    rng = np.random.default_rng((seed, class_index, i))
    g = i * len(CLASSES) + class_index
    drawn = str(rng.choice(_KIND_NAMES, p=_KIND_P))
    kind = _FORCED_KINDS[g] if g < len(_FORCED_KINDS) else drawn
    width, height = _draw_size(rng)
    rgb, alpha, lum_threshold = render(rng, class_index, width, height)
    data, ext = _encode(rng, kind, rgb, alpha, lum_threshold)
    return f"{CLASSES[class_index]}_{i:05d}{ext}", data


def _check_free(root: Path) -> None:
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(
            f"{root} already exists and is not empty; remove it or choose another directory"
        )


def _draw_size(rng: np.random.Generator) -> tuple[int, int]:
    """Width and height in pixels, each 48..480; long side and aspect (w/h, 0.5..2) log-uniform.

    Log-uniform sides give as many small as large images, like scraped data, and keep the
    generator fast (pixels, not files, cost time).
    """
    long_side = round(float(np.exp(rng.uniform(np.log(72), np.log(_MAX_SIDE)))))
    aspect = float(np.exp(rng.uniform(np.log(0.5), np.log(2.0))))
    if aspect >= 1.0:
        return long_side, max(_MIN_SIDE, round(long_side / aspect))
    return max(_MIN_SIDE, round(long_side * aspect)), long_side


def _encode(
    rng: np.random.Generator,
    kind: str,
    rgb: NDArray[np.uint8],
    alpha: NDArray[np.uint8],
    lum_threshold: float,
) -> tuple[bytes, str]:
    """Store the picture as `kind` (a key of `_KIND_WEIGHTS`); returns bytes and file extension."""
    quality = int(rng.integers(70, 96))
    jpeg_ext = str(rng.choice(_JPEG_EXTS, p=_JPEG_EXT_P))
    png_ext = str(rng.choice(_PNG_EXTS, p=_PNG_EXT_P))
    orientation = int(rng.choice((6, 8)))
    colours = int(rng.integers(16, 257))
    image = Image.fromarray(rgb, "RGB")
    buf = io.BytesIO()
    # NOTE [ fast PNG ]: zlib's Huffman-only strategy (compress_type=2) encodes noisy pixels 2-3x
    # faster than the default at the same size; any PNG decoder reads it.
    png: dict[str, int] = {"compress_type": 2}
    if kind == "rgb_jpeg":
        image.save(buf, "JPEG", quality=quality)
    elif kind == "l_jpeg":
        image.convert("L").save(buf, "JPEG", quality=quality)
    elif kind == "cmyk_jpeg":
        image.convert("CMYK").save(buf, "JPEG", quality=quality)
    elif kind == "exif_jpeg":
        # Orientation 6 means "rotate 90 degrees clockwise to display", so store the picture
        # turned 90 degrees counter-clockwise (8: the other way); viewers show it upright.
        turn = Image.Transpose.ROTATE_90 if orientation == 6 else Image.Transpose.ROTATE_270
        exif = Image.Exif()
        exif[_EXIF_ORIENTATION] = orientation
        image.transpose(turn).save(buf, "JPEG", quality=quality, exif=exif)
    elif kind == "rgb_png":
        image.save(buf, "PNG", **png)
    elif kind == "l_png":
        image.convert("L").save(buf, "PNG", **png)
    elif kind == "rgba_png":
        image.putalpha(Image.fromarray(alpha, "L"))  # colour kept under alpha 0: no info lost
        image.save(buf, "PNG", **png)
    elif kind == "p_png":
        image.quantize(colors=colours, method=Image.Quantize.FASTOCTREE).save(buf, "PNG")
    elif kind == "i16_png":
        luma = np.asarray(image.convert("L"), dtype=np.float64)
        lo, hi = float(luma.min()), float(luma.max())
        wide = np.round((luma - lo) / max(hi - lo, 1.0) * 65535).astype(np.uint16)
        Image.fromarray(wide).save(buf, "PNG", **png)  # mode "I;16", spanning 0..65535
    elif kind == "bw_png":
        luma = np.asarray(image.convert("L"))
        Image.fromarray(luma > lum_threshold).save(buf, "PNG")  # mode "1"
    else:
        raise ValueError(f"unknown image kind {kind!r}; valid: {', '.join(_KIND_NAMES)}")
    return buf.getvalue(), (jpeg_ext if kind.endswith("jpeg") else png_ext)


def _edge_files(seed: int) -> list[tuple[int, str, bytes]]:
    """The deliberately broken, edge-case and junk files as (class index, file name, bytes).

    Spread over the classes; names say what each file is so a reject report reads by itself.
    """
    rngs = [np.random.default_rng((seed, _EDGE_STREAM, k)) for k in range(10)]
    n = len(CLASSES)

    def picture(k: int, width: int, height: int) -> Image.Image:
        rgb, _, _ = render(rngs[k], k % n, width, height)
        return Image.fromarray(rgb, "RGB")

    def encoded(image: Image.Image, fmt: str) -> bytes:
        buf = io.BytesIO()
        image.save(buf, fmt, **({"quality": 85} if fmt == "JPEG" else {}))
        return buf.getvalue()

    jpeg = encoded(picture(0, 160, 120), "JPEG")
    png = encoded(picture(1, 160, 120), "PNG")
    dup_class = 7 % n
    dup_name, dup_bytes = sample_image(seed, dup_class, 0)
    frames = [picture(8, 96, 96).convert("P") for _ in range(3)]  # each call draws a new picture
    gif = io.BytesIO()
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:], duration=200, loop=0)
    text = b"This is not a JPEG. It is a text file that was saved with the wrong extension.\n"
    return [
        (0 % n, "broken_truncated_half.jpg", jpeg[: len(jpeg) // 2]),
        (1 % n, "broken_truncated_half.png", png[: len(png) // 2]),
        (2 % n, "broken_zero_bytes.jpg", b""),
        (3 % n, "broken_text_not_image.jpg", text),
        (4 % n, "broken_bad_crc.png", _corrupt_ihdr_crc(encoded(picture(4, 96, 72), "PNG"))),
        (5 % n, "edge_too_small_12x10.png", encoded(picture(5, 12, 10), "PNG")),
        (6 % n, "edge_extreme_aspect_400x20.jpg", encoded(picture(6, 400, 20), "JPEG")),
        (dup_class, f"edge_duplicate_of_{dup_name}", dup_bytes),
        (8 % n, "edge_animated_3frames.gif", gif.getvalue()),
        (9 % n, ".DS_Store", b"\x00\x00\x00\x01Bud1" + bytes(2048 - 8)),
    ]


def _corrupt_ihdr_crc(png: bytes) -> bytes:
    """Flip the CRC of the IHDR chunk (bytes 29..32): every PNG decoder must refuse the file."""
    start = 8 + 4 + 4 + 13  # signature, chunk length, chunk type, IHDR payload (fixed by the spec)
    bad = (zlib.crc32(png[12:start]) ^ 0xFFFFFFFF).to_bytes(4, "big")
    return png[:start] + bad + png[start + 4 :]
