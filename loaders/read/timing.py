"""The stages of making a batch in this process, timed: how long its reads, decodes and crops
took on the thread that made it (`loaders.loader.stats` reports them).

NOTE [ cheap by design ]: a batch costs two `perf_counter` calls around its making and two per
stage reached (a handful, never one per sample): the stages are timed around the calls that
spread a batch's samples over the loader's threads, as wall time of the thread that makes the
batch. Worker processes make their batches out of sight; a loader there counts only the loop's
side. Measured in benchmarks/load/workers.py (`--stats`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

STAGES = ("read", "decode", "crop")
"""The stages of making a batch: `read` (rows or stored bytes copied out of the shards, with
their first-read checks), `decode` (encoded samples decoded at their stored size), `crop`
(samples decoded at the crop's scale, cropped and resized: `with_crop`)."""

_times: ContextVar[dict[str, float] | None] = ContextVar("loaders_stage_times", default=None)


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Count the time inside toward stage `name` of the batch being made (nothing where no
    batch is being made in this thread: a worker process, a plain `dataset.gather`)."""
    times = _times.get()
    if times is None:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        times[name] = times.get(name, 0.0) + time.perf_counter() - start


class MakingTimes:
    """Seconds spent making batches in this process, whole and by stage, since the last reset:
    kept by a loader's `BatchMemory`, which every batch made here passes through."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def __getstate__(self) -> dict[str, Any]:
        return {}  # a worker's copy starts afresh and is never read

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def reset(self) -> None:
        with self._lock:
            self.batches = 0
            self.seconds = 0.0
            self.stages = dict.fromkeys(STAGES, 0.0)

    @contextmanager
    def making(self) -> Iterator[None]:
        """Time the making of one batch, with its stages (`stage`)."""
        times: dict[str, float] = {}
        token = _times.set(times)
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            _times.reset(token)
            with self._lock:
                self.batches += 1
                self.seconds += seconds
                for name, value in times.items():
                    self.stages[name] = self.stages.get(name, 0.0) + value
