"""The `folder` kind: one sub-folder per class under `source.path`. Only paths and `stat` are
read while listing, never image bytes, so a no-change rerun over 100k files stays a matter of
seconds. A file outside any class folder or a link out of the root becomes a `SourceReject`."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from etl.config import FolderSource
from etl.errors import SourceError
from etl.format import names
from etl.sources import in_store
from etl.sources.kind import SourceKind
from etl.sources.safe_files import stat_file, too_large
from etl.sources.timed import check_in_store, read_file

if TYPE_CHECKING:
    pass
from etl.sources.entries import FileColumnsBuilder, FileStat, ListContext, SourceListing
from etl.sources.listed_rejects import RejectsBuilder, SourceReject


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
    if isinstance(root, str):
        return _list_prefix(config, root, context)
    if not root.is_dir():
        raise SourceError(f"source.path: {root} is not a folder")
    top = str(root)
    prefix = len(top) + 1
    real_root = os.path.realpath(top) + os.sep
    selected = _selection(config)
    files = FileColumnsBuilder(context.scratch if context is not None else None)
    rejects = RejectsBuilder(context.scratch if context is not None else None)
    unlistable: list[tuple[str, OSError]] = []
    for entry in _walk(top, unlistable):
        relative = entry.path[prefix:]
        if not selected(relative):
            continue
        source = names.path_to_source(relative)
        if entry.is_symlink() and not os.path.realpath(entry.path).startswith(real_root):
            rejects.add(SourceReject(source, "outside_root", "link leads outside the root"))
            continue
        outcome = stat_file(source, entry.path, config.max_file_bytes)
        if isinstance(outcome, SourceReject):
            rejects.add(outcome)
        else:
            _take(files, rejects, relative, entry.path, outcome)
    for folder, exc in unlistable:
        rejects.add(
            SourceReject(
                names.path_to_source(folder[prefix:] + "/"),
                "folder_unreadable",
                f"cannot list this folder: {exc.strerror or exc}",
            )
        )
    return SourceListing(files.build(), rejects.build())


def _selection(config: FolderSource) -> Callable[[str], bool]:
    """Whether a path relative to the root is one `include` matches and `exclude` does not
    (case-insensitive)."""
    include, exclude = _pattern(config.include), _pattern(config.exclude)

    def selected(relative: str) -> bool:
        lowered = relative.lower()
        if include is None or not include.match(lowered):
            return False
        return exclude is None or not exclude.match(lowered)

    return selected


def _take(
    files: FileColumnsBuilder,
    rejects: RejectsBuilder,
    relative: str,
    locator: str,
    found: FileStat,
) -> None:
    """A readable file of the folder: a sample of the class its first path component names,
    or a `no_class` reject when it lies directly under the root."""
    source = names.path_to_source(relative)
    slash = relative.find("/")
    if slash < 0:
        rejects.add(found.reject(source, "no_class", "file is not inside a class folder"))
    else:
        files.add(source, locator, names.path_to_source(relative[:slash]), found)


def _list_prefix(config: FolderSource, url: str, context: ListContext | None) -> SourceListing:
    """A folder in object storage (`etl.sources.in_store`): the same rules, with each object's
    size, modification time and ETag where a file has its stat. Dot-named keys are skipped, as
    dot-named files are; a key with an empty, '.' or '..' segment is a reject naming it."""
    selected = _selection(config)
    files = FileColumnsBuilder(context.scratch if context is not None else None)
    rejects = RejectsBuilder(context.scratch if context is not None else None)
    # each page within io_timeout: a hung store stops the run, named (NOTE [ a listing in
    # pages ] in etl.storage.calls)
    listed = in_store.list_objects(url, config.storage_options, config.io_timeout)
    for relative, size, mtime_ns, etag in listed:
        found = FileStat(size, mtime_ns, 0, etag)
        parts = relative.split("/")
        odd = next((part for part in parts if part in ("", ".", "..")), None)
        if odd is not None:  # a key no path on a disk can name: accounted for, never packed
            what = "an empty" if odd == "" else f"a {odd!r}"
            why = f"the key has {what} segment, which no local path can name"
            rejects.add(found.reject(names.path_to_source(relative), "unnameable_key", why))
            continue
        if any(part.startswith(".") for part in parts) or not selected(relative):
            continue
        if size > config.max_file_bytes:
            why = too_large(size, config.max_file_bytes)
            rejects.add(found.reject(names.path_to_source(relative), "file_too_large", why))
        else:
            _take(files, rejects, relative, f"{url}/{relative}", found)
    return SourceListing(files.build(), rejects.build())


def _check(config: FolderSource) -> None:
    if isinstance(config.path, str):
        check_in_store(config, in_store.is_folder, "holds no object")
    elif not config.path.is_dir():
        raise SourceError(f"source.path: {config.path} is not a folder")


KIND = SourceKind(
    name="folder",
    list=list_folder,
    read=read_file,
    check=_check,
    by_path=True,
    walks_path=True,
)
