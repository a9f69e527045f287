"""Rows a run makes faster than it can keep: new manifest rows leave memory in sorted runs on
disk as shards finish, and come back merged in source order, a piece at a time, as the commit
writes them. So the parent's memory follows the shards in flight, not the dataset.

The runs are Arrow files in a `.tmp-` folder of the output's versions/, written by this
process under the dataset lock: a run that dies leaves them to `clean_leftovers`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from etl.format.columns import merge_sorted, sorted_by
from etl.format.manifest import VERSIONS_DIR

RUN_ROWS = 1 << 18
"""Rows gathered before they are sorted and written as one run: few runs to merge (40 at
10M rows), each written once."""

PIECE_ROWS = 1 << 12
"""Rows of a run read back at a time: the merge holds one piece of every run."""


class SortedSpill:
    """Tables of one schema, kept sorted by `key` in runs on disk; `merged` reads them back."""

    def __init__(self, root: Path, schema: pa.Schema, key: str) -> None:
        self.folder = root / VERSIONS_DIR / f".tmp-spill-{os.getpid()}"
        self.schema, self.key = schema, key
        self.rows = 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._runs: list[Path] = []

    def __enter__(self) -> SortedSpill:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def add(self, table: pa.Table) -> None:
        self._pending.append(table.cast(self.schema))
        self._pending_rows += table.num_rows
        self.rows += table.num_rows
        if self._pending_rows >= RUN_ROWS:
            self._write_run()

    def _write_run(self) -> None:
        rows = sorted_by(pa.concat_tables(self._pending), self.key)
        self._pending, self._pending_rows = [], 0
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"run-{len(self._runs):05d}.arrow"
        with ipc.new_file(str(path), self.schema) as writer:
            writer.write_table(rows, max_chunksize=PIECE_ROWS)
        self._runs.append(path)

    def merged(self, *sorted_tables: pa.Table) -> Iterator[pa.Table]:
        """Every row added, and those of `sorted_tables` (each sorted by `key` already), in
        `key` order, a piece at a time. Call once, after the last `add`."""
        streams: list[Iterator[pa.Table | pa.RecordBatch]] = [
            iter(table.to_batches(max_chunksize=PIECE_ROWS)) for table in sorted_tables
        ]
        if self._pending:
            rows = sorted_by(pa.concat_tables(self._pending), self.key)
            self._pending = []
            streams.append(iter(rows.to_batches(max_chunksize=PIECE_ROWS)))
        streams += [_pieces(path) for path in self._runs]
        return merge_sorted(streams, self.key)


def _pieces(path: Path) -> Iterator[pa.RecordBatch]:
    """The record batches of the Arrow file at `path`, read one at a time (no memory map:
    mapped pages would stay resident)."""
    with pa.OSFile(str(path)) as file:
        reader = ipc.open_file(file)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)
