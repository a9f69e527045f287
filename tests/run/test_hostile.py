"""End to end on a hostile source tree (tests/helpers/hostile.py), the way a user meets it: `etl
run` in a subprocess under a time limit must not hang, crash or pack a lie; every entry gets its
expected outcome; a rerun is a no-op; `etl audit --source` and `etl show` agree on every odd name.

Outputs are checked with plain pyarrow, numpy and Pillow reads, not with the code under test.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc
import pytest
from PIL import Image, ImageOps

from tests.helpers.hostile import MAX_FILE_BYTES, HostileTree, make_hostile_tree

SIZE = 16
CONFIG = f"""\
source:
  kind: folder
  path: src
  max_file_bytes: {MAX_FILE_BYTES}
  split: {{val: 0.25}}
stages:
  - decode: {{mode: RGB}}
  - validate: {{duplicates: allow}}
  - resize: {{size: [{SIZE}, {SIZE}], mode: center_crop, filter: bilinear}}
output:
  dir: out
  samples_per_shard: 8
run:
  n_jobs: 2
"""


def spelt(raw: bytes) -> str:
    """The `source` docs/FORMAT.md promises for a raw relative path (written out here, apart
    from etl.format.names): printable UTF-8 as is, anything else as hex: + the bytes in hex."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + raw.hex()
    return text if text.isprintable() and not text.startswith("hex:") else "hex:" + raw.hex()


def etl(tree: HostileTree, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{tree.root.parent / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        [sys.executable, "-m", "etl", *args],
        cwd=tree.root.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,  # a hang fails the test instead of stalling the suite
    )


def read_table(path: Path) -> list[dict[str, object]]:
    with ipc.open_file(path) as reader:
        return reader.read_all().to_pylist()


@pytest.fixture
def tree(tmp_path: Path) -> HostileTree:
    made = make_hostile_tree(tmp_path)
    (tmp_path / "pipeline.yaml").write_text(CONFIG)
    yield made
    made.close()


@pytest.mark.slow
def test_hostile_tree_end_to_end(tree: HostileTree) -> None:
    done = etl(tree, "run", "pipeline.yaml", "--json")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    assert report["listed"] == len(tree.expected)
    assert report["samples_total"] + report["rejected"] == report["listed"]

    version = tree.root.parent / "out" / "versions" / "v000001"
    samples = read_table(version / "manifest.arrow")
    rejects = read_table(version / "rejects.arrow")
    got = {str(r["source"]): "packed" for r in samples}
    got.update({str(r["source"]): str(r["reason"]) for r in rejects})
    want = {spelt(raw): outcome for raw, outcome in tree.expected.items()}
    assert got == want

    # every packed sample holds the pixels of a plain Pillow decode of its file
    by_source = {spelt(raw): raw for raw in tree.expected}
    for row in samples:
        raw_path = os.fsencode(tree.root) + b"/" + by_source[str(row["source"])]
        with open(raw_path, "rb") as f:
            image = Image.open(io.BytesIO(f.read())).convert("RGB")
        expected = np.asarray(ImageOps.fit(image, (SIZE, SIZE), Image.Resampling.BILINEAR))
        shard = np.load(tree.root.parent / "out" / str(row["shard"]), mmap_mode="r")
        np.testing.assert_array_equal(shard[int(row["row"])], expected, str(row["source"]))

    again = etl(tree, "run", "pipeline.yaml", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["committed"] is False

    audit = etl(tree, "audit", "out", "--source", "src")
    assert audit.returncode == 0, audit.stdout + audit.stderr

    odd = [r for r in samples if str(r["source"]).startswith("hex:")]
    assert len(odd) >= 3  # latin-1, newline, tab, 'hex:' itself, the odd class
    sheet = tree.root.parent / "odd.png"
    ids = ",".join(str(r["sample_id"]) for r in odd)
    shown = etl(tree, "show", "out", "--ids", ids, "--out", str(sheet), "--json")
    assert shown.returncode == 0, shown.stderr
    assert {c["source"] for c in json.loads(shown.stdout)["cells"]} == {r["source"] for r in odd}

    assert tree.marker is not None and not tree.marker.exists(), "Ghostscript was run"
