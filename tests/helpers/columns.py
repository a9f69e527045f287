"""A CSV listing whose rows carry per-sample columns of every kind (text, numbers, fixed and
ragged lists, a struct), with the values each packed sample must hold, written here from
plain Python values (the oracle), not by the code under test."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from tests.helpers.encoded import picture

COLUMNS_YAML = """\
columns:
  caption: string
  score: {type: float32, from: quality, required: true}
  embedding: list<float32>
  boxes: list<list<float32>>
  meta: "struct<origin: string, year: int16>"
"""
"""The declared columns of `write_captioned` (score is the listing's 'quality')."""


def write_captioned(folder: Path, count: int = 12) -> dict[str, dict[str, Any]]:
    """`count` pictures and folder/list.csv naming them with a label and the columns; returns
    source -> the values its sample must carry (a float32-exact score, boxes of 0-2 rows)."""
    folder.mkdir(parents=True, exist_ok=True)
    expected: dict[str, dict[str, Any]] = {}
    rows = []
    for i in range(count):
        name = f"img{i:02d}.png"
        (folder / name).write_bytes(picture(2 * i + 1))
        values = {
            "caption": f"photo {i:03d}, taken at noon" if i % 4 else f"{i:03d}",
            "score": i * 0.25,
            "embedding": [float(i), -1.0, 0.5],
            "boxes": [[0.0, 0.0, float(i), float(i + 1)]] * (i % 3),
            "meta": {"origin": f"cam{i % 2}", "year": 2000 + i},
        }
        expected[name] = {**values, "label": "even" if i % 2 == 0 else "odd"}
        rows.append(
            {
                "path": name,
                "label": expected[name]["label"],
                "caption": values["caption"],
                "quality": str(values["score"]),
                "embedding": json.dumps(values["embedding"]),
                "boxes": json.dumps(values["boxes"]),
                "meta": json.dumps(values["meta"]),
            }
        )
    write_csv(folder / "list.csv", rows)
    return expected


def write_csv(path: Path, rows: list[dict[str, str]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_listing_config(tmp_path: Path, columns: str = COLUMNS_YAML) -> Path:
    """tmp_path/pipeline.yaml packing tmp_path/photos/list.csv with `columns` to tmp_path/out."""
    path = tmp_path / "pipeline.yaml"
    path.write_text(
        f"""\
source: {{kind: listing, path: photos/list.csv, split: {{val: 0.25}}}}
stages:
  - decode: {{}}
  - resize: {{size: [12, 16]}}
output: {{dir: out, samples_per_shard: 5}}
run: {{n_jobs: 2, backend: threading}}
{columns}"""
    )
    return path
