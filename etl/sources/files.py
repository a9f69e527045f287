"""Folders and listings: only paths and `stat` are read here, never image bytes, so a no-change
rerun over 100k files stays a matter of seconds. A file outside any class folder, a link out of
the root or a listed file that is missing becomes a `SourceReject`."""

from __future__ import annotations

import fnmatch
import itertools
import os
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from etl.config import FolderSource, ListingSource
from etl.errors import SourceError
from etl.format import names
from etl.sources import readers

if TYPE_CHECKING:
    import pyarrow as pa
from etl.sources.base import (
    FileColumnsBuilder,
    FileStat,
    ListContext,
    ListingBuilder,
    Occurrences,
    SourceListing,
    SourceReject,
)


def _pattern(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """One compiled regex for a list of fnmatch patterns (case-insensitive)."""
    if not patterns:
        return None
    return re.compile("|".join(fnmatch.translate(p.lower()) for p in patterns))


def _walk(root: str, unlistable: list[tuple[str, OSError]]) -> Iterator[os.DirEntry[str]]:
    """Entries under root that are not folders, depth first; dot-entries skipped, links to
    folders not followed. A folder below root that cannot be listed (permission, a path over
    the OS limit, an I/O error midway) goes to `unlistable` and the walk goes on."""
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.name.startswith("."):
                        continue
                    if _is_folder(entry):
                        stack.append(entry.path)
                    else:
                        yield entry
        except OSError as exc:
            if folder == root:
                raise SourceError(f"source.path: cannot list {root}: {exc.strerror}") from None
            unlistable.append((folder, exc))


def _is_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False  # listed as a file; its stat names the problem


def list_folder(config: FolderSource, context: ListContext | None = None) -> SourceListing:
    """Walk `config.path`: the first path component is the class. Dot-files are skipped; links to
    folders are not followed; a linked file that resolves outside the root, anything that is not
    a regular file (a FIFO, socket, device, a link to a folder) and a folder that cannot be
    listed are rejects. Only `stat` is called here: no file is opened.

    NOTE: os.scandir and plain strings, not pathlib: a no-change rerun over 100k files spends
    most of its time here, and pathlib's object overhead tripled it.
    """
    root = config.path
    if not root.is_dir():
        raise SourceError(f"source.path: {root} is not a folder")
    top = str(root)
    prefix = len(top) + 1
    real_root = os.path.realpath(top) + os.sep
    include, exclude = _pattern(config.include), _pattern(config.exclude)
    files = FileColumnsBuilder(context.scratch if context is not None else None)
    rejects: list[SourceReject] = []
    unlistable: list[tuple[str, OSError]] = []
    for entry in _walk(top, unlistable):
        relative = entry.path[prefix:]
        lowered = relative.lower()
        if include is None or not include.match(lowered):
            continue
        if exclude is not None and exclude.match(lowered):
            continue
        source = names.path_to_source(relative)
        if entry.is_symlink() and not os.path.realpath(entry.path).startswith(real_root):
            rejects.append(SourceReject(source, "outside_root", "link leads outside the root"))
            continue
        outcome = _stat_file(source, entry.path, config.max_file_bytes)
        if isinstance(outcome, SourceReject):
            rejects.append(outcome)
            continue
        slash = relative.find("/")
        if slash < 0:
            rejects.append(outcome.reject(source, "no_class", "file is not inside a class folder"))
            continue
        files.add(source, entry.path, names.path_to_source(relative[:slash]), outcome)
    for folder, exc in unlistable:
        rejects.append(
            SourceReject(
                names.path_to_source(folder[prefix:] + "/"),
                "folder_unreadable",
                f"cannot list this folder: {exc.strerror or exc}",
            )
        )
    rejects.sort(key=lambda r: r.source)
    return SourceListing(files.build(), tuple(rejects))


def _stat_file(source: str, path: str, max_bytes: int) -> FileStat | SourceReject:
    """The stat of the regular file at `path` (links followed), or why it is none."""
    try:
        st = os.stat(path)
    except OSError as exc:
        reason = "missing" if isinstance(exc, FileNotFoundError) else "io_error"
        return SourceReject(source, reason, f"cannot stat: {exc.strerror}")
    kind = readers.not_a_file(st)
    if kind is not None:
        return SourceReject(source, "not_a_file", f"{kind}, not a regular file (never opened)")
    found = FileStat(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if st.st_size > max_bytes:
        return found.reject(source, "file_too_large", readers.too_large(st.st_size, max_bytes))
    return found


def listing_batches(
    path: Path,
    text_columns: tuple[str, ...] = (),
    bad_rows: list[tuple[int, str]] | None = None,
    byte_columns: tuple[str, ...] = (),
) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The schema of a CSV/TSV/Parquet listing and its rows, a batch at a time (a 10M-row
    listing is never whole in memory).

    `text_columns` are read from CSV as strings, never inferred as numbers ('007' stays);
    `byte_columns` as bytes, in any encoding (file names need not be UTF-8). With `bad_rows`, a
    CSV row with the wrong number of fields is skipped and recorded there as (line number,
    text) before the batch it would have been in is yielded; without it, it is an error naming
    the line. An unreadable file is a SourceError, on opening or at the batch that fails.
    """

    def skip(row: Any) -> str:
        assert bad_rows is not None
        bad_rows.append((row.number or 0, row.text))
        return "skip"

    # NOTE: imported here, not above: pack workers import this module (SourceFile,
    # SourceReject) and never read a listing; pyarrow would add to every worker's start-up.
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    suffix = path.suffix.lower()
    if suffix not in (".parquet", ".csv", ".tsv"):
        raise SourceError(
            f"{path}: listing must be .csv, .tsv or .parquet, not {suffix or 'no suffix'}"
        )
    try:
        if suffix == ".parquet":
            parquet = pq.ParquetFile(path)
            schema, batches = parquet.schema_arrow, parquet.iter_batches(LISTING_BATCH)
        else:
            reader = pacsv.open_csv(
                path,
                # NOTE: one thread, so the handler sees every bad row with its line number
                read_options=pacsv.ReadOptions(use_threads=bad_rows is None),
                parse_options=pacsv.ParseOptions(
                    delimiter="\t" if suffix == ".tsv" else ",",
                    invalid_row_handler=skip if bad_rows is not None else None,
                ),
                # NOTE: types are inferred from the first block and then fixed, so every column
                # a caller reads as text is named: a label column of digits that turns to
                # words a million rows later is not an error
                convert_options=pacsv.ConvertOptions(
                    strings_can_be_null=True,
                    column_types={
                        **{name: pa.string() for name in text_columns},
                        **{name: pa.binary() for name in byte_columns},
                    },
                ),
            )
            schema, batches = reader.schema, reader
    except (pa.ArrowInvalid, OSError) as exc:
        raise SourceError(f"{path}: cannot read listing ({exc})") from None

    def checked() -> Iterator[pa.RecordBatch]:
        try:
            yield from batches
        except (pa.ArrowInvalid, OSError) as exc:
            raise SourceError(f"{path}: cannot read listing ({exc})") from None

    return schema, checked()


LISTING_BATCH = 1 << 14
"""Rows of a listing read at a time."""


def table_column(table: pa.Table, name: str, path: Path, required: bool) -> list[str | None] | None:
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


def _line_names(path: Path, bad_rows: list[tuple[int, str]]) -> Iterator[str]:
    """How an error names each row of the table, in order: 'row i' in Parquet; in CSV its
    line (the header is line 1), counting the skipped bad rows' lines. `bad_rows` may grow
    while this is read, as long as it holds every bad row before the row asked for."""
    if path.suffix.lower() == ".parquet":
        yield from (f"row {i}" for i in itertools.count())
        return
    passed = 0
    for number in itertools.count(2):
        while passed < len(bad_rows) and bad_rows[passed][0] < number:
            passed += 1
        if passed == len(bad_rows) or bad_rows[passed][0] != number:
            yield f"line {number}"


def line_name(path: Path, bad_rows: list[tuple[int, str]], row: int) -> str:
    """`_line_names` of row `row` alone."""
    return next(itertools.islice(_line_names(path, bad_rows), row, None))


def listing_cell(path: Path, column: str, row: int) -> str | None:
    """The text of one cell of a listing, read again (for an error message)."""
    _, batches = listing_batches(path, bad_rows=[], byte_columns=(column,))
    for batch in batches:
        if row < batch.num_rows:
            (value,) = table_column(batch.slice(row, 1), column, path, required=True) or [None]
            return value
        row -= batch.num_rows
    return None


def list_listing(config: ListingSource, context: ListContext | None = None) -> SourceListing:
    """Read a listing; paths are relative to the listing file's folder. A row that cannot be a
    sample (malformed, empty, absolute, leading out of the folder, not a regular file) is a
    reject naming its line; only a path listed twice stops the run, naming both lines.

    The table is read a batch of rows at a time, its cells as Python values; a path listed
    twice is found on the sorted listing (`ListingBuilder`), not in a set."""
    listing = config.path
    if not listing.is_file():
        raise SourceError(f"source.path: {listing} is not a file")
    bad_rows: list[tuple[int, str]] = []
    text = tuple(c for c in (config.label_column, config.split_column) if c)
    schema, batches = listing_batches(listing, text, bad_rows, (config.path_column,))
    for name in (config.path_column, config.label_column):
        table_column(schema.empty_table(), name, listing, required=True)
    base = listing.parent
    real_base = os.path.realpath(base) + os.sep
    taken = ListingBuilder(context.scratch if context is not None else None)
    line_of = _line_names(listing, bad_rows)
    met = Occurrences()
    for batch in batches:
        rows = batch.num_rows
        paths = table_column(batch, config.path_column, listing, required=True)
        labels = table_column(batch, config.label_column, listing, required=True)
        splits = table_column(batch, config.split_column, listing, required=False) or [None] * rows
        assert paths is not None and labels is not None
        for raw, label, split in zip(paths, labels, splits, strict=True):
            line = next(line_of)
            where = f"{listing}:{line}"
            if raw is None or not raw.strip():
                taken.reject(
                    SourceReject(f"{listing.name} {line}", "bad_row", f"{where}: empty path")
                )
                met.meet("")
                continue
            pure = PurePosixPath(raw.strip().replace("\\", "/"))
            relative = os.path.normpath(pure.as_posix())
            source = names.to_source(os.fsencode(relative))
            met.meet(source)
            if pure.is_absolute() or relative == ".." or relative.startswith("../"):
                why = f"{where}: path {raw!r} is outside the listing's folder"
                taken.reject(SourceReject(source, "outside_root", why))
                continue
            full = os.path.join(base, relative)
            if not os.path.realpath(full).startswith(real_base):
                why = f"{where}: a link leads outside the listing's folder"
                taken.reject(SourceReject(source, "outside_root", why))
                continue
            outcome = _stat_file(source, full, config.max_file_bytes)
            if isinstance(outcome, SourceReject):
                taken.reject(outcome)
            elif label is None or not label.strip():
                taken.reject(outcome.reject(source, "unknown_label", f"{line} has no label"))
            else:
                taken.files.add(source, full, label.strip(), outcome, split or None)
    for number, text_of_row in bad_rows:
        where = f"{listing}:{number}"
        taken.reject(
            SourceReject(
                f"{listing.name} line {number}",
                "bad_row",
                f"{where}: malformed row {text_of_row[:80]!r}",
            )
        )
    found = taken.build(lambda source: ("duplicate_path", "listed twice"))
    if taken.duplicated:
        *before, last = met.positions(taken.duplicated[0])
        raw_path = listing_cell(listing, config.path_column, last)
        also = ", ".join(line_name(listing, bad_rows, i) for i in before)
        raise SourceError(
            f"{listing}:{line_name(listing, bad_rows, last)}: path {raw_path!r} is listed "
            f"twice (also {also})"
        )
    return found
