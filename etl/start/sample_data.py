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
from PIL import Image, ImageFilter

# NOTE [ the shape carries the class ]: colours, position, scale, rotation, lighting, blur and noise
# are random in every class, so a classifier has to look at structure. Rotations are limited for
# the two stripe classes (|angle| <= 15 degrees) so horizontal and vertical stay distinguishable.
CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "hstripes", "vstripes", "checker")

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

Float = NDArray[np.float32]


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
    rgb, alpha, lum_threshold = _render(rng, class_index, width, height)
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


def _render(
    rng: np.random.Generator, class_index: int, width: int, height: int
) -> tuple[NDArray[np.uint8], NDArray[np.uint8], float]:
    """Draw one picture of `CLASSES[class_index]`.

    Returns the RGB pixels (h, w, 3), the object's extent as an alpha mask (h, w) and the
    luminance half-way between foreground and background (a clean threshold for 1-bit output).
    """
    short = min(width, height)
    fg, bg = _colours(rng)
    cx = width / 2 + rng.uniform(-0.08, 0.08) * width
    cy = height / 2 + rng.uniform(-0.08, 0.08) * height
    name = CLASSES[class_index]
    max_angle = 15.0 if name.endswith("stripes") else 45.0
    angle = np.deg2rad(rng.uniform(-max_angle, max_angle))
    x = np.arange(width, dtype=np.float32)[None, :] + np.float32(0.5 - cx)
    y = np.arange(height, dtype=np.float32)[:, None] + np.float32(0.5 - cy)
    cos, sin = np.float32(np.cos(angle)), np.float32(np.sin(angle))
    u = x * cos + y * sin  # object coordinates, (h, w) after broadcasting
    v = y * cos - x * sin

    region, shape = _SHAPES[name](rng, u, v, short)
    # Composite and blur in Pillow (C), then add lighting and noise in one int16 pass.
    mask = Image.fromarray((shape * 255 + 0.5).astype(np.uint8), "L")
    image = Image.composite(_solid(fg, width, height), _solid(bg, width, height), mask)
    blur = rng.uniform(0.0, 1.2) * max(1.0, short / 160)
    if blur > 0.3:
        image = image.filter(ImageFilter.BoxBlur(blur))  # 3x faster than GaussianBlur
    shade = (
        rng.uniform(-25, 25) * (x / np.float32(width))
        + rng.uniform(-25, 25) * (y / np.float32(height))
    ).astype(np.int16)
    # Uniform rather than Gaussian sensor noise: a quarter of the cost, and nobody can tell.
    amplitude = int(rng.integers(4, 21))
    noise = rng.integers(-amplitude, amplitude + 1, size=(height, width, 3), dtype=np.int16)
    noise += shade[:, :, None]
    noise += np.asarray(image, dtype=np.int16)
    rgb = np.clip(noise, 0, 255).astype(np.uint8)
    alpha = (region * 255 + 0.5).astype(np.uint8)
    return rgb, alpha, float((_luma(fg) + _luma(bg)) / 2)


def _solid(colour: Float, width: int, height: int) -> Image.Image:
    r, g, b = (round(float(channel)) for channel in colour)
    return Image.new("RGB", (width, height), (r, g, b))


def _colours(rng: np.random.Generator) -> tuple[Float, Float]:
    """Foreground and background colours whose luminances differ by >= 80 (of 255).

    The contrast floor keeps the shape visible after conversion to greyscale or 1-bit.
    """
    while True:
        fg, bg = rng.uniform(0, 255, size=(2, 3)).astype(np.float32)
        if abs(_luma(fg) - _luma(bg)) >= 80:
            return fg, bg


def _luma(rgb: Float) -> float:
    return float(0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2])


def _coverage(distance: Float) -> Float:
    """Anti-aliased coverage (0..1) from a signed distance in pixels (negative = inside)."""
    return np.clip(np.float32(0.5) - distance, 0, 1)


def _band(t: Float, period: float) -> Float:
    """Coverage of stripes of the given period (pixels) along coordinate `t`, half on, half off."""
    frac = np.mod(t / np.float32(period), 1).astype(np.float32)
    return _coverage((np.abs(frac - np.float32(0.5)) - np.float32(0.25)) * np.float32(period))


# A shape function returns (region, shape): the object's extent and where the foreground colour
# goes, both (h, w) coverages in 0..1. `u`, `v` are pixel offsets from the object centre in the
# object's rotated frame; `short` is the image's shorter side in pixels.
ShapeFn = Callable[[np.random.Generator, Float, Float, int], tuple[Float, Float]]


def _circle(rng: np.random.Generator, u: Float, v: Float, short: int) -> tuple[Float, Float]:
    radius = rng.uniform(0.45, 0.85) * short / 2
    m = _coverage(np.sqrt(u * u + v * v) - np.float32(radius))
    return m, m


def _square(rng: np.random.Generator, u: Float, v: Float, short: int) -> tuple[Float, Float]:
    half = rng.uniform(0.45, 0.72) * short / 2
    m = _coverage(np.maximum(np.abs(u), np.abs(v)) - np.float32(half))
    return m, m


def _triangle(rng: np.random.Generator, u: Float, v: Float, short: int) -> tuple[Float, Float]:
    """Equilateral triangle as the intersection of three half-planes; circumradius given."""
    inradius = rng.uniform(0.5, 0.9) * short / 2 / 2
    normals = -np.pi / 2 + 2 * np.pi * np.arange(3) / 3
    d = np.maximum.reduce([u * np.float32(np.cos(a)) + v * np.float32(np.sin(a)) for a in normals])
    m = _coverage(d - np.float32(inradius))
    return m, m


def _patch(rng: np.random.Generator, u: Float, v: Float, short: int) -> tuple[Float, float, float]:
    """A rectangular patch for textured classes; returns its coverage and half-sizes (pixels)."""
    half_u = rng.uniform(0.55, 0.9) * short / 2
    half_v = rng.uniform(0.55, 0.9) * short / 2
    d = np.maximum(np.abs(u) - np.float32(half_u), np.abs(v) - np.float32(half_v))
    return _coverage(d), half_u, half_v


def _stripes(along_v: bool) -> ShapeFn:
    """Stripes parallel to the u axis (horizontal, `along_v`) or to the v axis (vertical)."""

    def shape(rng: np.random.Generator, u: Float, v: Float, short: int) -> tuple[Float, Float]:
        region, half_u, half_v = _patch(rng, u, v, short)
        across = half_v if along_v else half_u
        period = max(6.0, 2 * across / rng.uniform(2.5, 5.0))
        phase = np.float32(rng.uniform(0, period))
        return region, region * _band((v if along_v else u) + phase, period)

    return shape


def _checker(rng: np.random.Generator, u: Float, v: Float, short: int) -> tuple[Float, Float]:
    region, half_u, half_v = _patch(rng, u, v, short)
    period = max(8.0, 2 * min(half_u, half_v) / rng.uniform(1.5, 3.0))
    a = _band(u + np.float32(rng.uniform(0, period)), period)
    b = _band(v + np.float32(rng.uniform(0, period)), period)
    return region, region * (a + b - 2 * a * b)  # a soft XOR: anti-aliased at the cell edges


_SHAPES: dict[str, ShapeFn] = {
    "circle": _circle,
    "square": _square,
    "triangle": _triangle,
    "hstripes": _stripes(along_v=True),
    "vstripes": _stripes(along_v=False),
    "checker": _checker,
}


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
        rgb, _, _ = _render(rngs[k], k % n, width, height)
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
