"""Per-format decoding that tells the truth: the decoder's own evidence that every pixel came
from the file, where Pillow would silently fill the rest.

NOTE [short data]: Pillow pads an image whose data ends early without an error in two common
cases: a JPEG whose entropy-coded data stops at a marker (a cut file with an end-of-image
marker put back, or a header that claims more pixels than the data holds: libjpeg fills grey and
only warns), and a PNG whose zlib stream is complete but holds fewer rows than the header
declares (Pillow leaves the rest black). JPEGs are therefore decoded by libjpeg-turbo through
simplejpeg, which turns libjpeg's warnings into errors; with the same library settings
(accurate integer DCT, fancy upsampling) its pixels equal Pillow's (tests/images/test_formats.py
compares them with Pillow's own decode and draft). For a PNG the rows' bytes are counted by
inflating its IDAT stream. Neither check looks at pixel values.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import simplejpeg
from PIL import Image, ImageFile


class ShortData(Exception):
    """The data ends before the image it declares is filled."""


class Damaged(Exception):
    """The decoder reported damaged data (a bad code, a lost restart marker, ...)."""


# --- JPEG ---------------------------------------------------------------------------------------

_SHORT_JPEG = ("premature end",)
"""libjpeg's warnings for data that ran out (JWRN_JPEG_EOF, JWRN_HIT_MARKER)."""
_HARMLESS_JPEG = ("extraneous bytes before marker", "invalid sos parameters for sequential jpeg")
"""Warnings common in camera files whose pixels are nevertheless complete; such a file is
decoded again without stopping at warnings (its other warnings are then not seen)."""


def decodes_natively(header: ImageFile.ImageFile) -> bool:
    """True for a JPEG that `decode_jpeg` decodes by itself: one tile of YCbCr or grey data
    (Pillow's raw modes 'RGB' and 'L'). CMYK and YCCK go through Pillow and `check_jpeg`."""
    tile = header.tile
    return len(tile) == 1 and tile[0].args is not None and tile[0].args[0] in ("RGB", "L")


def decode_jpeg(
    data: bytes, header: Image.Image, gray: bool, scale: int, padded: bool = False
) -> Image.Image:
    """Decode a JPEG that `decodes_natively` as Pillow would (mode 'RGB', or 'L' for a grey
    file or when `gray`), at DCT scale 1/`scale`; raise ShortData or Damaged.

    `padded`: a colour image comes back in mode 'RGBX' instead, sharing libjpeg's output
    buffer. NOTE: Pillow stores RGB as four bytes a pixel; handing it three-byte RGB costs a
    copy of every pixel (0.12 ms for a 500x400 photo, 6% of packing it), libjpeg's RGBX output
    is Pillow's own layout and costs none. Resizing RGBX gives the same RGB bytes."""
    width, height = header.size
    colorspace = "GRAY" if gray or header.mode == "L" else "RGBX" if padded else "RGB"
    options = {
        "colorspace": colorspace,
        "min_factor": scale,
        # NOTE: with these minimums the only scale that fits is exactly 1/scale, Pillow's.
        "min_width": -(-width // scale),
        "min_height": -(-height // scale),
    }
    array = _strict(lambda strict: simplejpeg.decode_jpeg(data, strict=strict, **options))
    if colorspace == "RGBX":
        size = (array.shape[1], array.shape[0])
        return Image.frombuffer("RGBX", size, array, "raw", "RGBX", 0, 1)  # no copy
    return Image.fromarray(array[:, :, 0] if array.ndim == 3 and array.shape[2] == 1 else array)


def check_jpeg(data: bytes) -> None:
    """Raise ShortData or Damaged if libjpeg warns on `data` (any colour space, decoded at 1/8
    scale: the entropy-coded data is read in full, the inverse DCT mostly skipped)."""
    _strict(lambda strict: simplejpeg.decode_jpeg(data, "CMYK", strict=strict, min_factor=8))


def _strict(decode: Callable[[bool], Any]) -> np.ndarray:
    """decode(strict=True), classifying libjpeg's warnings (see _SHORT_JPEG, _HARMLESS_JPEG)."""
    try:
        return np.asarray(decode(True))
    except ValueError as exc:
        message = str(exc)
        lowered = message.lower()
        if any(text in lowered for text in _SHORT_JPEG):
            raise ShortData(f"JPEG: {message}") from None
        if any(text in lowered for text in _HARMLESS_JPEG):
            try:
                return np.asarray(decode(False))
            except ValueError as again:
                raise Damaged(f"JPEG: {again}") from None
        raise Damaged(f"JPEG: {message}") from None


# --- containers that declare their length ----------------------------------------------------


def check_declared_length(data: bytes) -> None:
    """Raise ShortData for a RIFF file (WebP) whose header declares more bytes than it holds:
    libwebp refuses such a file without saying why."""
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        declared = 8 + struct.unpack_from("<I", data, 4)[0]
        if declared > len(data):
            raise ShortData(f"WebP: the file holds {len(data)} of the {declared} bytes it declares")


# --- PNG ----------------------------------------------------------------------------------------

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_ADAM7 = (
    (0, 0, 8, 8),
    (4, 0, 8, 8),
    (0, 4, 4, 8),
    (2, 0, 4, 4),
    (0, 2, 2, 4),
    (1, 0, 2, 2),
    (0, 1, 1, 2),
)
"""(x0, y0, dx, dy) of the seven interlace passes."""
_INFLATE_STEP = 1 << 20


def _png_chunks(data: bytes) -> Iterator[tuple[bytes, memoryview]]:
    view = memoryview(data)
    at = len(_PNG_SIGNATURE)
    while at + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, at)
        yield kind, view[at + 8 : at + 8 + length]
        at += 12 + length


def png_row_bytes(width: int, height: int, bits: int, color_type: int, interlace: int) -> int:
    """Bytes the IDAT stream must inflate to: every row of every pass with its filter byte."""
    bits_per_pixel = bits * _PNG_CHANNELS.get(color_type, 4)
    passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
    total = 0
    for x0, y0, dx, dy in passes:
        cols, rows = -(-(width - x0) // dx), -(-(height - y0) // dy)
        if cols > 0 and rows > 0:
            total += rows * (1 + -(-cols * bits_per_pixel // 8))
    return total


def check_png(data: bytes) -> None:
    """Raise ShortData if the IDAT stream holds fewer bytes of rows than the header declares.
    Called after Pillow decoded the file, so the chunks are known to be well formed."""
    if not data.startswith(_PNG_SIGNATURE):
        return
    inflater = zlib.decompressobj()
    expected = produced = 0
    for kind, body in _png_chunks(data):
        if kind == b"IHDR" and len(body) >= 13:
            width, height, bits, color_type, _, _, interlace = struct.unpack(">IIBBBBB", body[:13])
            expected = png_row_bytes(width, height, bits, color_type, interlace)
        elif kind == b"IDAT":
            pending: bytes | memoryview = body
            while pending and produced < expected:
                try:
                    produced += len(inflater.decompress(pending, _INFLATE_STEP))
                except zlib.error:
                    return  # Pillow decoded it; a stream it accepts is not ours to judge
                pending = inflater.unconsumed_tail
        elif kind == b"IEND" or produced >= expected > 0:
            break
    if produced < expected:
        raise ShortData(f"PNG: the image data holds {produced} of the {expected} bytes of rows")
