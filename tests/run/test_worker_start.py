"""A pack worker starts light (#60): the config is validated once, in the `etl` process, and
the workers get plain data. Asked from inside the workers of a real `etl run` (a `call` stage
that writes down what its process has imported), and of each kind's read spec in a fresh
interpreter."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from etl.config import load_config
from etl.engine.fill import warm
from etl.run.worker import hash_chunk, pack_batch, pack_spec
from etl.sources.registry import spec_of

HEAVY = ("pydantic", "pyarrow", "yaml", "etl.config", "etl.sources.registry")
"""What a pack worker has no use for: the config models, the planner's Arrow, the registry
that imports every kind."""

SPY = f"""
import os, sys

def spy(array):
    found = [m for m in {HEAVY!r} if m in sys.modules]
    with open(os.path.join(os.environ["SPY_DIR"], f"{{os.getpid()}}.txt"), "w") as f:
        f.write(",".join(found))
    return array
"""


def write_source(base: Path, n: int) -> None:
    for i in range(n):
        folder = base / "src" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        Image.fromarray(np.full((20, 30, 3), i * 7 % 256, np.uint8)).save(buffer, "JPEG")
        (folder / f"{i:03d}.jpg").write_bytes(buffer.getvalue())


@pytest.mark.timeout(180)
def test_the_workers_of_a_run_never_import_the_config_models(tmp_path: Path) -> None:
    write_source(tmp_path, 40)
    (tmp_path / "spymodule.py").write_text(SPY)
    (tmp_path / "pipeline.yaml").write_text(
        "source: {kind: folder, path: src}\n"
        "stages: [decode: {}, resize: {size: [8, 8]}, call: {function: 'spymodule:spy'}]\n"
        "output: {dir: out, samples_per_shard: 5}\n"
        "run: {n_jobs: 2, backend: loky}\n"
    )
    spies = tmp_path / "spies"
    spies.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SPY_DIR": str(spies)}
    done = subprocess.run(
        [sys.executable, "-m", "etl", "run", "pipeline.yaml", "-q"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = {path.stem: path.read_text() for path in spies.iterdir()}
    assert seen, "no worker ran the call stage"
    assert str(os.getpid()) not in seen
    assert all(found == "" for found in seen.values()), seen
    # and the run packed what it should: 40 samples, as a plain read of the manifest says
    import pyarrow.ipc as ipc

    versions = sorted((tmp_path / "out" / "versions").iterdir())
    with ipc.open_file(versions[-1] / "manifest.arrow") as manifest:
        assert manifest.read_all().num_rows == 40


def imported_by_unpickling(payload: Any, tmp_path: Path) -> list[str]:
    """Which of HEAVY a fresh interpreter imports to unpickle `payload`."""
    path = tmp_path / "payload.pickle"
    path.write_bytes(pickle.dumps(payload))
    code = (
        "import pickle, sys\n"
        f"pickle.loads(open({str(path)!r}, 'rb').read())\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return [m for m in done.stdout.strip().split(",") if m]


@pytest.mark.timeout(120)
def test_what_each_phase_sends_a_worker_is_plain_data(tmp_path: Path) -> None:
    write_source(tmp_path, 2)
    (tmp_path / "pipeline.yaml").write_text(
        "source: {kind: folder, path: src}\n"
        "stages: [decode: {}, validate: {min_size: [4, 4]}, resize: {size: [8, 8]}]\n"
        "output: {dir: out, codec: jpeg}\n"
    )
    config = load_config(tmp_path / "pipeline.yaml")
    assert imported_by_unpickling((pack_batch, pack_spec(config)), tmp_path) == []
    assert imported_by_unpickling((hash_chunk, spec_of(config.source)), tmp_path) == []
    assert imported_by_unpickling((warm,), tmp_path) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "source",
    [
        "{kind: listing, path: list.csv}",
        "{kind: python, function: 'records:make'}",
        "{kind: webdataset, path: tars}",
        "{kind: parquet, path: tables}",
        "{kind: lmdb, path: env, label_field: label, allow_pickle: true}",
    ],
)
def test_every_kind_reads_without_the_config_models(source: str, tmp_path: Path) -> None:
    (tmp_path / "list.csv").write_text("path,label\n")
    for folder in ("tars", "tables"):
        (tmp_path / folder).mkdir()
    stages = "stages: [decode: {}, resize: {size: [8, 8]}]"
    (tmp_path / "pipeline.yaml").write_text(f"source: {source}\n{stages}\noutput: {{dir: out}}\n")
    config = load_config(tmp_path / "pipeline.yaml")
    assert imported_by_unpickling(spec_of(config.source), tmp_path) == []
