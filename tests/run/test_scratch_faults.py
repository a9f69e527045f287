"""A run's own scratch files, damaged between the moment the run writes them and the moment it
reads them back (another process, a failing disk): the run stops with one line naming the
file, commits nothing, keeps the previous version intact and leaves no scratch behind. Never a
traceback, never rows that were not written.

The run executes in a subprocess with spilling forced (tiny runs, tiny fan-in), and the
damage is done right after the file is sealed (see NOTE [ sealed scratch ] in etl/format/spill.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.ipc as ipc
import pytest

pytestmark = pytest.mark.slow

DAMAGE = r"""
import json, os, sys
from pathlib import Path
import etl.format.spill as spill

spill.RUN_ROWS, spill.FAN_IN = 2, 2  # every few rows a run on disk, every two runs a merge
prefix, how = sys.argv[2], sys.argv[3]
real_seal = spill.Seals.seal
damaged = []

def seal(self, path):
    real_seal(self, path)
    if damaged or not path.name.startswith(prefix):
        return
    damaged.append(str(path))
    data = path.read_bytes()
    if how == "flip":
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :])
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.unlink()

spill.Seals.seal = seal
from etl.cli import main
code = 0
try:
    main(["run", sys.argv[1], "--quiet"])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "damaged": damaged}))
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("scratch")
    subprocess.run(
        [sys.executable, "-m", "etl", "sample-data", str(work / "src"), "--per-class", "5", "-q"],
        check=True,
        timeout=120,
    )
    (work / "pipeline.yaml").write_text(
        "source: {kind: folder, path: src}\n"
        "stages:\n  - decode: {mode: RGB}\n  - resize: {size: [8, 8], mode: center_crop}\n"
        "output: {dir: ds, samples_per_shard: 4}\nrun: {n_jobs: 1, backend: sequential}\n"
    )
    subprocess.run(
        [sys.executable, "-m", "etl", "run", str(work / "pipeline.yaml"), "--quiet"],
        check=True,
        timeout=120,
    )
    return work


@pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
@pytest.mark.parametrize("prefix", ["listing", "bucket", "stored", "reused", "rejects"])
def test_a_scratch_file_damaged_mid_run_stops_the_run_in_one_line(
    base: Path, tmp_path: Path, prefix: str, how: str
) -> None:
    work = tmp_path / "work"
    shutil.copytree(base, work)
    image = sorted((work / "src").rglob("*.png"))[0]
    shutil.copy(image, image.with_name("added_copy.png"))  # the run has something to pack
    done = subprocess.run(
        [sys.executable, "-c", DAMAGE, str(work / "pipeline.yaml"), prefix, how],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert "Traceback" not in done.stderr, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["damaged"], f"no {prefix} scratch file was written: nothing was tested"
    assert result["code"] == 2, done.stderr
    said = done.stderr.strip()
    assert "\n" not in said and Path(result["damaged"][0]).name in said, said
    assert "changed after it was written" in said and "nothing committed" in said, said
    versions = sorted(p.name for p in (work / "ds" / "versions").iterdir())
    assert versions == ["v000001"], "no version committed, no scratch folder left"
    check = subprocess.run(
        [sys.executable, "-m", "etl", "audit", str(work / "ds"), "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr


SPOOL_DAMAGE = r"""
import json, sys
from pathlib import Path
import etl.sources.readers as readers

real_close = readers.SpoolWriter.close

def close(self):
    real_close(self)
    data = bytearray(self.path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of one record, after the records were listed
    self.path.write_bytes(bytes(data))

readers.SpoolWriter.close = close
from etl.cli import main
try:
    main(["run", sys.argv[1], "--quiet", "--json"])
except SystemExit as exc:
    print(json.dumps({"exit": exc.code}))
"""

RECORDS = """
import io
from PIL import Image

def records():
    for i in range(6):
        image = Image.new("RGB", (16, 12), (40 * i, 255 - 40 * i, 7 * i))
        data = io.BytesIO()
        image.save(data, format="PNG")
        yield {"id": f"r{i}", "data": data.getvalue(), "label": "abc"[i % 3]}
"""


def test_a_spooled_record_damaged_mid_run_is_a_changed_reject_naming_it(tmp_path: Path) -> None:
    """A Python source's records wait in a spool file until the workers read them: one byte
    changed there is caught by the content hash taken when the record was listed."""
    (tmp_path / "my_records.py").write_text(RECORDS)
    (tmp_path / "pipeline.yaml").write_text(
        'source: {kind: python, function: "my_records:records"}\n'
        "stages:\n  - decode: {mode: RGB}\n  - resize: {size: [8, 8], mode: center_crop}\n"
        "output: {dir: ds}\nrun: {n_jobs: 1, backend: sequential}\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", SPOOL_DAMAGE, str(tmp_path / "pipeline.yaml")],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert "Traceback" not in done.stderr, done.stderr
    *summary, exit_line = done.stdout.strip().splitlines()
    assert json.loads(exit_line) == {"exit": 0}, done.stderr
    report = json.loads("\n".join(summary))
    assert report["rejects_by_reason"] == {"changed": 1}, report
    assert report["packed_new"] == 5
    rejects = ipc.open_file(tmp_path / "ds/versions/v000001/rejects.arrow").read_all()
    named = rejects.select(["source", "reason"]).to_pylist()
    assert len(named) == 1 and named[0]["reason"] == "changed"
    assert named[0]["source"] in {f"r{i}" for i in range(6)}
