"""Inputs a lister refused, each a `SourceReject` saying why it cannot be a sample: a listing's
rejects as Arrow rows (`Rejects`), built as they come and spilled to disk when many
(`RejectsBuilder`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from etl.format.mapped import Mapped


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


REJECT_FIELDS = (
    "source", "reason", "message", "size", "mtime_ns", "ctime_ns", "inode", "source_hash"
)  # fmt: skip
"""The fields of a `SourceReject` in the order of REJECTS_SCHEMA's columns."""


def rejects_table(rejects: Iterable[SourceReject]) -> pa.Table:
    """Rejects as rows of a version's rejects table (REJECTS_SCHEMA), in the order given: how
    rejects leave Python objects behind a window, a bucket or a shard at a time."""
    import pyarrow as pa  # NOTE: here, not above: pack workers import this module

    from etl.format.schema import REJECTS_SCHEMA

    rows = list(rejects)
    columns = [[getattr(r, name) for r in rows] for name in REJECT_FIELDS]
    return pa.table(columns, schema=REJECTS_SCHEMA)


class Rejects(Sequence[SourceReject]):
    """A listing's rejects as a table (REJECTS_SCHEMA), on disk when large (`mapped`): 800k
    missing files of a listing cost ~700 bytes each as objects. Iterating makes objects a
    record batch at a time, for the few callers that look at rejects one by one."""

    def __init__(self, table: pa.Table, mapped: Mapped | None = None) -> None:
        self.table = table
        self.mapped = mapped

    @classmethod
    def of(cls, rejects: Iterable[SourceReject]) -> Rejects:
        return rejects if isinstance(rejects, Rejects) else cls(rejects_table(rejects))

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"reject {index} of {len(self)}")
        return next(_reject_objects(self.table.slice(index % len(self), 1)))

    def __iter__(self) -> Iterator[SourceReject]:
        return _reject_objects(self.table)


def _reject_objects(table: pa.Table) -> Iterator[SourceReject]:
    for batch in table.to_batches():
        columns = [batch.column(i).to_pylist() for i in range(len(REJECT_FIELDS))]
        for values in zip(*columns, strict=True):
            yield SourceReject(**dict(zip(REJECT_FIELDS, values, strict=True)))


class RejectsBuilder:
    """Collects a lister's rejects a batch of objects at a time into Arrow, on disk in sorted
    runs when there is a `scratch` folder (as `FileColumnsBuilder` does with files)."""

    BATCH = 1 << 14

    def __init__(self, scratch: Path | None = None) -> None:
        self._pending: list[SourceReject] = []
        self._tables: list[pa.Table] = []
        self._scratch = scratch
        self._spill: Any = None
        if scratch is not None:
            from etl.format.schema import REJECTS_SCHEMA
            from etl.format.spill import SortedSpill  # NOTE: here: pack workers import this module

            self._spill = SortedSpill(scratch, REJECTS_SCHEMA, "source", "listed-rejects")

    def add(self, reject: SourceReject) -> None:
        self._pending.append(reject)
        if len(self._pending) >= self.BATCH:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        table = rejects_table(self._pending)
        self._pending = []
        if self._spill is not None:
            self._spill.add(table)
        else:
            self._tables.append(table)

    def build(self) -> Rejects:
        """Every reject added, sorted by source."""
        import pyarrow as pa

        from etl.format.schema import REJECTS_SCHEMA
        from etl.format.table_ops import sorted_by

        self._flush()
        if self._spill is not None:
            assert self._scratch is not None
            mapped = self._spill.written(self._scratch / "listed-rejects.arrow")
            return Rejects(mapped.table, mapped)
        table = pa.concat_tables(self._tables) if self._tables else REJECTS_SCHEMA.empty_table()
        self._tables = []
        return Rejects(sorted_by(table, "source"))
