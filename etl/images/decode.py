"""The decode stage: encoded bytes (or .npy bytes) -> an RGB or L image, upright, every pixel
real. Pure: no file I/O. A file that cannot be decoded faithfully is a `Reject` with its reason
(strict decoders: `etl.images.formats`)."""

from __future__ import annotations

import io
import math
import struct
import warnings
import zlib
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np
from PIL import ExifTags, Image, ImageFile, ImageOps, UnidentifiedImageError

from etl.errors import described
from etl.format.codecs import REDUCING_GAP, dct_factor
from etl.format.npy import MAX_HEADER_BYTES, NpyHeaderError, parse_header
from etl.images import formats
from etl.images.recipe import DecodeStep, ResizeStep
from etl.images.rejects import Reject


@dataclass(frozen=True)
class Decoded:
    image: Image.Image
    """Mode "RGB" or "L" as DecodeStep.mode says, EXIF orientation applied; "RGBX" (RGB in
    Pillow's four-byte layout) only for a caller that named the resize that follows, which
    returns "RGB"."""
    source_size: tuple[int, int]
    """(height, width) of the source after EXIF orientation, at full resolution (even if a
    JPEG draft decoded it smaller)."""


_ORIENTATION = ExifTags.Base.Orientation
_SWAPS_AXES = frozenset({5, 6, 7, 8})
"""EXIF orientations that transpose the image: displayed width is the stored height."""
_SIXTEEN_BIT = frozenset({"I;16", "I;16B", "I;16L", "I;16N"})
_JPEG_FORMATS = frozenset({"JPEG", "MPO"})
_DECODER_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error, zlib.error)
"""What Pillow raises on damaged data (UnidentifiedImageError, an OSError, is caught first)."""


def decode(
    data: bytes,
    opts: DecodeStep,
    next_resize: ResizeStep | None = None,
    reducing_gap: float = REDUCING_GAP,
) -> Decoded:
    """Decode one encoded image fully, or raise `Reject`.

    `next_resize`: the resize stage that follows, if any; unless its `draft` is false and when
    the data is a JPEG, libjpeg decodes at 1/2, 1/4 or 1/8 scale where that leaves at least
    `reducing_gap` times what the resize needs (`etl.format.codecs.dct_factor`; 1: never below
    it, the rule of datasets drafted before the gap). With a resize named (draft or not), a
    colour JPEG comes back as "RGBX" (see `formats.decode_jpeg`) for `resize`, which returns
    "RGB".
    """
    if data[: len(NPY_MAGIC)] == NPY_MAGIC:
        return _decode_npy(data, opts)
    with warnings.catch_warnings():
        # NOTE [decompression bombs]: Image.open warns above Image.MAX_IMAGE_PIXELS and raises
        # above twice that, before any pixel is decoded. The warning means "too large" only when
        # our own limit is not higher; otherwise our header check in _decode decides. Filters are
        # process-wide (catch_warnings is not thread-safe before Python 3.14): under the threading
        # backend a racing thread may run without this filter, which is still correct (the
        # header check rejects the same images) but may print the warning once.
        warnings.simplefilter(_bomb_warning_action(opts.max_pixels), Image.DecompressionBombWarning)
        try:
            return _decode(data, opts, next_resize, reducing_gap)
        except UnidentifiedImageError:
            raise Reject("unreadable", _identify_failure(data)) from None
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise Reject("too_large", str(exc)) from None
        except _DECODER_ERRORS as exc:
            # NOTE: Pillow reports a short read as OSError("image file is truncated ..."), the
            # only way to tell it from a damaged stream ("broken data stream ...").
            reason = "truncated" if "truncated" in str(exc) else "corrupt"
            raise Reject(reason, f"{described(exc)}") from None


def _decode(
    data: bytes, opts: DecodeStep, next_resize: ResizeStep | None, reducing_gap: float
) -> Decoded:
    try:
        formats.check_declared_length(data)
    except formats.ShortData as exc:
        raise Reject("truncated", str(exc)) from None
    image = _open(data, opts.formats)  # lazy: reads the header only
    width, height = image.size
    if width * height > opts.max_pixels:
        raise Reject(
            "too_large",
            f"{width}x{height} (WxH) = {width * height} pixels > max_pixels {opts.max_pixels}",
        )
    # NOTE: an MPO is a JPEG with extra pictures (phone previews, depth or gain maps), not an
    # animation; frame 0 is the photo, so it never counts as multi-frame.
    if (
        opts.multi_frame == "reject"
        and image.format != "MPO"
        and getattr(image, "is_animated", False)
    ):
        n_frames = getattr(image, "n_frames", "several")
        raise Reject("multi_frame", f"{image.format} with {n_frames} frames")
    try:
        if image.format in _JPEG_FORMATS:
            return _decode_jpeg(data, image, opts, next_resize, reducing_gap)
        image.load()  # full decode here, inside the caller's try: short data raises
        if image.format == "PNG":
            formats.check_png(data)
    except formats.ShortData as exc:
        raise Reject("truncated", str(exc)) from None
    except formats.Damaged as exc:
        raise Reject("corrupt", str(exc)) from None
    ImageOps.exif_transpose(image, in_place=True)
    # NOTE: the size is read after orientation, not derived from the header: Pillow 13 applies
    # a TIFF's orientation in load() and reports the rotated size at open.
    return Decoded(_to_mode(image, opts), (image.height, image.width))


def _open(data: bytes, allowed: tuple[str, ...]) -> ImageFile.ImageFile:
    """Image.open restricted to `allowed` formats. A file it cannot identify is identified once
    more among every format (headers only: no plugin's load() runs, so no external program) to
    tell `format_not_allowed` from `unreadable`."""
    try:
        return Image.open(io.BytesIO(data), formats=allowed)
    except UnidentifiedImageError:
        try:
            other = Image.open(io.BytesIO(data)).format
        except _DECODER_ERRORS:
            other = None  # UnidentifiedImageError is an OSError
        if other is None:
            raise
        raise Reject(
            "format_not_allowed",
            f"{other} is not in decode.formats {list(allowed)}",
        ) from None


def _decode_jpeg(
    data: bytes,
    header: ImageFile.ImageFile,
    opts: DecodeStep,
    next_resize: ResizeStep | None,
    reducing_gap: float,
) -> Decoded:
    """A JPEG through `formats` (libjpeg's warnings are errors), decoded at the DCT scale
    `dct_factor` picks for what `next_resize` needs (unless its draft is false), grey from
    libjpeg for mode L; what Pillow's draft picks for the same request, with a gap of 1."""
    stored_w, stored_h = header.size
    orientation = header.getexif().get(_ORIENTATION, 1)
    swap = orientation in _SWAPS_AXES
    request: tuple[int, int] | None = None  # (width, height) as stored
    if next_resize is not None and next_resize.draft is not False:
        want_w, want_h = _draft_request((stored_h, stored_w) if swap else header.size, next_resize)
        request = (want_h, want_w) if swap else (want_w, want_h)
    if formats.decodes_natively(header):
        scale = dct_factor(header.size, request, reducing_gap) if request else 1
        gray = request is not None and opts.mode == "L"
        padded = next_resize is not None and opts.mode == "RGB"
        image = formats.decode_jpeg(data, header, gray, scale, padded)
    else:  # CMYK, YCCK: Pillow converts them; libjpeg's warnings come from a second pass
        if request is not None:  # Pillow's draft keeps the request: ask for the gap's
            (width, height), (want_w, want_h) = header.size, request
            gapped = (
                min(width, math.ceil(reducing_gap * want_w)),
                min(height, math.ceil(reducing_gap * want_h)),
            )
            header.draft(opts.mode, gapped)
        header.load()
        formats.check_jpeg(data)
        image = header
    method = _TRANSPOSE.get(orientation)
    if method is not None:
        image = image.transpose(method)
    return Decoded(_to_mode(image, opts), (stored_w, stored_h) if swap else (stored_h, stored_w))


_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
"""EXIF orientation -> the transpose that shows the image upright (as ImageOps.exif_transpose)."""


NPY_MAGIC = b"\x93NUMPY"
"""Raw pixels from an LMDB or Python source arrive as .npy bytes (never pickled)."""


def _decode_npy(data: bytes, opts: DecodeStep) -> Decoded:
    """.npy bytes of an HxW or HxWxC (C = 1..4: L, LA, RGB, RGBA) uint8 array -> the image in
    opts.mode, by the same conversions as an encoded image (alpha composited, grey to RGB).

    The header is checked before any pixel is read: numpy would allocate the array its header
    declares, so a forged shape is refused like a decompression bomb."""
    try:
        shape, dtype, fortran_order, offset = parse_header(data[:MAX_HEADER_BYTES])
    except NpyHeaderError as exc:
        cut = "past the end" in str(exc) or "ends inside" in str(exc)
        raise Reject("truncated" if cut else "corrupt", f".npy header: {exc}") from None
    if dtype != np.uint8 or len(shape) not in (2, 3) or 0 in shape:
        raise Reject(
            "unsupported_mode",
            f".npy array of dtype {dtype} and shape {shape}; expected uint8 HxW or HxWxC",
        )
    if len(shape) == 3 and shape[2] not in _NPY_MODES:
        raise Reject("unsupported_mode", f".npy array with {shape[2]} channels; expected 1-4")
    height, width = shape[:2]
    if height * width > opts.max_pixels:
        raise Reject(
            "too_large",
            f"{width}x{height} (WxH) = {width * height} pixels > max_pixels {opts.max_pixels}",
        )
    channels = shape[2] if len(shape) == 3 else 1
    expected = height * width * channels
    pixels = memoryview(data)[offset:]
    if len(pixels) != expected:
        reason = "truncated" if len(pixels) < expected else "corrupt"
        raise Reject(
            reason, f".npy data holds {len(pixels)} bytes of pixels, its header says {expected}"
        )
    array = np.frombuffer(pixels, np.uint8).reshape(shape, order="F" if fortran_order else "C")
    planar = np.ascontiguousarray(array.reshape(height, width) if channels == 1 else array)
    mode = _NPY_MODES[channels]
    image = Image.frombuffer(mode, (width, height), planar, "raw", mode, 0, 1)
    return Decoded(_to_mode(image, opts), (height, width))


_NPY_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}


def _bomb_warning_action(max_pixels: int) -> Any:
    limit = Image.MAX_IMAGE_PIXELS
    return "error" if limit is not None and max_pixels <= limit else "ignore"


def _identify_failure(data: bytes) -> str:
    if not data:
        return "empty file"
    return f"cannot identify an image format ({len(data)} bytes starting {data[:8]!r})"


def _draft_request(size: tuple[int, int], opts: ResizeStep) -> tuple[int, int]:
    """Smallest (width, height) from which `resize(image, opts)` upscales no more than from
    `size` = (width, height) itself: every axis at least its share of `opts.size`, capped at
    `size`. center_crop scales both axes by max(tw/w, th/h), pad by the min, stretch each its own.
    """
    width, height = size
    target_h, target_w = opts.output_size(height, width)
    scale_w, scale_h = Fraction(target_w, width), Fraction(target_h, height)
    if opts.mode == "center_crop":
        scale_w = scale_h = max(scale_w, scale_h)
    elif opts.mode == "pad":
        scale_w = scale_h = min(scale_w, scale_h)
    # exact ceilings (no float rounding up to one pixel too many)
    return (min(width, -(-width * scale_w // 1)), min(height, -(-height * scale_h // 1)))


def _to_mode(image: Image.Image, opts: DecodeStep) -> Image.Image:
    """Any Pillow mode -> opts.mode by an explicit rule per mode, never by accidental clipping."""
    mode = image.mode
    if mode in _SIXTEEN_BIT or mode == "I":
        image = _sixteen_bit_to_l(image)
    elif mode == "F":
        raise Reject("unsupported_mode", "32-bit float pixels (mode F) have no 8-bit scale")
    elif image.has_transparency_data:
        image = _composite(image, opts)
    elif mode == "1":
        image = image.convert("L")  # 0 -> 0, 1 -> 255
    elif mode == "RGBX" and opts.mode == "RGB":
        return image  # libjpeg's RGB, padded as Pillow stores it: for the resize that follows
    elif mode not in ("L", "RGB"):
        try:
            image = image.convert("RGB")  # P, CMYK (Pillow's naive formula), YCbCr, LAB, HSV
        except ValueError as exc:
            raise Reject("unsupported_mode", f"mode {mode}: {exc}") from None
    return image if image.mode == opts.mode else image.convert(opts.mode)


def _sixteen_bit_to_l(image: Image.Image) -> Image.Image:
    # NOTE [16-bit]: Pillow's convert("L") from "I"/"I;16" clips every value above 255 to 255
    # instead of scaling. Scale by hand: round(v / 257) maps 0..65535 exactly onto 0..255, and
    # (v + 128) // 257 equals it because v / 257 is never exactly halfway between integers.
    # Mode "I" carries no bit depth; only 0..65535 is read as 16-bit, the rest is refused.
    # A tRNS colour key on a 16-bit image is ignored (it would need compositing in 16 bits).
    values = np.asarray(image)
    if image.mode == "I":
        low, high = int(values.min()), int(values.max())
        if low < 0 or high > 65535:
            raise Reject(
                "unsupported_mode",
                f"32-bit integer pixels (mode I) range {low}..{high}, outside 16-bit 0..65535",
            )
    scaled = (values.astype(np.uint32) + 128) // 257
    return Image.fromarray(scaled.astype(np.uint8))


def _composite(image: Image.Image, opts: DecodeStep) -> Image.Image:
    """Flatten alpha (an alpha band, a transparent palette entry or colour key) onto
    opts.background, in opts.mode so a grey image is blended against the colour's luminance."""
    if image.mode == "La":
        image = image.convert("LA")  # premultiplied; Pillow converts "La" only to "LA"
    if opts.mode == "L" and image.mode == "LA":
        background = Image.new("L", image.size, luminance(opts.background))
    else:
        if image.mode != "RGBA":
            image = image.convert("RGBA")  # applies info["transparency"] of P, L, RGB and 1
        background = Image.new("RGB", image.size, opts.background)
    background.paste(image, (0, 0), image)  # the image's alpha band is the mask
    return background


@lru_cache(maxsize=64)
def luminance(color: tuple[int, int, int]) -> int:
    """Grey level Pillow's own RGB -> L conversion gives `color` (ITU-R 601-2 luma)."""
    value = Image.new("RGB", (1, 1), color).convert("L").getpixel((0, 0))
    assert isinstance(value, int)
    return value
