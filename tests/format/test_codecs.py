"""The stored samples' codecs (`etl.format.codecs`) as pure functions: exact round trips where
they promise them, JPEG within its error of the pixels (measured against Pillow's decode of the
same bytes), and every damaged or lying stream one `DecodeFailure`, never another exception, a
crash in libjpeg-turbo, or pixels of another size."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from etl.format.codecs import (
    CODECS,
    DecodeFailure,
    dct_factor,
    decode,
    decode_jpeg,
    encode,
    jpeg_as_stored,
)

pytestmark = pytest.mark.timeout(120)


def photo(
    height: int = 48, width: int = 64, channels: int = 3, seed: int = 0, grain: float = 3
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack(
        [127 + 90 * np.sin(x / (11 + 2 * c) + y / (17 + c) + seed) for c in range(channels)], -1
    )
    return np.clip(base + rng.normal(0, grain, base.shape), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("layout", ["HWC", "CHW"])
@pytest.mark.parametrize("channels", [1, 3])
def test_zlib_and_raw_are_exact(layout: str, channels: int) -> None:
    hwc = np.repeat(np.repeat(photo(6, 8, channels), 8, axis=0), 8, axis=1)  # flat blocks
    pixels = hwc if layout == "HWC" else np.ascontiguousarray(hwc.transpose(2, 0, 1))
    for kind in ("raw", "zlib"):
        codec, data = encode(pixels, kind, 90, 1.0, layout)
        assert codec == kind and data.dtype == np.uint8 and data.ndim == 1
        np.testing.assert_array_equal(decode(data, codec, pixels.shape), pixels)
        assert kind == "raw" or bytes(data) == zlib.compress(pixels.tobytes(), 1)


@pytest.mark.parametrize("channels", [1, 3])
def test_jpeg_decodes_as_pillow_decodes_the_same_bytes(channels: int) -> None:
    """Our libjpeg-turbo decode and Pillow's of the same bytes agree within 1 level (measured:
    equal); the JPEG is within q90's error of the pixels."""
    pixels = photo(channels=channels)
    codec, data = encode(pixels, "jpeg", 90, 1.0, "HWC")
    assert codec == "jpeg"
    ours = decode(data, "jpeg", pixels.shape)
    with Image.open(io.BytesIO(bytes(data))) as image:
        theirs = np.asarray(image).reshape(pixels.shape)
    assert np.abs(ours.astype(np.int16) - theirs).max() <= 1
    error = np.mean((ours.astype(float) - pixels) ** 2)
    assert 10 * np.log10(255**2 / error) > 35


def test_min_ratio_keeps_raw_where_encoding_does_not_pay() -> None:
    noise = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    assert encode(noise, "zlib", 90, 1.0, "HWC")[0] == "raw"  # noise does not compress
    smooth = photo()
    assert encode(smooth, "jpeg", 90, 1.0, "HWC")[0] == "jpeg"
    assert encode(smooth, "jpeg", 90, 1000.0, "HWC")[0] == "raw"
    codec, data = encode(smooth, "jpeg", 90, 1000.0, "HWC")
    np.testing.assert_array_equal(decode(data, codec, smooth.shape), smooth)


def test_lying_and_damaged_streams_are_one_named_failure() -> None:
    pixels = photo()
    _, jpeg = encode(pixels, "jpeg", 90, 1.0, "HWC")
    _, deflated = encode(pixels, "zlib", 90, 1.0, "HWC")
    cases = {
        "JPEG of 48x64, expected 40x64": (jpeg, "jpeg", (40, 64, 3)),
        "does not decode": (jpeg[: len(jpeg) // 2], "jpeg", pixels.shape),
        "not a JPEG": (b"\xff\xd8\xff" + b"0" * 64, "jpeg", pixels.shape),
        "does not inflate to the": (deflated, "zlib", (40, 64, 3)),
        "zlib stream is corrupt": (b"\x78\x01garbage", "zlib", pixels.shape),
        "raw sample of": (pixels.reshape(-1)[:-1], "raw", pixels.shape),
        "unknown codec 'webp'": (jpeg, "webp", pixels.shape),
    }
    for expected, (data, codec, shape) in cases.items():
        with pytest.raises(DecodeFailure, match=expected):
            decode(data, codec, shape)


def test_a_zlib_bomb_is_refused_without_inflating_it() -> None:
    """A stream that inflates to 1 GiB, where the row says 12 KiB: refused after inflating
    at most what the sample holds."""
    bomb = zlib.compress(bytes(1 << 30), 9)
    with pytest.raises(DecodeFailure, match="does not inflate"):
        decode(bomb, "zlib", (64, 64, 3))


def _scan_start(data: bytes) -> int:
    """Where a JPEG's entropy-coded data starts: after the SOS segment."""
    at = data.index(b"\xff\xda")
    return at + 2 + int.from_bytes(data[at + 2 : at + 4], "big")


@settings(max_examples=300, deadline=None)
@given(
    how=st.sampled_from(["garbage-scan", "flip", "truncate", "insert"]),
    at=st.integers(0, 1 << 16),
    value=st.integers(0, 255),
    seed=st.integers(0, 1 << 16),
)
def test_damaged_jpegs_never_crash_the_decoder(how: str, at: int, value: int, seed: int) -> None:
    """Valid-looking headers over garbage scans, flipped bytes anywhere (the header's sizes
    too), truncations, inserted bytes: each decodes to pixels of the recorded shape (JPEG has no
    checksum: the loaders check the row's before decoding) or is one DecodeFailure, at full
    and at reduced DCT scale."""
    pixels = photo(seed=seed % 7)
    data = bytearray(encode(pixels, "jpeg", 90, 1.0, "HWC")[1].tobytes())
    if how == "garbage-scan":
        start = _scan_start(bytes(data))
        garbage = np.random.default_rng(seed).integers(0, 256, len(data) - start - 2, np.uint8)
        data[start : len(data) - 2] = garbage.tobytes()
    elif how == "flip":
        data[at % len(data)] ^= value or 1
    elif how == "truncate":
        del data[at % len(data) :]
    else:
        data[at % len(data) : at % len(data)] = bytes([value]) * (1 + at % 9)
    for factor in (1, 2):
        try:
            out = decode_jpeg(bytes(data), pixels.shape, factor=factor)
        except DecodeFailure:
            continue
        assert out.shape == (-(-48 // factor), -(-64 // factor), 3) and out.dtype == np.uint8


def test_dct_factor_keeps_the_reducing_gap() -> None:
    """The largest reduction that leaves at least `reducing_gap` times the needed size."""
    assert dct_factor((3000, 4000), (224, 224), 2.0) == 4  # 750x1000 >= 448
    assert dct_factor((3000, 4000), (224, 224), 3.0) == 4  # 750 >= 672
    assert dct_factor((3000, 4000), (224, 224), 4.0) == 2
    assert dct_factor((256, 341), (224, 224), 2.0) == 1
    assert dct_factor((4000, 4000), (100, 100), 2.0) == 8
    with pytest.raises(ValueError, match="reducing_gap"):
        dct_factor((10, 10), (1, 1), 0.5)
    assert CODECS == ("raw", "jpeg", "zlib")  # the codes a loader's arrays hold: never reorder


def _baseline_jpeg() -> bytes:
    buffer = io.BytesIO()
    rng = np.random.default_rng(7)
    Image.fromarray(rng.integers(0, 255, (16, 24, 3), dtype=np.uint8)).save(
        buffer, "JPEG", quality=80, comment="note"
    )
    return buffer.getvalue()


def test_a_stored_source_jpeg_is_its_segments_without_metadata() -> None:
    """`jpeg_as_stored`, read back by Pillow: the same pixels, no comment, nothing after the
    image; a progressive or CMYK file, or no JPEG at all, is not stored as itself."""
    data = _baseline_jpeg()
    stored = jpeg_as_stored(data + b"trailing bytes")
    assert stored is not None and b"note" not in stored and stored.endswith(b"\xff\xd9")
    assert np.array_equal(
        np.asarray(Image.open(io.BytesIO(stored))), np.asarray(Image.open(io.BytesIO(data)))
    )
    image = Image.open(io.BytesIO(data))
    for options in ({"progressive": True}, {}):
        buffer = io.BytesIO()
        (image if options else image.convert("CMYK")).save(buffer, "JPEG", **options)
        assert jpeg_as_stored(buffer.getvalue()) is None
    assert jpeg_as_stored(b"") is None and jpeg_as_stored(b"\x89PNG\r\n") is None


def test_metadata_between_the_scan_and_the_end_goes_too() -> None:
    """A comment after the entropy-coded data (before the end-of-image marker, where libjpeg
    reads it too) is metadata like any other; restart markers inside the scan are kept."""
    buffer = io.BytesIO()
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 255, (32, 48, 3), dtype=np.uint8)).save(
        buffer, "JPEG", quality=80, restart_marker_blocks=1
    )
    data = buffer.getvalue()
    assert b"\xff\xd0" in data  # the scan has restart markers
    late = data[:-2] + b"\xff\xfe\x00\x08secret" + b"\xff\xd9"
    stored = jpeg_as_stored(late)
    assert stored is not None and b"secret" not in stored and stored == jpeg_as_stored(data)
    assert np.array_equal(
        np.asarray(Image.open(io.BytesIO(stored))), np.asarray(Image.open(io.BytesIO(late)))
    )
    assert jpeg_as_stored(data[:-2]) is None  # no end of the image


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + (len(payload) + 2).to_bytes(2, "big") + payload


def test_jfif_and_adobe_segments_keep_their_headers_and_no_thumbnail() -> None:
    """A source whose JFIF segment carries a thumbnail (of the whole, uncropped photo), with a
    JFXX thumbnail segment and an Adobe segment with bytes after its header: the stored file
    keeps JFIF's and Adobe's fixed headers only (no thumbnail's bytes, no JFXX), and decodes,
    by Pillow, to the source's very pixels."""
    data = _baseline_jpeg()
    jfif = data.index(b"JFIF\0")
    end = jfif - 2 + int.from_bytes(data[jfif - 2 : jfif], "big")
    thumbnail = bytes(range(3 * 4 * 4))  # a 4x4 RGB thumbnail, recognisable bytes
    segments = (
        _segment(0xE0, data[jfif : jfif + 12] + bytes([4, 4]) + thumbnail)
        + _segment(0xE0, b"JFXX\0\x13" + bytes(range(200, 240)))
        + _segment(0xEE, b"Adobe\0\x64\0\0\0\0\x01" + b"extra bytes")
    )
    source = data[: jfif - 4] + segments + data[end:]
    stored = jpeg_as_stored(source)
    assert stored is not None
    assert thumbnail not in stored and b"JFXX" not in stored and b"extra bytes" not in stored
    assert stored.count(b"JFIF\0") == 1 and stored.count(b"Adobe") == 1
    at = stored.index(b"JFIF\0")
    assert stored[at + 12 : at + 14] == b"\0\0" and int.from_bytes(stored[at - 2 : at], "big") == 16
    assert np.array_equal(
        np.asarray(Image.open(io.BytesIO(stored))), np.asarray(Image.open(io.BytesIO(source)))
    )


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_damaged_source_jpeg_is_bytes_or_none_never_an_error(data: st.DataObject) -> None:
    """Flips, cuts and insertions anywhere in a JPEG's segments: `jpeg_as_stored` returns None
    or a file from its start to an end-of-image marker, and never raises."""
    original = bytearray(_baseline_jpeg())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(original) - 1))
        what = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if what == "flip":
            original[at] ^= data.draw(st.integers(1, 255))
        elif what == "cut":
            del original[at : at + data.draw(st.integers(1, 64))]
        else:
            original[at:at] = data.draw(st.binary(min_size=1, max_size=16))
        if not original:
            break
    stored = jpeg_as_stored(bytes(original))
    assert stored is None or (stored.startswith(b"\xff\xd8") and stored.endswith(b"\xff\xd9"))
