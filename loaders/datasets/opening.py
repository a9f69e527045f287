"""How `PackedDataset.open` opens a dataset: its location (a folder, a URL, a view), the
version and selection read, the row checks and a store's shard access; what a run's record
keeps to open the same selection again; the former store keywords it still takes, and the
warning for a retired version."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from etl.deprecations import warn_once
from etl.errors import without_credentials
from etl.format.manifest import VERSIONS_DIR
from etl.format.retirement import retired_versions
from etl.format.views import View
from etl.storage.location import Location, StoreOptions, StoreUrl, as_location, open_location
from loaders.read.catalog import Selection, Where, open_catalog
from loaders.read.row_checks import Verify, checked_rows, checks_of, row_checksums


def how_opened(
    path: Path | str | View,
    version: int,
    split: str | Sequence[str] | None,
    classes: Sequence[str | int] | None,
    where: Where | None,
) -> dict[str, Any] | None:
    """What a run's record keeps to open the same selection again (`loaders.loader.trace`): the
    dataset (absolute, or its URL without credentials), version and selection, or a view's
    chain of predicates; None where a predicate is code (a callable where=, a pyarrow
    Expression)."""
    if isinstance(path, View):
        if any(str(p.get("where", "")).startswith("arrow: ") for p in path.chain()):
            return None
        written = os.path.join(path.folder, path.dataset)
        in_store = isinstance(as_location(path.dataset), StoreUrl)
        dataset = without_credentials(path.dataset) if in_store else str(Path(written).resolve())
        return {"view": {"dataset": dataset, "version": version, "chain": path.chain()}}
    if where is not None and not isinstance(where, str):
        return None
    in_store = isinstance(as_location(path), StoreUrl)
    return {
        "dataset": without_credentials(str(path)) if in_store else str(Path(path).resolve()),
        "version": version,
        "split": split if split is None or isinstance(split, str) else list(split),
        "classes": None if classes is None else list(classes),
        "where": where,
    }


def check_view_alone(**given: Any) -> None:
    """A view says which rows and version: ValueError for any given beside it."""
    named = [name for name, value in given.items() if value is not None]
    if named:
        raise ValueError(
            f"a view says which rows and version; narrow it (view.narrowed(split=...)) instead "
            f"of passing {', '.join(named)}"
        )


STORE_KEYWORDS = {
    "cache_dir": "cache_dir",
    "storage_options": "storage_options",
    "store_timeout": "timeout",
    "cache_limit": "cache_limit",
    "ranged": "ranged",
}
"""`PackedDataset.open`'s former keywords -> the `StoreOptions` field each is now."""


def store_options(store: StoreOptions | None, renamed: dict[str, Any]) -> StoreOptions:
    """`store`, or the options the former keywords in `renamed` give (each warns once)."""
    unknown = sorted(set(renamed) - set(STORE_KEYWORDS))
    if unknown:
        raise TypeError(f"PackedDataset.open() got an unexpected keyword argument {unknown[0]!r}")
    if not renamed:
        return store or StoreOptions()
    if store is not None:
        raise TypeError(f"give store= or {sorted(renamed)}, not both")
    for name in renamed:
        warn_once(f"PackedDataset.open({name}=)", f"store=StoreOptions({STORE_KEYWORDS[name]}=)")
    fields = {STORE_KEYWORDS[name]: value for name, value in renamed.items()}
    if fields.get("storage_options") is None:
        fields.pop("storage_options", None)
    return StoreOptions(**fields)


def warn_if_retired(location: Location, version: int) -> None:
    """Say once that `version` is retired (NOTE [ a grace period ]): it reads whole until its
    grace is over, then its files go at the next compaction."""
    retirement = retired_versions(location.root / VERSIONS_DIR).get(version)
    if retirement is not None:
        until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(retirement.remove_after))
        warnings.warn(
            f"{location.given}: version {version} was retired by a compaction; it reads "
            f"whole until {until}, when a compaction may remove its files: pin a kept version",
            RuntimeWarning,
            stacklevel=3,
        )


def open_selection(
    path: Path | str | View,
    split: str | Sequence[str] | None,
    classes: Sequence[str | int] | None,
    where: Where | None,
    version: int | None,
    verify: Verify,
    verify_manifest: bool,
    store: StoreOptions | None,
    columns: Sequence[str] | None,
    renamed: dict[str, Any],
) -> tuple[Selection, str | None]:
    """The selection `PackedDataset.open` reads (its arguments mean what it says), with its
    rows' checksums where rows are checked and its store's shard access, and the checks
    chosen (`loaders.read.row_checks.checks_of`)."""
    view = path if isinstance(path, View) else None
    if view is not None:
        check_view_alone(split=split, classes=classes, where=where, version=version)
        version = view.version
    checks = checks_of(verify)
    location = open_location(
        view.dataset if view else cast(Path | str, path),
        store_options(store, renamed),
        view.folder if view else "",
    )
    version = location.fetch_version(version)
    catalog = open_catalog(location.root, version, verify_manifest)
    warn_if_retired(location, catalog.version)
    selected = catalog.select_view(view) if view else catalog.select(split, classes, where)
    selection = catalog.with_columns(selected, columns)
    sums = None
    if checks in ("rows", "once"):
        sums = row_checksums(catalog, selection)
        selection = checked_rows(selection, sums, once=checks == "once")
    if location.store is not None:
        shards = selection.shards
        cache, ranged = location.shard_access(
            shards, lambda: sums or row_checksums(catalog, selection)
        )
        shards = replace(shards, url=location.store.url, cache=cache, ranged=ranged)
        selection = replace(selection, shards=shards)
    return selection, checks
