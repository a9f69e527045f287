"""Rows a run makes faster than it can keep: tables leave memory in sorted runs on disk and
come back merged in key order, a piece at a time, so the parent's memory follows the pieces in
flight, not the dataset.

Everything lives in one scratch folder per run (`scratch`): a `.tmp-` folder of the output's
versions/, written by this process under the dataset lock, removed when the run ends; a run
that dies leaves it to `clean_leftovers`. A dry run with no output folder yet uses a system
temporary folder instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from etl.format.checksums import file_digests
from etl.format.manifest import VERSIONS_DIR
from etl.format.mapped import Mapped
from etl.format.table_ops import merge_sorted, rebatched, sorted_by

RUN_ROWS = 1 << 16
"""Rows gathered before they are sorted and written as one run. Sorting copies them, so this
bounds what the parent holds twice while it packs: 1 << 18 rows of samples swung its resident
memory by 150 MB a run."""

FAN_IN = 16
"""Runs of one size merged into one run of the next as soon as there are this many, so a merge
never reads from more than (FAN_IN - 1) runs a size, whatever the count of rows: 10M rows of
runs of RUN_ROWS leave 9 + 9 runs, each row written twice."""

BATCH_ROWS = 1 << 9
"""Rows of each record batch of a run on disk: the smallest piece the merge can read."""

MERGE_ROWS = 1 << 15
"""Rows the merge holds across all its runs: a piece of each is MERGE_ROWS / runs rows (one
batch at least). FAN_IN bounds the runs, so merging 10M rows costs what merging 1M does."""


@contextlib.contextmanager
def scratch(root: Path | None) -> Iterator[Path]:
    """A folder for one run's temporary files, removed when the block ends, error or not:
    `root`/versions/.tmp-scratch-<pid> (on the output's disk, cleaned after a kill by the
    next run), or a system temporary folder when `root` is None."""
    if root is None:
        with tempfile.TemporaryDirectory(prefix="etl-scratch-") as temporary:
            yield Path(temporary)
        return
    versions = root / VERSIONS_DIR
    made = not versions.exists()
    folder = versions / f".tmp-scratch-{os.getpid()}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if made:  # a run that stopped before its first commit leaves the output as it found it
            with contextlib.suppress(OSError):
                versions.rmdir()


class Seals:
    """Digests of the scratch files a run wrote, checked before it reads them back.

    NOTE [ sealed scratch ]: a run reads its spill runs and buckets back long after writing
    them (a 10M-file run: minutes); a file changed meanwhile (another process, a failing disk)
    must stop the run, never feed it rows that were not written, nor hand pyarrow a damaged
    file. A mismatch is the I/O error it amounts to (EIO under the output folder), which the
    run turns into one line, nothing committed. xxh3 of a file at write and again at read:
    two passes over scratch files that are mostly still in the page cache.
    """

    ALGORITHM = "xxh3_64"

    def __init__(self) -> None:
        self._digests: dict[str, str] = {}

    def seal(self, path: Path) -> None:
        self._digests[str(path)] = file_digests(path, (self.ALGORITHM,))[0]

    def holds(self, path: Path) -> bool:
        """Whether `path` was sealed (written by this run)."""
        return str(path) in self._digests

    def check(self, path: Path) -> None:
        """Raise OSError(EIO) unless `path` holds exactly what `seal` saw."""
        try:
            actual = file_digests(path, (self.ALGORITHM,))[0]
        except OSError as exc:
            actual = f"unreadable ({exc.strerror or exc})"
        if actual != self._digests.get(str(path)):
            raise OSError(
                errno.EIO, "a scratch file of this run changed after it was written", str(path)
            )


class SortedSpill:
    """Tables of one schema, kept sorted by `key` in runs on disk under `folder` (files named
    `name`-NNNNN.arrow); `merged` reads them back, `written` writes them as one file."""

    def __init__(self, folder: Path, schema: pa.Schema, key: str, name: str = "run") -> None:
        self.folder, self.name = folder, name
        self.schema, self.key = schema, key
        self.rows = 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._runs: list[tuple[int, Path]] = []
        """(level, path) of each run on disk: a run of level L merged FAN_IN ** L runs."""
        self._written = 0
        self._seals = Seals()

    def __enter__(self) -> SortedSpill:
        return self

    def __exit__(self, *exc: object) -> None:
        self._remove_runs()

    def add(self, table: pa.Table) -> None:
        self._pending.append(table.cast(self.schema))
        self._pending_rows += table.num_rows
        self.rows += table.num_rows
        if self._pending_rows >= RUN_ROWS:
            rows = sorted_by(pa.concat_tables(self._pending), self.key)
            self._pending, self._pending_rows = [], 0
            self._runs.append((0, self._write_file([rows])))
            del rows  # NOTE: before the cascade, whose merge would otherwise sit on top of it
            self._cascade()

    def add_sorted(self, table: pa.Table) -> None:
        """Rows sorted by `key` already: written as a run of their own, never sorted again or
        kept waiting."""
        if table.num_rows:
            self._runs.append((0, self._write_file([table.cast(self.schema)])))
            self.rows += table.num_rows
            self._cascade()

    def _write_file(self, pieces: Iterable[pa.Table]) -> Path:
        """A new run file holding `pieces`, in batches of BATCH_ROWS."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{self.name}-{self._written:05d}.arrow"
        self._written += 1
        try:
            with ipc.new_file(str(path), self.schema) as writer:
                for piece in pieces:
                    writer.write_table(piece, max_chunksize=BATCH_ROWS)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        self._seals.seal(path)
        return path

    def _cascade(self) -> None:
        """While the last FAN_IN runs are of one level, merge them into one of the next. Runs
        are added in order and merged from the end, so levels never rise along the list (a
        counter in base FAN_IN)."""
        while len(self._runs) >= FAN_IN:
            last = self._runs[-FAN_IN:]
            level = last[0][0]
            if any(run_level != level for run_level, _ in last):
                return
            piece = max(BATCH_ROWS, MERGE_ROWS // FAN_IN)
            streams = [self._read(path, piece) for _, path in last]
            merged = self._write_file(merge_sorted(streams, self.key))
            for _, path in last:
                path.unlink(missing_ok=True)
            self._runs[-FAN_IN:] = [(level + 1, merged)]

    def merged(self, *sorted_tables: pa.Table) -> Iterator[pa.Table]:
        """Every row added, and those of `sorted_tables` (each sorted by `key` already), in
        `key` order, a piece at a time. Call once, after the last `add`."""
        pending = [sorted_by(pa.concat_tables(self._pending), self.key)] if self._pending else []
        self._pending = []
        tables = [*sorted_tables, *pending]
        piece = max(BATCH_ROWS, MERGE_ROWS // max(1, len(tables) + len(self._runs)))
        streams = [_slices(table, piece) for table in tables]
        streams += [self._read(path, piece) for _, path in self._runs]
        return merge_sorted(streams, self.key)

    def written(
        self,
        path: Path,
        *sorted_tables: pa.Table,
        through: Callable[[Iterator[pa.Table]], Iterator[pa.Table]] | None = None,
    ) -> Mapped:
        """Every row added, and those of `sorted_tables` (as `merged`), in `key` order,
        written to the Arrow file `path` a piece at a time and mapped back: a table the rest of
        the run can slice and take from while its pages stay the page cache's. `through` may
        filter the pieces on their way. The runs are removed."""
        pieces = self.merged(*sorted_tables)
        with ipc.new_file(str(path), self.schema) as writer:
            for batch in rebatched(through(pieces) if through is not None else pieces):
                writer.write_table(batch)
        self._remove_runs()
        return Mapped(path)

    def _read(self, path: Path, rows: int) -> Iterator[pa.Table]:
        """A run's rows, `rows` at a time, once its seal holds (NOTE [ sealed scratch ])."""
        self._seals.check(path)
        return _pieces(path, rows)

    def _remove_runs(self) -> None:
        for _, path in self._runs:
            path.unlink(missing_ok=True)
        self._runs = []


def _slices(table: pa.Table, rows: int) -> Iterator[pa.Table]:
    """`table` in slices of `rows`, each made when asked for (a 10M-row table would otherwise
    be 20,000 batch objects at once)."""
    for start in range(0, table.num_rows, rows):
        yield table.slice(start, rows)


def _pieces(path: Path, rows: int) -> Iterator[pa.Table]:
    """The rows of the Arrow file at `path`, `rows` (or a batch more) at a time, read batch by
    batch (no memory map: mapped pages would stay resident)."""
    with pa.OSFile(str(path)) as file:
        reader = ipc.open_file(file)
        batches: list[pa.RecordBatch] = []
        held = 0
        for i in range(reader.num_record_batches):
            batches.append(reader.get_batch(i))
            held += batches[-1].num_rows
            if held >= rows:
                yield pa.Table.from_batches(batches)
                batches, held = [], 0
        if batches:
            yield pa.Table.from_batches(batches)
