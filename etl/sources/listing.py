"""List the inputs -> sorted source records, by source kind (`LISTERS`): folders and listings
in `files`, LMDB and Python sources in `records`, tar shards in `containers`, tables in `tables`.

Folders and listings: only paths and `stat` are read here, never image bytes: a no-change rerun
over 100k files stays a matter of seconds. LMDB and Python sources have no stat that proves a
value unchanged, so their listers read and hash every value (LMDB values are memory-mapped; a
Python source's records exist only while its function runs) and set `content_hash`. An input
that cannot be a sample (outside any class folder, a link out of the root, missing, a refused
pickle) becomes a `SourceReject`, so every listed input is accounted for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from etl.config import SourceConfig
from etl.errors import SourceError
from etl.sources.base import ListContext, SourceListing
from etl.sources.files import list_folder, list_listing
from etl.sources.records import list_lmdb, list_python


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


def _list_container(config: Any, context: ListContext) -> SourceListing:
    # NOTE: imported here: the container listers read tables with pyarrow, and pack workers
    # import this module (NOTE [ worker start-up ] in etl/run/execute.py)
    from etl.sources import containers, tables

    if config.kind == "webdataset":
        return containers.list_webdataset(config, context)
    return tables.list_parquet(config, context)


CONTAINER_KINDS = frozenset({"webdataset", "parquet"})
"""Source kinds whose samples are records inside files matched by `source.files`."""

LISTERS: dict[str, Callable[[Any, ListContext], SourceListing]] = {
    "folder": list_folder,
    "listing": list_listing,
    "lmdb": list_lmdb,
    "python": list_python,
    **{kind: _list_container for kind in CONTAINER_KINDS},
}
