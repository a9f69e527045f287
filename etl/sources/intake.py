"""Building a listing as a lister meets its inputs: `ListingBuilder` (files, rejects, and a
source met twice found on the sorted listing), `Occurrences` (where each source was met, to
name a duplicate's records), and `RecordIntake` for the kinds whose records exist only while
they are listed (a Python function, tar shards, tables): hashed here, spooled for the workers."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

from etl.format.checksums import digest
from etl.sources.entries import (
    FileColumnsBuilder,
    FileStat,
    ListContext,
    SourceListing,
    repeated_sources,
)
from etl.sources.listed_rejects import Rejects, RejectsBuilder, SourceReject, rejects_table
from etl.sources.spool import NOT_SPOOLED, SpoolWriter

if TYPE_CHECKING:
    from etl.format.sample_columns import SampleColumn


class Occurrences:
    """Where each source was met, in order, as 8-byte hashes: enough to name the records or
    lines of a duplicate found on the sorted listing, without a set of every source."""

    def __init__(self) -> None:
        self._hashes = array("Q")

    def meet(self, source: str) -> None:
        self._hashes.append(_source_hash(source))

    def positions(self, source: str) -> list[int]:
        """Where `source` was met (and any source sharing its 64-bit hash)."""
        import numpy as np

        met = np.frombuffer(self._hashes, dtype=np.uint64)
        return [int(i) for i in np.flatnonzero(met == np.uint64(_source_hash(source)))]


def _source_hash(source: str) -> int:
    return xxhash.xxh3_64_intdigest(source.encode("utf-8", "surrogateescape"))


DuplicateReject = Callable[[str], tuple[str, str]]
"""source -> (reason, message) of a source taken more than once."""


class ListingBuilder:
    """A listing's files (as columns, `FileColumnsBuilder`) and rejects (`RejectsBuilder`) as a
    lister meets them, both on disk in sorted runs when there is a scratch folder. A source
    taken more than once, as files or rejects, becomes one reject of the reason the lister
    gives (`build`), found on the sorted listing: no set of every source is kept."""

    def __init__(self, scratch: Path | None, columns: Sequence[SampleColumn] = ()) -> None:
        self.files = FileColumnsBuilder(scratch, columns)
        """Where the lister adds each file."""
        self._rejects = RejectsBuilder(scratch)
        self._withdrawn: dict[str, tuple[str, str]] = {}
        self.duplicated: list[str] = []
        """After `build`: each source taken more than once (sorted)."""

    def reject(self, reject: SourceReject) -> None:
        self._rejects.add(reject)

    def withdraw(self, sources: Iterable[str], reason: str, message: str) -> None:
        """Make `sources` one reject each, whatever was taken of them before or after."""
        for source in sources:
            self._withdrawn[source] = (reason, message)

    def build(
        self, duplicate: DuplicateReject, classes: tuple[str, ...] | None = None
    ) -> SourceListing:
        import pyarrow as pa
        import pyarrow.compute as pc

        from etl.format.table_ops import sorted_by

        taken = self._rejects.build()
        sources = taken.table.column("source")
        files = self.files.build(drop=self._withdrawn.keys(), drop_sorted=sources)
        duplicated = {*self.files.duplicates, *repeated_sources(sources)}
        duplicated.update(s for s in self.files.dropped if s not in self._withdrawn)
        duplicated.difference_update(self._withdrawn)
        self.duplicated = sorted(duplicated)
        gone = duplicated | self._withdrawn.keys()
        extra = [SourceReject(s, *why) for s, why in self._withdrawn.items()]
        extra += [SourceReject(s, *duplicate(s)) for s in self.duplicated]
        if not gone:
            return SourceListing(files, taken, classes)
        kept = taken.table.filter(
            pc.invert(pc.is_in(sources, value_set=pa.array(sorted(gone), pa.string())))
        )
        rejects = sorted_by(pa.concat_tables([kept, rejects_table(extra)]), "source")
        return SourceListing(files, Rejects(rejects), classes)


class RecordIntake:
    """Takes the records of a source that has no file per sample (a Python function, tar
    shards, tables): each is hashed here, in this process, and the ones whose content is not
    already stored (`context.stored`) go into the spool (`context.spool`, NOTE [spool] in
    etl/sources/spool.py) for the workers. A dry run (no spool) writes nothing.

    NOTE: a record is spooled even when an earlier one had the same content: remembering
    every content spooled would cost an object per record, and duplicate content is rare."""

    def __init__(self, context: ListContext) -> None:
        self._checksum = context.checksum
        self._stored = context.stored
        self._wanted = context.wanted
        self._spool = SpoolWriter(context.spool) if context.spool is not None else None
        self._taken = ListingBuilder(context.scratch, context.columns)
        self.columns = context.columns
        """The declared per-sample columns, whose values `add` takes from a record."""
        self.class_names: set[str] = set()
        """The class name of every record added."""

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
        record: Mapping[str, Any] | None = None,
        where: str = "",
    ) -> None:
        """A record to pack (or to reuse, when its content is stored already). `in_place`: a
        locator workers can read the same bytes from (a member of an uncompressed tar), so the
        record is not spooled. `record` holds the declared columns' values (by their keys); one
        that does not fit makes the record a 'bad_column' reject, its message starting with
        `where` (which record)."""
        values: tuple[Any, ...] = ()
        if self.columns:
            # NOTE: imported here: pack workers import this module, and this imports pyarrow
            from etl.format.sample_columns import BadValue, values_of

            try:
                values = values_of(self.columns, record or {})
            except BadValue as exc:
                self.reject(source, "bad_column", f"{where}{exc}", payload)
                return
        content = digest(payload, self._checksum)
        locator = in_place or self._spooled(content, payload)
        stat = FileStat(len(payload), 0, 0, 0)
        self._taken.files.add(source, locator, class_name, stat, split, content, values)
        self.class_names.add(class_name)

    def _spooled(self, content: str, payload: bytes | memoryview) -> str:
        """The spool locator of `payload`; NOT_SPOOLED for content stored already (never
        read), content not `wanted`, and in a dry run."""
        if self._spool is None or content in self._stored:
            return NOT_SPOOLED
        if self._wanted is not None and content not in self._wanted:
            return NOT_SPOOLED
        return self._spool.append(payload)

    def reject(
        self, source: str, reason: str, message: str, payload: bytes | memoryview | None = None
    ) -> None:
        """A record that cannot be a sample; with its bytes, when it has them, so the reject
        carries their size and hash."""
        if payload is None:
            self._taken.reject(SourceReject(source, reason, message))
        else:
            size, content = len(payload), digest(payload, self._checksum)
            self._taken.reject(SourceReject(source, reason, message, size, 0, content))

    def withdraw(self, sources: set[str], reason: str, message: str) -> None:
        """Make `sources` one reject each, whatever was taken of them before (a key found twice:
        its first record may have been taken, its second rejected)."""
        self._taken.withdraw(sources, reason, message)

    def listing(
        self, duplicate: DuplicateReject, classes: tuple[str, ...] | None = None
    ) -> SourceListing:
        """The records taken; one taken twice is a reject `duplicate` names."""
        return self._taken.build(duplicate, classes)

    @property
    def duplicated(self) -> list[str]:
        """After `listing`: each source taken more than once."""
        return self._taken.duplicated
