"""What the parent hands a worker: a batch of sources to pack into part of a shard, or to hash.

Plain frozen dataclasses in a module of their own, so that a worker process unpickling them
imports nothing of the planner (pyarrow among it): a worker's start-up is on the critical path
of every run (see NOTE [ worker start-up ] in etl.engine.parallel).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class Texts(Sequence[str]):
    """Strings as one bytes buffer and their offsets: what Arrow stores, without pyarrow, so a
    shard of 87k tiny images travels and waits as a few buffers, not 87k objects per column.
    Items decode as the OS decodes file names (UTF-8, other bytes kept by surrogateescape)."""

    data: bytes
    offsets: NDArray[np.int64]
    """len + 1 positions in `data`: item i is data[offsets[i]:offsets[i + 1]]."""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"text {index} of {len(self)}")
        index %= len(self)
        start, stop = int(self.offsets[index]), int(self.offsets[index + 1])
        return self.data[start:stop].decode("utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        data, bounds = self.data, self.offsets.tolist()
        for start, stop in pairwise(bounds):
            yield data[start:stop].decode("utf-8", "surrogateescape")

    @classmethod
    def of(cls, values: Sequence[str]) -> Texts:
        encoded = [v.encode("utf-8", "surrogateescape") for v in values]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        return cls(b"".join(encoded), offsets)

    @classmethod
    def of_arrow(cls, column: pa.ChunkedArray | pa.Array) -> Texts:
        """A string or binary column without nulls: a copy of its bytes and offsets."""
        import pyarrow as pa  # NOTE: here: workers unpickle Texts and never need pyarrow

        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if array.null_count:
            raise ValueError("a column with nulls has no Texts")
        array = array.cast(pa.large_binary())
        if not len(array):
            return cls(b"", np.zeros(1, dtype=np.int64))
        _, offsets_buffer, data_buffer = array.buffers()
        offsets = np.frombuffer(offsets_buffer, np.int64, len(array) + 1, array.offset * 8)
        first, last = int(offsets[0]), int(offsets[-1])
        data = memoryview(data_buffer)[first:last].tobytes() if last > first else b""
        return cls(data, offsets - first)

    def to_arrow(self) -> pa.Array:
        """As an Arrow string array (the bytes must be UTF-8, as hex checksums are)."""
        import pyarrow as pa

        offsets = np.ascontiguousarray(self.offsets, dtype=np.int64)  # a copy only if not so
        buffers = [None, pa.py_buffer(offsets), pa.py_buffer(self.data)]
        return pa.Array.from_buffers(pa.large_string(), len(self), buffers).cast(pa.string())


@dataclass(frozen=True)
class PackTask:
    """A batch of one shard's sources: a worker stores the sources `start` ..
    `start + len(sources)` of the plan's `packing` table at the shard's slots `slot` onwards
    (NOTE [ tasks smaller than shards ] in etl.format.parts)."""

    shard: str
    start: int
    slot: int
    """The first source's place in its shard, as planned (its row if nothing is rejected)."""
    capacity: int
    """The sources planned for the whole shard: the seal waits for that many."""
    sources: Texts
    locators: Texts
    """Where `etl.sources.readers` reads each source (a file path, an LMDB key, ...)."""
    hashes: Texts
    """The content hash each source had when planned: one that differs is a 'changed' reject."""

    def __len__(self) -> int:
        return len(self.sources)


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


TASK_BYTES = 8 << 20
"""Pixels a pack task aims to write: tens of photos, a few hundred small images; its hand-off
(about a millisecond) stays small against decoding them."""
MIN_BATCH, MAX_BATCH = 8, 256
TASKS_PER_WORKER = 4
"""At least this many tasks a worker when there are sources enough: the last ones to finish
are short, so no worker waits long for the others at the end of a run."""


def batch_size(items: int, per_shard: int, sample_bytes: int, workers: int) -> int:
    """Sources per pack task: about TASK_BYTES of pixels, fewer where that would leave fewer
    than TASKS_PER_WORKER tasks a worker, within [MIN_BATCH, MAX_BATCH] and one shard. The
    output does not depend on it (NOTE [ tasks smaller than shards ] in etl.format.parts)."""
    by_bytes = min(MAX_BATCH, max(MIN_BATCH, TASK_BYTES // max(1, sample_bytes)))
    spread = -(-items // (TASKS_PER_WORKER * max(1, workers)))
    return max(1, min(per_shard, max(MIN_BATCH, min(by_bytes, spread))))


class ShardBatches(Sequence[T]):
    """`items` cut into shards of `per_shard` and each shard into batches of at most `batch`
    (no batch spans two shards), each made into a task only when it is asked for:
    make(shard index, start, stop, shard start, shard size)."""

    def __init__(
        self, items: int, per_shard: int, batch: int, make: Callable[[int, int, int, int, int], T]
    ) -> None:
        if per_shard <= 0 or batch <= 0:
            raise ValueError(f"per_shard {per_shard} and batch {batch} must be positive")
        self.items, self.per_shard, self.batch = items, per_shard, min(batch, per_shard)
        self._make = make
        self._per_full = -(-self.per_shard // self.batch)

    @property
    def shards(self) -> int:
        return -(-self.items // self.per_shard)

    def __len__(self) -> int:
        if not self.items:
            return 0
        last = self.items - (self.shards - 1) * self.per_shard
        return (self.shards - 1) * self._per_full + -(-last // self.batch)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        shard, within = divmod(index % len(self), self._per_full)
        shard_start = shard * self.per_shard
        shard_stop = min(self.items, shard_start + self.per_shard)
        start = shard_start + within * self.batch
        stop = min(shard_stop, start + self.batch)
        return self._make(shard, start, stop, shard_start, shard_stop - shard_start)

    def __iter__(self) -> Iterator[T]:
        return (self[i] for i in range(len(self)))
