"""What the parent hands a pack worker: one shard to fill and the sources that go in it.

Plain frozen dataclasses in a module of their own, so that a worker process unpickling them
imports nothing of the planner (pyarrow among it): a worker's start-up is on the critical path
of every run (see NOTE [ worker start-up ] in etl.run.execute).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar


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


T = TypeVar("T")


class Chunks(Sequence[T]):
    """`count` items in fixed-size chunks, each made into a task only when it is asked for (a
    worker is about to take it), so the parent never holds every task at once."""

    def __init__(self, items: int, size: int, make: Callable[[int, int], T]) -> None:
        self.items, self.size, self._make = items, size, make

    def __len__(self) -> int:
        return -(-self.items // self.size)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"chunk {index} of {len(self)}")
        start = (index % len(self)) * self.size
        return self._make(start, min(self.items, start + self.size))

    def __iter__(self) -> Iterator[T]:
        return (self[i] for i in range(len(self)))
