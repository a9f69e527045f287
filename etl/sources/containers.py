"""The rules every container kind shares (samples stored inside files: WebDataset tar shards in
`etl.sources.kinds.webdataset`, tables in `etl.sources.kinds.parquet`). Each file is read
once, in the parent, record by record, and every record goes through a `RecordIntake` (hashed;
spooled for the workers when it must be packed).

`source` is the file's path relative to `source.path`, '/', then the record's key: a tar
sample's key (its member name up to the first dot of the last part, as WebDataset groups
them), or a table row's id (`id_column`, else its row number in the file). It is spelt by the
rule of etl/format/names.py, so it is one-to-one with (file, key).

NOTE [hostile containers]: nothing is ever extracted to disk, no link is followed, and nothing
in a file stops the run. A member or row that cannot be a sample is a reject naming file and
key (a path with '..' or a leading '/', a link or device member, a member over
`max_file_bytes`, a key found twice, no image, no label); a file that cannot be read, or ends
early, is a reject naming the file, and the records read before the damage are kept.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from etl.config import FilePatterns
from etl.errors import SourceError
from etl.format import names
from etl.sources import in_store
from etl.sources.intake import DuplicateReject, RecordIntake
from etl.sources.labels import integer_classes
from etl.sources.safe_files import SAFE_OPEN_FLAGS, not_a_file
from etl.sources.timed import check_in_store

# --- files --------------------------------------------------------------------------------------


def match_files(
    root: Path | str, patterns: FilePatterns, options: in_store.Options | None = None
) -> list[tuple[str, str | None]]:
    """(path relative to `root` as an os string, split or None) of each file the glob
    `patterns` match (a dict: split -> patterns), sorted, each once; `root` a folder or a
    prefix in object storage (`options`: its driver's). A pattern that matches nothing, or a
    file two splits match, is a SourceError: a typo would otherwise pack nothing, or pack a
    file into the wrong split."""
    groups = patterns.items() if isinstance(patterns, dict) else [(None, patterns)]
    found: dict[str, str | None] = {}
    for split, group in groups:
        for pattern in group:
            if isinstance(root, str):
                matched = in_store.glob_objects(root, pattern, options)
            else:
                matched = glob.glob(pattern, root_dir=root, recursive=True)
            if not matched:
                raise SourceError(f"source.files: {pattern!r} matches nothing in {root}")
            for relative in matched:
                if relative in found and found[relative] != split:
                    raise SourceError(
                        f"source.files: {relative!r} is in splits {found[relative]!r} and "
                        f"{split!r}; a file's records belong to one split"
                    )
                found[relative] = split
    return sorted(found.items())


def record_source(relative: str, key: bytes) -> str:
    """`source` of the record `key` (raw bytes) in the file at `relative`."""
    return names.to_source(os.fsencode(relative) + b"/" + key)


def joined(root: Path | str, relative: str) -> str:
    """The file at `relative` under a folder, or the object under a prefix."""
    return f"{root}/{relative}" if isinstance(root, str) else os.path.join(root, relative)


@contextmanager
def opened_file(
    root: Path | str, relative: str, intake: RecordIntake, options: in_store.Options | None = None
) -> Iterator[IO[bytes] | None]:
    """The regular file at root/relative (or the object, `root` a prefix in object storage),
    open for reading; None (and a reject naming the file) when it is a link out of the root,
    not a regular file, or cannot be opened."""
    source = names.path_to_source(relative)
    if isinstance(root, str):
        try:
            remote = in_store.open_object(joined(root, relative), options)
        except OSError as exc:
            intake.reject(source, "io_error", f"cannot open: {exc.strerror or exc}")
            yield None
            return
        with remote:
            yield remote
        return
    full = os.path.join(root, relative)
    if not os.path.realpath(full).startswith(os.path.realpath(root) + os.sep):
        intake.reject(source, "outside_root", "link leads outside source.path")
        yield None
        return
    try:
        fd = os.open(full, SAFE_OPEN_FLAGS)
    except OSError as exc:
        intake.reject(source, "io_error", f"cannot open: {exc.strerror or exc}")
        yield None
        return
    kind = not_a_file(os.fstat(fd))
    if kind is not None:
        os.close(fd)
        intake.reject(source, "not_a_file", f"{kind}, not a regular file (never read)")
        yield None
        return
    with os.fdopen(fd, "rb") as f:
        yield f


def declared_classes(
    intake: RecordIntake, table_names: tuple[str, ...] | None
) -> tuple[str, ...] | None:
    return table_names or integer_classes(intake.class_names)


def duplicate_in(relatives: Iterable[str], what: str) -> DuplicateReject:
    """The reject of a record whose key is taken twice in one of the files at `relatives`
    (`what`: "key", "id"), naming the file."""
    folders = sorted((os.fsencode(r) + b"/" for r in relatives), key=len, reverse=True)

    def duplicate(source: str) -> tuple[str, str]:
        raw = names.to_raw(source)
        inside = next((os.fsdecode(f[:-1]) for f in folders if raw.startswith(f)), None)
        return "duplicate_key", f"the {what} appears more than once in {inside or 'its file'}"

    return duplicate


# --- WebDataset tar shards ----------------------------------------------------------------------


def check_container_folder(config: Any) -> None:
    """source.path must be the folder (or object-storage prefix) `source.files` are matched
    in."""
    if isinstance(config.path, str):
        check_in_store(config, in_store.is_folder, "holds no object")
    elif not config.path.is_dir():
        raise SourceError(
            f"source.path: {config.path} is not a folder (source.files are matched in it)"
        )
