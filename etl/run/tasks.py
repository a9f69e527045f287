"""What the parent hands a pack worker: one shard to fill and the sources that go in it.

Plain frozen dataclasses in a module of their own, so that a worker process unpickling them
imports nothing of the planner (pyarrow among it): a worker's start-up is on the critical path
of every run (see NOTE [ worker start-up ] in etl.run.execute).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PackItem:
    """One source to decode and store; everything the worker needs, nothing large."""

    source: str
    path: str
    source_hash: str
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    sample_id: str
    label: int
    class_name: str
    split: str


@dataclass(frozen=True)
class PackTask:
    """One shard's worth of work: a worker fills exactly one shard file."""

    shard: str
    items: tuple[PackItem, ...]
