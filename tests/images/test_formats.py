"""etl.images.formats against Pillow itself: JPEGs decoded through simplejpeg equal Pillow's own
decode (and Pillow's own draft at the same request) pixel for pixel; short data is refused."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
from PIL import Image, ImageOps

from etl.config import DecodeStage, ResizeStage
from etl.format.codecs import dct_factor
from etl.images import formats
from etl.images.rejects import Reject
from etl.images.stages import decode
from tests.helpers.hostile import (
    encode,
    jpeg_claiming,
    short_gif,
    short_png,
    short_tiff,
    short_webp,
)


def photo(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    smooth = np.stack([x * 255 // width, y * 255 // height, (x * y) % 256], axis=-1)
    noise = rng.integers(0, 12, (height, width, 3))  # some texture, within what Pillow encodes
    return Image.fromarray(((smooth + noise) % 256).astype(np.uint8))


def jpegs() -> list[tuple[str, bytes]]:
    out = []
    for (w, h), subsampling, progressive, grey, orientation in itertools.product(
        [(97, 61), (320, 240)], [0, 2], [False, True], [False, True], [1, 6]
    ):
        image = photo(w, h, w + subsampling)
        exif = Image.Exif()
        exif[0x0112] = orientation
        data = encode(
            image.convert("L") if grey else image,
            "JPEG",
            quality=88,
            subsampling=subsampling,
            progressive=progressive,
            exif=exif.tobytes(),
        )
        name = f"{w}x{h}-s{subsampling}-{'prog' if progressive else 'base'}-"
        out.append((name + f"{'L' if grey else 'RGB'}-o{orientation}", data))
    return out


@pytest.mark.parametrize(("name", "data"), jpegs())
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_jpeg_full_decode_equals_pillow(name: str, data: bytes, mode: str) -> None:
    reference = Image.open(io.BytesIO(data))
    reference.load()
    reference = ImageOps.exif_transpose(reference).convert(mode)
    decoded = decode(data, DecodeStage(mode=mode), ResizeStage(size=(16, 16), draft=False))
    # colour before a resize comes in Pillow's own padded layout, RGBX, without a copy
    assert decoded.image.mode in ({"RGB", "RGBX"} if mode == "RGB" else {"L"})
    np.testing.assert_array_equal(np.asarray(decoded.image.convert(mode)), np.asarray(reference))
    assert decoded.source_size == (reference.height, reference.width)


@pytest.mark.parametrize(("name", "data"), jpegs()[::3])
@pytest.mark.parametrize("request_size", [(40, 30), (100, 100), (12, 200), (300, 300)])
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_jpeg_scaled_decode_equals_pillow_draft(
    name: str, data: bytes, request_size: tuple[int, int], mode: str
) -> None:
    header = Image.open(io.BytesIO(data))
    scale = dct_factor(header.size, request_size, 1.0)  # gap 1: Pillow's draft rule
    ours = formats.decode_jpeg(data, header, mode == "L", scale)
    reference = Image.open(io.BytesIO(data))
    reference.draft(mode, request_size)
    reference.load()
    assert ours.size == reference.size
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(reference))


def test_short_data_is_truncated_for_jpeg_and_png() -> None:
    data = encode(photo(64, 48, 1), "JPEG")
    for short in (data[: len(data) // 2] + b"\xff\xd9", jpeg_claiming(data, 4000, 3000)):
        with pytest.raises(Reject, match="premature end") as caught:
            decode(short, DecodeStage())
        assert caught.value.reason == "truncated"
    with pytest.raises(Reject) as caught:
        decode(short_png(300, 300, 3), DecodeStage())
    assert caught.value.reason == "truncated"


@pytest.mark.parametrize(
    ("name", "data", "reasons"),
    [
        ("gif", short_gif(60, 40), {"truncated"}),
        ("tiff raw", short_tiff(60, 40, "raw"), {"truncated"}),
        # libtiff says "Not enough data" on stderr; Pillow passes on only "decoder error -2"
        ("tiff deflate", short_tiff(60, 40, "tiff_deflate"), {"truncated", "corrupt"}),
        ("tiff lzw", short_tiff(60, 40, "tiff_lzw"), {"truncated", "corrupt"}),
        ("tiff packbits", short_tiff(60, 40, "packbits"), {"truncated", "corrupt"}),
        ("webp lossy", short_webp(60, 40, lossless=False), {"truncated", "corrupt"}),
        ("webp lossless", short_webp(60, 40, lossless=True), {"truncated", "corrupt"}),
    ],
)
def test_short_but_well_formed_streams_are_never_padded(
    name: str, data: bytes, reasons: set[str]
) -> None:
    """Each declares more rows than its data fills; Pillow would pad the rest with zeros if
    it accepted it. Every one must be refused."""
    with pytest.raises(Reject) as caught:
        decode(data, DecodeStage())
    assert caught.value.reason in reasons, (name, caught.value)


@pytest.mark.parametrize("interlace", [0, 1])
@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "P", "1", "I;16"])
def test_complete_pngs_pass_the_row_count(mode: str, interlace: int) -> None:
    image = photo(37, 23, 3).convert(mode if mode != "I;16" else "L")
    if mode == "I;16":
        image = Image.fromarray(np.asarray(image).astype(np.uint16) * 257)
    formats.check_png(encode(image, "PNG", interlace=interlace))  # raises if miscounted
