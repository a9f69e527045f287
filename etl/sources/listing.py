"""List the inputs -> sorted source records, by source kind (`LISTERS`).

Folders and listings: only paths and `stat` are read here, never image bytes: a no-change rerun
over 100k files stays a matter of seconds. LMDB and Python sources have no stat that proves a
value unchanged, so their listers read and hash every value (LMDB values are memory-mapped; a
Python source's records exist only while its function runs) and set `content_hash`. An input
that cannot be a sample (outside any class folder, a link out of the root, missing, a refused
pickle) becomes a `SourceReject`, so every listed input is accounted for.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import numbers
import os
import pickle
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from etl.config import FolderSource, ListingSource, LmdbSource, PythonSource, SourceConfig
from etl.errors import SourceError
from etl.format import names
from etl.format.checksums import digest
from etl.sources import readers

if TYPE_CHECKING:
    import pyarrow as pa


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
    `plan.stat_key`); 0 for kinds with no file."""


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


@dataclass(frozen=True)
class SourceListing:
    files: tuple[SourceFile, ...]
    rejects: tuple[SourceReject, ...]
    classes: tuple[str, ...] | None = None
    """The label order the source itself declares (a table's ClassLabel names; 0..max for
    integer labels), used when `source.classes` is not set; None: sorted class names."""

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


def list_sources(config: SourceConfig, context: ListContext) -> SourceListing:
    """Every input of `config`, sorted by `source`; the lister is picked by `config.kind`."""
    try:
        lister = LISTERS[config.kind]
    except KeyError:
        raise ValueError(f"no lister for source kind {config.kind!r}; add it to LISTERS") from None
    return lister(config, context)


def check_exists(config: SourceConfig) -> None:
    """SourceError naming source.path when it is not what its kind reads; called before a run
    creates anything on disk, so a refused config leaves no output folder behind."""
    path = config.path
    if config.kind == "folder" and not path.is_dir():
        raise SourceError(f"source.path: {path} is not a folder")
    if config.kind == "listing" and not path.is_file():
        raise SourceError(f"source.path: {path} is not a file")
    if config.kind == "lmdb" and not path.exists():
        raise SourceError(f"source.path: {path} is not an LMDB environment (no such file)")
    if config.kind in CONTAINER_KINDS and not path.is_dir():
        raise SourceError(f"source.path: {path} is not a folder (source.files are matched in it)")


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
    files: list[SourceFile] = []
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
        class_name = names.path_to_source(relative[:slash])
        files.append(outcome.file(source, entry.path, class_name, None))
    for folder, exc in unlistable:
        rejects.append(
            SourceReject(
                names.path_to_source(folder[prefix:] + "/"),
                "folder_unreadable",
                f"cannot list this folder: {exc.strerror or exc}",
            )
        )
    files.sort(key=lambda f: f.source)
    rejects.sort(key=lambda r: r.source)
    return SourceListing(tuple(files), tuple(rejects))


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


def _read_listing_table(
    path: Path,
    text_columns: tuple[str, ...] = (),
    bad_rows: list[tuple[int, str]] | None = None,
    byte_columns: tuple[str, ...] = (),
) -> pa.Table:
    """`text_columns` are read from CSV as strings, never inferred as numbers ('007' stays);
    `byte_columns` as bytes, in any encoding (file names need not be UTF-8). With `bad_rows`, a
    CSV row with the wrong number of fields is skipped and recorded there as (line number,
    text); without it, it is an error naming the line."""

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
    try:
        if suffix == ".parquet":
            return pq.read_table(path)
        if suffix in (".csv", ".tsv"):
            return pacsv.read_csv(
                path,
                # NOTE: one thread, so the handler sees every bad row with its line number
                read_options=pacsv.ReadOptions(use_threads=bad_rows is None),
                parse_options=pacsv.ParseOptions(
                    delimiter="\t" if suffix == ".tsv" else ",",
                    invalid_row_handler=skip if bad_rows is not None else None,
                ),
                convert_options=pacsv.ConvertOptions(
                    strings_can_be_null=True,
                    column_types={
                        **{name: pa.string() for name in text_columns},
                        **{name: pa.binary() for name in byte_columns},
                    },
                ),
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
    # NOTE: bytes (a path column read as binary) decode as the OS decodes file names, so a name
    # that is not UTF-8 keeps its bytes (surrogateescape) and reaches the file it names.
    return [
        None if v is None else os.fsdecode(v) if isinstance(v, bytes) else str(v)
        for v in table.column(name).to_pylist()
    ]


def _line_names(path: Path, rows: int, bad_rows: list[tuple[int, str]]) -> list[str]:
    """How an error names each row of the table: 'row i' in Parquet; in CSV its line (the
    header is line 1), counting the skipped bad rows' lines."""
    if path.suffix.lower() == ".parquet":
        return [f"row {i}" for i in range(rows)]
    skipped = {number for number, _ in bad_rows}
    lines = (n for n in range(2, 2 + rows + len(skipped)) if n not in skipped)
    return [f"line {n}" for n in lines]


def list_listing(config: ListingSource, context: ListContext | None = None) -> SourceListing:
    """Read a listing; paths are relative to the listing file's folder. A row that cannot be a
    sample (malformed, empty, absolute, leading out of the folder, not a regular file) is a
    reject naming its line; only a path listed twice stops the run, naming both lines."""
    listing = config.path
    if not listing.is_file():
        raise SourceError(f"source.path: {listing} is not a file")
    bad_rows: list[tuple[int, str]] = []
    table = _read_listing_table(listing, bad_rows=bad_rows, byte_columns=(config.path_column,))
    paths = _column(table, config.path_column, listing, required=True)
    labels = _column(table, config.label_column, listing, required=True)
    splits = _column(table, config.split_column, listing, required=False)
    assert paths is not None and labels is not None
    base = listing.parent
    real_base = os.path.realpath(base) + os.sep
    line_of = _line_names(listing, len(paths), bad_rows)
    rejects = [
        SourceReject(
            f"{listing.name} line {number}",
            "bad_row",
            f"{listing}:{number}: malformed row {text[:80]!r}",
        )
        for number, text in bad_rows
    ]
    seen: dict[str, int] = {}
    files: list[SourceFile] = []
    for i, (raw, label) in enumerate(zip(paths, labels, strict=True)):
        where = f"{listing}:{line_of[i]}"
        if raw is None or not raw.strip():
            rejects.append(
                SourceReject(f"{listing.name} {line_of[i]}", "bad_row", f"{where}: empty path")
            )
            continue
        pure = PurePosixPath(raw.strip().replace("\\", "/"))
        relative = os.path.normpath(pure.as_posix())
        source = names.to_source(os.fsencode(relative))
        if pure.is_absolute() or relative == ".." or relative.startswith("../"):
            rejects.append(
                SourceReject(
                    source, "outside_root", f"{where}: path {raw!r} is outside the listing's folder"
                )
            )
            continue
        if relative in seen:
            raise SourceError(
                f"{where}: path {raw!r} is listed twice (also {line_of[seen[relative]]})"
            )
        seen[relative] = i
        full = os.path.join(base, relative)
        if not os.path.realpath(full).startswith(real_base):
            rejects.append(
                SourceReject(
                    source, "outside_root", f"{where}: a link leads outside the listing's folder"
                )
            )
            continue
        outcome = _stat_file(source, full, config.max_file_bytes)
        if isinstance(outcome, SourceReject):
            rejects.append(outcome)
            continue
        if label is None or not label.strip():
            rejects.append(outcome.reject(source, "unknown_label", f"{line_of[i]} has no label"))
            continue
        split = splits[i] if splits is not None else None
        files.append(outcome.file(source, full, label.strip(), split or None))
    files.sort(key=lambda f: f.source)
    rejects.sort(key=lambda r: r.source)
    return SourceListing(tuple(files), tuple(rejects))


# --- lmdb ---------------------------------------------------------------------------------------


def list_lmdb(config: LmdbSource, context: ListContext) -> SourceListing:
    """One sample per key (from `keys_entry`, else a cursor scan minus `meta_keys`); `source`
    is the key as `names.to_source` spells it. Every value is read and hashed here
    (memory-mapped, no copy), so a value whose bytes changed is packed again even when its
    length did not change. A pickled value is a `pickle` reject unless allow_pickle."""
    labels = _key_labels(config.labels) if config.labels is not None else None
    env = readers.open_lmdb(config.path)
    files: list[SourceFile] = []
    rejects: list[SourceReject] = []
    with env.begin(buffers=True) as txn:
        for key in _lmdb_keys(txn, config):
            source = names.to_source(key)
            value = txn.get(key)
            if value is None:
                rejects.append(
                    SourceReject(
                        source, "missing", f"keys entry {config.keys_entry!r} lists it; no such key"
                    )
                )
                continue
            outcome = _lmdb_sample(source, value, config, labels, context.checksum)
            if isinstance(outcome, SourceFile):
                files.append(outcome)
            else:
                rejects.append(outcome)
    files.sort(key=lambda f: f.source)
    rejects.sort(key=lambda r: r.source)
    return SourceListing(tuple(files), tuple(rejects))


def _lmdb_sample(
    source: str,
    value: memoryview,
    config: LmdbSource,
    labels: Mapping[str, tuple[str | None, str | None]] | None,
    checksum: str,
) -> SourceFile | SourceReject:
    """One key's record or reject. size and content_hash describe the bytes the decoder will
    see: the value, or a pickled record's image field."""

    def reject(reason: str, message: str) -> SourceReject:
        return SourceReject(source, reason, message, len(value), 0, digest(value, checksum))

    if len(value) > config.max_file_bytes:
        return SourceReject(
            source, "file_too_large", readers.too_large(len(value), config.max_file_bytes)
        )
    if readers.is_pickle(value) and not config.allow_pickle:
        return reject(
            "pickle", f"the value is a Python pickle (protocol {value[1]}); {readers.PICKLE_ADVICE}"
        )
    try:
        image, record = readers.lmdb_record(value, config)
    except readers.UNPICKLE_ERRORS as exc:
        return reject("unreadable", f"pickled record: {type(exc).__name__}: {exc}")
    split: str | None = None
    if labels is not None:
        label, split = labels.get(source, (None, None))
        if label is None:
            return reject("unknown_label", f"key not in {config.labels} (or its label is empty)")
    else:
        assert config.label_field is not None  # the config requires labels or label_field
        if record is None:
            return reject(
                "unknown_label",
                f"not a pickled record, so it has no label field {config.label_field!r}",
            )
        try:
            label = _label_text(readers.field_of(record, config.label_field))
        except (KeyError, TypeError) as exc:
            return reject("unknown_label", f"pickled record: {exc}")
        if label is None:
            return reject("unknown_label", f"label field {config.label_field!r} is empty")
    return SourceFile(
        source, source, label, split, len(image), 0, content_hash=digest(image, checksum)
    )


def _label_text(value: Any) -> str | None:
    """A label as a class name: text as it is (stripped; empty is None), an integer (also a
    numpy one) as its decimal digits."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))
    raise TypeError(f"label {value!r} is a {type(value).__name__}, not text or an integer")


def _lmdb_keys(txn: Any, config: LmdbSource) -> list[bytes]:
    if config.keys_entry is None:
        skip = {names.to_raw(k) for k in config.meta_keys}
        cursor = txn.cursor()
        return [bytes(k) for k in cursor.iternext(keys=True, values=False) if bytes(k) not in skip]
    where = f"{config.path}: keys_entry {config.keys_entry!r}"
    raw = txn.get(names.to_raw(config.keys_entry))
    if raw is None:
        raise SourceError(f"{where} is not a key of the environment; omit it to scan all keys")
    listed = _keys_entry_names(bytes(raw), config, where)
    keys: list[bytes] = []
    for name in listed:
        try:
            keys.append(name if isinstance(name, bytes) else names.to_raw(name))
        except ValueError as exc:
            raise SourceError(f"{where}: {exc}") from None
    counts = Counter(keys)
    dupes = sorted(names.to_source(k) for k, n in counts.items() if n > 1)
    if dupes:
        raise SourceError(f"{where} lists keys twice: {dupes[:5]}")
    return keys


def _keys_entry_names(raw: bytes, config: LmdbSource, where: str) -> list[str | bytes]:
    """A JSON list of strings, one key per line, or (allow_pickle) a pickled list of str/bytes."""
    if readers.is_pickle(raw):
        if not config.allow_pickle:
            raise SourceError(f"{where} is a Python pickle: refused; {readers.PICKLE_ADVICE}")
        try:
            names: Any = pickle.loads(raw)  # allowed explicitly by the config (allow_pickle)
        except readers.UNPICKLE_ERRORS as exc:
            raise SourceError(f"{where}: cannot unpickle ({exc})") from None
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SourceError(f"{where}: not UTF-8 text, JSON or a pickle") from None
        if text.lstrip().startswith("["):
            try:
                names = json.loads(text)
            except json.JSONDecodeError as exc:
                raise SourceError(f"{where}: invalid JSON ({exc})") from None
        else:
            names = [line.strip() for line in text.splitlines() if line.strip()]
    if not isinstance(names, list | tuple) or not all(isinstance(n, str | bytes) for n in names):
        raise SourceError(f"{where}: expected a list of key strings")
    return list(names)


def _key_labels(path: Path) -> dict[str, tuple[str | None, str | None]]:
    """key -> (label or None, split or None) from a CSV/TSV/Parquet file with columns key,
    label and optionally split. Keys are spelt as `source` (see etl/names.py)."""
    if not path.is_file():
        raise SourceError(f"source.labels: {path} is not a file")
    table = _read_listing_table(path, text_columns=("key", "label", "split"))
    for name in ("key", "label"):
        if name not in table.column_names:
            raise SourceError(
                f"{path}: no column {name!r}; columns are {table.column_names} "
                "(expected key, label and optionally split)"
            )
    keys = _column(table, "key", path, required=True)
    labels = _column(table, "label", path, required=True)
    splits = _column(table, "split", path, required=False)
    assert keys is not None and labels is not None
    line_of = (
        (lambda i: f"row {i}") if path.suffix.lower() == ".parquet" else (lambda i: f"line {i + 2}")
    )
    out: dict[str, tuple[str | None, str | None]] = {}
    first: dict[str, int] = {}
    for i, (key, label) in enumerate(zip(keys, labels, strict=True)):
        if key is None or not key:
            raise SourceError(f"{path}:{line_of(i)}: empty key")
        if key in first:
            raise SourceError(
                f"{path}:{line_of(i)}: key {key!r} is listed twice (also {line_of(first[key])})"
            )
        first[key] = i
        split = splits[i] if splits is not None else None
        out[key] = ((label or "").strip() or None, split or None)
    return out


# --- records: sources with no file per sample ---------------------------------------------------


class RecordIntake:
    """Takes the records of a source that has no file per sample (a Python function, tar
    shards, tables): each is hashed here, in this process, and the ones whose content is not
    already stored (`context.stored`) go into the spool (`context.spool`, NOTE [spool] in
    etl/readers.py) for the workers. A dry run (no spool) writes nothing."""

    def __init__(self, context: ListContext) -> None:
        self._checksum = context.checksum
        self._stored = context.stored
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
        files = sorted(self.files, key=lambda f: f.source)
        rejects = sorted(self.rejects, key=lambda r: r.source)
        return SourceListing(tuple(files), tuple(rejects), classes)


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
    return _label_text(value)


def integer_classes(names: Iterable[str]) -> tuple[str, ...] | None:
    """For labels that are all non-negative integers: '0' .. the largest, so label i stays i
    even where a class has no sample; None when any label is not such an integer."""
    largest = -1
    for name in names:
        if not name.isdecimal() or (len(name) > 1 and name[0] == "0"):
            return None
        largest = max(largest, int(name))
    return tuple(str(i) for i in range(largest + 1)) if largest >= 0 else None


# --- python -------------------------------------------------------------------------------------

RECORD_KEYS = ("id", "data", "array", "label", "split")


def list_python(config: PythonSource, context: ListContext) -> SourceListing:
    """Call `config.function(**config.options)` once and take every record it yields into a
    `RecordIntake`. Ids must be unique: a duplicate is an error naming them, after the whole
    iteration, so all are named at once.
    """
    spec = config.function
    function = _records_function(config)
    try:
        iterator = iter(function(**config.options))
    except Exception as exc:
        raise SourceError(f"source.function {spec!r} raised {type(exc).__name__}: {exc}") from exc
    first: dict[str, int] = {}
    dupes: dict[str, list[int]] = {}
    index = 0
    try:
        with RecordIntake(context) as intake:
            while True:
                try:
                    record = next(iterator)
                except StopIteration:
                    break
                except Exception as exc:
                    raise SourceError(
                        f"source.function {spec!r} raised {type(exc).__name__} after {index} "
                        f"record(s): {exc}"
                    ) from exc
                source, payload, label, split = _parse_record(record, index, spec)
                if source in first:
                    dupes.setdefault(source, [first[source]]).append(index)
                else:
                    first[source] = index
                index += 1
                if label is None:
                    intake.reject(source, "unknown_label", "the record has no label", payload)
                else:
                    intake.add(source, payload, label, split)
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()  # a generator stopped early releases its connection or files now
    if dupes:
        named = ", ".join(
            f"{s!r} (records {', '.join(map(str, at))})" for s, at in sorted(dupes.items())[:5]
        )
        more = f" and {len(dupes) - 5} more" if len(dupes) > 5 else ""
        raise SourceError(
            f"source.function {spec!r}: ids are not unique: {named}{more}; every record needs "
            "its own id, stable across runs"
        )
    return intake.listing()


def _records_function(config: PythonSource) -> Callable[..., Any]:
    """Import `module:function` with `config.path` first on sys.path (only while importing)."""
    spec = config.function
    module_name, _, attr = spec.partition(":")
    folder = str(config.path)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SourceError(
            f"source.function {spec!r}: cannot import {module_name!r} ({exc}); is it installed, "
            f"on PYTHONPATH or in {folder}?"
        ) from None
    except Exception as exc:
        raise SourceError(
            f"source.function {spec!r}: importing {module_name!r} raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    finally:
        if added:
            sys.path.remove(folder)
    function = getattr(module, attr, None)
    if function is None or not callable(function):
        what = "no" if function is None else f"a {type(function).__name__}, not a callable,"
        raise SourceError(f"source.function {spec!r}: module {module_name!r} has {what} {attr!r}")
    return function


def _parse_record(record: Any, index: int, spec: str) -> tuple[str, bytes, str | None, str | None]:
    """(source, encoded bytes, class name or None, split or None) of one record, or a
    SourceError naming the record index: a malformed record is a bug in the function."""
    where = f"source.function {spec!r}: record {index}"
    if isinstance(record, Mapping):
        unknown = sorted(set(map(str, record)) - set(RECORD_KEYS))
        if unknown:
            raise SourceError(f"{where} has unknown keys {unknown}; expected {list(RECORD_KEYS)}")
        if "id" not in record or "label" not in record:
            raise SourceError(f"{where} needs keys 'id' and 'label' (has {sorted(record)})")
        if ("data" in record) == ("array" in record):
            raise SourceError(f"{where} needs exactly one of 'data' (bytes) or 'array'")
        rid, label, split = record["id"], record["label"], record.get("split")
        data = record["data"] if "data" in record else record["array"]
    elif isinstance(record, tuple | list) and len(record) in (3, 4):
        rid, data, label = record[0], record[1], record[2]
        split = record[3] if len(record) == 4 else None
    else:
        raise SourceError(
            f"{where} is a {type(record).__name__}; expected a dict {{id, data|array, label, "
            "split?}} or a tuple (id, data_or_array, label[, split])"
        )
    if isinstance(rid, bool) or not isinstance(rid, str | numbers.Integral):
        raise SourceError(f"{where}: id {rid!r} is a {type(rid).__name__}; use a str or an int")
    source = rid if isinstance(rid, str) else str(int(rid))
    if not source:
        raise SourceError(f"{where}: the id is empty")
    if isinstance(data, np.ndarray) and data.dtype == object:
        raise SourceError(f"{where} ({source!r}): an object array; use a uint8 array")
    try:
        payload = readers.image_bytes(data, "data")
    except ValueError as exc:
        raise SourceError(f"{where} ({source!r}): {exc}") from None
    try:
        class_name = _label_text(label)
    except TypeError as exc:
        raise SourceError(f"{where} ({source!r}): {exc}") from None
    if split is not None and not isinstance(split, str):
        raise SourceError(f"{where} ({source!r}): split {split!r} is not a string")
    return source, payload, class_name, split or None


def _list_container(config: Any, context: ListContext) -> SourceListing:
    # NOTE: imported here: etl.sources.containers reads tables with pyarrow, and pack workers import
    # this module (NOTE [ worker start-up ] in etl/execute.py)
    from etl.sources import containers

    return containers.LISTERS[config.kind](config, context)


CONTAINER_KINDS = frozenset({"webdataset", "parquet"})
"""Source kinds whose samples are records inside files matched by `source.files`."""

LISTERS: dict[str, Callable[[Any, ListContext], SourceListing]] = {
    "folder": list_folder,
    "listing": list_listing,
    "lmdb": list_lmdb,
    "python": list_python,
    **{kind: _list_container for kind in CONTAINER_KINDS},
}
"""Source kind -> lister(source config, context) -> every input, sorted by `source`."""
