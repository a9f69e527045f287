"""List the inputs: a class-per-folder tree or a CSV/Parquet listing -> sorted source records.

Only paths and `stat` are read here, never image bytes: a no-change rerun over 100k files
stays a matter of seconds. A file that cannot be a sample (outside any class folder, a link out
of the root, missing) becomes a `SourceReject`, so every listed input is accounted for.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from etl.config import FolderSource, ListingSource
from etl.errors import SourceError


@dataclass(frozen=True)
class SourceFile:
    """One input image, identified by `source`: its path relative to the source root (POSIX)."""

    source: str
    path: str
    """Where to read it (absolute, or relative to the working directory)."""
    class_name: str | None
    split: str | None
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class SourceReject:
    source: str
    reason: str
    message: str
    size: int | None = None
    mtime_ns: int | None = None
    source_hash: str | None = None


@dataclass(frozen=True)
class SourceListing:
    files: tuple[SourceFile, ...]
    rejects: tuple[SourceReject, ...]

    @property
    def listed(self) -> int:
        return len(self.files) + len(self.rejects)


def list_sources(config: FolderSource | ListingSource) -> SourceListing:
    if isinstance(config, FolderSource):
        return list_folder(config)
    return list_listing(config)


def _pattern(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """One compiled regex for a list of fnmatch patterns (case-insensitive)."""
    if not patterns:
        return None
    return re.compile("|".join(fnmatch.translate(p.lower()) for p in patterns))


def _walk(root: str) -> Iterator[os.DirEntry[str]]:
    """Files under root, depth first; dot-entries skipped, links to folders not followed."""
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    yield entry


def list_folder(config: FolderSource) -> SourceListing:
    """Walk `config.path`: the first path component is the class. Dot-files are skipped; links to
    folders are not followed, and a linked file that resolves outside the root is rejected.

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
    files: list[SourceFile] = []
    rejects: list[SourceReject] = []
    for entry in _walk(top):
        relative = entry.path[prefix:].replace(os.sep, "/")
        lowered = relative.lower()
        if include is None or not include.match(lowered):
            continue
        if exclude is not None and exclude.match(lowered):
            continue
        if entry.is_symlink() and not os.path.realpath(entry.path).startswith(real_root):
            rejects.append(SourceReject(relative, "outside_root", "link leads outside the root"))
            continue
        try:
            st = entry.stat()
        except OSError as exc:
            rejects.append(SourceReject(relative, "io_error", f"cannot stat: {exc.strerror}"))
            continue
        slash = relative.find("/")
        if slash < 0:
            rejects.append(
                SourceReject(
                    relative,
                    "no_class",
                    "file is not inside a class folder",
                    st.st_size,
                    st.st_mtime_ns,
                )
            )
            continue
        files.append(
            SourceFile(relative, entry.path, relative[:slash], None, st.st_size, st.st_mtime_ns)
        )
    files.sort(key=lambda f: f.source)
    rejects.sort(key=lambda r: r.source)
    return SourceListing(tuple(files), tuple(rejects))


def _read_listing_table(path: Path) -> pa.Table:
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return pq.read_table(path)
        if suffix in (".csv", ".tsv"):
            return pacsv.read_csv(
                path,
                parse_options=pacsv.ParseOptions(delimiter="\t" if suffix == ".tsv" else ","),
                convert_options=pacsv.ConvertOptions(strings_can_be_null=True),
            )
    except (pa.ArrowInvalid, OSError) as exc:
        raise SourceError(f"{path}: cannot read listing ({exc})") from None
    raise SourceError(
        f"{path}: listing must be .csv, .tsv or .parquet, not {suffix or 'no suffix'}"
    )


def _column(table: pa.Table, name: str, path: Path, required: bool) -> list[str | None] | None:
    if name not in table.column_names:
        if required:
            raise SourceError(
                f"{path}: no column {name!r}; columns are {table.column_names} "
                f"(set source.{'path' if name == 'path' else 'label'}_column to rename)"
            )
        return None
    return [None if v is None else str(v) for v in table.column(name).to_pylist()]


def list_listing(config: ListingSource) -> SourceListing:
    """Read a listing; paths are relative to the listing file's folder. Errors name the line
    (CSV: the header is line 1, so row i is line i + 2)."""
    listing = config.path
    if not listing.is_file():
        raise SourceError(f"source.path: {listing} is not a file")
    table = _read_listing_table(listing)
    paths = _column(table, config.path_column, listing, required=True)
    labels = _column(table, config.label_column, listing, required=True)
    splits = _column(table, config.split_column, listing, required=False)
    assert paths is not None and labels is not None
    base = listing.parent
    line_of = (
        (lambda i: f"line {i + 2}")
        if listing.suffix.lower() != ".parquet"
        else (lambda i: f"row {i}")
    )
    seen: dict[str, int] = {}
    files: list[SourceFile] = []
    rejects: list[SourceReject] = []
    for i, (raw, label) in enumerate(zip(paths, labels, strict=True)):
        if raw is None or not raw.strip():
            raise SourceError(f"{listing}:{line_of(i)}: empty path")
        pure = PurePosixPath(raw.strip().replace("\\", "/"))
        if pure.is_absolute():
            raise SourceError(
                f"{listing}:{line_of(i)}: path {raw!r} is absolute; make it "
                "relative to the listing's folder"
            )
        relative = os.path.normpath(pure.as_posix())
        if relative in seen:
            raise SourceError(
                f"{listing}:{line_of(i)}: path {raw!r} is listed twice "
                f"(also {line_of(seen[relative])})"
            )
        seen[relative] = i
        full = base / relative
        try:
            st = full.stat()
        except FileNotFoundError:
            rejects.append(SourceReject(relative, "missing", f"{full} does not exist"))
            continue
        except OSError as exc:
            rejects.append(SourceReject(relative, "io_error", f"cannot stat: {exc.strerror}"))
            continue
        if not full.is_file():
            rejects.append(SourceReject(relative, "missing", f"{full} is not a file"))
            continue
        if label is None or not label.strip():
            rejects.append(
                SourceReject(
                    relative,
                    "unknown_label",
                    f"{line_of(i)} has no label",
                    st.st_size,
                    st.st_mtime_ns,
                )
            )
            continue
        split = splits[i] if splits is not None else None
        files.append(
            SourceFile(
                relative, str(full), label.strip(), split or None, st.st_size, st.st_mtime_ns
            )
        )
    files.sort(key=lambda f: f.source)
    rejects.sort(key=lambda r: r.source)
    return SourceListing(tuple(files), tuple(rejects))
