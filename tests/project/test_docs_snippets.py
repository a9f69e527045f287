"""Every Python snippet of docs/ runs as written: a page's snippets in order, in one fresh
process, in a folder holding the sample data (`data/sample`) packed by the checked-in
pipeline.yaml into `artifacts/`, as a reader who ran the Quick start has it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from etl.config import load_config
from etl.run import pipeline
from etl.start.sample_data import make_sample_data

pytestmark = pytest.mark.slow  # end to end: see docs/architecture.md, "Test tiers"

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
NAMED = re.compile(r"<!-- snippet: [\w-]+ -->\n```python\n.*?```", re.S)
"""A snippet that runs alone, in its own process (tests/project/test_readme_snippets.py)."""


def pages() -> dict[str, str]:
    """Page name -> its Python snippets, joined in order (but the named ones)."""
    found = {}
    for page in sorted((ROOT / "docs").glob("*.md")):
        blocks = BLOCK.findall(NAMED.sub("", page.read_text()))
        if blocks:
            found[page.name] = "\n".join(blocks)
    return found


def test_the_snippets_are_found() -> None:
    assert set(pages()) >= {"FORMAT.md", "inspecting.md", "training.md"}


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder a reader has after the Quick start: sample data and its packed dataset."""
    folder = tmp_path_factory.mktemp("quick-start")
    make_sample_data(folder / "data" / "sample", per_class=6, seed=1)
    shutil.copy(ROOT / "pipeline.yaml", folder / "pipeline.yaml")
    report = pipeline.run(load_config(folder / "pipeline.yaml"))
    assert report.committed and report.packed_new > 0
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted(pages()))
def test_docs_snippets_run(quick_start: Path, tmp_path: Path, page: str) -> None:
    work = tmp_path / "work"
    shutil.copytree(quick_start, work)
    script = work / f"snippet_{page.removesuffix('.md').lower()}.py"
    script.write_text(pages()[page])
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert done.returncode == 0, f"{page}:\n{done.stderr[-3000:]}"
