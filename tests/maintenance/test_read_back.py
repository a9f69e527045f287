"""Sources read back after a run, for every source kind: `etl audit --repair` re-packs damaged
samples from their source, and `etl show --rejects` draws rejected records, both through the
readers a run uses. Every restored sample is compared with an independent Pillow decode of the
bytes the source holds."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from tests.helpers.encoded import SIZE, latest, picture, reference

pytestmark = pytest.mark.slow  # end to end: see docs/architecture.md, "Test tiers"

HEADER = 128
"""Bytes before the first row of a shard .npy written by the pipeline (format 1.0 header)."""

IDS = [f"s{i}" for i in range(6)]
TOO_SMALL = "tiny"
BROKEN = "broken"


def tiny_png() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((10, 12, 3), 200, np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def records() -> dict[str, bytes]:
    """Six good pictures, one too small for the validate stage, one that is not an image."""
    items = {name: picture(i) for i, name in enumerate(IDS)}
    items[TOO_SMALL] = tiny_png()
    items[BROKEN] = b"\x89PNG\r\n\x1a\n" + b"not really" * 10
    return items


# --- one writer per source kind: (folder, items) -> the lines under `source:` -----------------


def write_parquet(folder: Path, items: dict[str, bytes]) -> str:
    table = pa.table(
        {
            "id": list(items),
            "image": pa.array(list(items.values()), pa.binary()),
            "label": ["c"] * len(items),
        }
    )
    pq.write_table(table, folder / "t.parquet")
    return f"  kind: parquet\n  path: {folder}\n  id_column: id\n"


def _write_tar(path: Path, items: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz" if path.suffix == ".gz" else "w") as tar:
        for key, data in items.items():
            for name, payload in ((f"{key}.png", data), (f"{key}.cls", b"c")):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))


def write_tar(folder: Path, items: dict[str, bytes]) -> str:
    _write_tar(folder / "a.tar", items)
    return f"  kind: webdataset\n  path: {folder}\n  files: ['*.tar']\n"


def write_tar_gz(folder: Path, items: dict[str, bytes]) -> str:
    _write_tar(folder / "a.tar.gz", items)
    return f"  kind: webdataset\n  path: {folder}\n  files: ['*.tar.gz']\n"


def write_lmdb(folder: Path, items: dict[str, bytes]) -> str:
    lmdb = pytest.importorskip("lmdb")
    with lmdb.open(str(folder / "env"), map_size=1 << 24) as env, env.begin(write=True) as txn:
        for key, data in items.items():
            txn.put(key.encode(), data)
    with open(folder / "labels.csv", "w", newline="") as f:
        csv.writer(f).writerows([("key", "label"), *((key, "c") for key in items)])
    return f"  kind: lmdb\n  path: {folder / 'env'}\n  labels: {folder / 'labels.csv'}\n"


def write_python(folder: Path, items: dict[str, bytes]) -> str:
    for key, data in items.items():
        (folder / f"{key}.bin").write_bytes(data)
    module = f"read_back_{folder.parent.name.replace('-', '_')}"
    (folder / f"{module}.py").write_text(
        "from pathlib import Path\n\n"
        "def records(folder):\n"
        "    for path in sorted(Path(folder).glob('*.bin')):\n"
        "        yield {'id': path.stem, 'data': path.read_bytes(), 'label': 'c'}\n"
    )
    return (
        f"  kind: python\n  path: {folder}\n  function: '{module}:records'\n"
        f"  options: {{folder: '{folder}'}}\n"
    )


WRITERS: dict[str, Callable[[Path, dict[str, bytes]], str]] = {
    "parquet": write_parquet,
    "webdataset": write_tar,
    "webdataset-gz": write_tar_gz,
    "lmdb": write_lmdb,
    "python": write_python,
}


def setup(tmp_path: Path, kind: str, items: dict[str, bytes]) -> Path:
    """The source and its pipeline.yaml (validate drops the tiny picture), packed by `etl run`."""
    folder = tmp_path / "src"
    folder.mkdir()
    source = WRITERS[kind](folder, items)
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        f"source:\n{source}  split: {{}}\nstages:\n  - decode: {{}}\n"
        f"  - validate: {{min_size: [20, 20]}}\n  - resize: {{size: [{SIZE[0]}, {SIZE[1]}]}}\n"
        f"output: {{dir: {tmp_path / 'out'}, samples_per_shard: 4}}\n"
        "run: {n_jobs: 2, backend: threading}\n"
    )
    etl(["run", str(config)], expect=0)
    return config


def etl(args: list[str], expect: int) -> dict[str, Any]:
    """`python -m etl ARGS --json` as a user runs it, under a time limit; its JSON report."""
    proc = subprocess.run(
        [sys.executable, "-m", "etl", *args, "--json"], capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == expect and "Traceback" not in proc.stderr, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def by_id(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Manifest rows by the record id their source ends in."""
    return {r["source"].rsplit("/", 1)[-1].split(".", 1)[0]: r for r in rows}


def flip(out: Path, row: dict[str, Any]) -> None:
    sample = int(np.prod(SIZE)) * 3
    with open(out / row["shard"], "r+b") as f:
        f.seek(HEADER + row["row"] * sample + 5)
        value = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([value ^ 0xFF]))


@pytest.mark.parametrize("kind", list(WRITERS))
def test_repair_reads_back_every_source_kind(tmp_path: Path, kind: str) -> None:
    items = records()
    config = setup(tmp_path, kind, items)
    out = tmp_path / "out"
    rows = by_id(latest(out, "manifest"))
    assert set(rows) == set(IDS)
    flip(out, rows["s1"])
    flip(out, rows["s4"])
    changed = dict(items, s4=picture(40))  # s4's record now holds other bytes
    for path in (tmp_path / "src").iterdir():
        if path.is_dir() and kind == "lmdb":
            continue
        path.unlink()
    WRITERS[kind](tmp_path / "src", changed)

    report = etl(["audit", str(out), "--repair", "--config", str(config), "-j", "1"], expect=1)

    decoded = {
        r["sample_id"]: r["how"] for r in report["repair"]["repaired"] if r["how"] != "copied"
    }
    assert decoded == {rows["s1"]["sample_id"]: "restored"}  # the rest of its shard is copied
    (failed,) = report["repair"]["failed"]
    assert failed["sample_id"] == rows["s4"]["sample_id"] and "changed" in failed["reason"]
    after = by_id(latest(out, "manifest"))
    stored = np.load(out / after["s1"]["shard"], mmap_mode="r")[after["s1"]["row"]]
    np.testing.assert_array_equal(stored, reference(items["s1"]))
    findings = report["repair"]["after"]["findings"]  # s4 stays, in its damaged shard
    assert {f["sample_id"] for f in findings if f["sample_id"]} == {rows["s4"]["sample_id"]}
    assert {f["shard"] for f in findings} == {rows["s4"]["shard"]}
    assert not [p.name for p in (out / "shards").iterdir() if p.name.startswith(".tmp")]


@pytest.mark.parametrize("kind", list(WRITERS))
def test_reject_sheets_read_back_every_source_kind(tmp_path: Path, kind: str) -> None:
    config = setup(tmp_path, kind, records())
    out = tmp_path / "out"
    sheet = tmp_path / "rejects.png"
    report = etl(
        ["show", str(out), "--rejects", "--config", str(config), "--out", str(sheet)], expect=0
    )
    cells = {c["source"].rsplit("/", 1)[-1].split(".", 1)[0]: c for c in report["cells"]}
    assert set(cells) == {TOO_SMALL, BROKEN} and cells[TOO_SMALL]["reason"] == "too_small"
    assert cells[TOO_SMALL]["decoded"] and not cells[BROKEN]["decoded"]
    assert cells[BROKEN]["note"]
    left, top, right, bottom = cells[TOO_SMALL]["box"]
    drawn = np.asarray(Image.open(sheet).convert("RGB"))[top:bottom, left:right]
    factor = (right - left) // 12
    expected = np.asarray(Image.open(io.BytesIO(tiny_png())).convert("RGB"))
    np.testing.assert_array_equal(drawn, expected.repeat(factor, 0).repeat(factor, 1))
    assert not [p.name for p in (out / "shards").iterdir() if p.name.startswith(".tmp")]
