"""Output faults a user meets: a read-only output, a full disk, a worker killed (the OOM killer).
Each is a real `etl run` in a subprocess: one line, exit 2, nothing half-written, and the
previous version still audits clean.

Read-only and full disks are real tmpfs mounts; without mount rights those tests are skipped.
An output folder without write permission is in test_permissions.py.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from etl.format.manifest import list_versions

CONFIG = """\
source: {{kind: folder, path: {source}}}
stages:
  - decode: {{mode: RGB}}
  - resize: {{size: [{side}, {side}]}}
{extra}output: {{dir: {out}, samples_per_shard: 8}}
run: {{n_jobs: 2}}
"""


def make_source(folder: Path, n: int, start: int = 0) -> None:
    rng = np.random.default_rng(start)
    for i in range(start, start + n):
        target = folder / f"c{i % 2}" / f"{i:04d}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (20, 20, 3), np.uint8)).save(buffer, "PNG")
        target.write_bytes(buffer.getvalue())


def write_config(base: Path, out: Path, side: int = 8, extra: str = "") -> Path:
    path = base / "pipeline.yaml"
    path.write_text(CONFIG.format(source=base / "src", out=out, side=side, extra=extra))
    return path


def etl(base: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "etl", *args],
        cwd=base,
        env={**os.environ, "PYTHONPATH": str(base)},
        capture_output=True,
        text=True,
        timeout=180,
    )


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """An empty 2 MiB tmpfs mount (skips where this process may not mount)."""
    point = tmp_path / "disk"
    point.mkdir()
    try:
        mount("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(point))
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs mount rights for a tmpfs")
    yield point
    subprocess.run(["umount", "-l", str(point)], capture_output=True)


def leftovers(out: Path) -> list[str]:
    return [
        p.name
        for folder in (out / "shards", out / "versions")
        if folder.is_dir()
        for p in folder.iterdir()
        if p.name.startswith(".tmp-")
    ]


@pytest.mark.slow
def test_a_read_only_output_is_one_line_and_leaves_the_version_intact(
    tmp_path: Path, tmpfs: Path
) -> None:
    make_source(tmp_path / "src", 10)
    config = write_config(tmp_path, tmpfs / "out")
    mount("-o", "remount,ro", str(tmpfs))
    line = one_error_line(etl(tmp_path, "run", str(config)))
    assert line == (
        f"error: {tmpfs / 'out'}: the output is on a read-only file system; "
        "choose a writable output.dir"
    )
    mount("-o", "remount,rw", str(tmpfs))
    assert not (tmpfs / "out").exists()

    assert etl(tmp_path, "run", str(config)).returncode == 0
    make_source(tmp_path / "src", 6, start=10)
    mount("-o", "remount,ro", str(tmpfs))
    line = one_error_line(etl(tmp_path, "run", str(config)))
    assert "read-only file system; choose a writable output.dir" in line
    done = etl(tmp_path, "audit", str(tmpfs / "out"))
    assert done.returncode == 0, done.stdout
    assert list_versions(tmpfs / "out") == [1]


def test_a_full_disk_is_one_line_nothing_half_written(tmp_path: Path, tmpfs: Path) -> None:
    """48x48x3 samples, 8 per shard: about 55 KiB a shard. 20 images fit in 2 MiB, 400 do not."""
    out = tmpfs / "out"
    config = write_config(tmp_path, out, side=48)
    make_source(tmp_path / "src", 20)
    assert etl(tmp_path, "run", str(config)).returncode == 0
    before = sorted(p.name for p in (out / "shards").iterdir())

    make_source(tmp_path / "src", 400, start=20)
    line = one_error_line(etl(tmp_path, "run", str(config)))
    assert line.startswith(f"error: {out}: no space left for the output (No space left on device")
    assert line.endswith(
        "free some space or choose another output.dir; nothing committed; "
        "the previous version 1 is intact"
    )
    assert list_versions(out) == [1] and not leftovers(out)
    assert sorted(p.name for p in (out / "shards").iterdir()) == before
    done = etl(tmp_path, "audit", str(out))
    assert done.returncode == 0 and "leftover" not in done.stdout, done.stdout


KILLER_STAGE = """\
import os, signal

def kill_on_bright(array):
    if array.mean() > 200:  # one image is white: the worker packing it dies like an OOM kill
        os.kill(os.getpid(), signal.SIGKILL)
    return array
"""


def test_a_worker_killed_mid_run_is_one_line(tmp_path: Path) -> None:
    make_source(tmp_path / "src", 12)
    white = io.BytesIO()
    Image.fromarray(np.full((20, 20, 3), 255, np.uint8)).save(white, "PNG")
    (tmp_path / "src" / "c0" / "white.png").write_bytes(white.getvalue())
    (tmp_path / "killer.py").write_text(KILLER_STAGE)
    out = tmp_path / "out"
    extra = '  - call: {function: "killer:kill_on_bright"}\n'
    line = one_error_line(etl(tmp_path, "run", str(write_config(tmp_path, out, extra=extra))))
    assert line.startswith("error: a worker process died ("), line
    assert "out of memory? lower run.n_jobs or output.shard_size" in line
    assert line.endswith("nothing committed; no version existed")
    assert list_versions(out) == [] and not leftovers(out)


def test_a_dry_run_with_a_full_temporary_folder_is_one_line(tmp_path: Path, tmpfs: Path) -> None:
    """A dry run with no output folder yet keeps its scratch files in TMPDIR: a full one is
    one line naming it and the fix, and nothing is left there or in the output."""
    make_source(tmp_path / "src", 1500)
    config = write_config(tmp_path, tmp_path / "out")
    stat = os.statvfs(tmpfs)
    free = stat.f_bavail * stat.f_frsize
    (tmpfs / "filler").write_bytes(b"\0" * (free - 16384))  # room for Python's probe, no more
    done = subprocess.run(
        [sys.executable, "-m", "etl", "run", str(config), "--dry-run"],
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmpfs)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    line = one_error_line(done)
    assert line.startswith(f"error: {tmpfs}: no space left for temporary files (")
    assert line.endswith("free some space there or set TMPDIR to a folder with room")
    assert sorted(p.name for p in tmpfs.iterdir()) == ["filler"]
    assert not (tmp_path / "out").exists()
