"""SIGINT and SIGTERM during a real `etl run`, as a terminal or a scheduler sends them: one line,
exit 130 or 143, no commit after the signal, no process of the run left, an audit that passes.

The run packs through a slow `call` stage, and the signal goes out once a shard of the new
version is on disk, so it always lands mid-pack (no sleeps tuned to this machine's speed).
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc
import pytest
from PIL import Image

from etl.config import RunConfig
from etl.engine.parallel import parallel_map

pytestmark = pytest.mark.slow  # end to end: see docs/architecture.md, "Test tiers"

SLOW_STAGE = """\
import time

def slow(array):
    time.sleep(0.05)
    return array
"""

CONFIG = """\
source: {kind: folder, path: src}
stages:
  - decode: {mode: RGB}
  - resize: {size: [8, 8]}
  - call: {function: "slowstage:slow"}
output: {dir: out, samples_per_shard: 4}
run: {n_jobs: 2}
"""
CALL_STAGE = '  - call: {function: "slowstage:slow"}\n'


def make_source(base: Path, n: int) -> None:
    for i in range(n):
        folder = base / "src" / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        Image.fromarray(np.full((12, 12, 3), i % 256, np.uint8)).save(buffer, "PNG")
        (folder / f"{i:03d}.png").write_bytes(buffer.getvalue())
    (base / "slowstage.py").write_text(SLOW_STAGE)
    (base / "pipeline.yaml").write_text(CONFIG)


def etl(base: Path, *args: str, **popen: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(base)}
    return subprocess.Popen(
        [sys.executable, "-m", "etl", *args],
        cwd=base,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        **popen,  # type: ignore[arg-type]
    )


def wait_for_shard(base: Path, version: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not list((base / "out" / "shards").glob(f"v{version:06d}-*.npy")):
        assert process.poll() is None, "the run ended before it was interrupted"
        assert time.monotonic() < deadline, "no shard appeared"
        time.sleep(0.02)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def ctrl_c_once(
    mark: Path, run: subprocess.Popen[str], timeout: float = 60, signum: int = signal.SIGINT
) -> str:
    """Once `mark` exists, SIGINT (or `signum`) to the run's whole group, as a terminal's
    Ctrl-C (or a scheduler's SIGTERM): its stderr, after checking it exited 128 + signum."""
    deadline = time.monotonic() + 60
    while not mark.exists():
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.01)
    os.killpg(run.pid, signum)
    _, stderr = run.communicate(timeout=timeout)
    assert run.returncode == 128 + signum, stderr
    return stderr


def assert_group_gone(pgid: int) -> None:
    deadline = time.monotonic() + 10
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(pgid), "a process of the stopped run is still alive"


def versions(base: Path) -> list[str]:
    return sorted(p.name for p in (base / "out" / "versions").iterdir())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "to_group", "code"),
    [
        (signal.SIGINT, True, 130),  # Ctrl-C: the terminal signals the whole group
        (signal.SIGTERM, True, 143),
        (signal.SIGTERM, False, 143),  # `kill PID`: the workers get nothing themselves
    ],
)
def test_signal_mid_pack_commits_nothing_and_leaves_nothing(
    tmp_path: Path, signum: int, to_group: bool, code: int
) -> None:
    make_source(tmp_path, 60)
    first = etl(tmp_path, "run", "pipeline.yaml", "-q")
    assert first.wait(timeout=180) == 0, first.communicate()[1]
    manifest_before = (tmp_path / "out" / "versions" / "v000001" / "manifest.arrow").read_bytes()

    run = etl(tmp_path, "run", "pipeline.yaml", "-q", "--rebuild")
    wait_for_shard(tmp_path, 2, run)
    (os.killpg if to_group else os.kill)(run.pid, signum)
    _, stderr = run.communicate(timeout=30)

    assert run.returncode == code, stderr
    assert stderr.strip() == "interrupted: nothing committed; the previous version 1 is intact"
    assert_group_gone(run.pid)

    assert versions(tmp_path) == ["v000001"]
    assert (tmp_path / "out" / "versions" / "v000001" / "manifest.arrow").read_bytes() == (
        manifest_before
    )
    left = sorted(p.name for p in (tmp_path / "out" / "shards").iterdir())
    assert all(name.startswith("v000001-") for name in left), left
    with ipc.open_file(tmp_path / "out" / "versions" / "v000001" / "manifest.arrow") as f:
        assert f.read_all().num_rows == 60

    audit = etl(tmp_path, "audit", "out")
    assert audit.wait(timeout=120) == 0, audit.communicate()


@pytest.mark.slow
def test_audit_after_kill_9_names_leftovers_as_notes(tmp_path: Path) -> None:
    """Nothing can clean up after SIGKILL: the audit still passes on the committed version and
    names the uncommitted shards as leftovers that the next run removes."""
    make_source(tmp_path, 60)
    assert etl(tmp_path, "run", "pipeline.yaml", "-q").wait(timeout=180) == 0
    run = etl(tmp_path, "run", "pipeline.yaml", "-q", "--rebuild")
    wait_for_shard(tmp_path, 2, run)
    os.killpg(run.pid, signal.SIGKILL)
    run.communicate(timeout=30)

    audit = etl(tmp_path, "audit", "out")
    stdout, stderr = audit.communicate(timeout=120)
    assert audit.returncode == 0, stdout + stderr
    assert "leftover" in stdout and "v000002-" in stdout, stdout

    rerun = etl(tmp_path, "run", "pipeline.yaml", "-q")
    assert rerun.wait(timeout=180) == 0
    left = sorted(p.name for p in (tmp_path / "out" / "shards").iterdir())
    assert all(name.startswith("v000001-") for name in left), left


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["loky", "dask"])
def test_workers_exit_when_the_parent_is_killed(tmp_path: Path, backend: str) -> None:
    """`kill -9 PID` (or the OOM killer) reaches the parent alone: its workers must notice and
    exit within seconds, with the resource trackers they hold open."""
    if backend == "dask":
        pytest.importorskip("distributed")
    make_source(tmp_path, 60)
    config = (tmp_path / "pipeline.yaml").read_text()
    (tmp_path / "pipeline.yaml").write_text(
        config.replace("n_jobs: 2}", f"n_jobs: 2, backend: {backend}}}")
    )
    run = etl(tmp_path, "run", "pipeline.yaml", "-q")
    wait_for_shard(tmp_path, 1, run)
    os.kill(run.pid, signal.SIGKILL)
    run.communicate(timeout=30)
    assert_group_gone(run.pid)


PAUSING_ETL = """\
import os, sys, time, pathlib

import etl.run.execute, etl.format.commit, etl.run.phases, etl.run.pipeline
import etl.cli.run
from etl.cli import main

MARK = pathlib.Path(os.environ["PAUSE_MARK"])


def pausing(fn):
    def paused(*args, **kwargs):
        MARK.touch()  # the test signals now, while this phase is under way
        time.sleep(3)
        return fn(*args, **kwargs)
    return paused


PHASES = {
    "listing": (etl.run.phases, "list_sources"),
    "hashing": (etl.run.execute, "hash_sources"),
    "packing on threads": (etl.run.execute, "pack_batch"),
    "committing": (etl.format.commit, "write_record"),
    "after the commit": (etl.cli.run, "_print_report"),
    "loading the config": (etl.cli.run, "load_config"),
    "opening the previous version": (etl.run.pipeline, "open_previous"),
    "planning": (etl.run.pipeline, "plan_run"),
    "writing the manifest": (etl.format.commit, "_write_rows"),
}
if os.environ["PAUSE_IN"] == "exit handlers":  # where loky's joins its workers
    import threading

    threading._register_atexit(pausing(lambda: None))
else:
    module, name = PHASES[os.environ["PAUSE_IN"]]
    setattr(module, name, pausing(getattr(module, name)))
main()  # as the etl command calls it: its arguments from sys.argv
"""


PHASES = [
    "loading the config", "opening the previous version", "listing", "hashing", "planning",
    "packing on threads", "writing the manifest", "committing", "after the commit",
    "exit handlers",
]  # fmt: skip
"""Each moment of a run the harness pauses in; all take a Ctrl-C, those of `TERMINATED` a
scheduler's SIGTERM too: 20 moments in all with the other tests here (mid-pack, while
workers start, a second Ctrl-C)."""
TERMINATED = ["listing", "committing", "after the commit", "exit handlers"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("phase", "signum"),
    [(p, signal.SIGINT) for p in PHASES] + [(p, signal.SIGTERM) for p in TERMINATED],
)
def test_ctrl_c_in_each_phase(tmp_path: Path, phase: str, signum: int) -> None:
    """A harness pauses the run inside one phase (no sleeps tuned to this machine) and the
    terminal's SIGINT reaches the whole group there. Before the commit: nothing committed.
    During it: the version is published whole, then the run stops and says so. Packing: a
    small run without user code packs on threads in the `etl` process (NOTE [ head start ]),
    paused inside a task; the threads finish it before the run cleans up. After the commit
    (printing its summary) and in the exit handlers (loky's among them: NOTE [ signals after
    the command ]): one line and 130, never a traceback nor 0."""
    make_source(tmp_path, 12)
    if phase == "packing on threads":
        config = (tmp_path / "pipeline.yaml").read_text()
        (tmp_path / "pipeline.yaml").write_text(config.replace(CALL_STAGE, ""))
    assert etl(tmp_path, "run", "pipeline.yaml", "-q").wait(timeout=180) == 0
    new = io.BytesIO()
    Image.fromarray(np.full((12, 12, 3), 200, np.uint8)).save(new, "PNG")  # a new sample
    (tmp_path / "src" / "c0" / "999.png").write_bytes(new.getvalue())
    (tmp_path / "pausing_etl.py").write_text(PAUSING_ETL)
    mark = tmp_path / "paused"
    run = subprocess.Popen(
        [
            sys.executable,
            str(tmp_path / "pausing_etl.py"),
            "run",
            "pipeline.yaml",
            *([] if phase == "after the commit" else ["-q"]),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path), "PAUSE_IN": phase, "PAUSE_MARK": str(mark)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    stderr = ctrl_c_once(mark, run, signum=signum)
    assert "Traceback" not in stderr, stderr
    if phase in ("writing the manifest", "committing"):  # the publish is not cut short
        assert stderr.strip() == "interrupted: version 2 was committed"
        assert versions(tmp_path) == ["v000001", "v000002"]
    elif phase == "after the commit":  # the summary's bars, then the one line
        assert stderr.strip().splitlines()[-1] == "interrupted", stderr
        assert versions(tmp_path) == ["v000001", "v000002"]
    elif phase == "exit handlers":
        assert stderr.strip() == "interrupted (the command had ended)", stderr
        assert versions(tmp_path) == ["v000001", "v000002"]
    elif phase == "loading the config":  # before the run began: nothing of it to say
        assert stderr.strip() == "interrupted", stderr
        assert versions(tmp_path) == ["v000001"]
    else:
        assert stderr.strip() == "interrupted: nothing committed; the previous version 1 is intact"
        assert versions(tmp_path) == ["v000001"]
    assert_group_gone(run.pid)
    audit = etl(tmp_path, "audit", "out")
    stdout, _ = audit.communicate(timeout=120)
    assert audit.returncode == 0 and "leftover" not in stdout, stdout


STARTING_WORKER = """\
import os
import sys
import time

if sys.orig_argv[1:3] != ["-m", "etl"]:  # a process the run started, still in Python's start-up
    open(os.environ["STARTING_MARK"], "a").close()
    time.sleep(1.5)
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["loky", "dask"])
def test_ctrl_c_while_workers_start_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Ctrl-C reaches the whole group while worker processes are still importing `site`
    (before any code of ours runs in them: held there by a sitecustomize): one line, exit
    130, and no worker's 'Fatal Python error' or KeyboardInterrupt on the terminal."""
    make_source(tmp_path, 12)
    config = (
        (tmp_path / "pipeline.yaml")
        .read_text()
        .replace("n_jobs: 2", f"n_jobs: 2, backend: {backend}")
    )
    (tmp_path / "pipeline.yaml").write_text(config)
    (tmp_path / "sitecustomize.py").write_text(STARTING_WORKER)
    mark = tmp_path / "starting"
    monkeypatch.setenv("STARTING_MARK", str(mark))
    run = etl(tmp_path, "run", "pipeline.yaml", "-q")
    stderr = ctrl_c_once(mark, run, timeout=120)
    assert stderr.strip() == "interrupted: nothing committed; no version existed", stderr
    assert_group_gone(run.pid)


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_without_damage(tmp_path: Path) -> None:
    make_source(tmp_path, 60)
    assert etl(tmp_path, "run", "pipeline.yaml", "-q").wait(timeout=180) == 0
    run = etl(tmp_path, "run", "pipeline.yaml", "-q", "--rebuild")
    wait_for_shard(tmp_path, 2, run)
    os.killpg(run.pid, signal.SIGINT)
    os.killpg(run.pid, signal.SIGINT)
    _, stderr = run.communicate(timeout=30)
    assert run.returncode == 130 and "Traceback" not in stderr, stderr
    assert_group_gone(run.pid)
    # NOTE: the second signal may land while the first one's clean-up runs, and then ends the
    # process before it is done (see NOTE [signals]): hidden leftovers may stay, for the next
    # run to remove. What must hold is that no version but the first exists.
    assert [v for v in versions(tmp_path) if not v.startswith(".")] == ["v000001"]
    audit = etl(tmp_path, "audit", "out")
    stdout, _ = audit.communicate(timeout=120)
    assert audit.returncode == 0, stdout
    (tmp_path / "out" / "versions" / ".tmp-scratch-as-if-left").mkdir(exist_ok=True)
    assert etl(tmp_path, "run", "pipeline.yaml", "-q").wait(timeout=180) == 0
    assert versions(tmp_path) == ["v000001"], "the next run left the leftovers"


def _slow_write(task: int, folder: str) -> int:
    time.sleep(0.3 if task == 0 else 1.5)
    Path(folder, f"done-{task}").write_text("written")
    return task


def test_leaving_the_result_loop_stops_the_workers_at_once(tmp_path: Path) -> None:
    """An exception in the loop over results (a signal lands there as often as in joblib)
    stops the workers before it propagates: nothing is written after the run cleaned up."""
    tasks, run = list(range(6)), RunConfig(n_jobs=2)
    with (
        pytest.raises(RuntimeError, match="stop here"),
        parallel_map(_slow_write, tasks, run, str(tmp_path)) as results,
    ):
        for _ in results:
            raise RuntimeError("stop here")
    at_exit = sorted(p.name for p in tmp_path.iterdir())
    time.sleep(2.5)  # the other tasks would have finished by now
    assert sorted(p.name for p in tmp_path.iterdir()) == at_exit == ["done-0"]
