"""Datasets packed with `output.codec` (format version 3) from photo-like PNGs, and the plain
reads a stranger would write from docs/FORMAT.md: pyarrow for the manifest, numpy for the
shard, Pillow for the JPEG bytes. None of it calls this project's readers."""

from __future__ import annotations

import io
import shutil
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.ipc as ipc
from PIL import Image


def write_photos(
    root: Path, count: int = 12, seed: int = 0, sides: tuple[int, int] = (90, 120)
) -> None:
    """Smooth gradients with mild grain (what JPEG is made for), two classes, PNG on disk so
    the source is exact; sizes vary around `sides`."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        height = sides[0] + int(rng.integers(-20, 20))
        width = sides[1] + int(rng.integers(-20, 20))
        y, x = np.mgrid[0:height, 0:width].astype(np.float64)
        phase = rng.uniform(0, 6.28, 3)
        base = np.stack(
            [127 + 100 * np.sin(x / (9 + 3 * c) + y / (13 + c) + phase[c]) for c in range(3)], -1
        )
        pixels = np.clip(base + rng.normal(0, 4, base.shape), 0, 255).astype(np.uint8)
        folder = root / ("sea" if i % 2 else "sky")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"{i:03d}.png")


def write_config(folder: Path, codec: str, resize: str = "size: [32, 40]", extra: str = "") -> Path:
    """pipeline.yaml over `folder/images` into `folder/out` with `codec` (a YAML value)."""
    path = folder / "pipeline.yaml"
    path.write_text(
        "source: {kind: folder, path: images}\n"
        f"stages: [decode: {{}}, resize: {{{resize}}}]\n"
        f"output: {{dir: out, samples_per_shard: 5, codec: {codec}{extra}}}\n"
        "run: {n_jobs: 2}\n"
    )
    return path


def pack_photos(
    folder: Path,
    codec: str,
    count: int,
    resize: str = "mode: keep_aspect, shorter: 24, longer: 40",
    sides: tuple[int, int] = (90, 120),
) -> Path:
    """`write_photos` packed by `etl run` with `codec`, the aspect kept by default: the out dir."""
    from etl.config import load_config
    from etl.run import pipeline

    write_photos(folder / "images", count=count, sides=sides)
    assert pipeline.run(load_config(write_config(folder, codec, resize=resize))).committed
    return folder / "out"


def read_plainly(out: Path, version: int = 1) -> tuple[dict[bytes, bytes], list[dict[str, Any]]]:
    """(schema metadata, rows) of a version's manifest, read with pyarrow alone."""
    with ipc.open_file(out / "versions" / f"v{version:06d}" / "manifest.arrow") as f:
        table = f.read_all()
    return dict(table.schema.metadata or {}), table.to_pylist()


def stored_of(out: Path, row: dict[str, Any]) -> bytes:
    """A sample's stored bytes, as docs/FORMAT.md says: its shard's flat array with numpy."""
    data = np.load(out / row["shard"], mmap_mode="r")
    start = row["sample_offset"]
    return bytes(data[start : start + row["sample_bytes"]])


def pixels_of(out: Path, row: dict[str, Any], channels: int = 3) -> np.ndarray:
    """A sample's pixels (HWC) decoded without this project: Pillow for JPEG, zlib, numpy."""
    data, shape = stored_of(out, row), (row["sample_height"], row["sample_width"], channels)
    if row["sample_codec"] == "jpeg":
        with Image.open(io.BytesIO(data)) as image:
            return np.asarray(image.convert("RGB" if channels == 3 else "L")).reshape(shape)
    if row["sample_codec"] == "zlib":
        return np.frombuffer(zlib.decompress(data), np.uint8).reshape(shape)
    assert row["sample_codec"] == "raw", row["sample_codec"]
    return np.frombuffer(data, np.uint8).reshape(shape)


def zeroed_copy(
    out: Path, dest: Path, index: int, start: int, stop: int | None = None
) -> dict[str, Any]:
    """A copy of the pack `out` at `dest` with bytes [start, stop) of manifest row `index`'s
    stored bytes zeroed (negative: from their end; None: to it), as a damaged disk would
    leave them: its shard's checksum no longer holds. The row, as pyarrow reads it."""
    shutil.copytree(out, dest)
    _, rows = read_plainly(dest)
    row = rows[index]
    path = dest / row["shard"]
    data = bytearray(path.read_bytes())
    first = 128 + row["sample_offset"]  # the flat array after its .npy header
    span = slice(*slice(start, stop).indices(row["sample_bytes"])[:2])
    data[first + span.start : first + span.stop] = bytes(span.stop - span.start)
    path.write_bytes(bytes(data))
    return row
