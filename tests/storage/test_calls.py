"""Calls to a store that never return: a timeout for the caller, a bounded number of threads
left behind, and an abandoned upload cleaned up by its own thread only."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from etl.storage import calls


def wait_for(condition: Callable[[], bool], limit: float = 10.0) -> None:
    end = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < end, "condition never held"
        time.sleep(0.01)


@pytest.mark.timeout(30)
def test_a_call_that_never_returns_is_a_timeout_and_its_thread_is_counted_until_it_ends() -> None:
    release = threading.Event()
    wait_for(lambda: calls.left_behind() == 0, 60)  # what earlier tests left has ended
    before = calls.left_behind()
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"no answer from the store in 0\.2 s"):
        calls.bounded(0.2, release.wait)
    assert time.monotonic() - started < 5
    assert calls.left_behind() == before + 1
    release.set()
    wait_for(lambda: calls.left_behind() == before)


@pytest.mark.timeout(30)
def test_past_the_cap_a_call_is_refused_at_once_and_starts_no_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wait_for(lambda: calls.left_behind() == 0, 60)  # what earlier tests left has ended
    monkeypatch.setattr(calls, "MAX_LEFT_BEHIND", 3)
    release = threading.Event()
    try:
        for _ in range(3):
            with pytest.raises(TimeoutError):
                calls.bounded(0.05, release.wait)

        def ours() -> int:
            return sum(t.name == "etl-store" for t in threading.enumerate())

        threads = ours()
        ran: list[int] = []
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="3 calls to the store have not returned"):
            calls.bounded(10, ran.append, 1)
        assert time.monotonic() - started < 1, "refused at once, not after the timeout"
        assert ran == [] and ours() <= threads, "no thread was started for it"
    finally:
        release.set()
    wait_for(lambda: calls.left_behind() < calls.MAX_LEFT_BEHIND)
    assert calls.bounded(5, len, "abc") == 3


@pytest.mark.timeout(30)
def test_steps_within_the_timeout_finish_however_long_the_whole() -> None:
    def slow(step: Callable[[], None]) -> str:
        for _ in range(6):
            step()
            time.sleep(0.1)
        return "done"

    assert calls.watched(0.4, slow) == "done"  # 0.6 s in all, no step apart by 0.4 s


@pytest.mark.timeout(30)
def test_an_abandoned_upload_is_cleaned_up_by_its_own_thread_only() -> None:
    """The caller gives up while a write hangs; the writer thread, when the write returns,
    meets Abandoned at its next step and discards the upload itself."""
    write_returns = threading.Event()
    touched_by: dict[str, int] = {}

    class Upload:
        def write(self) -> None:
            touched_by["write"] = threading.get_ident()
            write_returns.wait()

        def discard(self) -> None:
            touched_by["discard"] = threading.get_ident()

    def put(step: Callable[[], None]) -> None:
        upload = Upload()
        try:
            for _ in range(2):
                step()
                upload.write()
        except BaseException:
            upload.discard()
            raise

    with pytest.raises(TimeoutError):
        calls.watched(0.2, put)
    assert "discard" not in touched_by
    write_returns.set()
    wait_for(lambda: "discard" in touched_by)
    assert touched_by["discard"] == touched_by["write"] != threading.get_ident()


def test_an_error_in_the_call_is_raised_as_it_is() -> None:
    def fail() -> None:
        raise FileExistsError("there")

    with pytest.raises(FileExistsError, match="there"):
        calls.bounded(5, fail)
