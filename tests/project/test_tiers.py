"""The fast tier (`make check`) is a selection by marker: every test not marked `slow` (or
`cuda`) runs in it, so a new test file without a marker is in the fast tier, and every package
keeps unit tests there. The end-to-end, fuzzing and trainer tests are marked slow."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAST = "not slow and not cuda"

END_TO_END = {
    "tests/format/test_format_fuzz.py": "fuzzing",
    "tests/loaders/loader/test_trainers.py": "trainers",
    "tests/run/test_cluster.py": "a Dask cluster",
    "tests/run/test_interrupt.py": "signals to whole runs",
    "tests/project/test_benchmarks_smoke.py": "benchmarks",
    "tests/project/test_example_train.py": "the example's training",
}
"""Files that are end to end as a whole: none of their tests may be in the fast tier."""


def collected(marker: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", marker, "-p", "no:xdist"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_make_check_selects_by_marker() -> None:
    """`make check` runs the marker expression checked here: a test is in the fast tier unless
    it is marked out, never by being listed in."""
    target = re.search(r"^check:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert target is not None and f'-m "{FAST}"' in target.group(1)


def test_the_fast_tier_covers_every_package_and_leaves_out_end_to_end() -> None:
    fast = collected(FAST)
    files = {line.split("::")[0] for line in fast}
    folders = {Path(f).parts[1] for f in files}
    packages = {p.name for p in (ROOT / "tests").iterdir() if (p / "__init__.py").is_file()}
    packages -= {"helpers"}
    assert packages <= folders, f"no fast test in tests/{sorted(packages - folders)}"
    assert not files & set(END_TO_END), sorted(files & set(END_TO_END))
    assert len(fast) > 600  # the unit tests: most of the suite by count


def test_an_unmarked_test_file_is_in_the_fast_tier(tmp_path: Path) -> None:
    """A test written without a marker is selected by the fast tier's expression, and one
    marked slow is not: the selection pytest makes, on a file made here."""
    (tmp_path / "test_new.py").write_text(
        "import pytest\n\ndef test_plain():\n    pass\n\n"
        "@pytest.mark.slow\ndef test_marked():\n    pass\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: x\n    cuda: x\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", FAST, "-p", "no:xdist",
         "-p", "no:cacheprovider", str(tmp_path / "test_new.py")],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    names = [line.split("::")[-1] for line in proc.stdout.splitlines() if "::" in line]
    assert names == ["test_plain"], proc.stdout + proc.stderr
