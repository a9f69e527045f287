"""Pure per-image stages: encoded bytes -> decoded image (`etl.images.decode`) -> validated ->
resized image -> call stages -> uint8 array.

No file I/O, no parallelism, no printing. The stages read a `Recipe` (`etl.images.recipe`), the
config's plain copy, so a worker never imports the config models. `etl.engine.fill` loads the
call-stage functions once per worker with `load_function`, runs `process_image` on each file's
bytes, and turns a `Reject` into a row of the rejects table (reasons: `etl.images.rejects`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import numpy as np
from numpy.typing import NDArray
from PIL import Image, ImageOps

from etl.errors import ConfigError, described
from etl.images.decode import decode, luminance
from etl.images.recipe import CallStep, Recipe, ResizeStep, ValidateStep
from etl.images.rejects import Reject

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
    "keep_aspect": _stretch,  # to ResizeStep.output_size, which keeps the aspect ratio
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


def resize(
    image: Image.Image, opts: ResizeStep, source_size: tuple[int, int] | None = None
) -> Image.Image:
    """Resize to `opts.output_size` (opts.size, or the aspect kept) by opts.mode with
    opts.filter. `source_size`: the (height, width) the output size is computed from when
    `image` is a reduced decode of it (JPEG draft), so the stored size never depends on it."""
    height, width = opts.output_size(*(source_size or (image.height, image.width)))
    resize_fn: ResizeFn = _lookup(RESIZE_MODES, opts.mode, "resize mode")
    method: Image.Resampling = _lookup(FILTERS, opts.filter, "resize filter")
    fill: Fill = luminance(opts.fill) if image.mode == "L" else opts.fill
    resized = resize_fn(image, (width, height), method, fill)
    return resized.convert("RGB") if resized.mode == "RGBX" else resized


# --- validate -------------------------------------------------------------------------------


def check_source(source_size: tuple[int, int], opts: ValidateStep) -> None:
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
    function: Callable[..., Any], stage: CallStep, array: NDArray[np.uint8]
) -> NDArray[np.uint8]:
    channels = array.shape[2]
    try:
        out = function(array, **stage.options)
    except Reject:
        raise  # a user function may reject an image on purpose
    except Exception as exc:
        raise Reject("stage_error", f"{stage.function}: {described(exc)}") from None
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
    data: bytes, recipe: Recipe, functions: Mapping[str, Callable[..., Any]]
) -> tuple[NDArray[np.uint8], tuple[int, int]]:
    """Run the recipe's stages in order on one encoded image -> (array of recipe.sample_shape,
    source (height, width)); raises `Reject`.

    `functions` maps each CallStep.function spec to its callable (from `load_function`), so a
    worker imports user code once, not once per image. The array may be read-only.
    """
    steps = recipe.steps
    # NOTE: draft only when resize follows decode with nothing in between that looks at pixels
    # (validate reads only the source size); a call stage must see the full-resolution image.
    pixel_steps = [step for step in steps if not isinstance(step, ValidateStep)]
    next_resize = pixel_steps[0] if isinstance(pixel_steps[0], ResizeStep) else None
    decoded = decode(data, recipe.decode, next_resize, recipe.reducing_gap)

    current: Image.Image | NDArray[np.uint8] = decoded.image
    for step in steps:
        if isinstance(step, ResizeStep):
            full = decoded.source_size if step is next_resize else None
            current = resize(_image(current), step, full)
        elif isinstance(step, ValidateStep):
            check_source(decoded.source_size, step)
        else:
            current = _call(functions[step.function], step, _hwc(current))

    layout = recipe.layout
    array = (
        _layout(current, layout) if isinstance(current, np.ndarray) else to_array(current, layout)
    )
    if not _fits(array.shape, recipe):
        raise Reject(
            "bad_output",
            f"sample has shape {array.shape}, expected {_expected(recipe)} ({layout})",
        )
    return array, decoded.source_size


def _fits(shape: tuple[int, ...], recipe: Recipe) -> bool:
    """Whether a sample of `shape` is one the output stores: the configured shape, or for
    samples that keep their aspect ratio, the channels and sides within `shorter` x `longer`."""
    if not recipe.ragged:
        return shape == recipe.sample_shape
    resize = recipe.resize
    assert resize.shorter is not None and resize.longer is not None
    if len(shape) != 3:
        return False
    height, width = shape[:2] if recipe.layout == "HWC" else shape[1:]
    channels = shape[2] if recipe.layout == "HWC" else shape[0]
    return (
        channels == recipe.channels
        and 0 < min(height, width) <= resize.shorter
        and max(height, width) <= resize.longer
    )


def _expected(recipe: Recipe) -> str:
    if not recipe.ragged:
        return str(recipe.sample_shape)
    resize, channels = recipe.resize, recipe.channels
    sides = f"sides at most {resize.shorter} (shorter) and {resize.longer} (longer)"
    return f"{channels} channels, {sides}"
