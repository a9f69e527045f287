"""What every lister returns (`SourceFile`, `SourceReject`, `SourceListing`) and what it is
given (`ListContext`), with the helpers the record kinds share: `RecordIntake` for records that
exist only while they are listed, and the rules that turn a label into a class name."""

from __future__ import annotations

import numbers
import os
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from etl.format.checksums import digest
from etl.sources import readers

if TYPE_CHECKING:
    import pyarrow as pa

    from etl.format.mapped import Mapped


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


@dataclass(frozen=True, slots=True)
class SourceReject:
    source: str
    reason: str
    message: str
    size: int | None = None
    mtime_ns: int | None = None
    source_hash: str | None = None
    ctime_ns: int | None = None
    inode: int | None = None


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


def _file_schema() -> pa.Schema:
    import pyarrow as pa  # NOTE: here, not above: pack workers import this module

    text, number = pa.string(), pa.int64()
    types = (text, pa.binary(), text, text, number, number, text, number, pa.uint64())
    return pa.schema(list(zip(FILE_COLUMNS, types, strict=True)))


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

        from etl.format.columns import sorted_by

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
        row = self.table.slice(index % len(self), 1).to_pylist()[0]
        return SourceFile(**{**row, "path": os.fsdecode(row["path"])})


class FileColumnsBuilder:
    """Collects files column by column (texts in lists, numbers in `array`s: no object per
    number) and turns every `BATCH` of them into Arrow arrays, so a listing holds Python values
    for one batch at most. With a `scratch` folder the batches go to sorted runs on disk there
    and the listing is built as a mapped file, so listing 10M files holds one run in memory,
    not every file."""

    BATCH = 1 << 16

    def __init__(self, scratch: Path | None = None) -> None:
        self._texts: tuple[list[str], list[str], list[str | None]] = ([], [], [])
        self._numbers = _number_columns()
        self._batches: list[pa.RecordBatch] = []
        self._scratch = scratch
        self._spill: Any = None
        if scratch is not None:
            from etl.run.spill import SortedSpill  # NOTE: here: pack workers import this module

            self._spill = SortedSpill(scratch, _file_schema(), "source", "listing")

    def add(self, source: str, path: str, class_name: str | None, stat: FileStat) -> None:
        sources, paths, classes = self._texts
        sources.append(source)
        paths.append(path)
        classes.append(class_name)
        for column, value in zip(self._numbers, stat, strict=True):
            column.append(value)
        if len(sources) >= self.BATCH:
            self._flush()

    def _flush(self) -> None:
        import numpy as np
        import pyarrow as pa

        sources, paths, classes = self._texts
        if not sources:
            return
        none = pa.nulls(len(sources), pa.string())
        sizes, mtimes, ctimes, inodes = (
            pa.array(np.frombuffer(column, dtype=column.typecode)) for column in self._numbers
        )
        encoded = [os.fsencode(p) for p in paths]
        arrays = [sources, encoded, classes, none, sizes, mtimes, none, ctimes, inodes]
        batch = pa.record_batch(arrays, schema=_file_schema())
        del encoded, arrays
        self._texts = ([], [], [])
        self._numbers = _number_columns()
        if self._spill is not None:
            self._spill.add(pa.Table.from_batches([batch]))
        else:
            self._batches.append(batch)

    def build(self) -> FileColumns:
        import pyarrow as pa

        from etl.format.columns import sorted_by

        self._flush()
        if self._scratch is not None:
            mapped = self._spill.written(self._scratch / "listing.arrow")
            return FileColumns(mapped.table, mapped)
        table = pa.Table.from_batches(self._batches, schema=_file_schema())
        self._batches.clear()
        return FileColumns(sorted_by(table, "source"))


def _number_columns() -> tuple[array[int], ...]:
    """Size, mtime and ctime (signed) and inode (unsigned), 8 bytes each: `FileStat`'s order."""
    return array("q"), array("q"), array("q"), array("Q")


@dataclass(frozen=True)
class SourceListing:
    files: FileColumns
    """Sorted by source. A tuple of `SourceFile`s is turned into columns."""
    rejects: tuple[SourceReject, ...]
    classes: tuple[str, ...] | None = None
    """The label order the source itself declares (a table's ClassLabel names; 0..max for
    integer labels), used when `source.classes` is not set; None: sorted class names."""

    def __post_init__(self) -> None:
        if not isinstance(self.files, FileColumns):
            object.__setattr__(self, "files", FileColumns.of(self.files))

    @property
    def listed(self) -> int:
        return len(self.files) + len(self.rejects)


@dataclass(frozen=True)
class ListContext:
    """What a lister may need beyond its source config (only lmdb and python use it)."""

    checksum: str
    """Algorithm of content hashes computed while listing (output.checksum)."""
    stored: frozenset[str] = field(default_factory=frozenset)
    """Content hashes the plan will reuse or reject without reading: not spooled again."""
    spool: Path | None = None
    """Where a Python source writes the records to pack; None (a dry run) writes nothing."""
    wanted: frozenset[str] | None = None
    """When set, only records with these content hashes are spooled: what a repair or a reject
    sheet reads back (`etl.sources.locate`), not the whole source."""
    scratch: Path | None = None
    """A folder for the run's temporary files: a lister that can keeps its listing there, on
    disk, instead of in memory."""


def label_text(value: Any) -> str | None:
    """A label as a class name: text as it is (stripped; empty is None), an integer (also a
    numpy one) as its decimal digits."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))
    raise TypeError(f"label {value!r} is a {type(value).__name__}, not text or an integer")


class RecordIntake:
    """Takes the records of a source that has no file per sample (a Python function, tar
    shards, tables): each is hashed here, in this process, and the ones whose content is not
    already stored (`context.stored`) go into the spool (`context.spool`, NOTE [spool] in
    etl/readers.py) for the workers. A dry run (no spool) writes nothing."""

    def __init__(self, context: ListContext) -> None:
        self._checksum = context.checksum
        self._stored = context.stored
        self._wanted = context.wanted
        self._spool = readers.SpoolWriter(context.spool) if context.spool is not None else None
        self._spooled: dict[str, str] = {}
        self.files: list[SourceFile] = []
        self.rejects: list[SourceReject] = []

    def __enter__(self) -> RecordIntake:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._spool is not None:
            self._spool.close()

    def add(
        self,
        source: str,
        payload: bytes | memoryview,
        class_name: str,
        split: str | None,
        in_place: str | None = None,
    ) -> None:
        """A record to pack (or to reuse, when its content is stored already). `in_place`: a
        locator workers can read the same bytes from (a member of an uncompressed tar), so the
        record is not spooled."""
        content = digest(payload, self._checksum)
        locator = in_place or self._spool_once(content, payload)
        self.files.append(
            SourceFile(source, locator, class_name, split, len(payload), 0, content_hash=content)
        )

    def _spool_once(self, content: str, payload: bytes | memoryview) -> str:
        """The spool locator of `content`, appended the first time; NOT_SPOOLED for content
        stored already (never read) and in a dry run."""
        if content in self._spooled:
            return self._spooled[content]
        if self._spool is None or content in self._stored:
            return readers.NOT_SPOOLED
        if self._wanted is not None and content not in self._wanted:
            return readers.NOT_SPOOLED
        locator = self._spooled[content] = self._spool.append(payload)
        return locator

    def reject(
        self, source: str, reason: str, message: str, payload: bytes | memoryview | None = None
    ) -> None:
        """A record that cannot be a sample; with its bytes, when it has them, so the reject
        carries their size and hash."""
        if payload is None:
            self.rejects.append(SourceReject(source, reason, message))
        else:
            size, content = len(payload), digest(payload, self._checksum)
            self.rejects.append(SourceReject(source, reason, message, size, 0, content))

    def withdraw(self, sources: set[str], reason: str, message: str) -> None:
        """Make `sources` one reject each, whatever was taken of them before (a key found twice:
        its first record may have been taken, its second rejected)."""
        self.files = [f for f in self.files if f.source not in sources]
        self.rejects = [r for r in self.rejects if r.source not in sources]
        self.rejects += [SourceReject(source, reason, message) for source in sorted(sources)]

    def listing(self, classes: tuple[str, ...] | None = None) -> SourceListing:
        rejects = sorted(self.rejects, key=lambda r: r.source)
        return SourceListing(FileColumns.of(self.files), tuple(rejects), classes)


def class_name_of(value: Any, classes: tuple[str, ...] | None) -> str | None:
    """A record's label as a class name. Text is a class name as it is (stripped; empty is
    None). An integer (also a numpy one) indexes `classes` when given, and otherwise stands for
    itself as its decimal digits. ValueError for a negative integer (the Hub's -1: no label) or
    one outside `classes`, TypeError for a value that is neither."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"label {int(value)} is negative: the record has no class")
        if classes is not None:
            if int(value) >= len(classes):
                raise ValueError(f"label {int(value)} is outside the {len(classes)} class names")
            return classes[int(value)]
    return label_text(value)


def integer_classes(names: Iterable[str]) -> tuple[str, ...] | None:
    """For labels that are all non-negative integers: '0' .. the largest, so label i stays i
    even where a class has no sample; None when any label is not such an integer."""
    largest = -1
    for name in names:
        if not name.isdecimal() or (len(name) > 1 and name[0] == "0"):
            return None
        largest = max(largest, int(name))
    return tuple(str(i) for i in range(largest + 1)) if largest >= 0 else None
