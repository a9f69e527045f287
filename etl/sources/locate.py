"""Finding a packed dataset's sources again, for any source kind: the locators that
`readers.read_many` takes, so repair and reject sheets read a source the way a run does.

    folder, listing   the path under the source root (never outside it, links included)
    lmdb, python,     the source is listed again; records whose content is wanted are spooled
    webdataset,       (`ListContext.wanted`, NOTE [spool] in etl/sources/spool.py) or read in
    parquet           place, as a run's workers read them

Nothing here checks content: the reader of a locator compares what it reads with the hash the
manifest recorded.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from etl.config import SourceConfig
from etl.format import names
from etl.sources import readers
from etl.sources.entries import ListContext
from etl.sources.registry import kind_of, list_sources
from etl.storage.location import as_location

CHANGED = "changed since it was packed (content hash differs)"


@dataclass(frozen=True)
class Located:
    locators: dict[str, str]
    """source -> where `readers.read_many(spec_of(config), ...)` reads it."""
    missing: dict[str, str]
    """source -> why it cannot be read back (outside the root, no longer listed, rejected)."""


def locate(
    config: SourceConfig,
    sources: Collection[str],
    context: ListContext,
    root: Path | str | None = None,
) -> Located:
    """Where each of `sources` (manifest `source` names) is now. `root`: where the source is,
    when not where `config` says (`--source DIR`; see `location`). Record kinds are listed
    again with `context` (its `spool` and `wanted` say which records to spool)."""
    where = location(config, root)
    kind = kind_of(config)
    if kind.by_path:
        return _locate_files(where, sources)
    config = config.model_copy(update={"path": where})
    if context.spool is None and not kind.in_place:
        raise ValueError(f"a {config.kind} source is read back through a spool: set one")
    listing = list_sources(config, context)
    found = {f.source: f.path for f in listing.files if f.source in sources}
    rejected = {r.source: r for r in listing.rejects if r.source in sources}
    missing: dict[str, str] = {}
    for source in sources:
        if source in rejected:
            now = rejected[source]
            missing[source] = f"now rejected while listing ({now.reason}: {now.message})"
        elif source not in found:
            missing[source] = "no longer in the source"
        elif found[source] == readers.NOT_SPOOLED:
            missing[source] = CHANGED  # spooled only when its content is the one wanted
    return Located({s: p for s, p in found.items() if s not in missing}, missing)


def location(config: SourceConfig, root: Path | str | None = None) -> Path | str:
    """Where a source is read back from: `root` when given, else its kind's `root` (the folder
    a file kind's names are relative to, or a record source's `path`)."""
    if root is not None:
        return as_location(root)
    return kind_of(config).root(config)


def _locate_files(root: Path | str, sources: Collection[str]) -> Located:
    """Each source's path under `root`; a prefix in object storage has no links to follow."""
    remote = isinstance(root, str)
    real_root = root if remote else os.path.realpath(root)
    locators: dict[str, str] = {}
    missing: dict[str, str] = {}
    for source in sources:
        try:
            path = names.source_path(root, source)
        except ValueError:
            missing[source] = "path outside the source root"
            continue
        if not remote and os.path.commonpath([real_root, os.path.realpath(path)]) != real_root:
            missing[source] = "link leads outside the source root"
            continue
        locators[source] = path
    return Located(locators, missing)
