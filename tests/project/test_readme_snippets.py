"""The README's training snippets run as written, each in a fresh process, on a packed dataset
in `artifacts/` of the working folder: a snippet that drifts from the API fails here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.packed import make_packed

pytestmark = pytest.mark.slow  # end to end: see docs/architecture.md, "Test tiers"

README = Path(__file__).resolve().parents[2] / "README.md"
SNIPPET = re.compile(r"<!-- snippet: ([\w-]+) -->\n```python\n(.*?)```", re.S)
EXPECTED = {"plain-loop", "lightning", "accelerate"}


def snippets() -> dict[str, str]:
    return dict(SNIPPET.findall(README.read_text()))


def test_the_readme_has_the_three_training_forms() -> None:
    assert set(snippets()) == EXPECTED


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_readme_snippet_runs(tmp_path: Path, name: str) -> None:
    make_packed(tmp_path / "artifacts", shard_sizes=(40, 30, 50))
    script = tmp_path / f"snippet_{name.replace('-', '_')}.py"  # not the package names
    script.write_text(snippets()[name])
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    saved = {"plain-loop": "last.pt", "accelerate": "checkpoint", "lightning": None}[name]
    assert saved is None or (tmp_path / saved).exists()
