"""A run's phases (list, hash, plan, pack, commit): each one's wall time, and the memory it
freed handed back before the next starts, so one phase's peak is not carried into the next."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pyarrow as pa


def convert_while_waiting() -> None:
    """Make pyarrow ready to convert Python values, on a thread, while this process waits for
    the hash phase's workers to start.

    NOTE: the first `pa.array` of a process imports pandas when it is installed (pyarrow
    checks whether the values are pandas objects; apache/arrow#34994): 0.2 s of a 300-photo
    run, spent in `plan` with nothing else to do. Started here it overlaps with the workers'
    start-up (0.4 s). Harmless if the main thread gets there first: imports are locked.
    """
    threading.Thread(target=pa.array, args=([0],), name="etl-arrow-warm", daemon=True).start()


@contextlib.contextmanager
def phase(phases: dict[str, float], name: str) -> Iterator[None]:
    """Records the block's wall time as phases[name], and hands back the memory the block
    freed (`release_freed_memory`)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = time.perf_counter() - start
        release_freed_memory()


def release_freed_memory() -> None:
    """Return to the system what Arrow's allocator keeps of the memory freed so far.

    NOTE: mimalloc keeps freed pages for reuse, so the resident set after a phase carried its
    peak into the next: 60 to 100 MiB at 1M files (session 18, VmHWM per phase). One call
    between phases costs milliseconds; lowering its purge delay for the whole run
    (MIMALLOC_PURGE_DELAY=0) slowed the plan by 20 to 40 %.
    """
    pa.default_memory_pool().release_unused()
