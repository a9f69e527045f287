"""etl.images.stages against independent computations written out here (Pillow calls and numpy).

Every image is tiny and made in memory; expected values never come from the code under test.
"""

from __future__ import annotations

import io
import math
import pickle
import struct
import sys
import textwrap
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from etl import config as config_module
from etl.config import (
    CallStage,
    DecodeStage,
    FolderSource,
    OutputConfig,
    PipelineConfig,
    ResizeStage,
    ValidateStage,
)
from etl.errors import ConfigError
from etl.format.checksums import HASHERS
from etl.images import stages
from etl.images.recipe import decode_step, recipe_of, step_of
from etl.images.rejects import CONTENT_REJECTS, REJECT_REASONS, Reject
from etl.images.stages import FILTERS, RESIZE_MODES, load_function, to_array

# The stages as a run calls them: with the plain copies (`etl.images.recipe`) of validated
# config models, which is what the tests below write.


def decode(data: bytes, stage: DecodeStage, next_resize: Any = None, **kw: Any) -> Any:
    step = next_resize and step_of(next_resize)
    return stages.decode(data, decode_step(stage), step, **kw)


def resize(image: Image.Image, stage: ResizeStage, source_size: Any = None) -> Image.Image:
    return stages.resize(image, step_of(stage), source_size)


def check_source(source_size: tuple[int, int], stage: ValidateStage) -> None:
    stages.check_source(source_size, step_of(stage))


def process_image(data: bytes, config: PipelineConfig, functions: Any) -> Any:
    return stages.process_image(data, recipe_of(config), functions)


RED, GREEN, BLUE, WHITE = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255)

# --- helpers --------------------------------------------------------------------------------


def encode(image: Image.Image, fmt: str, **params: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def noise(height: int, width: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    shape = (height, width, channels) if channels > 1 else (height, width)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def quadrants(width: int, height: int) -> np.ndarray:
    """Red top-left, green top-right, blue bottom-left, white bottom-right."""
    array = np.zeros((height, width, 3), np.uint8)
    half_h, half_w = height // 2, width // 2
    array[:half_h, :half_w] = RED
    array[:half_h, half_w:] = GREEN
    array[half_h:, :half_w] = BLUE
    array[half_h:, half_w:] = WHITE
    return array


def with_orientation(image: Image.Image, fmt: str, orientation: int, **params: Any) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(image, fmt, exif=exif, **params)


def smooth_photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Gradients, low-frequency waves and mild noise: what a photo looks like to a codec."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    rng = np.random.default_rng(seed)
    channels = [
        128 + 70 * np.sin(x / 97 + phase) * np.cos(y / 61 - phase) + 40 * (x / width - y / height)
        for phase in (0.0, 1.3, 2.6)
    ]
    array = np.stack(channels, axis=-1) + rng.normal(0, 6, (height, width, 3))
    return np.clip(np.rint(array), 0, 255).astype(np.uint8)


def png_header_only(width: int, height: int) -> bytes:
    """A valid PNG signature and IHDR for an 8-bit grey image, then an IDAT cut short."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + struct.pack(">I", 10_000) + b"IDAT" + b"x"


def pipeline(*stages: Any, layout: str = "HWC") -> PipelineConfig:
    return PipelineConfig(
        source=FolderSource(path=Path("unused")),
        stages=stages,
        output=OutputConfig(layout=layout),
    )


def expect_reject(call: Callable[[], Any]) -> Reject:
    with pytest.raises(Reject) as info:
        call()
    assert info.value.reason in REJECT_REASONS
    return info.value


def reference(
    data: bytes,
    mode: str,
    size: tuple[int, int],
    resize_mode: str,
    filter_name: str,
    fill: tuple[int, int, int],
    layout: str,
) -> np.ndarray:
    """The pipeline written out plainly with Pillow and numpy."""
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert(mode)
    method = getattr(Image.Resampling, filter_name.upper())
    height, width = size
    if resize_mode == "center_crop":
        image = ImageOps.fit(image, (width, height), method)
    elif resize_mode == "pad":
        color: Any = fill
        if mode == "L":
            r, g, b = fill
            color = round(0.299 * r + 0.587 * g + 0.114 * b)
        image = ImageOps.pad(image, (width, height), method, color=color)
    else:
        image = image.resize((width, height), method)
    array = np.asarray(image)
    if array.ndim == 2:
        array = array[:, :, None]
    return array.transpose(2, 0, 1) if layout == "CHW" else array


# --- registries and Reject ------------------------------------------------------------------


def choices(model: type, field: str) -> set[str]:
    """The values a config field's Literal accepts: what a user can write in pipeline.yaml."""
    return set(get_args(model.model_fields[field].annotation))  # type: ignore[attr-defined]


def test_registries_match_the_config_choices() -> None:
    assert set(RESIZE_MODES) == choices(config_module.ResizeStage, "mode")
    assert set(FILTERS) == choices(config_module.ResizeStage, "filter")
    assert set(HASHERS) == choices(config_module.OutputConfig, "checksum")


def test_reject_reasons_are_exactly_the_reasons_the_code_gives() -> None:
    """Every reason a stage, a lister or the executor can give is registered (with a one-line
    description), and every registered reason is given somewhere: read from the package's own
    string literals, outside the registry."""
    import ast

    import etl

    registry = Path(etl.__file__).parent / "images" / "rejects.py"
    literals: set[str] = set()
    for module in Path(etl.__file__).parent.rglob("*.py"):
        if module != registry:
            literals.update(
                node.value
                for node in ast.walk(ast.parse(module.read_text()))
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
            )
    assert len(REJECT_REASONS) >= 20
    assert set(REJECT_REASONS) - literals == set(), "registered but never given"
    given = {"unreadable", "truncated", "corrupt", "no_class", "outside_root", "pickle"}
    assert given <= literals  # a sample of reasons the scan must see
    assert all(description and "\n" not in description for description in REJECT_REASONS.values())


def test_content_rejects_are_reject_reasons() -> None:
    """The plan remembers these across runs by content hash: each must be a real reason."""
    assert set(REJECT_REASONS) >= CONTENT_REJECTS
    assert {"io_error", "changed", "duplicate", "missing"}.isdisjoint(CONTENT_REJECTS)


def test_reject_pickles_and_refuses_unknown_reasons() -> None:
    copy = pickle.loads(pickle.dumps(Reject("too_small", "3x4")))
    assert (copy.reason, copy.message, str(copy)) == ("too_small", "3x4", "too_small: 3x4")
    with pytest.raises(ValueError, match="unknown reject reason"):
        Reject("blurry", "no such reason")


def test_unknown_resize_mode_lists_the_valid_ones() -> None:
    opts = ResizeStage.model_construct(
        size=(4, 4), mode="zoom", filter="bilinear", fill=(0, 0, 0), draft=False
    )
    with pytest.raises(ConfigError, match=r"'zoom'.*center_crop.*pad.*stretch"):
        resize(Image.new("RGB", (8, 8)), opts)


# --- resize modes and layouts ---------------------------------------------------------------


@pytest.mark.parametrize("resize_mode", ["center_crop", "pad", "stretch"])
@pytest.mark.parametrize(("mode", "layout"), [("RGB", "HWC"), ("RGB", "CHW"), ("L", "HWC")])
@pytest.mark.parametrize("size", [(16, 10), (9, 25)])
def test_process_image_matches_pillow_reference(
    resize_mode: str, mode: str, layout: str, size: tuple[int, int]
) -> None:
    data = encode(Image.fromarray(noise(23, 37)), "PNG")
    fill = (10, 200, 30)
    config = pipeline(
        DecodeStage(mode=mode),
        ResizeStage(size=size, mode=resize_mode, filter="bicubic", fill=fill),
        layout=layout,
    )
    array, source_size = process_image(data, config, {})
    expected = reference(data, mode, size, resize_mode, "bicubic", fill, layout)
    assert source_size == (23, 37)
    assert array.shape == config.sample_shape == expected.shape
    assert array.dtype == np.uint8 and array.flags.c_contiguous
    np.testing.assert_array_equal(array, expected)


def test_l_in_chw_has_one_channel_first() -> None:
    data = encode(Image.fromarray(noise(12, 20, channels=1)), "PNG")
    config = pipeline(DecodeStage(mode="L"), ResizeStage(size=(6, 10)), layout="CHW")
    array, _ = process_image(data, config, {})
    expected = np.asarray(Image.open(io.BytesIO(data)).resize((10, 6), Image.Resampling.BILINEAR))
    assert array.shape == (1, 6, 10) and array.flags.c_contiguous
    np.testing.assert_array_equal(array[0], expected)


def test_to_array_layouts_agree() -> None:
    image = Image.fromarray(noise(5, 7))
    hwc, chw = to_array(image, "HWC"), to_array(image, "CHW")
    assert hwc.shape == (5, 7, 3) and chw.shape == (3, 5, 7)
    assert chw.flags.c_contiguous
    np.testing.assert_array_equal(chw, np.moveaxis(np.asarray(image), -1, 0))
    assert to_array(image.convert("L"), "HWC").shape == (5, 7, 1)


def test_pad_letterboxes_with_fill_and_luminance_for_grey() -> None:
    opts = ResizeStage(size=(10, 10), mode="pad", fill=(255, 0, 0))
    rgb = np.asarray(resize(Image.new("RGB", (20, 10), (0, 0, 255)), opts))
    assert (rgb[0, 0] == RED).all() and (rgb[5, 5] == BLUE).all()
    grey = np.asarray(resize(Image.new("L", (20, 10), 0), opts))
    assert grey[0, 0] == round(0.299 * 255)  # red's luma, 76


@settings(max_examples=150, deadline=None)
@given(
    source=st.tuples(st.integers(1, 300), st.integers(1, 300)),
    target=st.tuples(st.integers(1, 200), st.integers(1, 200)),
    resize_mode=st.sampled_from(sorted(set(RESIZE_MODES) - {"keep_aspect"})),
    filter_name=st.sampled_from(sorted(FILTERS)),
    mode=st.sampled_from(["RGB", "L"]),
)
def test_resize_always_returns_exactly_the_target_size(
    source: tuple[int, int],
    target: tuple[int, int],
    resize_mode: str,
    filter_name: str,
    mode: str,
) -> None:
    image = Image.new(mode, source, 77 if mode == "L" else (1, 2, 3))
    out = resize(image, ResizeStage(size=target, mode=resize_mode, filter=filter_name))
    assert (out.height, out.width) == target
    assert out.mode == mode


@settings(max_examples=300, deadline=None)
@given(
    source=st.tuples(st.integers(1, 400), st.integers(1, 400)),
    shorter=st.integers(1, 64),
    extra=st.integers(0, 96),
    upscale=st.booleans(),
)
def test_keep_aspect_keeps_the_ratio_within_a_pixel(
    source: tuple[int, int], shorter: int, extra: int, upscale: bool
) -> None:
    """The oracle is the rule in plain floats: scale the shorter side to `shorter` (never up
    unless `upscale`), cap the longer at `longer`; each side within half a pixel of it."""
    height, width = source
    longer = shorter + extra
    opts = ResizeStage(mode="keep_aspect", shorter=shorter, longer=longer, upscale=upscale)
    scale = shorter / min(height, width)
    if not upscale:
        scale = min(scale, 1.0)
    if max(height, width) * scale > longer:
        scale = longer / max(height, width)
    out = resize(Image.new("RGB", (width, height), (1, 2, 3)), opts)
    assert abs(out.height - height * scale) <= 0.5 + 1e-9 or out.height == 1
    assert abs(out.width - width * scale) <= 0.5 + 1e-9 or out.width == 1
    assert max(out.height, out.width) <= longer and min(out.height, out.width) <= shorter
    if max(height, width) * shorter <= longer * min(height, width) and (
        upscale or min(height, width) >= shorter
    ):
        assert min(out.height, out.width) == shorter  # the side aimed at, exactly
    assert step_of(opts).output_size(height, width) == (out.height, out.width)


def test_keep_aspect_config_errors_name_the_keys() -> None:
    with pytest.raises(ValueError, match="needs shorter and longer"):
        ResizeStage(mode="keep_aspect", shorter=256)
    with pytest.raises(ValueError, match="not size"):
        ResizeStage(mode="keep_aspect", size=(8, 8), shorter=8, longer=8)
    with pytest.raises(ValueError, match="below shorter"):
        ResizeStage(mode="keep_aspect", shorter=256, longer=128)
    with pytest.raises(ValueError, match="shorter: only for mode keep_aspect"):
        ResizeStage(size=(8, 8), shorter=8)
    with pytest.raises(ValueError, match="needs size"):
        ResizeStage(mode="pad")


# --- EXIF orientation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("orientation", "numpy_turns", "red_corner"),
    [(6, -1, "top_right"), (8, 1, "bottom_left")],  # 6: turn clockwise; 8: counter-clockwise
)
@pytest.mark.parametrize("fmt", ["JPEG", "TIFF"])
def test_exif_orientation_turns_the_image(
    orientation: int, numpy_turns: int, red_corner: str, fmt: str
) -> None:
    stored = quadrants(width=40, height=24)
    params = {"quality": 95} if fmt == "JPEG" else {}
    data = with_orientation(Image.fromarray(stored), fmt, orientation, **params)
    decoded = decode(data, DecodeStage())
    array = np.asarray(decoded.image)
    assert decoded.source_size == (40, 24)  # (height, width) as displayed
    assert array.shape == (40, 24, 3)
    # the same stored pixels, turned by numpy rather than by EXIF handling
    raw = Image.open(io.BytesIO(data))
    raw_array = np.asarray(raw) if fmt == "JPEG" else stored  # Pillow turns TIFFs on load
    np.testing.assert_array_equal(array, np.rot90(raw_array, numpy_turns))
    corners = {
        "top_right": array[5, -5],
        "bottom_left": array[-5, 5],
        "top_left": array[5, 5],
    }
    assert np.abs(corners[red_corner].astype(int) - RED).max() <= 8
    assert np.abs(corners["top_left"].astype(int) - RED).max() > 100


def test_orientation_then_stretch_to_the_turned_shape() -> None:
    data = with_orientation(Image.fromarray(quadrants(40, 24)), "JPEG", 6, quality=95)
    config = pipeline(DecodeStage(), ResizeStage(size=(20, 12), mode="stretch"))
    array, source_size = process_image(data, config, {})
    assert source_size == (40, 24) and array.shape == (20, 12, 3)
    assert np.abs(array[2, -2].astype(int) - RED).max() <= 8  # red top-left went top-right


# --- modes ----------------------------------------------------------------------------------


def test_cmyk_jpeg_becomes_rgb_by_the_naive_formula() -> None:
    cmyk = (0, 200, 255, 50)  # a dark orange
    data = encode(Image.new("CMYK", (16, 8), cmyk), "JPEG", quality=100)
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    c, m, y, k = cmyk
    expected = [round((255 - v) * (255 - k) / 255) for v in (c, m, y)]
    array = np.asarray(decode(data, DecodeStage()).image)
    assert array.shape == (8, 16, 3)
    assert np.abs(array.astype(int) - expected).max() <= 3


def test_palette_png_transparency_is_composited_on_the_background() -> None:
    background = (20, 120, 220)
    palette = [0, 0, 0, 255, 0, 0, 0, 255, 0] + [0] * (256 * 3 - 9)
    indices = np.array([[0, 1, 2, 1], [2, 1, 0, 0]], np.uint8)
    image = Image.new("P", (4, 2))
    image.putdata(indices.ravel().tolist())
    image.putpalette(palette)
    data = encode(image, "PNG", transparency=0)
    assert Image.open(io.BytesIO(data)).mode == "P"

    lookup = np.array([background, RED, GREEN], np.uint8)
    rgb = decode(data, DecodeStage(background=background)).image
    np.testing.assert_array_equal(np.asarray(rgb), lookup[indices])

    grey = decode(data, DecodeStage(mode="L", background=background)).image
    luma = np.rint(lookup.astype(float) @ [0.299, 0.587, 0.114])
    np.testing.assert_allclose(np.asarray(grey), luma[indices], atol=1)


def blend(fg: np.ndarray, alpha: np.ndarray, bg: Any) -> np.ndarray:
    a = alpha.astype(float)[..., None] / 255
    return np.rint(fg.astype(float) * a + np.asarray(bg, float) * (1 - a))


def test_rgba_is_composited_on_the_background() -> None:
    rgb, alpha = noise(9, 11), noise(9, 11, channels=1, seed=1)
    alpha[0, :3] = (0, 255, 128)
    data = encode(Image.fromarray(np.dstack([rgb, alpha])), "PNG")
    background = (200, 10, 90)
    out = np.asarray(decode(data, DecodeStage(background=background)).image).astype(int)
    expected = blend(rgb, alpha, background)
    assert np.abs(out - expected).max() <= 1
    assert (out[0, 0] == background).all() and (out[0, 1] == rgb[0, 1]).all()


@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_la_is_composited_on_the_background(mode: str) -> None:
    grey, alpha = noise(6, 8, channels=1), noise(6, 8, channels=1, seed=2)
    data = encode(Image.fromarray(np.dstack([grey, alpha]), mode="LA"), "PNG")
    assert Image.open(io.BytesIO(data)).mode == "LA"
    background = (0, 255, 0)
    out = np.asarray(decode(data, DecodeStage(mode=mode, background=background)).image)
    if mode == "L":
        expected = blend(grey[..., None], alpha, round(0.587 * 255))[..., 0]
    else:
        expected = blend(np.dstack([grey] * 3), alpha, background)
    assert np.abs(out.astype(int) - expected).max() <= 1


@pytest.mark.parametrize("fmt", ["PNG", "TIFF"])
def test_sixteen_bit_grey_is_scaled_not_clipped(fmt: str) -> None:
    values = np.linspace(0, 65535, 64 * 64).round().astype(np.uint16).reshape(64, 64)
    if fmt == "TIFF":
        values = values.astype(">u2")  # big-endian: mode I;16B
    data = encode(Image.fromarray(values), fmt)
    assert Image.open(io.BytesIO(data)).mode.startswith("I;16")
    out = np.asarray(decode(data, DecodeStage(mode="L")).image).astype(int)
    assert np.abs(out - values / 257).max() <= 0.5 + 1e-9  # rounded, so within 1 either way
    bright = out[values > 32768]
    assert (bright < 255).mean() > 0.9  # Pillow's convert("L") would make all of these 255
    assert out.max() == 255 and out.min() == 0
    assert len(np.unique(out)) == 256
    rgb = np.asarray(decode(data, DecodeStage(mode="RGB")).image)
    np.testing.assert_array_equal(rgb, np.dstack([out] * 3))


def test_mode_i_in_16_bit_range_is_scaled_and_beyond_is_refused() -> None:
    values = np.array([[0, 257, 32896, 65535]], np.int32)
    data = encode(Image.fromarray(values), "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "I"
    out = np.asarray(decode(data, DecodeStage(mode="L")).image)
    np.testing.assert_array_equal(out, [[0, 1, 128, 255]])

    for bad in (70_000, -1):
        data = encode(Image.fromarray(np.array([[0, bad]], np.int32)), "TIFF")
        reject = expect_reject(lambda data=data: decode(data, DecodeStage()))
        assert reject.reason == "unsupported_mode"
        assert str(bad) in reject.message


def test_float_images_are_refused() -> None:
    data = encode(Image.fromarray(np.ones((2, 2), np.float32)), "TIFF")
    assert expect_reject(lambda: decode(data, DecodeStage())).reason == "unsupported_mode"


def test_one_bit_png_becomes_0_and_255() -> None:
    bits = np.indices((6, 6)).sum(axis=0) % 2 == 0
    data = encode(Image.fromarray(bits), "PNG")
    assert Image.open(io.BytesIO(data)).mode == "1"
    out = np.asarray(decode(data, DecodeStage(mode="L")).image)
    np.testing.assert_array_equal(out, np.where(bits, 255, 0))


# --- damaged and hostile inputs -------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize("keep", [0.3, 0.6, 0.95])
def test_truncated_images_are_rejected_not_padded(fmt: str, keep: float) -> None:
    data = encode(Image.fromarray(noise(48, 64)), fmt)
    cut = data[: int(len(data) * keep)]
    reject = expect_reject(lambda: decode(cut, DecodeStage()))
    assert reject.reason == "truncated", reject.message


def test_damaged_compressed_stream_is_corrupt() -> None:
    data = bytearray(encode(Image.fromarray(noise(48, 64)), "PNG"))
    start = data.index(b"IDAT") + 20
    data[start : start + 40] = bytes(40)
    assert expect_reject(lambda: decode(bytes(data), DecodeStage())).reason == "corrupt"


@pytest.mark.parametrize("data", [b"", b"not an image at all" * 10, b"\x89PNG\r\n\x1a\n"])
def test_unidentifiable_bytes_are_unreadable(data: bytes) -> None:
    assert expect_reject(lambda: decode(data, DecodeStage())).reason == "unreadable"


def test_pixel_limit_is_checked_from_the_header_before_decoding() -> None:
    data = png_header_only(3000, 2000)  # no pixel data: decoding would say 'truncated'
    reject = expect_reject(lambda: decode(data, DecodeStage(max_pixels=5_000_000)))
    assert reject.reason == "too_large" and "6000000" in reject.message
    assert expect_reject(lambda: decode(data, DecodeStage())).reason == "truncated"


def test_pillow_decompression_bomb_guard_becomes_too_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)
    warned = encode(Image.new("L", (150, 100)), "PNG")  # 15,000 px: Pillow warns
    refused = encode(Image.new("L", (250, 100)), "PNG")  # 25,000 px: Pillow raises
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing may leak out as a warning
        reject = expect_reject(lambda: decode(warned, DecodeStage(max_pixels=10_000)))
        assert reject.reason == "too_large"
        # our own, higher limit decides in Pillow's warning zone
        assert decode(warned, DecodeStage(max_pixels=1_000_000)).image.size == (150, 100)
        reject = expect_reject(lambda: decode(refused, DecodeStage(max_pixels=1_000_000)))
        assert reject.reason == "too_large"


def animation(fmt: str) -> bytes:
    frames = [Image.new("RGB", (8, 6), color) for color in (RED, GREEN, BLUE)]
    return encode(frames[0], fmt, save_all=True, append_images=frames[1:])


@pytest.mark.parametrize("fmt", ["GIF", "TIFF"])
def test_multi_frame_first_or_reject(fmt: str) -> None:
    data = animation(fmt)
    first = np.asarray(decode(data, DecodeStage(multi_frame="first")).image)
    assert first.shape == (6, 8, 3)
    assert np.abs(first.astype(int) - RED).max() <= 1
    reject = expect_reject(lambda: decode(data, DecodeStage(multi_frame="reject")))
    assert reject.reason == "multi_frame" and "3" in reject.message


def test_single_frame_gif_passes_multi_frame_reject() -> None:
    data = encode(Image.new("RGB", (8, 6), GREEN), "GIF")
    assert decode(data, DecodeStage(multi_frame="reject")).image.size == (8, 6)


def test_mpo_is_a_jpeg_not_an_animation() -> None:
    """Phone JPEGs with a preview or gain map open as MPO, n_frames > 1; frame 0 is the photo."""
    photo = smooth_photo(320, 240)
    data = encode(
        Image.fromarray(photo),
        "MPO",
        save_all=True,
        append_images=[Image.new("RGB", (160, 120), RED)],
    )
    opened = Image.open(io.BytesIO(data))
    assert opened.format == "MPO" and opened.n_frames == 2
    decoded = decode(data, DecodeStage(multi_frame="reject"))
    assert decoded.source_size == (240, 320)
    np.testing.assert_array_equal(np.asarray(decoded.image), np.asarray(opened))
    assert np.abs(np.asarray(decoded.image).astype(int) - photo).mean() < 8
    drafted = decode(data, DecodeStage(), next_resize=ResizeStage(size=(30, 40), draft=True))
    assert drafted.image.size == (80, 60) and drafted.source_size == (240, 320)  # 1/4: 2x kept


# --- validate -------------------------------------------------------------------------------


def test_check_source_min_size_and_aspect() -> None:
    check_source((100, 200), ValidateStage(min_size=(100, 200), max_aspect=2.0))
    reject = expect_reject(lambda: check_source((99, 300), ValidateStage(min_size=(100, 200))))
    assert (
        reject.reason == "too_small" and "99x300" in reject.message and "100x200" in reject.message
    )
    reject = expect_reject(lambda: check_source((300, 99), ValidateStage(min_size=(100, 100))))
    assert reject.reason == "too_small"
    reject = expect_reject(lambda: check_source((100, 201), ValidateStage(max_aspect=2.0)))
    assert reject.reason == "aspect"
    reject = expect_reject(lambda: check_source((301, 100), ValidateStage(max_aspect=3.0)))
    assert reject.reason == "aspect" and "301x100" in reject.message


def test_validate_uses_the_turned_full_resolution_source() -> None:
    data = with_orientation(Image.fromarray(noise(30, 60)), "JPEG", 6)  # shown 30 wide, 60 high
    opts = ValidateStage(min_size=(50, 25))
    for order in [(opts, ResizeStage(size=(8, 8))), (ResizeStage(size=(8, 8), draft=True), opts)]:
        array, size = process_image(data, pipeline(DecodeStage(), *order), {})
        assert size == (60, 30) and array.shape == (8, 8, 3)
    too_tall = pipeline(DecodeStage(), ResizeStage(size=(8, 8)), ValidateStage(min_size=(61, 1)))
    assert expect_reject(lambda: process_image(data, too_tall, {})).reason == "too_small"


# --- call stages ----------------------------------------------------------------------------

USER_MODULE = """
import numpy as np

def invert(array, amount=255):
    return (amount - array.astype(np.int16)).clip(0, 255).astype(np.uint8)

def mark_in_place(array):
    array[0, 0] = 7
    return array

def left_half(array):
    return array[:, : array.shape[1] // 2]

def shape_of(array):
    return np.full((4, 4, array.shape[2]), array.shape[2], np.uint8)

def as_float(array):
    return array.astype(np.float32)

def grey(array):
    return array[:, :, :1]

def empty(array):
    return array[:0]

def as_list(array):
    return array.tolist()

SEEN = []

def record(array):
    SEEN.append(array.shape)
    return array

def boom(array):
    raise RuntimeError("lens cap on")

NOT_CALLABLE = 3
"""


@pytest.fixture(scope="module")
def user_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("user_code")
    (folder / "etl_test_user_fns.py").write_text(textwrap.dedent(USER_MODULE))
    sys.path.insert(0, str(folder))
    yield "etl_test_user_fns"
    sys.path.remove(str(folder))
    sys.modules.pop("etl_test_user_fns", None)


def run_with_calls(
    data: bytes, module: str, *stages: Any, mode: str = "RGB", layout: str = "HWC"
) -> np.ndarray:
    config = pipeline(DecodeStage(mode=mode), *stages, layout=layout)
    specs = [s.function for s in stages if isinstance(s, CallStage)]
    array, _ = process_image(data, config, {spec: load_function(spec) for spec in specs})
    return array


def test_call_stage_before_and_after_resize(user_module: str) -> None:
    source = noise(10, 16)
    data = encode(Image.fromarray(source), "PNG")
    invert = CallStage(function=f"{user_module}:invert", options={"amount": 200})
    out = run_with_calls(data, user_module, invert, ResizeStage(size=(10, 16), mode="stretch"))
    np.testing.assert_array_equal(out, np.clip(200 - source.astype(int), 0, 255))

    out = run_with_calls(data, user_module, ResizeStage(size=(5, 8)), invert, layout="CHW")
    resized = np.asarray(Image.fromarray(source).resize((8, 5), Image.Resampling.BILINEAR))
    expected = np.clip(200 - resized.astype(int), 0, 255).transpose(2, 0, 1)
    np.testing.assert_array_equal(out, expected)


def test_call_stage_gets_a_writable_hwc_array_with_one_channel_for_l(user_module: str) -> None:
    data = encode(Image.fromarray(noise(6, 6, channels=1)), "PNG")
    mark = CallStage(function=f"{user_module}:mark_in_place")
    shape_of = CallStage(function=f"{user_module}:shape_of")
    out = run_with_calls(data, user_module, mark, ResizeStage(size=(6, 6)), mode="L")
    assert out.shape == (6, 6, 1) and out[0, 0, 0] == 7
    out = run_with_calls(data, user_module, shape_of, ResizeStage(size=(4, 4)), mode="L")
    assert (out == 1).all()  # the function saw C=1


def test_call_stage_may_change_the_size_before_resize(user_module: str) -> None:
    source = quadrants(20, 10)
    data = encode(Image.fromarray(source), "PNG")
    half = CallStage(function=f"{user_module}:left_half")
    out = run_with_calls(data, user_module, half, ResizeStage(size=(10, 10), mode="stretch"))
    np.testing.assert_array_equal(out, source[:, :10])


@pytest.mark.parametrize(
    ("function", "reason", "fragment"),
    [
        ("as_float", "bad_output", "float32"),
        ("grey", "bad_output", "(10, 16, 1)"),
        ("as_list", "bad_output", "list"),
        ("empty", "bad_output", "(0, 16, 3)"),
        ("boom", "stage_error", "RuntimeError: lens cap on"),
    ],
)
def test_call_stage_failures_are_rejects(
    user_module: str, function: str, reason: str, fragment: str
) -> None:
    data = encode(Image.fromarray(noise(10, 16)), "PNG")
    stage = CallStage(function=f"{user_module}:{function}")
    reject = expect_reject(
        lambda: run_with_calls(data, user_module, stage, ResizeStage(size=(4, 4)))
    )
    assert reject.reason == reason
    assert fragment in reject.message and stage.function in reject.message


def test_final_shape_is_checked_after_a_last_call_stage(user_module: str) -> None:
    data = encode(Image.fromarray(noise(10, 16)), "PNG")
    half = CallStage(function=f"{user_module}:left_half")
    reject = expect_reject(
        lambda: run_with_calls(data, user_module, ResizeStage(size=(4, 4)), half)
    )
    assert reject.reason == "bad_output" and "(4, 2, 3)" in reject.message


def test_load_function_errors_name_the_spec(user_module: str) -> None:
    assert load_function(f"{user_module}:invert").__name__ == "invert"
    for spec, fragment in [
        ("etl_no_such_module_xyz:fn", "cannot import"),
        (f"{user_module}:missing", "has no 'missing'"),
        (f"{user_module}:NOT_CALLABLE", "not callable"),
        ("no_colon_here", "package.module:function"),
    ]:
        with pytest.raises(ConfigError, match=fragment) as info:
            load_function(spec)
        assert spec in str(info.value)


# --- JPEG draft -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def photo_jpeg() -> bytes:
    return encode(Image.fromarray(smooth_photo(1200, 900)), "JPEG", quality=90)


@pytest.mark.parametrize("resize_mode", ["center_crop", "pad", "stretch"])
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_draft_is_close_to_a_full_decode(
    photo_jpeg: bytes, resize_mode: str, mode: str, record_property: Any
) -> None:
    full = ResizeStage(size=(64, 64), mode=resize_mode, draft=False)
    draft = full.model_copy(update={"draft": True})
    decoded = decode(photo_jpeg, DecodeStage(mode=mode), next_resize=draft)
    assert decoded.source_size == (900, 1200)
    # 1/4 scale keeps twice what each mode needs (86x64, 64x64, 64x48); 1/8 would not, but for
    # pad; the rule of datasets drafted before the gap (1) went to 1/8, never below the need
    assert decoded.image.size == ((150, 113) if resize_mode == "pad" else (300, 225))
    legacy = decode(photo_jpeg, DecodeStage(mode=mode), next_resize=draft, reducing_gap=1.0)
    assert legacy.image.size == (150, 113)
    expected, _ = process_image(photo_jpeg, pipeline(DecodeStage(mode=mode), full), {})
    drafted, size = process_image(photo_jpeg, pipeline(DecodeStage(mode=mode), draft), {})
    assert size == (900, 1200) and drafted.shape == expected.shape
    mad = float(np.abs(drafted.astype(float) - expected).mean())
    record_property(f"draft_mad_{resize_mode}_{mode}", mad)
    print(f"draft mean abs difference ({resize_mode}, {mode}): {mad:.3f} grey levels")
    assert mad < 3.0


def test_draft_counts_in_turned_coordinates() -> None:
    """Stored 800x400 turned to 400 wide x 800 high; a 400-wide stretch needs the full width.
    Computing the request in stored coordinates would halve it and upscale afterwards."""
    stored = Image.fromarray(smooth_photo(800, 400))
    data = with_orientation(stored, "JPEG", 6, quality=90)
    opts = ResizeStage(size=(50, 400), mode="stretch", draft=True)
    decoded = decode(data, DecodeStage(), next_resize=opts)
    assert decoded.source_size == (800, 400)
    assert decoded.image.width >= 400 and decoded.image.height >= 50

    square = ResizeStage(size=(64, 64), mode="center_crop", draft=True)
    decoded = decode(data, DecodeStage(), next_resize=square)
    assert decoded.source_size == (800, 400)
    assert decoded.image.size == (200, 400)  # 1/2 scale: twice what 64x64 needs, turned
    legacy = decode(data, DecodeStage(), next_resize=square, reducing_gap=1.0)
    assert legacy.image.size == (100, 200)  # 1/4: never below the need
    full, _ = process_image(
        data, pipeline(DecodeStage(), square.model_copy(update={"draft": False})), {}
    )
    drafted, _ = process_image(data, pipeline(DecodeStage(), square), {})
    assert float(np.abs(drafted.astype(float) - full).mean()) < 3.0


def test_draft_is_ignored_for_png_and_when_not_asked(photo_jpeg: bytes) -> None:
    opts = ResizeStage(size=(64, 64), draft=True)
    png = encode(Image.fromarray(smooth_photo(120, 90)), "PNG")
    assert decode(png, DecodeStage(), next_resize=opts).image.size == (120, 90)
    no_draft = ResizeStage(size=(64, 64), draft=False)
    assert decode(photo_jpeg, DecodeStage(), next_resize=no_draft).image.size == (1200, 900)
    unset = ResizeStage(size=(64, 64))  # a new dataset's default: the reduced decode
    assert decode(photo_jpeg, DecodeStage(), next_resize=unset).image.size == (300, 225)


def test_draft_still_applies_across_a_validate_stage(photo_jpeg: bytes) -> None:
    draft = ResizeStage(size=(64, 64), draft=True)
    via_draft = np.asarray(resize(decode(photo_jpeg, DecodeStage(), draft).image, draft))
    full = np.asarray(resize(decode(photo_jpeg, DecodeStage()).image, draft))
    assert not np.array_equal(via_draft, full)
    config = pipeline(DecodeStage(), ValidateStage(min_size=(10, 10)), draft)
    array, size = process_image(photo_jpeg, config, {})
    assert size == (900, 1200)
    np.testing.assert_array_equal(array, via_draft)


def test_no_draft_when_a_call_stage_comes_first(user_module: str, photo_jpeg: bytes) -> None:
    record = CallStage(function=f"{user_module}:record")
    seen = sys.modules[user_module].SEEN
    seen.clear()
    run_with_calls(photo_jpeg, user_module, record, ResizeStage(size=(8, 8), draft=True))
    run_with_calls(photo_jpeg, user_module, ResizeStage(size=(8, 8), draft=True), record)
    assert seen == [(900, 1200, 3), (8, 8, 3)]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    stored=st.tuples(st.integers(8, 160), st.integers(8, 160)),
    target=st.tuples(st.integers(1, 120), st.integers(1, 120)),
    resize_mode=st.sampled_from(["center_crop", "pad", "stretch"]),
    orientation=st.sampled_from([1, 3, 6, 8]),
)
def test_draft_never_decodes_below_what_resize_needs(
    stored: tuple[int, int], target: tuple[int, int], resize_mode: str, orientation: int
) -> None:
    data = with_orientation(Image.new("RGB", stored, (90, 30, 200)), "JPEG", orientation)
    opts = ResizeStage(size=target, mode=resize_mode, draft=True)
    decoded = decode(data, DecodeStage(), next_resize=opts)
    turned = orientation in (6, 8)
    width, height = (stored[1], stored[0]) if turned else stored
    assert decoded.source_size == (height, width)
    target_h, target_w = target
    if resize_mode == "stretch":
        need_w, need_h = min(width, target_w), min(height, target_h)
    else:
        pick = max if resize_mode == "center_crop" else min
        scale = pick(target_w / width, target_h / height)
        need_w = min(width, math.ceil(width * scale - 1e-9))
        need_h = min(height, math.ceil(height * scale - 1e-9))
    got_w, got_h = decoded.image.size
    assert need_w <= got_w <= width and need_h <= got_h <= height
    out = resize(decoded.image, opts)
    assert (out.height, out.width) == target
