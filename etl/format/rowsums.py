"""The checksum the manifest recorded for each selected sample, found by (shard, row): what a
row read on its own is checked against (`ranged=True` reads, `verify="rows"`), so a changed
byte is an error naming the shard and the row, never a wrong sample."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from etl.errors import ShardError
from etl.format.checksums import row_digest


class RowChecksums:
    """`checksums[i]`: the recorded checksum (hex, `algorithm`) of row `keys[i]`, a sorted
    `shard << 32 | row` of the selection's shard numbering."""

    def __init__(self, keys: NDArray[np.int64], checksums: Sequence[str], algorithm: str) -> None:
        self.keys = keys
        self.checksums = np.asarray(checksums, dtype=np.bytes_)
        self.algorithm = algorithm

    def positions(self, shard: NDArray[np.int64], row: NDArray[np.int64]) -> NDArray[np.int64]:
        """Where rows (shard, row) are in `keys`; IndexError for a row not selected."""
        wanted = (shard.astype(np.int64) << 32) | row.astype(np.int64)
        at = np.searchsorted(self.keys, wanted)
        found = at < len(self.keys)
        found[found] = self.keys[at[found]] == wanted[found]
        if not found.all():
            bad = int(np.flatnonzero(~found)[0])
            raise IndexError(f"row {row[bad]} of shard {shard[bad]} is not selected")
        return at.astype(np.int64)

    def expected(self, shard: NDArray[np.int64], row: NDArray[np.int64]) -> NDArray[Any]:
        """The recorded checksums of rows (shard, row); IndexError for a row not selected."""
        return self.checksums[self.positions(shard, row)]

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
        at = self.positions(shard, row)
        digest = row_digest(self.algorithm)
        flat = rows.reshape(len(rows), -1)
        todo = np.arange(len(at)) if seen is None else np.flatnonzero(~seen[at])
        wanted = self.checksums[at[todo]].tolist()
        for j, want in zip(todo.tolist(), wanted, strict=True):
            if digest(flat[j]).encode() != want:
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
