"""Pure per-image stages: encoded bytes -> decoded image -> resized image -> uint8 array.

No file I/O, no parallelism, no printing. `etl.run.execute` loads the call-stage functions once per
worker with `load_function`, runs `process_image` on each file's bytes, and turns a `Reject` into
a row of the rejects table (reasons: `etl.images.rejects`).
"""

from __future__ import annotations

import importlib
import io
import struct
import warnings
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, TypeAlias

import numpy as np
from numpy.typing import NDArray
from PIL import ExifTags, Image, ImageFile, ImageOps, UnidentifiedImageError

from etl.config import CallStage, DecodeStage, PipelineConfig, ResizeStage, ValidateStage
from etl.errors import ConfigError
from etl.images import formats
from etl.images.rejects import Reject

# --- decode ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decoded:
    image: Image.Image
    """Mode "RGB" or "L" as DecodeStage.mode says, EXIF orientation applied; "RGBX" (RGB in
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


def decode(data: bytes, opts: DecodeStage, next_resize: ResizeStage | None = None) -> Decoded:
    """Decode one encoded image fully, or raise `Reject`.

    `next_resize`: the resize stage that follows, if any; when its `draft` is set and the data is a
    JPEG, libjpeg decodes at 1/2, 1/4 or 1/8 scale, never below what that resize needs. With a
    resize named (draft or not), a colour JPEG comes back as "RGBX" (see `formats.decode_jpeg`)
    for `resize`, which returns "RGB".
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
            return _decode(data, opts, next_resize)
        except UnidentifiedImageError:
            raise Reject("unreadable", _identify_failure(data)) from None
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise Reject("too_large", str(exc)) from None
        except _DECODER_ERRORS as exc:
            # NOTE: Pillow reports a short read as OSError("image file is truncated ..."), the
            # only way to tell it from a damaged stream ("broken data stream ...").
            reason = "truncated" if "truncated" in str(exc) else "corrupt"
            raise Reject(reason, f"{type(exc).__name__}: {exc}") from None


def _decode(data: bytes, opts: DecodeStage, next_resize: ResizeStage | None) -> Decoded:
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
            return _decode_jpeg(data, image, opts, next_resize)
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
    data: bytes, header: ImageFile.ImageFile, opts: DecodeStage, next_resize: ResizeStage | None
) -> Decoded:
    """A JPEG through `formats` (libjpeg's warnings are errors), with Pillow's draft semantics:
    with `next_resize.draft`, the DCT scale Pillow's draft picks, grey from libjpeg for mode L."""
    stored_w, stored_h = header.size
    orientation = header.getexif().get(_ORIENTATION, 1)
    swap = orientation in _SWAPS_AXES
    request: tuple[int, int] | None = None  # (width, height) as stored
    if next_resize is not None and next_resize.draft:
        want_w, want_h = _draft_request((stored_h, stored_w) if swap else header.size, next_resize)
        request = (want_h, want_w) if swap else (want_w, want_h)
    if formats.decodes_natively(header):
        scale = formats.draft_scale(header.size, request) if request else 1
        gray = request is not None and opts.mode == "L"
        padded = next_resize is not None and opts.mode == "RGB"
        image = formats.decode_jpeg(data, header, gray, scale, padded)
    else:  # CMYK, YCCK: Pillow converts them; libjpeg's warnings come from a second pass
        if request is not None:
            header.draft(opts.mode, request)
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


def _decode_npy(data: bytes, opts: DecodeStage) -> Decoded:
    """.npy bytes of an HxW or HxWxC (C = 1..4: L, LA, RGB, RGBA) uint8 array -> the image in
    opts.mode, by the same conversions as an encoded image (alpha composited, grey to RGB).

    The header is checked before any pixel is read: numpy would allocate the array its header
    declares, so a forged shape is refused like a decompression bomb."""
    buffer = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(buffer)
        read_header = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran_order, dtype = read_header(buffer)
    except (ValueError, EOFError) as exc:
        reason = "truncated" if "EOF" in str(exc) else "corrupt"
        raise Reject(reason, f".npy header: {exc}") from None
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
    pixels = memoryview(data)[buffer.tell() :]
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


def _draft_request(size: tuple[int, int], opts: ResizeStage) -> tuple[int, int]:
    """Smallest (width, height) from which `resize(image, opts)` upscales no more than from
    `size` = (width, height) itself: every axis at least its share of `opts.size`, capped at
    `size`. center_crop scales both axes by max(tw/w, th/h), pad by the min, stretch each its own.
    """
    width, height = size
    target_h, target_w = opts.size
    scale_w, scale_h = Fraction(target_w, width), Fraction(target_h, height)
    if opts.mode == "center_crop":
        scale_w = scale_h = max(scale_w, scale_h)
    elif opts.mode == "pad":
        scale_w = scale_h = min(scale_w, scale_h)
    # exact ceilings (no float rounding up to one pixel too many)
    return (min(width, -(-width * scale_w // 1)), min(height, -(-height * scale_h // 1)))


def _to_mode(image: Image.Image, opts: DecodeStage) -> Image.Image:
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


def _composite(image: Image.Image, opts: DecodeStage) -> Image.Image:
    """Flatten alpha (an alpha band, a transparent palette entry or colour key) onto
    opts.background, in opts.mode so a grey image is blended against the colour's luminance."""
    if image.mode == "La":
        image = image.convert("LA")  # premultiplied; Pillow converts "La" only to "LA"
    if opts.mode == "L" and image.mode == "LA":
        background = Image.new("L", image.size, _luminance(opts.background))
    else:
        if image.mode != "RGBA":
            image = image.convert("RGBA")  # applies info["transparency"] of P, L, RGB and 1
        background = Image.new("RGB", image.size, opts.background)
    background.paste(image, (0, 0), image)  # the image's alpha band is the mask
    return background


@lru_cache(maxsize=64)
def _luminance(color: tuple[int, int, int]) -> int:
    """Grey level Pillow's own RGB -> L conversion gives `color` (ITU-R 601-2 luma)."""
    value = Image.new("RGB", (1, 1), color).convert("L").getpixel((0, 0))
    assert isinstance(value, int)
    return value


# --- resize ---------------------------------------------------------------------------------

Fill: TypeAlias = int | tuple[int, int, int]
ResizeFn: TypeAlias = Callable[[Image.Image, tuple[int, int], Image.Resampling, Fill], Image.Image]
"""(image, (width, height) as Pillow orders it, filter, fill colour) -> image of that size."""


def _center_crop(
    image: Image.Image, size: tuple[int, int], method: Image.Resampling, fill: Fill
) -> Image.Image:
    # fit resizes straight from the crop box: no intermediate cropped copy
    return ImageOps.fit(image, size, method)


def _pad(
    image: Image.Image, size: tuple[int, int], method: Image.Resampling, fill: Fill
) -> Image.Image:
    return ImageOps.pad(image, size, method, color=fill)


def _stretch(
    image: Image.Image, size: tuple[int, int], method: Image.Resampling, fill: Fill
) -> Image.Image:
    return image.resize(size, method)


RESIZE_MODES: dict[str, ResizeFn] = {
    "center_crop": _center_crop,  # crop to the target aspect around the centre, then resize
    "pad": _pad,  # fit inside the target, letterbox with ResizeStage.fill
    "stretch": _stretch,  # resize each axis on its own; distorts the aspect
}

FILTERS: dict[str, Image.Resampling] = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


def _lookup(registry: Mapping[str, Any], name: str, what: str) -> Any:
    try:
        return registry[name]
    except KeyError:
        raise ConfigError(f"unknown {what} {name!r}; expected one of {sorted(registry)}") from None


def resize(image: Image.Image, opts: ResizeStage) -> Image.Image:
    """Resize to exactly opts.size = (height, width) by opts.mode with opts.filter."""
    height, width = opts.size
    resize_fn: ResizeFn = _lookup(RESIZE_MODES, opts.mode, "resize mode")
    method: Image.Resampling = _lookup(FILTERS, opts.filter, "resize filter")
    fill: Fill = _luminance(opts.fill) if image.mode == "L" else opts.fill
    resized = resize_fn(image, (width, height), method, fill)
    return resized.convert("RGB") if resized.mode == "RGBX" else resized


# --- validate -------------------------------------------------------------------------------


def check_source(source_size: tuple[int, int], opts: ValidateStage) -> None:
    """Refuse a source by its full-resolution (height, width) after EXIF orientation."""
    height, width = source_size
    if opts.min_size is not None:
        min_h, min_w = opts.min_size
        if height < min_h or width < min_w:
            raise Reject(
                "too_small",
                f"source {height}x{width} (HxW) is smaller than min_size {min_h}x{min_w}",
            )
    if opts.max_aspect is not None:
        aspect = max(width / height, height / width)
        if aspect > opts.max_aspect:
            raise Reject(
                "aspect",
                f"source {height}x{width} (HxW) has aspect {aspect:.3g} > max_aspect "
                f"{opts.max_aspect:g}",
            )


# --- arrays and call stages -----------------------------------------------------------------


def to_array(image: Image.Image, layout: str) -> NDArray[np.uint8]:
    """An "RGB" or "L" image -> C-contiguous uint8 array, (H, W, C) for "HWC" or (C, H, W) for
    "CHW"; "L" keeps its channel axis (C=1). The array may be read-only (it wraps Pillow's bytes).
    """
    if image.mode not in ("RGB", "L"):
        raise ValueError(f"to_array takes an RGB or L image, got mode {image.mode!r}")
    array: NDArray[np.uint8] = np.asarray(image)  # one copy out of Pillow's storage
    if image.mode == "L":
        array = array.reshape(image.height, image.width, 1)  # a view
    return _layout(array, layout)


def _layout(hwc: NDArray[np.uint8], layout: str) -> NDArray[np.uint8]:
    if layout == "HWC":
        return np.ascontiguousarray(hwc)  # no copy unless a call stage returned a strided view
    if layout == "CHW":
        if hwc.shape[2] == 1:
            return np.ascontiguousarray(hwc.reshape(1, *hwc.shape[:2]))
        return np.ascontiguousarray(hwc.transpose(2, 0, 1))
    raise ValueError(f"unknown layout {layout!r}; expected 'HWC' or 'CHW'")


def load_function(spec: str) -> Callable[..., Any]:
    """'package.module:function' -> the callable; ConfigError naming `spec` if it is not one."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"call function {spec!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"call function {spec!r}: cannot import {module_name!r} ({exc}); is it installed "
            "or on PYTHONPATH?"
        ) from None
    function = getattr(module, attr, None)
    if function is None:
        raise ConfigError(f"call function {spec!r}: module {module_name!r} has no {attr!r}")
    if not callable(function):
        raise ConfigError(
            f"call function {spec!r}: {attr!r} is a {type(function).__name__}, not callable"
        )
    return function


def _hwc(current: Image.Image | NDArray[np.uint8]) -> NDArray[np.uint8]:
    if isinstance(current, np.ndarray):
        return current
    # NOTE: a writable copy (np.array, not asarray) so a user function may work in place.
    array: NDArray[np.uint8] = np.array(current)
    return array.reshape(current.height, current.width, -1)


def _image(current: Image.Image | NDArray[np.uint8]) -> Image.Image:
    if isinstance(current, Image.Image):
        return current
    return Image.fromarray(current[:, :, 0] if current.shape[2] == 1 else current)


def _call(
    function: Callable[..., Any], stage: CallStage, array: NDArray[np.uint8]
) -> NDArray[np.uint8]:
    channels = array.shape[2]
    try:
        out = function(array, **stage.options)
    except Reject:
        raise  # a user function may reject an image on purpose
    except Exception as exc:
        raise Reject("stage_error", f"{stage.function}: {type(exc).__name__}: {exc}") from None
    if (
        not isinstance(out, np.ndarray)
        or out.dtype != np.uint8
        or out.ndim != 3
        or out.shape[2] != channels
        or 0 in out.shape
    ):
        raise Reject(
            "bad_output",
            f"{stage.function} returned {_describe(out)}; expected a uint8 array of shape "
            f"(H, W, {channels})",
        )
    return out


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array of shape {value.shape}"
    return f"a {type(value).__name__}"


# --- the per-image pipeline -----------------------------------------------------------------


def process_image(
    data: bytes, config: PipelineConfig, functions: Mapping[str, Callable[..., Any]]
) -> tuple[NDArray[np.uint8], tuple[int, int]]:
    """Run config.stages in order on one encoded image -> (array of config.sample_shape,
    source (height, width)); raises `Reject`.

    `functions` maps each CallStage.function spec to its callable (from `load_function`), so a
    worker imports user code once, not once per image. The array may be read-only.
    """
    stages = config.stages
    # NOTE: draft only when resize follows decode with nothing in between that looks at pixels
    # (validate reads only the source size); a call stage must see the full-resolution image.
    pixel_stages = [stage for stage in stages[1:] if not isinstance(stage, ValidateStage)]
    next_resize = pixel_stages[0] if isinstance(pixel_stages[0], ResizeStage) else None
    decoded = decode(data, config.decode, next_resize)

    current: Image.Image | NDArray[np.uint8] = decoded.image
    for stage in stages[1:]:
        if isinstance(stage, ResizeStage):
            current = resize(_image(current), stage)
        elif isinstance(stage, ValidateStage):
            check_source(decoded.source_size, stage)
        elif isinstance(stage, CallStage):
            current = _call(functions[stage.function], stage, _hwc(current))
        else:  # a second decode: config validation forbids it
            raise AssertionError(f"unexpected stage {stage.kind!r} after decode")

    layout = config.output.layout
    array = (
        _layout(current, layout) if isinstance(current, np.ndarray) else to_array(current, layout)
    )
    if array.shape != config.sample_shape:
        raise Reject(
            "bad_output",
            f"sample has shape {array.shape}, expected {config.sample_shape} ({layout})",
        )
    return array, decoded.source_size
