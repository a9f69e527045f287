"""A dataset with two versions made to be shown: hostile class, file and column values (markup
that would run if it were not escaped), rejects of several reasons, per-sample columns, and a
second version that adds, removes and relabels samples. Built from a CSV listing by real runs
of `etl run` (in this process); what each version must hold is written here, as plain values."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from etl.config import load_config
from etl.run import pipeline
from tests.helpers.columns import write_csv

HOSTILE_CLASS = "<img src=x onerror=alert(1)>"
HOSTILE_FILE = "<script>alert(2)</script>.png"
"""A source path holding markup: a folder `<script>alert(2)<` and in it `script>.png`."""
HOSTILE_CAPTION = "</pre><script>alert(3)</script>"
HOSTILE_REJECT = '"><svg onload=alert(4)>.jpg'
"""A file that is not an image, so the report lists its name and message as a reject."""

CONFIG = """\
source: {kind: listing, path: photos/list.csv}
stages:
  - decode: {}
  - validate: {min_size: [16, 16], duplicates: keep_first}
  - resize: {size: [24, 24]}
output: {dir: out, samples_per_shard: 6}
run: {backend: sequential}
columns:
  caption: string
  score: {type: float32, from: quality}
  boxes: list<list<float32>>
"""


def _png(seed: int, side: int = 32) -> bytes:
    rng = np.random.default_rng(seed)
    colour = rng.integers(0, 256, 3, dtype=np.uint8)
    array = np.broadcast_to(colour, (side, side, 3)).copy()
    array[side // 4 : side // 2, :, :] = 255 - colour
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "PNG")
    return buffer.getvalue()


def write_photos(folder: Path, version: int) -> list[dict[str, str]]:
    """photos/ and its list.csv for `version` 1 or 2; returns the listing's rows."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "<script>alert(2)<").mkdir(exist_ok=True)
    rows: list[dict[str, Any]] = []
    for i in range(15):
        name = HOSTILE_FILE if i == 0 else f"p{i:02d}.png"
        (folder / name).write_bytes(_png(i))
        label = ("cat", "dog", HOSTILE_CLASS)[i % 3]
        if version == 2 and i == 4:
            label = "cat"  # relabelled
        if version == 2 and i == 5:
            continue  # removed
        caption = HOSTILE_CAPTION if i == 1 else f"photo {i % 4}"
        rows.append(
            {
                "path": name,
                "label": label,
                "split": "val" if i % 5 == 0 else "train",
                "caption": caption,
                "quality": str(i * 0.5),
                "boxes": "[[0, 0, 1, 1]]" if i % 2 else "[]",
            }
        )
    extras = {"tiny.png": _png(99, side=8), HOSTILE_REJECT: b"not an image at all"}
    if version == 2:
        extras["p20.png"] = _png(20)  # added
    for name, data in extras.items():
        (folder / name).write_bytes(data)
        rows.append(
            {"path": name, "label": "dog", "split": "", "caption": "", "quality": "", "boxes": ""}
        )
    write_csv(folder / "list.csv", rows)
    return rows


def pack_versions(root: Path) -> Path:
    """root/out with versions 1 and 2 (see `write_photos`); returns root/pipeline.yaml."""
    config = root / "pipeline.yaml"
    config.write_text(CONFIG)
    for version in (1, 2):
        write_photos(root / "photos", version)
        report = pipeline.run(load_config(config))
        assert report.committed and report.version == version
    return config
