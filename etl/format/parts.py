"""A shard filled by several tasks at once: each task writes its rows at their slots of one
temp file (`SlotWriter`), and one step (`seal`) closes the gaps rejects left, writes the header,
hashes the file and publishes it under the shard's name.

NOTE [ tasks smaller than shards ]: a task of a whole shard kept at most as many workers busy
as a run had shards left, and on large shards the last one was packed by one worker while the
rest waited (#43). A slot is a source's place in its shard as planned; a source that becomes a
reject leaves its slot unwritten, and the seal moves the rows after it down, so a published
shard holds exactly its samples, in plan order: the same bytes whatever the tasks, the worker
count or the engine. The manifest's row of a sample is its slot less the gaps before it
(`etl.run.results.ShardGaps`). The temp file lives next to the shard, so every worker that can
write the shard (a Dask cluster's shared folder too) writes its rows there, and the rename is
atomic.
"""

from __future__ import annotations

import os
from itertools import pairwise
from pathlib import Path
from types import TracebackType

import numpy as np
from numpy.typing import NDArray

from etl.format.checksums import TAMPER_DIGEST, digest, file_digests
from etl.format.shards import HEADER_BYTES, ShardInfo, check_fits, npy_header

MOVE_BYTES = 8 << 20
"""Bytes moved at a time when a seal closes the gaps of rejects."""


def temp_name(shard: str, token: str) -> str:
    """The file the tasks of `shard` ('shards/v000003-00012.npy') write into for one run
    (`token`): hidden, and removed by the next run if this one dies (`clean_leftovers`)."""
    folder, _, name = shard.rpartition("/")
    return f"{folder}/.tmp-{name}-{token}" if folder else f".tmp-{name}-{token}"


class SlotWriter:
    """Writes one task's rows of a shard, each at its slot (`first_slot` + its position in
    the task) of the shard's temp file. Use as a context manager.

    `durable=True` fsyncs the rows written before the block ends: on a cluster only the
    machine that wrote them can. On one machine the seal's fsync covers every task's rows."""

    def __init__(
        self,
        root: Path,
        name: str,
        temp: str,
        first_slot: int,
        sample_shape: tuple[int, ...],
        checksum: str,
        durable: bool = False,
        slot_bytes: int | None = None,
    ) -> None:
        self.name = name
        self.path = root / temp
        self.sample_shape = tuple(sample_shape)
        self.sample_bytes = slot_bytes or int(np.prod(sample_shape))
        """The bytes of a slot: a sample's, or for samples of their own size (0 in
        `sample_shape`), the most one can take (NOTE [ flat slots ])."""
        self.checksum = checksum
        self.durable = durable
        self.slot = first_slot
        self._fd: int | None = None

    def __enter__(self) -> SlotWriter:
        return self

    def append(self, sample: NDArray[np.uint8]) -> tuple[int, str]:
        """Store the next source's sample at its slot; returns (slot, checksum of its bytes)."""
        check_fits(sample, self.sample_shape, self.name)
        if sample.nbytes > self.sample_bytes:
            raise ValueError(f"a sample of {sample.shape} overflows a slot of {self.name}")
        if self._fd is None:  # opened on the first row: a task of rejects writes nothing
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        sample = np.ascontiguousarray(sample)
        _write_at(
            self._fd,
            memoryview(sample.data).cast("B"),
            HEADER_BYTES + self.slot * self.sample_bytes,
        )
        slot = self.slot
        self.slot += 1
        return slot, digest(sample, self.checksum)

    def skip(self) -> None:
        """The next source became a reject: its slot stays unwritten (a gap the seal closes)."""
        self.slot += 1

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if self.durable and exc_type is None:
                os.fsync(fd)
        finally:
            os.close(fd)


def _write_at(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def seal(
    root: Path,
    name: str,
    temp: str,
    capacity: int,
    gaps: NDArray[np.int64],
    sample_shape: tuple[int, ...],
    checksum: str,
) -> ShardInfo | None:
    """Publish shard `name` from the temp file its tasks filled: `capacity` slots, of which
    `gaps` (sorted) were left empty by rejects. Closes the gaps, writes the header for the rows
    stored, hashes the whole file, fsyncs it and renames it into place; None (and no file) when
    every slot is a gap. The caller fsyncs the folder before a version names the shard."""
    path, final = root / temp, root / name
    sample_bytes = int(np.prod(sample_shape))
    rows = capacity - len(gaps)
    if rows <= 0:
        path.unlink(missing_ok=True)
        return None
    last = _last_stored(capacity, gaps)
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size < HEADER_BYTES + (last + 1) * sample_bytes:
            raise OSError(f"{path}: {size} bytes, short of the rows its tasks wrote")
        _close_gaps(fd, gaps, capacity, sample_bytes)
        os.ftruncate(fd, HEADER_BYTES + rows * sample_bytes)
        _write_at(fd, memoryview(npy_header((rows, *sample_shape))), 0)
        shard_digest, tamper = file_digests(path, (checksum, TAMPER_DIGEST))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(path, final)
    return ShardInfo(name, rows, HEADER_BYTES + rows * sample_bytes, shard_digest, tamper)


def seal_flat(
    root: Path,
    name: str,
    temp: str,
    sizes: NDArray[np.int64],
    slot_bytes: int,
    checksum: str,
) -> tuple[ShardInfo | None, NDArray[np.int64]]:
    """`seal` for samples that keep their aspect ratio (format version 2): slot i of the temp
    file holds `sizes[i]` bytes at `slot_bytes * i` (0: a reject's gap). Moves every sample
    down to follow the one before, so the shard is one flat uint8 array of their bytes in slot
    order, and publishes it as `seal` does. Returns the shard and each slot's byte offset in
    the shard's data (a gap's is where it would have started).

    NOTE [ flat slots ]: tasks write at once and a sample's size is known only once it is
    decoded, so each slot is as large as the largest sample (shorter x longer x channels); the
    unwritten rest of a slot is a hole in a sparse temp file, never written to the disk. A
    sample only ever moves to a lower offset, never over one not read yet (offsets[i] + sizes[i]
    = offsets[i + 1] <= (i + 1) * slot_bytes)."""
    path, final = root / temp, root / name
    offsets = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1], out=offsets[1:])
    stored = np.flatnonzero(sizes > 0)
    total = int(sizes.sum())
    if not len(stored):
        path.unlink(missing_ok=True)
        return None, offsets
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        last = int(stored[-1])
        if size < HEADER_BYTES + last * slot_bytes + int(sizes[last]):
            raise OSError(f"{path}: {size} bytes, short of the samples its tasks wrote")
        for slot in stored.tolist():
            start, length = HEADER_BYTES + slot * slot_bytes, int(sizes[slot])
            if start != HEADER_BYTES + int(offsets[slot]):
                data = os.pread(fd, length, start)
                _write_at(fd, memoryview(data), HEADER_BYTES + int(offsets[slot]))
        os.ftruncate(fd, HEADER_BYTES + total)
        _write_at(fd, memoryview(npy_header((total,))), 0)
        shard_digest, tamper = file_digests(path, (checksum, TAMPER_DIGEST))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(path, final)
    return ShardInfo(name, len(stored), HEADER_BYTES + total, shard_digest, tamper), offsets


def _last_stored(capacity: int, gaps: NDArray[np.int64]) -> int:
    """The highest slot that holds a row (there is one: fewer gaps than slots)."""
    last = capacity - 1
    for gap in gaps[::-1].tolist():
        if gap != last:
            break
        last -= 1
    return last


def _close_gaps(fd: int, gaps: NDArray[np.int64], capacity: int, sample_bytes: int) -> None:
    """Move every run of stored slots after a gap down to the first free row, front to back
    (a row only ever moves to a lower offset, so nothing is overwritten before it is read)."""
    bounds = [*gaps.tolist(), capacity]
    free = bounds[0]
    step = max(1, MOVE_BYTES // sample_bytes)
    for gap, next_gap in pairwise(bounds):
        for start in range(gap + 1, next_gap, step):
            count = min(step, next_gap - start)
            data = os.pread(fd, count * sample_bytes, HEADER_BYTES + start * sample_bytes)
            _write_at(fd, memoryview(data), HEADER_BYTES + free * sample_bytes)
            free += count
