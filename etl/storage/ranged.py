"""Rows of a dataset in a store's shards read with ranged GETs, for selections that read few rows
of each shard (an evaluation subset, a `where=` filter, a look at a few samples).

`PackedDataset.open("s3://...", ranged=True)` downloads no shard: a batch's rows are read from
the store as byte ranges, one per run of consecutive rows of a shard, all of a batch's ranges
at once (fsspec's `cat_ranges`), and each row is verified against the checksum the manifest
recorded for its sample before it is handed out: a shard changed in the store is an error
naming it, never a wrong sample. Nothing is cached: every epoch reads the store again, so a
selection that reads most of each shard is faster with whole shards (the default).

A row's bytes start at the shard's size less its rows' bytes (`.npy` files hold the header,
then the rows, nothing after), so no header is read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from etl.errors import ShardError
from etl.format.coherence import check_shard_name
from etl.format.row_checksums import RowChecksums, mismatch
from etl.format.shards import HEADER_BYTES
from etl.storage.store import StoreDataset
from etl.storage.transport import why


class RangedRows:
    """The selected rows of the dataset at `url`'s shards, each checked against `sums` (the
    checksums of the selection's samples by shard and row).

    Pickles to a worker as its settings; each process opens its own store connection."""

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None,
        timeout: float,
        names: Sequence[str],
        sizes: Sequence[int],
        rows: Sequence[int] | NDArray[np.int64],
        sample_shape: tuple[int, ...],
        sums: RowChecksums,
    ) -> None:
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.timeout = timeout
        for name in names:  # NOTE [ names from a store ]: no request outside the dataset
            check_shard_name(name, url)
        self.names = tuple(names)
        self.sample_bytes = int(np.prod(sample_shape))
        self.offsets = np.asarray(sizes, np.int64) - np.asarray(rows, np.int64) * self.sample_bytes
        self.sums = sums
        self._store: StoreDataset | None = None
        self._store_pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None}

    @property
    def store(self) -> StoreDataset:
        """This process's connection to the store (fsspec's async drivers are not fork-safe)."""
        if self._store is None or self._store_pid != os.getpid():
            self._store_pid = os.getpid()
            self._store = StoreDataset(self.url, None, self.storage_options, self.timeout)
        return self._store

    def read(
        self, shard: NDArray[np.int64], row: NDArray[np.int64], out: NDArray[np.uint8]
    ) -> None:
        """Copy rows (shard[j], row[j]) into out[j], each verified; ShardError naming the shard
        for a range the store does not serve whole, or a row whose bytes are not its sample's."""
        size = self.sample_bytes
        order = np.lexsort((row, shard))  # consecutive rows of a shard become one range
        s, r = shard[order], row[order]
        first = np.flatnonzero(np.r_[True, (s[1:] != s[:-1]) | (r[1:] != r[:-1] + 1)])
        ends = np.r_[first[1:], len(s)]
        starts = self.offsets[s[first]] + r[first] * size
        stops = starts + (ends - first) * size
        paths = [self.store.in_store(self.names[k]) for k in s[first].tolist()]
        try:
            blobs = self.store.bounded(
                self.store.fs.cat_ranges, paths, starts.tolist(), stops.tolist()
            )
        except Exception as exc:
            raise ShardError(f"{self.url}: cannot read rows of its shards ({why(exc)})") from None
        flat = out.reshape(len(out), -1)
        for begin, end, blob, path in zip(first.tolist(), ends.tolist(), blobs, paths, strict=True):
            pieces = _whole(blob, path, (end - begin) * size).reshape(end - begin, size)
            flat[order[begin:end]] = pieces
        try:
            self.sums.check(shard, row, out, lambda k: self.store.in_store(self.names[k]))
        except ShardError as exc:
            raise ShardError(f"{exc}; {self._repair}") from None

    def read_spans(
        self,
        shard: NDArray[np.int64],
        row: NDArray[np.int64],
        starts: NDArray[np.int64],
        lengths: NDArray[np.int64],
    ) -> list[NDArray[np.uint8]]:
        """Samples of their own size (format version 2): bytes [starts[j], starts[j] +
        lengths[j]) of shard[j]'s data, which follows its 128-byte header (`ShardWriter`
        writes no other), one ranged GET each, all at once; each verified as `read`'s rows."""
        paths = [self.store.in_store(self.names[k]) for k in shard.tolist()]
        begins = HEADER_BYTES + np.asarray(starts, np.int64)
        stops = begins + np.asarray(lengths, np.int64)
        try:
            blobs = self.store.bounded(
                self.store.fs.cat_ranges, paths, begins.tolist(), stops.tolist()
            )
        except Exception as exc:
            raise ShardError(f"{self.url}: cannot read rows of its shards ({why(exc)})") from None
        at = self.sums.positions(shard, row)
        samples = []
        for j, (blob, path, length) in enumerate(
            zip(blobs, paths, np.asarray(lengths).tolist(), strict=True)
        ):
            data = _whole(blob, path, length)
            if not self.sums.matches(int(at[j]), data):
                raise ShardError(f"{mismatch(path, int(row[j]))}; {self._repair}")
            samples.append(data)
        return samples

    @property
    def _repair(self) -> str:
        return f"repair: etl audit {self.url} --repair --config pipeline.yaml"


def _whole(blob: bytes | BaseException, path: str, length: int) -> NDArray[np.uint8]:
    """The `length` bytes the store sent for a range of `path`, or the ShardError saying why
    it sent something else (an error, or fewer bytes: a shard shorter than its manifest)."""
    if isinstance(blob, BaseException):
        what = "not in the store" if isinstance(blob, FileNotFoundError) else why(blob)
        raise ShardError(f"{path}: cannot read rows ({what})")
    if len(blob) != length:
        raise ShardError(
            f"{path}: the store sent {len(blob):,} bytes of a range of {length:,}: the shard "
            "is shorter than the manifest records"
        )
    return np.frombuffer(blob, np.uint8)
