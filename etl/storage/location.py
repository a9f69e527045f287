"""Where a dataset is: the one place that decides a local folder or object storage (`is_url`),
and opens either as a local folder every reader takes (`open_location`).

Every entry point (the loaders' `PackedDataset.open`, `etl inspect`, `show`, `versions`,
`diff`, `audit`, `open_dataset`) asks `open_location` and reads `Location.root`; none branches
on the text of a path. A dataset in a store is mirrored into the cache as it is read
(`etl.storage.store`); how its shards are reached (fetched whole, through a bounded cache, or
by ranged GETs) is `StoreOptions`'.

Text becomes a location once, at the edge (`as_location`: a `StoreUrl` or a local `Path`);
every other layer branches on that type, never on the text (`tests/project/test_packaging.py`
fails on any module outside `etl.storage` that imports `is_url` or reads a URL's `"://"`).

NOTE: fsspec, pyarrow and the store's modules are imported only when a location is opened, so
parsing one costs the config nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from etl.format.sizes import parse_byte_size
from etl.storage.transport import STORE_TIMEOUT, with_allowed

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from etl.format.row_checksums import RowChecksums
    from etl.storage.cache import BoundedCache
    from etl.storage.ranged import RangedRows
    from etl.storage.store import StoreDataset


def is_url(location: object) -> bool:
    """A location in object storage (`s3://bucket/prefix`, any fsspec protocol but `file://`),
    as opposed to a local path: the one test, asked here alone (`as_location` for the rest)."""
    text = str(location)
    return "://" in text and not text.startswith("file://")


class StoreUrl(str):
    """A location in object storage as `as_location` parsed it: its URL, without a trailing
    '/'. A `str` wherever a URL is taken (fsspec, a manifest, a message); its type is what
    tells it from a local `Path`, so no other layer reads the text to decide."""

    __slots__ = ()

    def contains(self, other: Path | str) -> bool:
        """Whether `other` is this location or inside it ('s3://b/x' is inside 's3://b')."""
        return isinstance(other, StoreUrl) and (other == self or other.startswith(self + "/"))


def as_location(value: str | os.PathLike[str]) -> Path | StoreUrl:
    """A path or URL a user gave (a config field, a CLI argument, a view file's `dataset`, a
    listed input's locator), parsed once: a `StoreUrl` in object storage, else a local `Path`
    (a `file://` prefix dropped)."""
    if isinstance(value, StoreUrl | Path):
        return value
    text = os.fspath(value)
    if is_url(text):
        return StoreUrl(text.rstrip("/"))
    return Path(text.removeprefix("file://"))


@dataclass(frozen=True)
class StoreOptions:
    """How a dataset in object storage is reached and cached; a local folder takes none.

    `cache_dir`: the cache folder (default `$ETL_CACHE`, else ~/.cache/etl-memmap).
    `storage_options`: fsspec's (endpoint, credentials). `timeout`: seconds one call to the
    store may take. Without `cache_limit` every shard a selection reads is fetched at open
    and kept; with one (bytes, or '20GiB'), shards are fetched as the order needs them and
    removed to stay within it (`etl.storage.cache`). `ranged`: no shard is fetched, each
    batch's rows are read with ranged GETs and verified (`etl.storage.ranged`).
    `shared_cache`: the cache folder is shared with other users on purpose (default
    `$ETL_CACHE_SHARED`; NOTE [ a cache nobody can poison ]). `allow_protocols`: protocols
    other than a store's (s3, gs, gcs, az, abfs, abfss) this may reach, e.g. ("memory",)
    (NOTE [ no request nobody asked for ] in `etl.storage.transport`)."""

    cache_dir: Path | str | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    timeout: float = STORE_TIMEOUT
    cache_limit: int | str | None = None
    ranged: bool = False
    shared_cache: bool | None = None
    allow_protocols: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.ranged and self.cache_limit is not None:
            raise ValueError("ranged=True caches no shard: give it or cache_limit, not both")
        if self.cache_limit is not None:
            object.__setattr__(self, "cache_limit", parse_byte_size(self.cache_limit))

    @property
    def reach(self) -> dict[str, Any]:
        """The driver's options, with the protocols the user allowed (`with_allowed`)."""
        return with_allowed(self.storage_options, self.allow_protocols)

    def check_local(self, path: Path | str) -> None:
        """ValueError where an option that only a store has is given for a local `path`."""
        for given, name in ((self.cache_limit is not None, "cache_limit"), (self.ranged, "ranged")):
            if given:
                raise ValueError(f"{name} is for a dataset in object storage, not {str(path)!r}")


class ShardFiles(Protocol):
    """What `Location.shard_access` needs of a selection's shards
    (`loaders.read.catalog.ShardSet`)."""

    @property
    def names(self) -> tuple[str, ...]: ...
    @property
    def sizes(self) -> tuple[int, ...]: ...
    @property
    def checksums(self) -> tuple[str, ...]: ...
    @property
    def algorithm(self) -> str: ...
    @property
    def sample_shape(self) -> tuple[int, ...]: ...
    @property
    def rows(self) -> NDArray[np.int64]: ...


@dataclass(frozen=True)
class Location:
    """A dataset's files as a local folder: `root` is the dataset's own folder (or version
    folder, or manifest file, as given), or for a dataset in a store (`store` set) its mirror
    in the cache."""

    given: str
    """The path or URL as the user gave it."""
    root: Path
    store: StoreDataset | None = None
    options: StoreOptions = field(default_factory=StoreOptions)

    @property
    def url(self) -> str | None:
        """The dataset's URL in object storage; None for a local folder."""
        return self.store.url if self.store is not None else None

    def fetch_version(self, version: int | None) -> int | None:
        """`version` ready to read under `root`: a store's fetched into the mirror (None: its
        latest, whose number is returned); a local folder's as it is."""
        if self.store is None:
            return version
        return self.store.fetch_version(version)

    def versions(self) -> list[int]:
        """The committed versions, oldest first; ManifestError if there is none."""
        if self.store is not None:
            return self.store.versions()
        from etl.format.manifest import list_versions, resolve

        return list_versions(resolve(self.root)[0])

    def shard_access(
        self, shards: ShardFiles, row_sums: Callable[[], RowChecksums]
    ) -> tuple[BoundedCache | None, RangedRows | None]:
        """(the bounded cache, the ranged reader) through which `shards` are read: none for a
        local folder; for a store, each shard fetched and verified now without `cache_limit`
        or `ranged`, else the one they ask for (`row_sums`: the checksums ranged reads verify
        each row against)."""
        store, options = self.store, self.options
        if store is None:
            return None, None
        if options.ranged:
            from etl.storage.ranged import RangedRows

            ranged = RangedRows(
                store.url, options.reach, options.timeout, shards.names,
                shards.sizes, shards.rows, shards.sample_shape, row_sums(),
            )  # fmt: skip
            return None, ranged
        if options.cache_limit is None:
            store.fetch_shards(shards.names, shards.checksums, shards.algorithm, shards.sizes)
            return None, None
        from etl.storage.cache import BoundedCache

        cache = BoundedCache(
            store.url, options.cache_dir, options.reach, options.timeout,
            int(options.cache_limit), shards.names, shards.sizes, shards.checksums,
            shards.algorithm, options.shared_cache,
        )  # fmt: skip
        return cache, None


def open_location(
    path: Path | str, options: StoreOptions | None = None, relative_to: Path | str = ""
) -> Location:
    """The dataset at `path`: a local folder, version folder or manifest file (a relative one
    read from `relative_to`, as a view file's `dataset` is), or a URL in object storage, whose
    mirror in the cache is then `root` (nothing is fetched yet: `Location.fetch_version`).
    ValueError for store options given with a local path."""
    options = options or StoreOptions()
    text = os.fspath(path)
    if not is_url(text):
        options.check_local(text)
        local = Path(text.removeprefix("file://"))
        return Location(text, Path(relative_to) / local if relative_to else local, None, options)
    from etl.storage.store import StoreDataset

    store = StoreDataset(
        text, options.cache_dir, options.reach, options.timeout,
        shared=options.shared_cache,
    )  # fmt: skip
    return Location(text, store.root, store, options)
