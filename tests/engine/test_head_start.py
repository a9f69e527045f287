"""NOTE [ head start ] (etl.engine.parallel): threads here take tasks until the loky workers
have started, or all of them when the workers are never begun; every task runs once, and
leaving early stops and joins the threads."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from etl.config import RunConfig
from etl.engine import parallel
from etl.engine.parallel import Starting, parallel_map

RUN = RunConfig(n_jobs=2, backend="auto")
PARENT = os.getpid()
WORKERS: Starting | None = None
"""The Starting a test's tasks wait on while they run here (set by the test)."""


def where(index: int) -> tuple[int, int, str]:
    """The task: where it ran. Here, it holds its thread until the workers have started, so
    that each thread takes exactly one task before the workers take the rest."""
    if os.getpid() == PARENT and WORKERS is not None:
        while not WORKERS.started:
            time.sleep(0.01)
    return index, os.getpid(), threading.current_thread().name


def head_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("etl-head-")]


def test_threads_take_tasks_until_the_workers_have_started() -> None:
    global WORKERS
    starting = Starting(RUN)
    WORKERS = starting
    try:
        with parallel.workers_starting(RUN, wanted=False) as unused:
            assert not unused.started  # never begun: waiting for it at the end is free
        starting.begin()
        with parallel_map(where, range(30), RUN, starting=starting) as results:
            found = list(results)
        starting.wait()
    finally:
        WORKERS = None
    assert sorted(index for index, _, _ in found) == list(range(30))
    here = [(index, name) for index, pid, name in found if pid == PARENT]
    assert len(here) == 2, here  # one task for each of the 2 threads, then the workers
    assert all(name.startswith("etl-head-") for _, name in here)
    assert {pid for _, pid, _ in found} - {PARENT}, "the workers took the rest"
    assert not head_threads()


def test_a_run_that_never_begins_its_workers_runs_every_task_on_threads() -> None:
    with parallel_map(where, range(40), RUN, starting=Starting(RUN)) as results:
        found = list(results)
    assert sorted(index for index, _, _ in found) == list(range(40))
    assert {pid for _, pid, _ in found} == {PARENT}
    names = {name for _, _, name in found}
    assert names and len(names) <= parallel.worker_count(RUN)
    assert all(name.startswith("etl-head-") for name in names)
    assert not head_threads()


STARTED: list[int] = []


def fails_at_five(index: int) -> int:
    STARTED.append(index)
    time.sleep(0.01)
    if index == 5:
        raise ValueError(f"task {index} failed")
    return index


def test_a_failing_task_stops_the_threads_and_is_raised() -> None:
    STARTED.clear()
    with (
        pytest.raises(ValueError, match="task 5 failed"),
        parallel_map(fails_at_five, range(1000), RUN, starting=Starting(RUN)) as results,
    ):
        for _ in results:
            pass
    assert not head_threads()
    taken = len(STARTED)
    assert 6 <= taken <= 6 + parallel.worker_count(RUN), STARTED  # at most one more a thread
    time.sleep(0.1)
    assert len(STARTED) == taken


def test_leaving_the_loop_early_stops_and_joins_the_threads() -> None:
    STARTED.clear()
    with parallel_map(fails_at_five, range(1000), RUN, starting=Starting(RUN)) as results:
        first = next(iter(results))
    assert first in range(1000)
    assert not head_threads()
    taken = len(STARTED)
    assert taken < 1000
    time.sleep(0.1)
    assert len(STARTED) == taken


@pytest.mark.parametrize(("items", "worth"), [(0, False), (1023, False), (1024, True)])
def test_worth_processes(items: int, worth: bool) -> None:
    """2 workers: from 512 files a worker up."""
    assert parallel.worth_processes(RUN, items) is worth
    assert parallel.worth_processes(RunConfig(n_jobs=64, backend="auto"), 2047) is False
    assert parallel.worth_processes(RunConfig(n_jobs=64, backend="auto"), 2048) is True


def test_backend_loky_never_runs_a_task_here() -> None:
    run = RunConfig(n_jobs=2, backend="loky")
    assert parallel.worth_processes(run, 1)
    with parallel.workers_starting(run) as starting:
        with parallel_map(where, range(20), run, starting=starting) as results:
            found = list(results)
        assert starting.started
    assert sorted(index for index, _, _ in found) == list(range(20))
    assert PARENT not in {pid for _, pid, _ in found}


def fails_first(index: int, folder: str) -> int:
    """Task 0 fails at once; the others leave a file named by the process that ran them."""
    if index == 0:
        raise ValueError("the first task failed")
    time.sleep(0.05)
    (Path(folder) / f"{os.getpid()}-{index}").touch()
    return index


def test_a_task_failing_while_the_workers_start_hands_nothing_to_them(tmp_path: Path) -> None:
    """The error stops the run: the tasks left are not handed to the workers once they have
    started (nor to the pool while it is still starting)."""
    tasks = range(200)
    with (
        parallel.workers_starting(RUN) as starting,
        pytest.raises(ValueError, match="the first task failed"),
        parallel_map(fails_first, tasks, RUN, str(tmp_path), starting=starting) as results,
    ):
        for _ in results:
            pass
    time.sleep(0.5)
    ran_by = {int(p.name.split("-")[0]) for p in tmp_path.iterdir()}
    assert ran_by <= {PARENT}, ran_by
    assert not head_threads()
