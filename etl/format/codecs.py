"""How a stored sample's bytes become pixels and back (format version 3): raw rows, JPEG, zlib.

Pure functions over arrays and bytes, no Pillow: a training node decodes with libjpeg-turbo
(simplejpeg) and the standard library's zlib alone. A sample's manifest row names its codec
(`sample_codec`), its stored bytes (`sample_bytes`) and its decoded size (`sample_height`,
`sample_width`); `decode` checks the pixels it makes against that size, so bytes that decode to
anything else are an error, never a wrong sample.

NOTE [ the codec's choice ]: benchmarks/README.md, "Which codec for stored samples": JPEG q90
stores ~10% of a 256-px photo's raw bytes and decodes in 0.44 ms a core; zlib level 1 over the
raw rows is the fastest exact decode (~1 ms) at 1.3-2x smaller.
"""

from __future__ import annotations

import os
import zlib
from typing import Any

import numpy as np
from numpy.typing import NDArray

CODECS = ("raw", "jpeg", "zlib")
"""Every `sample_codec` a manifest may name; a sample's position here is its code in the
loaders' arrays (`etl.format.coherence.stored_codes`)."""
RAW, JPEG, ZLIB = range(3)
ZLIB_LEVEL = 1
"""zlib's fastest level: level 6 saves ~3% more of a photo's bytes at 5x the encode time."""


class DecodeFailure(ValueError):
    """Stored bytes that do not decode to the sample their manifest row describes."""


def encode(
    pixels: NDArray[np.uint8], kind: str, quality: int, min_ratio: float, layout: str
) -> tuple[str, NDArray[np.uint8]]:
    """(codec, stored bytes as a flat uint8 array) of one sample in the stored `layout`: encoded
    with `kind` where that is at least `min_ratio` times smaller than the raw bytes, else raw."""
    raw = np.ascontiguousarray(pixels).reshape(-1)
    if kind == "raw":
        return "raw", raw
    if kind == "jpeg":
        data = _encode_jpeg(pixels, quality, layout)
    elif kind == "zlib":
        data = zlib.compress(raw.data, ZLIB_LEVEL)
    else:
        raise ValueError(f"unknown codec {kind!r}; expected one of {', '.join(CODECS)}")
    if len(data) * min_ratio > raw.size:
        return "raw", raw
    return kind, np.frombuffer(data, np.uint8)


KEPT_APPS = (0xE0, 0xEE)
"""The application segments a source JPEG keeps when it is stored as its own bytes: JFIF, and
Adobe's (its transform flag says how the colours are coded), each cut to its fixed header
(`_kept_app`: a JFIF thumbnail goes). EXIF (its orientation, a camera's GPS position), XMP, ICC
and comments go: the stored sample is its pixels and nothing else."""
BASELINE_FRAMES = (0xC0, 0xC1)
"""SOF0 and SOF1: sequential, Huffman-coded, what every JPEG decoder reads (GPU ones too)."""


def jpeg_as_stored(data: bytes) -> bytes | None:
    """A source JPEG's bytes as a sample may store them (`output.codec.original`): its frame,
    tables and scans as they are, without metadata segments (all but `KEPT_APPS`, before or
    between the scans) or anything after the end of the image. None where it is not a baseline
    8-bit JPEG of 1 or 3 components (progressive, arithmetic-coded, 12-bit, CMYK) or its
    segments do not parse: such a source is encoded again. Pure: the caller checks that the
    bytes decode to the pixels it validated."""
    if data[:2] != b"\xff\xd8":
        return None
    kept, at, framed, scanned = [b"\xff\xd8"], 2, False, False
    while at + 2 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # a fill byte before a marker
            at += 1
            continue
        if marker == 0xD9:  # the end of the image: nothing after it is kept
            return b"".join([*kept, b"\xff\xd9"]) if scanned else None
        length = int.from_bytes(data[at + 2 : at + 4], "big")
        end = at + 2 + length
        if length < 2 or end > len(data) or 0xD0 <= marker <= 0xD8 or marker == 0x01:
            return None
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a frame (SOFn)
            if framed or marker not in BASELINE_FRAMES or length < 8 or data[at + 4] != 8:
                return None
            if data[at + 9] not in (1, 3):
                return None
            framed = True
        if marker == 0xDA:  # a scan: its header and its entropy-coded data, as they are
            if not framed:
                return None
            end, scanned = _scan_end(data, end), True
            kept.append(data[at:end])
        elif marker in KEPT_APPS:
            kept.append(_kept_app(marker, data[at + 4 : end]))
        elif not (marker == 0xFE or 0xE0 <= marker <= 0xEF):
            kept.append(data[at:end])
        at = end
    return None


def _kept_app(marker: int, payload: bytes) -> bytes:
    """A kept application segment cut to its fixed header: JFIF's densities without its
    thumbnail (a picture of the whole uncropped photo, the stored sample's or not), Adobe's
    transform flag without anything after it; any other kind of APP0 or APP14 (a JFXX
    thumbnail) is dropped (b"")."""
    if marker == 0xE0 and payload[:5] == b"JFIF\0" and len(payload) >= 14:
        header = payload[:12] + b"\0\0"  # version, units, densities; no thumbnail
    elif marker == 0xEE and payload[:5] == b"Adobe" and len(payload) >= 12:
        header = payload[:12]
    else:
        return b""
    return bytes([0xFF, marker]) + (len(header) + 2).to_bytes(2, "big") + header


def _scan_end(data: bytes, at: int) -> int:
    """Where the entropy-coded data from `at` ends: the next marker that is neither a stuffed
    0xFF (FF 00) nor a restart marker (FF D0-D7); the end of `data` where there is none."""
    while (at := data.find(b"\xff", at)) >= 0 and at + 1 < len(data):
        following = data[at + 1]
        if following != 0x00 and not 0xD0 <= following <= 0xD7 and following != 0xFF:
            return at
        at += 1 if following == 0xFF else 2
    return len(data)


def _encode_jpeg(pixels: NDArray[np.uint8], quality: int, layout: str) -> bytes:
    import simplejpeg

    if layout != "HWC":
        raise ValueError("JPEG stores HWC samples")
    channels = pixels.shape[2]
    if channels == 1:
        return bytes(simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality, "GRAY"))
    return bytes(
        simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality, "RGB", colorsubsampling="420")
    )


MAX_PIXELS = 1 << 28
"""The most pixels (height x width) a stored sample may declare for a reader to decode it,
whatever its manifest says (`ETL_MAX_PIXELS` raises it): a declared size is someone's word,
and a decode allocates it (NOTE [ bounded decodes ])."""


def max_pixels() -> int:
    """`MAX_PIXELS`, or the `ETL_MAX_PIXELS` the user set (a whole number)."""
    given = os.environ.get("ETL_MAX_PIXELS", "")
    return int(given) if given.strip().isdigit() else MAX_PIXELS


def check_pixels(height: int, width: int, declared: str = "") -> None:
    """DecodeFailure for a declared size over `max_pixels()`: nothing is allocated for it.

    NOTE [ bounded decodes ]: a 1 MB zlib stream can declare 16384x21845x3 and inflate to a
    gigabyte; a valid 65535x65535 JPEG is 16 MB. Each stored sample's declared size is checked
    against the reader's cap when a version is opened (`loaders.read.catalog`) and again here,
    before a decode allocates; a zlib stream inflates a megabyte at a time straight into the
    sample's pixels, never all at once beside them."""
    cap = max_pixels()
    if height * width > cap:
        raise DecodeFailure(
            f"declares {declared or f'{height}x{width}'} pixels, over the reader's cap of "
            f"{cap:,} (ETL_MAX_PIXELS raises it)"
        )


def decode(
    data: NDArray[np.uint8] | bytes | memoryview,
    codec: str | int,
    shape: tuple[int, int, int],
    out: NDArray[np.uint8] | None = None,
) -> NDArray[np.uint8]:
    """The pixels of one stored sample: `shape` (in its stored layout) uint8, written into `out`
    (C-contiguous, `shape`) where given. DecodeFailure (naming what was wrong) for bytes that are
    not a sample of `shape`: a corrupt or truncated JPEG, a zlib stream of another length, a
    size over the reader's cap (`check_pixels`)."""
    name = CODECS[codec] if isinstance(codec, int) else codec
    size = int(np.prod(shape))
    if name == "raw":
        flat = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
        if flat.size != size:
            raise DecodeFailure(f"raw sample of {flat.size} bytes, expected {size}")
        pixels = flat.reshape(shape)
    elif name == "zlib":
        check_pixels(1, size // min(shape[0], shape[2]), "x".join(map(str, shape)))
        into = out if out is not None else np.empty(shape, np.uint8)
        _inflate_into(data, into.reshape(-1))
        return into
    elif name == "jpeg":
        return decode_jpeg(data, shape, out)
    else:
        raise DecodeFailure(f"unknown codec {name!r}; this tool reads {', '.join(CODECS)}")
    if out is None:
        return pixels
    out[...] = pixels
    return out


_INFLATE_STEP = 1 << 20
"""Bytes a zlib stream is inflated at a time, each straight into the sample's pixels."""


def _inflate_into(data: Any, into: NDArray[np.uint8]) -> None:
    """`data` zlib-decompressed into `into`, exactly its size: never more is inflated than it
    holds (a stream that would inflate further is an error, not a memory bomb), a step at a
    time, so nothing of its size is held beside it."""
    inflater = zlib.decompressobj()
    size, done = into.size, 0
    pending: Any = data if isinstance(data, bytes) else np.ascontiguousarray(data).data
    try:
        while done <= size:
            chunk = inflater.decompress(pending, min(_INFLATE_STEP, size - done + 1))
            pending = inflater.unconsumed_tail
            if not chunk:
                break
            if done + len(chunk) > size:
                done += len(chunk)
                break
            into[done : done + len(chunk)] = np.frombuffer(chunk, np.uint8)
            done += len(chunk)
    except zlib.error as exc:
        raise DecodeFailure(f"zlib stream is corrupt ({exc})") from None
    if done != size or not inflater.eof or inflater.unused_data:
        raise DecodeFailure(f"zlib stream does not inflate to the {size} bytes of its sample")


def jpeg_size(data: Any) -> tuple[int, int]:
    """(height, width) a JPEG's header declares; DecodeFailure if it has none."""
    import simplejpeg

    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(
            data if isinstance(data, np.ndarray | bytes) else bytes(data)
        )
    except ValueError as exc:
        raise DecodeFailure(f"not a JPEG ({exc})") from None
    return int(height), int(width)


REDUCING_GAP = 2.0
"""A reduced JPEG decode keeps at least this many times the output size (Pillow's
`Image.thumbnail` default): the packing's draft and the loaders' decode alike."""


def dct_factor(source: tuple[int, int], needed: tuple[int, int], reducing_gap: float) -> int:
    """The largest of libjpeg's DCT-domain reductions (8, 4, 2, else 1) that leaves an image of
    `source` (height, width) at least `reducing_gap` times `needed` on both sides: decoding at
    1/factor costs a fraction of a full decode, and resampling the rest of the way from at
    least twice the output size is what Pillow's `reducing_gap=2.0` does. Pure, no decoder:
    the one rule the loaders' decode and packing's draft use."""
    if reducing_gap < 1:
        raise ValueError(f"reducing_gap must be at least 1, got {reducing_gap}")
    room = min(source[0] / (reducing_gap * needed[0]), source[1] / (reducing_gap * needed[1]))
    return 8 if room >= 8 else 4 if room >= 4 else 2 if room >= 2 else 1


def decode_jpeg(
    data: Any, shape: tuple[int, int, int], out: NDArray[np.uint8] | None = None, factor: int = 1
) -> NDArray[np.uint8]:
    """A stored JPEG's HWC pixels, checked to be `shape` (at 1/`factor` scale: `shape`'s sides
    divided by `factor`, rounded up, as libjpeg scales); DecodeFailure for any libjpeg warning
    or error (a truncated file, a garbage scan) or another size."""
    import simplejpeg

    height, width, channels = shape
    check_pixels(height, width)
    want = (-(-height // factor), -(-width // factor), channels)
    if out is None or factor != 1:  # into `out`: a larger JPEG overflows it, which libjpeg says
        found = jpeg_size(data)
        if found != (height, width):
            raise DecodeFailure(f"JPEG of {found[0]}x{found[1]}, expected {height}x{width}")
    space = "GRAY" if channels == 1 else "RGB"
    try:
        pixels = simplejpeg.decode_jpeg(
            data if isinstance(data, np.ndarray | bytes) else bytes(data),
            space,
            min_height=want[0],
            min_width=want[1],
            buffer=out,
            strict=True,
        )
    except ValueError as exc:
        raise DecodeFailure(f"JPEG does not decode ({exc})") from None
    if pixels.shape != want:
        raise DecodeFailure(f"JPEG decodes to {pixels.shape}, expected {want}")
    return pixels
