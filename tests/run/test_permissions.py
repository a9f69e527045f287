"""Permission denied, as a user meets it: a class folder or a file they may not read, and an
output folder they may not write. Each is a real `etl run` in a subprocess.

Root reads and writes through permission bits (CAP_DAC_OVERRIDE); as root the run goes
through `setpriv` with those capabilities dropped from its bounding set, so the bits apply.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc
import pytest
from PIL import Image


def _without_override() -> list[str]:
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: permission bits cannot be made to apply")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]


def etl(base: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_without_override(), sys.executable, "-m", "etl", *args],
        cwd=base,
        capture_output=True,
        text=True,
        timeout=180,
    )


CONFIG = """\
source: {{kind: folder, path: {source}, split: {{}}}}
stages: [{{decode: {{}}}}, {{resize: {{size: [8, 8]}}}}]
output: {{dir: {out}, samples_per_shard: 4}}
run: {{n_jobs: 2}}
"""


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Path]:
    """src/{a,b,closed}/*.png; `closed` may not be listed, b/secret.png not read."""
    for folder in ("a", "b", "closed"):
        for i in range(3):
            path = tmp_path / "src" / folder / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            buffer = io.BytesIO()
            Image.fromarray(np.full((10, 10, 3), 40 * i, np.uint8)).save(buffer, "PNG")
            path.write_bytes(buffer.getvalue())
    (tmp_path / "src" / "b" / "secret.png").write_bytes((tmp_path / "src/b/0.png").read_bytes())
    os.chmod(tmp_path / "src" / "b" / "secret.png", 0)
    os.chmod(tmp_path / "src" / "closed", 0)
    yield tmp_path
    os.chmod(tmp_path / "src" / "closed", 0o755)  # so that pytest can remove it


def test_unreadable_folder_and_file_are_rejects_and_the_run_goes_on(tree: Path) -> None:
    (tree / "pipeline.yaml").write_text(CONFIG.format(source=tree / "src", out=tree / "out"))
    done = etl(tree, "run", "pipeline.yaml")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    with ipc.open_file(tree / "out" / "versions" / "v000001" / "rejects.arrow") as f:
        rejects = {r["source"]: (r["reason"], r["message"]) for r in f.read_all().to_pylist()}
    assert rejects == {
        "closed/": ("folder_unreadable", "cannot list this folder: Permission denied"),
        "b/secret.png": ("io_error", rejects["b/secret.png"][1]),
    }
    assert "Permission denied" in rejects["b/secret.png"][1]
    with ipc.open_file(tree / "out" / "versions" / "v000001" / "manifest.arrow") as f:
        packed = sorted(f.read_all().column("source").to_pylist())
    assert packed == ["a/0.png", "a/1.png", "a/2.png", "b/0.png", "b/1.png", "b/2.png"]


def test_an_output_folder_without_write_permission_is_one_line(tree: Path) -> None:
    locked = tree / "locked"
    locked.mkdir(mode=0o555)
    (tree / "pipeline.yaml").write_text(CONFIG.format(source=tree / "src", out=locked / "out"))
    done = etl(tree, "run", "pipeline.yaml")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == (
        f"error: {locked / 'out'}: permission denied writing the output; "
        "make output.dir writable for this user or choose another"
    )
    assert not (locked / "out").exists()
