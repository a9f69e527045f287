"""The training snippets of the README and of docs/training.md's "Trainers" run as written,
each in a fresh process, on a packed dataset with a train and a val split in `artifacts/` of
the working folder: a snippet that drifts from the API, or from a trainer's, fails here."""

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
PAGES = (ROOT / "README.md", ROOT / "docs" / "training.md")
SNIPPET = re.compile(r"<!-- snippet: ([\w-]+) -->\n```python\n(.*?)```", re.S)
EXPECTED = {
    "README.md": {"plain-loop"},
    "training.md": {"lightning", "accelerate", "transformers", "keras", "ignite", "ray"},
}
SAVED = {"plain-loop": "last.pt", "accelerate": "checkpoint", "transformers": "runs",
         "ignite": "checkpoints", "ray": "ray_results"}  # fmt: skip
"""What each snippet leaves in its folder."""


def snippets() -> dict[str, str]:
    return {name: code for page in PAGES for name, code in SNIPPET.findall(page.read_text())}


def test_the_pages_have_the_training_forms() -> None:
    for page in PAGES:
        assert {name for name, _ in SNIPPET.findall(page.read_text())} == EXPECTED[page.name]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set().union(*EXPECTED.values())))
def test_training_snippet_runs(tmp_path: Path, name: str) -> None:
    make_packed(
        tmp_path / "artifacts", shard_sizes=(40, 30, 50),
        split_of=lambda i: "val" if i % 5 == 0 else "train",
    )  # fmt: skip
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
    saved = SAVED.get(name)
    assert saved is None or (tmp_path / saved).exists()
