"""The `listing` kind: a CSV or Parquet file with columns path, label and optionally split.
Its files are stat-ed, never read, while listing; a listed file that is missing, or a bad row,
becomes a `SourceReject` naming its line."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from etl.config import ListingSource
from etl.errors import SourceError
from etl.format import names
from etl.sources import in_store
from etl.sources.entries import FileStat, ListContext, SourceListing
from etl.sources.intake import ListingBuilder, Occurrences
from etl.sources.kind import SourceKind
from etl.sources.listed_rejects import SourceReject
from etl.sources.safe_files import stat_file, too_large
from etl.sources.timed import check_in_store, read_file

if TYPE_CHECKING:
    import pyarrow as pa

    from etl.format.sample_columns import SampleColumn


def listing_batches(
    path: Path | str,
    text_columns: tuple[str, ...] = (),
    bad_rows: list[tuple[int, str]] | None = None,
    byte_columns: tuple[str, ...] = (),
    options: in_store.Options | None = None,
) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The schema of a CSV/TSV/Parquet listing and its rows, a batch at a time (a 10M-row
    listing is never whole in memory).

    `text_columns` are read from CSV as strings, never inferred as numbers ('007' stays);
    `byte_columns` as bytes, in any encoding (file names need not be UTF-8). With `bad_rows`, a
    CSV row with the wrong number of fields is skipped and recorded there as (line number,
    text) before the batch it would have been in is yielded; without it, it is an error naming
    the line. An unreadable file is a SourceError, on opening or at the batch that fails.
    `path` may be an object's URL (`options`: its store's).
    """

    # NOTE: imported here, not above: pack workers import this module (SourceFile,
    # SourceReject) and never read a listing; pyarrow would add to every worker's start-up.
    import pyarrow as pa
    import pyarrow.parquet as pq

    suffix = PurePosixPath(str(path)).suffix.lower()
    if suffix not in (".parquet", ".csv", ".tsv"):
        raise SourceError(
            f"{path}: listing must be .csv, .tsv or .parquet, not {suffix or 'no suffix'}"
        )
    try:
        source: Any = in_store.open_object(path, options) if isinstance(path, str) else path
        if suffix == ".parquet":
            parquet = pq.ParquetFile(source)
            schema, batches = parquet.schema_arrow, parquet.iter_batches(LISTING_BATCH)
        else:
            reader = _open_csv(source, suffix, text_columns, byte_columns, bad_rows)
            schema, batches = reader.schema, reader
    except (pa.ArrowInvalid, OSError) as exc:
        raise SourceError(f"{path}: cannot read listing ({exc})") from None

    def checked() -> Iterator[pa.RecordBatch]:
        try:
            yield from batches
        except (pa.ArrowInvalid, OSError) as exc:
            raise SourceError(f"{path}: cannot read listing ({exc})") from None

    return schema, checked()


def _open_csv(
    source: Any,
    suffix: str,
    text_columns: tuple[str, ...],
    byte_columns: tuple[str, ...],
    bad_rows: list[tuple[int, str]] | None,
) -> Any:
    """pyarrow's streaming reader of a CSV (TSV for ".tsv") listing, as `listing_batches`
    reads it: named columns as text or bytes, only an empty cell null, bad rows recorded."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    def skip(row: Any) -> str:
        assert bad_rows is not None
        bad_rows.append((row.number or 0, row.text))
        return "skip"

    return pacsv.open_csv(
        source,
        # NOTE: one thread, so the handler sees every bad row with its line number
        read_options=pacsv.ReadOptions(use_threads=bad_rows is None),
        parse_options=pacsv.ParseOptions(
            delimiter="\t" if suffix == ".tsv" else ",",
            invalid_row_handler=skip if bad_rows is not None else None,
        ),
        # NOTE: types are inferred from the first block and then fixed, so every column a
        # caller reads as text is named: a label column of digits that turns to words a
        # million rows later is not an error
        convert_options=pacsv.ConvertOptions(
            # NOTE: only an empty cell is null: pyarrow's default also reads NA, null, nan,
            # N/A... as null, which would make a class, a path or a caption named so a
            # missing value
            strings_can_be_null=True,
            null_values=[""],
            column_types={
                **{name: pa.string() for name in text_columns},
                **{name: pa.binary() for name in byte_columns},
            },
        ),
    )


LISTING_BATCH = 1 << 14
"""Rows of a listing read at a time."""


def table_column(
    table: pa.Table, name: str, path: Path | str, required: bool
) -> list[str | None] | None:
    if name not in table.column_names:
        if required:
            raise SourceError(
                f"{path}: no column {name!r}; columns are {table.column_names} "
                f"(set source.{'path' if name == 'path' else 'label'}_column to rename)"
            )
        return None
    # NOTE: bytes (a path column read as binary) decode as the OS decodes file names, so a name
    # that is not UTF-8 keeps its bytes (surrogateescape) and reaches the file it names.
    return [
        None if v is None else os.fsdecode(v) if isinstance(v, bytes) else str(v)
        for v in table.column(name).to_pylist()
    ]


def check_unique_columns(schema: pa.Schema, read: list[str], where: Path | str) -> None:
    """SourceError naming the file when a column it reads appears more than once (a CSV
    header or a table may repeat a name; which one is meant cannot be known)."""
    for name in dict.fromkeys(read):
        if schema.names.count(name) > 1:
            raise SourceError(
                f"{where}: column {name!r} appears {schema.names.count(name)} times; "
                "rename all but one"
            )


def _line_names(path: Path | str, bad_rows: list[tuple[int, str]]) -> Iterator[str]:
    """How an error names each row of the table, in order: 'row i' in Parquet; in CSV its
    line (the header is line 1), counting the skipped bad rows' lines. `bad_rows` may grow
    while this is read, as long as it holds every bad row before the row asked for."""
    if PurePosixPath(str(path)).suffix.lower() == ".parquet":
        yield from (f"row {i}" for i in itertools.count())
        return
    passed = 0
    for number in itertools.count(2):
        while passed < len(bad_rows) and bad_rows[passed][0] < number:
            passed += 1
        if passed == len(bad_rows) or bad_rows[passed][0] != number:
            yield f"line {number}"


def line_name(path: Path | str, bad_rows: list[tuple[int, str]], row: int) -> str:
    """`_line_names` of row `row` alone."""
    return next(itertools.islice(_line_names(path, bad_rows), row, None))


def listing_cell(
    path: Path | str, column: str, row: int, options: in_store.Options | None = None
) -> str | None:
    """The text of one cell of a listing, read again (for an error message)."""
    _, batches = listing_batches(path, bad_rows=[], byte_columns=(column,), options=options)
    for batch in batches:
        if row < batch.num_rows:
            (value,) = table_column(batch.slice(row, 1), column, path, required=True) or [None]
            return value
        row -= batch.num_rows
    return None


def list_listing(config: ListingSource, context: ListContext | None = None) -> SourceListing:
    """Read a listing; paths are relative to the listing file's folder (or, for a listing in
    object storage, its prefix: the listed objects are looked up in one listing of it). A row
    that cannot be a sample (malformed, empty, absolute, leading out of the folder, not a
    regular file) is a reject naming its line; only a path listed twice stops the run, naming
    both lines. The declared columns are the listing's columns of their keys (JSON text for a
    list or struct in CSV); a value that does not fit is a 'bad_column' reject naming its line.

    The table is read a batch of rows at a time, its cells as Python values; a path listed
    twice is found on the sorted listing (`ListingBuilder`), not in a set."""
    listing, options = config.path, config.storage_options
    _check(config)
    bad_rows: list[tuple[int, str]] = []
    columns = context.columns if context is not None else ()
    keys = [c.key for c in columns]
    text = tuple(c for c in (config.label_column, config.split_column, *keys) if c)
    schema, batches = listing_batches(listing, text, bad_rows, (config.path_column,), options)
    _check_columns(schema, config, keys)
    is_text = PurePosixPath(str(listing)).suffix.lower() != ".parquet"
    if isinstance(listing, str):
        find = _store_files(config, listing)
    else:
        find = _local_files(config, listing)
    listing_name = PurePosixPath(str(listing)).name
    taken = ListingBuilder(context.scratch if context is not None else None, columns)
    line_of = _line_names(listing, bad_rows)
    met = Occurrences()
    rows_in = _ListedRows(str(listing), find, taken, met, columns, is_text)
    for batch in batches:
        rows = batch.num_rows
        paths = table_column(batch, config.path_column, listing, required=True)
        labels = table_column(batch, config.label_column, listing, required=True)
        splits = table_column(batch, config.split_column, listing, required=False) or [None] * rows
        assert paths is not None and labels is not None
        cells = {key: batch.column(key).to_pylist() for key in keys}
        for at, (raw, label, split) in enumerate(zip(paths, labels, splits, strict=True)):
            record = {k: cells[k][at] for k in keys}
            rows_in.take(next(line_of), raw, label, split, record)
    for number, text_of_row in bad_rows:
        where = f"{listing}:{number}"
        taken.reject(
            SourceReject(
                f"{listing_name} line {number}",
                "bad_row",
                f"{where}: malformed row {text_of_row[:80]!r}",
            )
        )
    found = taken.build(lambda source: ("duplicate_path", "listed twice"))
    if taken.duplicated:
        _refuse_twice(config, met.positions(taken.duplicated[0]), bad_rows)
    return found


@dataclass
class _ListedRows:
    """Each row of a listing taken as a listed file, or a reject naming its line: an empty
    path, one outside the listing's folder, one `find` refuses, no label, a bad column value.
    `met` counts every row's source, so a path listed twice can name both lines."""

    listing: str
    find: FindFile
    taken: ListingBuilder
    met: Occurrences
    columns: tuple[SampleColumn, ...]
    is_text: bool

    def take(
        self, line: str, raw: str | None, label: str | None, split: str | None, record: dict
    ) -> None:
        from etl.format.sample_columns import BadValue, values_of  # NOTE: here: imports pyarrow

        where, taken = f"{self.listing}:{line}", self.taken
        if raw is None or not raw.strip():
            name = PurePosixPath(self.listing).name
            taken.reject(SourceReject(f"{name} {line}", "bad_row", f"{where}: empty path"))
            self.met.meet("")
            return
        pure = PurePosixPath(raw.strip().replace("\\", "/"))
        relative = os.path.normpath(pure.as_posix())
        source = names.to_source(os.fsencode(relative))
        self.met.meet(source)
        if pure.is_absolute() or relative == ".." or relative.startswith("../"):
            why = f"{where}: path {raw!r} is outside the listing's folder"
            taken.reject(SourceReject(source, "outside_root", why))
            return
        full, outcome = self.find(source, relative, where)
        if isinstance(outcome, SourceReject):
            taken.reject(outcome)
        elif label is None or not label.strip():
            taken.reject(outcome.reject(source, "unknown_label", f"{line} has no label"))
        else:
            try:
                values = values_of(self.columns, record, self.is_text) if record else ()
            except BadValue as exc:
                taken.reject(outcome.reject(source, "bad_column", f"{where}: {exc}"))
                return
            taken.files.add(source, full, label.strip(), outcome, split or None, None, values)


def _check_columns(schema: pa.Schema, config: ListingSource, keys: Sequence[str]) -> None:
    """SourceError naming the listing for a column it lacks or has twice: the path and label
    columns, and every declared per-sample column's key."""
    listing = config.path
    read = (config.path_column, config.label_column, config.split_column, *keys)
    check_unique_columns(schema, [c for c in read if c], listing)
    for name in (config.path_column, config.label_column):
        table_column(schema.empty_table(), name, listing, required=True)
    for key in keys:
        if key not in schema.names:
            raise SourceError(
                f"{listing}: no column {key!r} (columns:); columns are {schema.names}"
            )


def _refuse_twice(
    config: ListingSource, positions: Sequence[int], bad_rows: list[tuple[int, str]]
) -> None:
    """The SourceError of a path listed twice, naming its lines: the last and the others."""
    listing = config.path
    *before, last = positions
    raw_path = listing_cell(listing, config.path_column, last, config.storage_options)
    also = ", ".join(line_name(listing, bad_rows, i) for i in before)
    raise SourceError(
        f"{listing}:{line_name(listing, bad_rows, last)}: path {raw_path!r} is listed "
        f"twice (also {also})"
    )


FindFile = Callable[[str, str, str], tuple[str, "FileStat | SourceReject"]]
"""(source, path relative to the listing's folder, where in the listing) -> (its locator, its
stat or why it cannot be a sample)."""


def _local_files(config: ListingSource, listing: Path) -> FindFile:
    """Listed paths as files under the listing's folder: stat-ed, links followed only inside."""
    base = listing.parent
    real_base = os.path.realpath(base) + os.sep

    def find(source: str, relative: str, where: str) -> tuple[str, FileStat | SourceReject]:
        full = os.path.join(base, relative)
        if not os.path.realpath(full).startswith(real_base):
            why = f"{where}: a link leads outside the listing's folder"
            return full, SourceReject(source, "outside_root", why)
        return full, stat_file(source, full, config.max_file_bytes)

    return find


def _store_files(config: ListingSource, listing: str) -> FindFile:
    """Listed paths as objects under the listing's prefix, looked up in one listing of it
    (`in_store.stats_under`, each page within io_timeout): its size, time and ETag stand for
    a stat."""
    base = listing.rsplit("/", 1)[0]
    options = config.storage_options
    stats = in_store.stats_under(base, options, config.io_timeout)  # each page within it

    def find(source: str, relative: str, where: str) -> tuple[str, FileStat | SourceReject]:
        full = f"{base}/{relative}"
        found = stats.get(relative)
        if found is None:
            return full, SourceReject(source, "missing", f"{where}: no object {full}")
        if found.size > config.max_file_bytes:
            why = too_large(found.size, config.max_file_bytes)
            return full, found.reject(source, "file_too_large", why)
        return full, found

    return find


def _check(config: ListingSource) -> None:
    if isinstance(config.path, str):
        check_in_store(config, in_store.is_object, "is not an object in the store")
    elif not config.path.is_file():
        raise SourceError(f"source.path: {config.path} is not a file")


def _folder_of(config: ListingSource) -> Path | str:
    """Where listed paths are relative to: the listing's folder, or its prefix."""
    if isinstance(config.path, str):
        return config.path.rsplit("/", 1)[0]
    return config.path.parent


KIND = SourceKind(
    name="listing",
    list=list_listing,
    read=read_file,
    check=_check,
    root=_folder_of,
    by_path=True,
    columns=True,
)
