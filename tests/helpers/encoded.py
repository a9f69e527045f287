"""Small encoded pictures, an independent reference for what a packed sample must hold, and
plain-pyarrow reads of a packed dataset: shared by the tests of sources that store encoded
images inside other files (tar shards, tables)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.ipc as ipc
from PIL import Image, ImageOps

SIZE = (12, 16)
"""(height, width) the tests' configs resize to."""


def picture(seed: int, height: int = 24, width: int = 30) -> bytes:
    """A small noisy gradient, PNG for odd seeds and JPEG for even ones."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x * y + seed) % 256], -1)
    array = ((base + rng.integers(0, 30, (height, width, 3))) % 256).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "PNG" if seed % 2 else "JPEG")
    return buffer.getvalue()


def reference(data: bytes) -> np.ndarray:
    """Independent of etl.images.stages: Pillow decode, RGB, centre-crop resize."""
    height, width = SIZE
    image = Image.open(io.BytesIO(data)).convert("RGB")
    return np.asarray(ImageOps.fit(image, (width, height), Image.Resampling.BILINEAR))


def latest(out: Path, table: str) -> list[dict[str, Any]]:
    """Rows of the newest version's `table` (manifest, rejects), read with plain pyarrow."""
    version = sorted((out / "versions").iterdir())[-1]
    with ipc.open_file(version / f"{table}.arrow") as reader:
        rows: list[dict[str, Any]] = reader.read_all().to_pylist()
    return rows


def stored(out: Path) -> dict[str, tuple[np.ndarray, dict[str, Any]]]:
    """source -> (its stored pixels, read with plain numpy; its manifest row)."""
    return {
        r["source"]: (np.load(out / r["shard"], mmap_mode="r")[r["row"]], r)
        for r in latest(out, "manifest")
    }


def reasons(out: Path) -> dict[str, str]:
    """source -> reject reason, of the newest version."""
    return {r["source"]: r["reason"] for r in latest(out, "rejects")}


def rejects_of(out: Path) -> dict[str, tuple[str, str]]:
    """source -> (reject reason, message), of the newest version."""
    return {r["source"]: (r["reason"], r["message"]) for r in latest(out, "rejects")}


def add_member(tar: tarfile.TarFile, name: str, data: bytes, **fields: Any) -> None:
    """A member of a tar shard as a WebDataset writer or a hostile one makes it: `fields` set
    on its TarInfo (a link, a device, a name with '..')."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in fields.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if info.isfile() else None)


def write_config(tmp_path: Path, source: str) -> Path:
    """tmp_path/pipeline.yaml: `source` (the lines under `source:`, indented two spaces), a
    decode and a resize to SIZE, output in tmp_path/out, two threads."""
    path = tmp_path / "pipeline.yaml"
    path.write_text(
        f"""\
source:
{source.rstrip()}
  split: {{val: 0.5}}
stages:
  - decode: {{}}
  - resize: {{size: [{SIZE[0]}, {SIZE[1]}]}}
output: {{dir: out, samples_per_shard: 3}}
run: {{n_jobs: 2, backend: threading}}
"""
    )
    return path


def etl_run(config: Path) -> dict[str, Any]:
    """`python -m etl run CONFIG --json` as a user runs it, under a time limit (a hang fails
    the test): it must succeed without a traceback; returns its report."""
    proc = subprocess.run(
        [sys.executable, "-m", "etl", "run", str(config), "--json"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report
