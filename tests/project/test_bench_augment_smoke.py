"""The augmentation benchmark still runs end to end, GPU sections included (on the CPU here):
`python -m benchmarks.load.augment --tiny --device cpu`. Its numbers mean nothing at this
size; the exactness column does: the batched path must match the per-sample reference."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end to end: see docs/architecture.md, "Test tiers"

REPO = Path(__file__).resolve().parents[2]


def test_bench_augment_tiny() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.load.augment", "--tiny", "--device", "cpu"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout
    assert "| contender | samples/s | vs per-sample loop |" in out
    assert "| feed | first batch ms | samples/s after it | of copy limit |" in out
    batched = re.search(r"one grid_sample, the CUDA path \| [\d,]+ \| [\d.]+x \| ([\d.e-]+) /", out)
    assert batched is not None and float(batched.group(1)) < 0.01, out
