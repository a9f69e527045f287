"""What every lister returns and is given: each input as a `SourceFile` (or a `SourceReject`,
`etl.sources.listed_rejects`), a listing's files as Arrow columns (`FileColumns`, built by
`FileColumnsBuilder`, on disk when large), the `SourceListing`, and the `ListContext`."""

from __future__ import annotations

import os
from array import array
from collections.abc import Collection, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from etl.sources.listed_rejects import Rejects, SourceReject

if TYPE_CHECKING:
    import pyarrow as pa

    from etl.format.mapped import Mapped
    from etl.format.sample_columns import SampleColumn


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One input image, identified by `source`: its path relative to the source root (POSIX)."""

    source: str
    path: str
    """Its locator: where `etl.sources.readers` reads it (a file path, an LMDB key, a spool
    slice)."""
    class_name: str | None
    split: str | None
    size: int
    mtime_ns: int
    """0 for kinds with no modification time (lmdb, python)."""
    content_hash: str | None = None
    """Set by kinds whose stat cannot prove a value unchanged: they hash while listing, and the
    plan takes this hash instead of hashing or trusting the stat."""
    ctime_ns: int = 0
    inode: int = 0
    """With size and mtime, the stat key that lets an unchanged file skip hashing (see
    `plan._FILE_STAT`); 0 for kinds with no file."""


def repeated_sources(sources: pa.ChunkedArray | pa.Array) -> list[str]:
    """The sources that occur more than once in a sorted column, each once, in order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    chunks = sources.chunks if isinstance(sources, pa.ChunkedArray) else [sources]
    found: list[str] = []
    last: str | None = None
    for chunk in chunks:
        if not len(chunk):
            continue
        if last is not None and chunk[0].as_py() == last and (not found or found[-1] != last):
            found.append(last)
        same = pc.equal(chunk.slice(1), chunk.slice(0, len(chunk) - 1))
        for value in pc.unique(chunk.slice(1).filter(same)).to_pylist():
            if not found or found[-1] != value:
                found.append(value)
        last = chunk[-1].as_py()
    return found


class FileStat(NamedTuple):
    """What `os.stat` says of a source file, as far as deciding "unchanged" goes."""

    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int

    def file(self, source: str, path: str, class_name: str, split: str | None) -> SourceFile:
        return SourceFile(
            source,
            path,
            class_name,
            split,
            self.size,
            self.mtime_ns,
            ctime_ns=self.ctime_ns,
            inode=self.inode,
        )

    def reject(self, source: str, reason: str, message: str) -> SourceReject:
        return SourceReject(
            source,
            reason,
            message,
            self.size,
            self.mtime_ns,
            ctime_ns=self.ctime_ns,
            inode=self.inode,
        )


FILE_COLUMNS = (
    "source",
    "path",
    "class_name",
    "split",
    "size",
    "mtime_ns",
    "content_hash",
    "ctime_ns",
    "inode",
)
"""The fields of `SourceFile`, in order: the columns of `FileColumns.table`. `path` is stored
as bytes (`os.fsencode`): a file name need not be UTF-8."""


def _file_schema(columns: Sequence[SampleColumn] = ()) -> pa.Schema:
    """FILE_COLUMNS' types, then each declared column's (named `CARRIED` + its name)."""
    import pyarrow as pa  # NOTE: here, not above: pack workers import this module

    from etl.format.sample_columns import CARRIED

    text, number = pa.string(), pa.int64()
    types = (text, pa.binary(), text, text, number, number, text, number, pa.uint64())
    fields = list(zip(FILE_COLUMNS, types, strict=True))
    return pa.schema(fields + [(CARRIED + c.name, c.type) for c in columns])


class FileColumns:
    """Listed files as Arrow columns, sorted by source: a few dozen bytes a file where a
    `SourceFile` object costs hundreds, so a listing of 10M files fits in memory. Iterating
    gives `SourceFile`s, a batch at a time, for the code that handles a few."""

    def __init__(self, table: pa.Table, mapped: Mapped | None = None) -> None:
        self.table = table
        self._mapped = mapped
        """The file `table` is mapped from, when the listing went to disk."""

    def release_pages(self) -> None:
        """Let go of the listing's pages read so far, when it is mapped (`Mapped.release`)."""
        if self._mapped is not None:
            self._mapped.release()

    @classmethod
    def of(cls, files: Iterable[SourceFile]) -> FileColumns:
        """Columns of `files` (any order; sorted here)."""
        import pyarrow as pa

        from etl.format.table_ops import sorted_by

        rows = list(files)
        columns = {name: [getattr(f, name) for f in rows] for name in FILE_COLUMNS}
        columns["path"] = [os.fsencode(path) for path in columns["path"]]
        table = pa.table(columns, schema=_file_schema())
        del rows, columns
        return cls(sorted_by(table, "source"))

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def __iter__(self) -> Iterator[SourceFile]:
        for batch in self.table.to_batches(max_chunksize=1 << 16):
            columns = [batch.column(name).to_pylist() for name in FILE_COLUMNS]
            columns[1] = [os.fsdecode(path) for path in columns[1]]
            for values in zip(*columns, strict=True):
                yield SourceFile(*values)

    def __getitem__(self, index: int) -> SourceFile:
        if not -len(self) <= index < len(self):
            raise IndexError(f"file {index} of a listing of {len(self)}")
        row = self.table.select(list(FILE_COLUMNS)).slice(index % len(self), 1).to_pylist()[0]
        return SourceFile(**{**row, "path": os.fsdecode(row["path"])})


class FileColumnsBuilder:
    """Collects files column by column (texts in lists, numbers in `array`s: no object per
    number) and turns every `BATCH` of them into Arrow arrays, so a listing holds Python values
    for one batch at most. With a `scratch` folder the batches go to sorted runs on disk there
    and the listing is built as a mapped file, so listing 10M files holds one run in memory,
    not every file.

    A source added more than once is left out of the listing altogether and named in
    `duplicates` after `build`: what a duplicate means (an error, a reject) is the lister's to
    say, and finding it on the sorted listing costs no set of every source seen.

    `columns`: the declared per-sample columns; each file comes with their values, checked
    (`etl.format.sample_columns.values_of`)."""

    BATCH = 1 << 16

    def __init__(self, scratch: Path | None = None, columns: Sequence[SampleColumn] = ()) -> None:
        self._columns = tuple(columns)
        self._schema = _file_schema(self._columns)
        self._texts = _text_columns()
        self._numbers = _number_columns()
        self._values: list[list[Any]] = [[] for _ in self._columns]
        self._batches: list[pa.RecordBatch] = []
        self._scratch = scratch
        self._spill: Any = None
        self.duplicates: list[str] = []
        """After `build`: each source that was added more than once (sorted)."""
        self.dropped: list[str] = []
        """After `build`: each source of `build(drop=...)` that was added (sorted)."""
        if scratch is not None:
            from etl.format.spill import SortedSpill  # NOTE: here: pack workers import this module

            self._spill = SortedSpill(scratch, self._schema, "source", "listing")

    def add(
        self,
        source: str,
        path: str,
        class_name: str | None,
        stat: FileStat,
        split: str | None = None,
        content_hash: str | None = None,
        values: Sequence[Any] = (),
    ) -> None:
        for texts, text in zip(
            self._texts, (source, path, class_name, split, content_hash), strict=True
        ):
            texts.append(text)
        for column, number in zip(self._numbers, stat, strict=True):
            column.append(number)
        if self._values:  # NOTE: the per-file path of a 10M-file listing: nothing without columns
            for held, value in zip(self._values, values or [None] * len(self._values), strict=True):
                held.append(value)
        if len(self._texts[0]) >= self.BATCH:
            self._flush()

    def _flush(self) -> None:
        import numpy as np
        import pyarrow as pa

        sources, paths, classes, splits, hashes = self._texts
        if not sources:
            return
        sizes, mtimes, ctimes, inodes = (
            pa.array(np.frombuffer(column, dtype=column.typecode)) for column in self._numbers
        )
        encoded = [os.fsencode(p or "") for p in paths]  # a path is never None
        arrays = [sources, encoded, classes, splits, sizes, mtimes, hashes, ctimes, inodes]
        arrays += [pa.array(v, c.type) for v, c in zip(self._values, self._columns, strict=True)]
        batch = pa.record_batch(arrays, schema=self._schema)
        del encoded, arrays
        self._texts = _text_columns()
        self._numbers = _number_columns()
        self._values = [[] for _ in self._columns]
        if self._spill is not None:
            self._spill.add(pa.Table.from_batches([batch]))
        else:
            self._batches.append(batch)

    def build(
        self, drop: Collection[str] = (), drop_sorted: pa.ChunkedArray | pa.Array | None = None
    ) -> FileColumns:
        """The listing, sorted by source, without the sources in `drop` or `drop_sorted` (a
        sorted column, perhaps mapped from disk: only the slice each piece spans is read) or
        added twice."""
        import pyarrow as pa

        from etl.format.table_ops import sorted_by

        self._flush()
        unique = _UniqueSources(drop, drop_sorted)
        if self._scratch is not None:
            mapped = self._spill.written(self._scratch / "listing.arrow", through=unique.rows)
            files = FileColumns(mapped.table, mapped)
        else:
            table = pa.Table.from_batches(self._batches, schema=self._schema)
            self._batches.clear()
            kept = list(unique.rows(iter([sorted_by(table, "source")])))
            files = FileColumns(pa.concat_tables(kept) if kept else table.slice(0, 0))
        self.duplicates, self.dropped = sorted(unique.duplicates), sorted(unique.dropped)
        return files


class _UniqueSources:
    """Passes sorted pieces of a listing on without the rows whose source repeats or is in
    `drop`, noting which did. Rows that share the last source of a piece wait for the next
    piece, which may hold more of them."""

    def __init__(
        self, drop: Collection[str], drop_sorted: pa.ChunkedArray | pa.Array | None = None
    ) -> None:
        import pyarrow as pa

        self.drop = pa.array(sorted(drop), pa.string()) if drop else None
        self.drop_sorted = drop_sorted if drop_sorted is not None and len(drop_sorted) else None
        self._drop_at = 0
        self.duplicates: list[str] = []
        self.dropped: list[str] = []

    def rows(self, pieces: Iterator[pa.Table]) -> Iterator[pa.Table]:
        import pyarrow as pa
        import pyarrow.compute as pc

        held: pa.Table | None = None
        for piece in pieces:
            if held is not None:
                piece = pa.concat_tables([held, piece])
            if not piece.num_rows:
                continue
            sources = piece.column("source")
            tail = pc.index(sources, sources[-1]).as_py()
            held = piece.slice(tail)
            yield self._kept(piece.slice(0, tail))
        if held is not None:
            yield self._kept(held)

    def _kept(self, rows: pa.Table) -> pa.Table:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        if not rows.num_rows:
            return rows
        sources = rows.column("source").combine_chunks()
        repeats = pc.equal(sources.slice(1), sources.slice(0, len(sources) - 1))
        repeated = np.zeros(len(sources), dtype=bool)
        if len(sources) > 1:
            twice = repeats.to_numpy(zero_copy_only=False)
            repeated[1:] |= twice
            repeated[:-1] |= twice
        keep = ~repeated
        if repeated.any():
            self.duplicates += pc.unique(sources.filter(pa.array(repeated))).to_pylist()
        for drop in (self.drop, self._sorted_slice(sources[0].as_py(), sources[-1].as_py())):
            if drop is None or not len(drop):
                continue
            listed = pc.is_in(sources, value_set=drop)
            dropped = listed.to_numpy(zero_copy_only=False) & keep
            self.dropped += sources.filter(pa.array(dropped)).to_pylist()
            keep &= ~dropped
        return rows if keep.all() else rows.filter(pa.array(keep))

    def _sorted_slice(self, first: str, last: str) -> pa.Array | None:
        """The part of `drop_sorted` from `first` to `last` (pieces come in ascending order)."""
        import pyarrow as pa

        from etl.format.table_ops import bisect_left, bisect_right

        if self.drop_sorted is None:
            return None
        column = self.drop_sorted
        start = bisect_left(column, first, self._drop_at)
        stop = bisect_right(column, last, start)
        self._drop_at = start
        piece = column.slice(start, stop - start)
        return piece.combine_chunks() if isinstance(piece, pa.ChunkedArray) else piece


def _text_columns() -> tuple[list[str | None], ...]:
    """Source, path, class name, split and content hash: the text fields of `SourceFile`."""
    return [], [], [], [], []


def _number_columns() -> tuple[array[int], ...]:
    """Size, mtime and ctime (signed) and inode (unsigned), 8 bytes each: `FileStat`'s order."""
    return array("q"), array("q"), array("q"), array("Q")


@dataclass(frozen=True)
class SourceListing:
    files: FileColumns
    """Sorted by source. A tuple of `SourceFile`s is turned into columns."""
    rejects: Rejects
    """Never a source of `files`. A tuple of `SourceReject`s is turned into a table."""
    classes: tuple[str, ...] | None = None
    """The label order the source itself declares (a table's ClassLabel names; 0..max for
    integer labels), used when `source.classes` is not set; None: sorted class names."""

    def __post_init__(self) -> None:
        if not isinstance(self.files, FileColumns):
            object.__setattr__(self, "files", FileColumns.of(self.files))
        if not isinstance(self.rejects, Rejects):
            object.__setattr__(self, "rejects", Rejects.of(self.rejects))

    @property
    def listed(self) -> int:
        return len(self.files) + len(self.rejects)


@dataclass(frozen=True)
class ListContext:
    """What a lister may need beyond its source config (only lmdb and python use it)."""

    checksum: str
    """Algorithm of content hashes computed while listing (output.checksum)."""
    stored: Container[str] = field(default_factory=frozenset)
    """Content hashes the plan will reuse or reject without reading: not spooled again (a
    `DigestSet` in a run: no object per hash)."""
    spool: Path | None = None
    """Where a Python source writes the records to pack; None (a dry run) writes nothing."""
    wanted: frozenset[str] | None = None
    """When set, only records with these content hashes are spooled: what a repair or a reject
    sheet reads back (`etl.sources.locate`), not the whole source."""
    scratch: Path | None = None
    """A folder for the run's temporary files: a lister that can keeps its listing there, on
    disk, instead of in memory."""
    columns: tuple[SampleColumn, ...] = ()
    """The declared per-sample columns (`config.sample_columns`): a lister of a kind that
    carries them gives each file their values; a value that does not fit is a 'bad_column'
    reject naming where it was."""
