"""Datasets whose samples keep their aspect ratio (format version 2), packed by `etl run` from
PNGs of random sizes, and the oracle of their pixels: plain Pillow, the size rule in floats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc
from PIL import Image

SHORTER, LONGER = 24, 40


def write_sources(root: Path, count: int = 14, seed: int = 3) -> None:
    """PNGs of random sizes (wide, tall, small, huge ratios) in two classes, and one broken."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        height, width = (int(v) for v in rng.integers(6, 120, size=2))
        if i == 0:
            height, width = 10, 100  # capped by LONGER
        if i == 1:
            height, width = 12, 15  # smaller than SHORTER: kept at its size
        folder = root / ("cat" if i % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:02d}.png")
    (root / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")


def write_config(folder: Path, layout: str = "HWC", jobs: int = 2, backend: str = "auto") -> Path:
    path = folder / "pipeline.yaml"
    path.write_text(
        f"""source: {{kind: folder, path: images}}
stages:
  - decode: {{}}
  - resize: {{mode: keep_aspect, shorter: {SHORTER}, longer: {LONGER}}}
output: {{dir: out, samples_per_shard: 5, layout: {layout}}}
run: {{n_jobs: {jobs}, backend: {backend}}}
"""
    )
    return path


def oracle_size(height: int, width: int) -> tuple[int, int]:
    scale = min(1.0, SHORTER / min(height, width))
    if max(height, width) * scale > LONGER:
        scale = LONGER / max(height, width)
    return max(1, round(height * scale)), max(1, round(width * scale))


def oracle_pixels(source: Path) -> np.ndarray:
    with Image.open(source) as image:
        height, width = oracle_size(image.height, image.width)
        return np.asarray(image.convert("RGB").resize((width, height), Image.Resampling.BILINEAR))


def pack_aspect(folder: Path, count: int, seed: int, layout: str = "HWC") -> Path:
    """`count` sources of `write_sources` packed by `etl run` in one process: the dataset."""
    write_sources(folder / "images", count=count, seed=seed)
    config = write_config(folder, layout, jobs=1, backend="sequential")
    done = subprocess.run(
        [sys.executable, "-m", "etl", "run", str(config), "--quiet"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return folder / "out"


def read_plainly(out: Path, version: int = 1) -> tuple[dict[bytes, bytes], list[dict]]:
    """The manifest's metadata and rows, and each sample's pixels (key 'pixels', HWC), read as
    docs/FORMAT.md says: np.load of the shard, `sample_offset` and the stored size."""
    with ipc.open_file(out / "versions" / f"v{version:06d}" / "manifest.arrow") as reader:
        table = reader.read_all()
    meta = table.schema.metadata
    shape = json.loads(meta[b"etl.sample_shape"])
    layout = json.loads(meta[b"etl.layout"])
    channels = shape[2] if layout == "HWC" else shape[0]
    rows = table.to_pylist()
    for row in rows:
        data = np.load(out / row["shard"], mmap_mode="r")
        height, width = row["sample_height"], row["sample_width"]
        flat = data[row["sample_offset"] : row["sample_offset"] + height * width * channels]
        if layout == "HWC":
            row["pixels"] = flat.reshape(height, width, channels)
        else:
            row["pixels"] = flat.reshape(channels, height, width).transpose(1, 2, 0)
    return meta, rows
