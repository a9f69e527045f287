"""Which codec for stored samples: bytes against raw rows, encode and decode time, exactness.

    python -m benchmarks.formats.codecs [--photos 300] [--shorter 256] [--kind photos|renders]
        [--json FILE]

The samples are the benchmark photos (`benchmarks.photos`: crops of the photographs
scikit-image bundles, 300-640 px JPEGs) decoded and resized with their aspect ratio kept to a
shorter side of `--shorter` (256: the datasets users grow into, #58), as uint8 HWC rows;
`--kind renders` takes the flat shapes `etl sample-data` draws instead (masks, renders). Each
codec encodes every sample and decodes it back, one thread, in one process: bytes as a
fraction of the raw rows (and how many times smaller), milliseconds a sample to encode and to
decode, and against the raw pixels the largest difference and the PSNR (lossy codecs).
Candidates: JPEG (simplejpeg, libjpeg-turbo, 4:2:0) at quality 90 and 95, the lossless PNG
(Pillow, levels 1 and 6), lossless WebP (Pillow, where it is built with WebP), zlib over the
raw rows (the standard library). No result is asserted; the README says what was chosen.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from PIL import Image, features

Pixels = NDArray[np.uint8]
Codec = tuple[Callable[[Pixels], bytes], Callable[[bytes, tuple[int, ...]], Pixels]]


def _pil_encode(fmt: str, **options: object) -> Callable[[Pixels], bytes]:
    def encode(pixels: Pixels) -> bytes:
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, fmt, **options)
        return out.getvalue()

    return encode


def _pil_decode(data: bytes, shape: tuple[int, ...]) -> Pixels:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def codecs() -> dict[str, Codec]:
    """The candidates, by name, as (encode, decode) pairs."""
    import simplejpeg

    def jpeg(quality: int) -> Codec:
        def encode(pixels: Pixels) -> bytes:
            return bytes(simplejpeg.encode_jpeg(pixels, quality=quality, colorsubsampling="420"))

        def decode(data: bytes, shape: tuple[int, ...]) -> Pixels:
            return np.asarray(simplejpeg.decode_jpeg(data))

        return encode, decode

    chosen: dict[str, Codec] = {
        "raw": (lambda p: p.tobytes(), lambda d, s: np.frombuffer(d, np.uint8).reshape(s).copy()),
        "jpeg q90 (simplejpeg)": jpeg(90),
        "jpeg q95 (simplejpeg)": jpeg(95),
        "png level 1 (Pillow)": (_pil_encode("PNG", compress_level=1), _pil_decode),
        "png level 6 (Pillow)": (_pil_encode("PNG", compress_level=6), _pil_decode),
        "zlib level 1 over raw rows": (
            lambda p: zlib.compress(p.tobytes(), 1),
            lambda d, s: np.frombuffer(zlib.decompress(d), np.uint8).reshape(s),
        ),
    }
    if features.check("webp"):
        chosen["webp lossless (Pillow)"] = (
            _pil_encode("WEBP", lossless=True, quality=0, method=0),
            _pil_decode,
        )
    return chosen


def samples(count: int, shorter: int, kind: str) -> list[Pixels]:
    """The first `count` benchmark photos (`kind` "photos"), or flat synthetic renders (the
    shapes `etl sample-data` draws: what masks and rendered data look like), decoded and
    resized to a shorter side of `shorter`."""
    if kind == "photos":
        from benchmarks.photos import list_photos, make_photos

        folder = Path(tempfile.gettempdir()) / "bench-codecs-photos"
        make_photos(folder, count)
        paths = list_photos(folder)[:count]
    else:
        from etl.start.sample_data import make_sample_data

        folder = Path(tempfile.mkdtemp(prefix="bench-codecs-renders-"))
        make_sample_data(folder, per_class=-(-count // 6), seed=3)
        paths = sorted(p for p in folder.rglob("*.png"))[:count]
    out = []
    for path in paths:
        try:
            with Image.open(path) as image:
                rgb = image.convert("RGB")
        except OSError:
            continue  # sample-data's deliberately broken files
        scale = shorter / min(rgb.size)
        size = (max(1, round(rgb.width * scale)), max(1, round(rgb.height * scale)))
        out.append(np.asarray(rgb.resize(size, Image.Resampling.BILINEAR)))
    return out


def psnr(a: Pixels, b: Pixels) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def measure(rows: list[Pixels], codec: Codec) -> dict[str, float]:
    encode, decode = codec
    raw = sum(r.nbytes for r in rows)
    start = time.perf_counter()
    encoded = [encode(r) for r in rows]
    encode_s = time.perf_counter() - start
    start = time.perf_counter()
    decoded = [decode(e, r.shape) for e, r in zip(encoded, rows, strict=True)]
    decode_s = time.perf_counter() - start
    stored = sum(len(e) for e in encoded)
    worst = max(
        int(np.abs(d.astype(np.int16) - r).max()) for d, r in zip(decoded, rows, strict=True)
    )
    quality = [psnr(d, r) for d, r in zip(decoded, rows, strict=True)]
    return {
        "fraction": stored / raw,
        "smaller": raw / stored,
        "encode_ms": encode_s * 1000 / len(rows),
        "decode_ms": decode_s * 1000 / len(rows),
        "max_diff": worst,
        "psnr_median": statistics.median(quality),
        "psnr_min": min(quality),
    }


def report(results: dict[str, dict[str, float]], rows: list[Pixels], kind: str) -> str:
    mean_kb = statistics.mean(r.nbytes for r in rows) / 1024
    lines = [
        f"# {len(rows)} {kind}, shorter side {min(rows[0].shape[:2])}, mean {mean_kb:.0f} KiB "
        f"raw; one thread; {os.cpu_count()} CPUs",
        "",
        "| codec | bytes of raw | x smaller | encode ms | decode ms | max diff "
        "| PSNR median / min |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        exact = r["max_diff"] == 0
        quality = "exact" if exact else f"{r['psnr_median']:.1f} / {r['psnr_min']:.1f} dB"
        lines.append(
            f"| {name} | {r['fraction']:.1%} | {r['smaller']:.1f} | {r['encode_ms']:.2f} | "
            f"{r['decode_ms']:.2f} | {r['max_diff']:.0f} | {quality} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", type=int, default=300)
    parser.add_argument("--shorter", type=int, default=256, help="shorter side of a sample")
    parser.add_argument("--kind", choices=("photos", "renders"), default="photos")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    rows = samples(args.photos, args.shorter, args.kind)
    results = {name: measure(rows, codec) for name, codec in codecs().items()}
    print(report(results, rows, args.kind))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
