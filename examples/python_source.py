"""A complete `source: python` example: images that live in a SQLite table (any database or
service works the same way), packed without writing a converter.

The pipeline imports `module:function`, calls it once per run as `function(**options)`, and
takes every record it yields: a dict

    {"id": str | int, "data": encoded image bytes, "label": str | int, "split": str | None}

with "array" (a uint8 HxW or HxWxC numpy array) instead of "data" for raw pixels, or the same
as a tuple (id, data_or_array, label[, split]). Ids must be unique and stable across runs: the
id is the sample's `source` in the manifest, and an incremental run matches samples by it.

pipeline.yaml (next to this file; `source.path`, default the config's folder, is where the
module is imported from):

    source:
      kind: python
      function: "python_source:records"
      options: {database: /data/photos.sqlite}    # passed as-is: use an absolute path
      split: {val: 0.1}                           # for records whose split is None
    stages:
      - decode: {mode: RGB}
      - resize: {size: [64, 64]}
    output: {dir: artifacts}

Run this file to try it: `python examples/python_source.py /tmp/demo` builds a small database,
writes that pipeline.yaml, packs it twice (the second run commits nothing) and prints both.
"""

from __future__ import annotations

import io
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


def records(database: str, table: str = "photos") -> Iterator[dict[str, Any]]:
    """One record per row of `table` (columns id, image, label, split), read-only.

    A generator keeps memory flat: the pipeline hashes each record as it arrives and writes only
    the ones it has not stored before to a spool file in the output folder for its workers.
    """
    uri = f"file:{Path(database).resolve()}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True)) as db:
        rows = db.execute(f"SELECT id, image, label, split FROM {table} ORDER BY id")
        for row_id, image, label, split in rows:
            yield {"id": row_id, "data": image, "label": label, "split": split}


def array_records(count: int = 8, size: int = 32) -> Iterator[tuple[str, np.ndarray, str]]:
    """Raw pixels instead of encoded bytes: tuples (id, uint8 array, label)."""
    for i in range(count):
        y, x = np.mgrid[0:size, 0:size]
        pixels = np.stack([x * 8 + i, y * 8, (x + y) * 4], axis=-1).astype(np.uint8)
        yield f"ramp-{i:03d}", pixels, "even" if i % 2 == 0 else "odd"


# --- the runnable demo ----------------------------------------------------------------------


def make_demo_database(path: Path, count: int = 24) -> None:
    """A table of small PNG and JPEG images in two classes; every fourth row is in 'val'."""
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE photos (id TEXT PRIMARY KEY, image BLOB, label TEXT, split TEXT)")
        rng = np.random.default_rng(0)
        for i in range(count):
            pixels = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, "PNG" if i % 2 else "JPEG")
            label = "cat" if i % 3 else "dog"
            split = "val" if i % 4 == 0 else None
            db.execute(
                "INSERT INTO photos VALUES (?, ?, ?, ?)",
                (f"photo-{i:04d}", buffer.getvalue(), label, split),
            )
        db.commit()


def main(folder: Path) -> None:
    from etl.config import load_config
    from etl.run import pipeline

    folder.mkdir(parents=True, exist_ok=True)
    database = folder / "photos.sqlite"
    if not database.exists():
        make_demo_database(database)
    config_path = folder / "pipeline.yaml"
    config_path.write_text(
        f"""\
source:
  kind: python
  path: {Path(__file__).resolve().parent}
  function: "python_source:records"
  options: {{database: {database.resolve()}}}
  split: {{val: 0.1}}
stages:
  - decode: {{mode: RGB}}
  - resize: {{size: [32, 32]}}
output: {{dir: artifacts}}
run: {{n_jobs: 2}}
"""
    )
    config = load_config(config_path)
    for attempt in ("first", "second"):
        report = pipeline.run(config)
        print(
            f"{attempt} run: version {report.version}, committed {report.committed}, "
            f"packed {report.packed_new}, reused {report.reused}, rejected {report.rejected}"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "python-source-demo"))
