"""Stopping on SIGINT (Ctrl-C) or SIGTERM: one exception in the main thread, no commit after it.

NOTE [signals]: a terminal sends SIGINT to the whole foreground process group, the workers
included, and a library on the way may catch what a worker raised, so the main thread's
exception alone cannot prove that no commit follows a signal. The handler therefore also
records the signal, and `check` (called right before a version is published) raises again if
one arrived. A second signal ends the process at once: nothing is ever half-written, because a
version becomes visible by one rename, and the next run removes what an interrupted one left.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)

_received: int | None = None
_deferring = False


class Interrupted(BaseException):
    """A SIGINT or SIGTERM arrived. A BaseException, like KeyboardInterrupt, so that no
    `except Exception` on the way swallows it."""

    def __init__(self, signum: int, message: str = "interrupted") -> None:
        super().__init__(signum, message)
        self.signum = signum
        self.message = message

    @property
    def exit_code(self) -> int:
        """130 for SIGINT, 143 for SIGTERM: the shell's 128 + signal number."""
        return 128 + self.signum


def _handle(signum: int, frame: FrameType | None) -> None:
    global _received
    if _received is not None:
        os._exit(128 + signum)  # a second signal: stop now (see NOTE [signals])
    _received = signum
    if not _deferring:
        raise Interrupted(signum)


@contextmanager
def handled() -> Iterator[None]:
    """For the length of a command: SIGINT and SIGTERM raise `Interrupted` in the main thread."""
    global _received
    previous = {s: signal.signal(s, _handle) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _received = None


_late: int | None = None


def exit_quietly() -> None:
    """From now to the end of the process: SIGINT or SIGTERM writes one line, lets the exit
    finish, and the process ends with 130 or 143 (`end_with_late_signal`); a second one ends
    it at once.

    NOTE [ signals after the command ]: once a command's work is done (its version committed
    or not), Python's own handler would turn a Ctrl-C into a KeyboardInterrupt inside whatever
    runs then: an exit handler (loky's `_python_exit` joins its workers there) printed its
    traceback and the process exited 0. Nothing is left to stop or to keep whole then: the
    signal is noted and said, the exit handlers finish (loky's resource tracker then finds
    nothing leaked), and the process ends with the signal's exit code."""
    for s in SIGNALS:
        signal.signal(s, _late_signal)


def _late_signal(signum: int, frame: FrameType | None) -> None:
    global _late
    if _late is not None:
        os._exit(128 + signum)  # a second signal: stop now
    _late = signum
    os.write(2, b"interrupted (the command had ended)\n")


def end_with_late_signal() -> None:
    """The last exit handler: where a signal arrived after the command, the process ends with
    its exit code (never 0 after a signal)."""
    if _late is not None:
        _let_go_of_workers()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(128 + _late)


def _let_go_of_workers() -> None:
    """loky's executor shut down and its locks collected, as the interpreter's own teardown
    would: its resource tracker then finds nothing leaked when this process is gone."""
    reusable = sys.modules.get("joblib.externals.loky.reusable_executor")
    executor = getattr(reusable, "_executor", None)
    if executor is None:
        return
    with contextlib.suppress(Exception):
        executor.shutdown(wait=True, kill_workers=True)
        reusable._executor = None  # type: ignore[union-attr]
        del executor
        gc.collect()


def check() -> None:
    """Raise `Interrupted` if a signal arrived since `handled` began, even if the exception
    its handler raised was caught on the way."""
    if _received is not None:
        raise Interrupted(_received)


@contextmanager
def deferred() -> Iterator[None]:
    """Publish a version without being cut short: raise first if a signal already arrived; a
    signal that arrives while the body runs is only recorded, and raised once it is done."""
    global _deferring
    check()
    _deferring = True
    try:
        yield
    finally:
        _deferring = False
    check()


@contextmanager
def starting_workers() -> Iterator[None]:
    """Around code that may start worker processes: SIGINT blocked in this thread.

    A process started meanwhile begins with SIGINT blocked (a signal mask survives fork and
    exec). A Ctrl-C that reaches the process group while such a worker's interpreter is still
    importing `site` then waits, and `worker_setup` discards it, instead of killing the worker
    there with a 'Fatal Python error' and a traceback on the user's terminal. Threads started
    meanwhile (an executor's manager, which starts replacements) keep the mask too. The
    standard library starts its resource tracker the same way. A signal for this process is
    not lost: another thread takes it, or it waits until the block ends.

    NOTE: the resource trackers (multiprocessing's, and loky's copy of it) are started first:
    starting one unblocks SIGINT in the calling thread, which undid the block for every
    worker started after it."""
    if not hasattr(signal, "pthread_sigmask"):  # not POSIX: no process groups to signal
        yield
        return
    from multiprocessing import resource_tracker

    from joblib.externals.loky.backend import resource_tracker as loky_tracker

    resource_tracker.ensure_running()  # no-ops once running
    loky_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def worker_setup(parent: int) -> None:
    """In a worker process: leave Ctrl-C to the parent, and exit when the parent is gone.

    A terminal signals the whole process group, and a worker's own KeyboardInterrupt would
    print its traceback; the parent stops the workers itself (see NOTE [signals]). Killed with
    SIGKILL (or by the OOM killer), the parent can stop nothing: loky workers and their resource
    trackers were seen alive ten minutes later. A watchdog thread notices the new parent pid.

    NOTE: not PR_SET_PDEATHSIG, which fires when the *thread* that spawned the worker ends:
    loky spawns from whichever thread submits, and its workers outlive runs.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


PARENT_POLL_S = 0.5


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)
