"""examples/train.py runs end to end (one process, and two under torchrun) on a tiny dataset."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.packed import make_packed

pytestmark = pytest.mark.slow  # end to end: see docs/architecture.md, "Test tiers"

ROOT = Path(__file__).resolve().parents[2]
ACCURACY = re.compile(r"^final validation accuracy: (\d\.\d{3}) on \d+ samples$", re.MULTILINE)


def run(command: list[str], data: Path, *extra: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}  # aborts say where
    args = ["--data", str(data), "--epochs", "2", "--batch-size", "8", *extra]
    done = subprocess.run(
        [*command, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-6000:]
    return done.stdout


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    make_packed(root, shard_sizes=(20, 15, 25), sample_shape=(16, 16, 3))
    return root


@pytest.mark.slow
def test_train_example_prints_an_accuracy(tiny: Path) -> None:
    out = run([sys.executable, "examples/train.py", "--workers", "1"], tiny)
    assert len(ACCURACY.findall(out)) == 1
    assert out.count("val accuracy") == 2


@pytest.mark.slow
def test_train_example_under_torchrun_prints_once(tiny: Path) -> None:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    out = run([*torchrun, "--nproc_per_node=2", "examples/train.py"], tiny)
    assert len(ACCURACY.findall(out)) == 1, "only rank 0 prints"


@pytest.mark.slow
def test_train_example_resumes_from_its_checkpoint(tiny: Path, tmp_path: Path) -> None:
    saved = str(tmp_path / "run.pt")
    command = [sys.executable, "examples/train.py", "--workers", "1", "--checkpoint", saved]
    out = run(command, tiny, "--checkpoint-every", "3", "--stop-after", "5")
    assert "stopped after 5 steps" in out and not ACCURACY.findall(out)
    out = run(command, tiny)
    assert "resumed epoch 1 after 24 samples" in out, "3 steps of 8 were saved, not 4"
    assert len(ACCURACY.findall(out)) == 1 and out.count("val accuracy") == 2


@pytest.fixture(scope="module")
def tiny_aspect(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample data packed with each picture's aspect ratio kept (format version 2)."""
    root = tmp_path_factory.mktemp("aspect")
    etl = [sys.executable, "-m", "etl"]
    subprocess.run(
        [*etl, "sample-data", str(root / "data"), "--per-class", "8", "--quiet"], check=True
    )
    (root / "pipeline.yaml").write_text(
        "source: {kind: folder, path: data, split: {val: 0.25}}\n"
        "stages:\n  - decode: {}\n  - resize: {mode: keep_aspect, shorter: 16, longer: 24}\n"
        "output: {dir: out}\nrun: {n_jobs: 1}\n"
    )
    subprocess.run([*etl, "run", str(root / "pipeline.yaml"), "--quiet"], check=True)
    return root / "out"


@pytest.mark.slow
def test_train_example_trains_on_samples_that_keep_their_aspect(tiny_aspect: Path) -> None:
    out = run([sys.executable, "examples/train.py", "--workers", "1"], tiny_aspect)
    assert len(ACCURACY.findall(out)) == 1
    assert out.count("val accuracy") == 2
