"""The checksum the manifest recorded for each selected sample, found by (shard, row): what a
row read on its own is checked against (`ranged=True` reads, `verify="rows"` and `"once"`), so
a changed byte is an error naming the shard and the row, never a wrong sample.

A checksum is kept as its raw bytes (8 for xxh3_64), not as the manifest's hex string: with
the sorted key, 16 bytes a sample, sent to every worker of a loader."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from etl.errors import ShardError
from etl.format.checksums import HEX_LENGTH, raw_digest

_NIBBLES = np.full(256, 0xFF, dtype=np.uint8)
_NIBBLES[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint8)
"""Each byte's value as a lowercase hex digit, 0xFF for any other byte."""


class RowChecksums:
    """`digests[i]`: the raw bytes of the recorded checksum (`algorithm`) of row `keys[i]`, a
    sorted `shard << 32 | row` of the selection's shard numbering. `known[i]` False (None: all
    known): the manifest's value was not a digest (a damaged manifest read on purpose), so
    that row matches nothing.

    `keys` and `digests` may be anything numpy reads without a copy (a loader passes tensors
    in shared memory, so DataLoader's workers share them instead of each unpickling a copy)."""

    def __init__(
        self, keys: Any, digests: Any, algorithm: str, known: NDArray[np.bool_] | None = None
    ) -> None:
        self.keys = keys
        self.digests = digests
        self.algorithm = algorithm
        self.known = known
        self._arrays: tuple[NDArray[np.int64], NDArray[np.uint8]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrays": None}

    def arrays(self) -> tuple[NDArray[np.int64], NDArray[np.uint8]]:
        """(keys, digests) as numpy arrays (views of tensors), made once per process."""
        if self._arrays is None:
            self._arrays = (np.asarray(self.keys), np.asarray(self.digests))
        return self._arrays

    @classmethod
    def from_hex(
        cls, keys: NDArray[np.int64], hex_digests: pa.Array | pa.ChunkedArray, algorithm: str
    ) -> RowChecksums:
        """From the manifest's `checksum` values (lowercase hex of `algorithm`) for `keys`, in
        one vectorised pass (no Python string per sample)."""
        width = HEX_LENGTH[algorithm]
        if isinstance(hex_digests, pa.ChunkedArray):
            hex_digests = hex_digests.combine_chunks()
        lengths = pc.binary_length(hex_digests).fill_null(-1).to_numpy(zero_copy_only=False)
        known = np.asarray(lengths == width)
        if not known.all():  # nulls and wrong lengths: a placeholder, marked unknown
            hex_digests = pc.if_else(pa.array(known), hex_digests, pa.scalar("0" * width))
        if not len(hex_digests):
            return cls(keys, np.zeros((0, width // 2), np.uint8), algorithm)
        flat = hex_digests.cast(pa.large_string())
        offsets = np.frombuffer(flat.buffers()[1], np.int64)[flat.offset : flat.offset + 2]
        data = np.frombuffer(flat.buffers()[2], np.uint8)
        chars = data[offsets[0] : offsets[0] + len(flat) * width].reshape(len(flat), width)
        nibbles = _NIBBLES[chars]
        known &= (nibbles != 0xFF).all(axis=1)
        digests = (nibbles[:, 0::2] << 4) | (nibbles[:, 1::2] & 0x0F)
        return cls(keys, digests, algorithm, None if known.all() else known)

    def positions(self, shard: NDArray[np.int64], row: NDArray[np.int64]) -> NDArray[np.int64]:
        """Where rows (shard, row) are in `keys`; IndexError for a row not selected."""
        keys = self.arrays()[0]
        wanted = (shard.astype(np.int64) << 32) | row.astype(np.int64)
        at = np.searchsorted(keys, wanted)
        found = at < len(keys)
        found[found] = keys[at[found]] == wanted[found]
        if not found.all():
            bad = int(np.flatnonzero(~found)[0])
            raise IndexError(f"row {row[bad]} of shard {shard[bad]} is not selected")
        return at.astype(np.int64)

    def unchecked(
        self,
        shard: NDArray[np.int64],
        row: NDArray[np.int64],
        seen: NDArray[np.bool_] | None = None,
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """(positions of rows (shard, row) in `keys`, which of them to hash): every one, or
        with `seen` (per key: checked already, `verify="once"`) those not seen."""
        at = self.positions(shard, row)
        todo = np.arange(len(at)) if seen is None else np.flatnonzero(~seen[at])
        return at, todo

    def matches(self, at: int, data: Any) -> bool:
        """Whether `data` (one row's bytes) hashes to the checksum of key `at`."""
        if self.known is not None and not self.known[at]:
            return False
        return bool(raw_digest(self.algorithm)(data) == self.arrays()[1][at].tobytes())

    def first_mismatch(
        self,
        shard: NDArray[np.int64],
        row: NDArray[np.int64],
        rows: NDArray[np.uint8],
        seen: NDArray[np.bool_] | None = None,
    ) -> int | None:
        """The position in `rows` (rows[j] read as (shard[j], row[j])) of the first whose
        bytes are not its sample's, None if every one matches. `seen` (per key: checked
        already, `verify="once"`): only the rows not seen are hashed, and marked once they
        match."""
        at, todo = self.unchecked(shard, row, seen)
        flat = rows.reshape(len(rows), -1)
        for j in todo.tolist():
            if not self.matches(int(at[j]), flat[j]):
                return j
        if seen is not None:
            seen[at[todo]] = True
        return None

    def check(
        self, shard: NDArray[np.int64], row: NDArray[np.int64], rows: NDArray[np.uint8], name: Any
    ) -> None:
        """ShardError naming the shard (`name(shard)`) and the row of the first row of `rows`
        whose bytes are not its sample's."""
        bad = self.first_mismatch(shard, row, rows)
        if bad is not None:
            raise mismatch(name(int(shard[bad])), int(row[bad]))


def mismatch(shard: Any, row: int) -> ShardError:
    """The error for row `row` of `shard` (its name or path) whose bytes are not its sample's."""
    return ShardError(
        f"{shard}: row {row} does not match the checksum the manifest recorded for its "
        "sample: the shard was changed after the commit"
    )
