"""The picture of one sample: its class's shape drawn over a background with random colours,
placement, rotation, lighting, blur and noise, a pure function of the generator it is given
(`etl.start.sample_data` seeds one per image and stores the result in many formats).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray
from PIL import Image, ImageFilter

# NOTE [ the shape carries the class ]: colours, position, scale, rotation, lighting, blur and noise
# are random in every class, so a classifier has to look at structure. Rotations are limited for
# the two stripe classes (|angle| <= 15 degrees) so horizontal and vertical stay distinguishable.
CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "hstripes", "vstripes", "checker")

Float = NDArray[np.float32]


def render(
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
