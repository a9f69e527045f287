"""Retired versions of a dataset in object storage: their records, and their removal once
their grace is over (NOTE [ a grace period ] in `etl.format.retirement`), by a compaction
(`etl.maintenance.store_compact`) or by a run publishing to the store (`etl.run.to_store`),
as a local run removes them (`etl.format.commit.remove_due_retirements`).
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

from etl.errors import OutputError
from etl.format.manifest import SHARDS_FILE, VERSIONS_DIR, load_table, version_name
from etl.format.record import FILES_AT, RECORD_FILE
from etl.format.retirement import RETIRED_DIR, Retirement, record_name, version_of_record
from etl.format.shards import SHARDS_DIR, shard_version
from etl.storage.records import staging_name_of
from etl.storage.store import StoreDataset
from etl.storage.transport import why


def remove_due_retirements(store: StoreDataset) -> list[int]:
    """The retired versions in `store` whose grace is over, removed (record, files, then the
    retirement record), then every shard that no remaining version, listed or still waiting,
    names and that was written for a version no later than the latest. Returns the versions
    removed. Call only from a writer's work folder, under its lock (a run, a compaction)."""
    retired = retirements(store)
    due = sorted(number for number, record in retired.items() if record.due())
    for number in due:
        remove_version(store, number)
    if not due:
        return due
    remaining = sorted(set(store.committed()) | (set(retired) - set(due)))
    named: set[str] = set()
    for number in remaining:
        store.fetch_version(number)
        table = load_table(store.root / VERSIONS_DIR / version_name(number) / SHARDS_FILE)
        named.update(table.column("shard").to_pylist())
    latest = max(remaining, default=0)
    unnamed = []
    for name in stored_shards(store):
        written_for = shard_version(PurePosixPath(name).name)
        if written_for is not None and written_for <= latest and name not in named:
            unnamed.append(store.in_store(name))
    remove_objects(store, unnamed)
    return due


def remove_version(store: StoreDataset, number: int) -> None:
    """Remove version `number`: its record first (then no reader lists it), its files after."""
    folder = store.in_store(VERSIONS_DIR, version_name(number))
    record = f"{folder}/{RECORD_FILE}"
    staging = None
    try:
        files_at = json.loads(store.bounded(store.fs.cat_file, record)).get(FILES_AT)
        if isinstance(files_at, str) and staging_name_of(files_at) == number:
            staging = store.in_store(VERSIONS_DIR, files_at)
    except (ValueError, AttributeError):
        pass  # a damaged record names nothing to follow; the folder goes all the same
    except FileNotFoundError:
        pass  # gone already (a killed compaction): what is left goes all the same
    except Exception as exc:
        raise OutputError(f"{record}: cannot read it ({why(exc)})") from None
    remove_objects(store, [record])
    remove_objects(store, [p for p in (folder, staging) if p], recursive=True)
    remove_objects(store, [store.in_store(VERSIONS_DIR, record_name(number))])


def retirements(store: StoreDataset) -> dict[int, Retirement]:
    """The retirement records in the store, by version; a damaged one is removed (never
    trusted: its version is listed again, NOTE [ a grace period ])."""
    found = {}
    for path in listed(store, store.in_store(VERSIONS_DIR, RETIRED_DIR), "retired versions"):
        number = version_of_record(PurePosixPath(path).name)
        if number is None:
            continue
        try:
            body = bytes(store.bounded(store.fs.cat_file, path, start=0, end=1 << 16))
        except FileNotFoundError:
            continue
        except Exception as exc:
            raise OutputError(f"{path}: cannot read it ({why(exc)})") from None
        retirement = Retirement.parse(body, number)
        if retirement is None:
            remove_objects(store, [path])
        else:
            found[number] = retirement
    return found


def stored_shards(store: StoreDataset) -> dict[str, int]:
    """Every shard object in the store: its dataset-relative name and its size."""
    found = listed(store, store.in_store(SHARDS_DIR), "shards")
    return {
        f"{SHARDS_DIR}/{PurePosixPath(path).name}": int(info.get("size") or 0)
        for path, info in found.items()
    }


def listed(store: StoreDataset, folder: str, what: str) -> dict[str, Any]:
    """Every object under `folder` as the store lists it now: path -> its details."""
    try:
        store.fs.invalidate_cache(folder)
        return dict(store.bounded(store.fs.find, folder, detail=True))
    except FileNotFoundError:
        return {}
    except Exception as exc:
        raise OutputError(f"{store.url}: cannot list its {what} ({why(exc)})") from None


def remove_objects(store: StoreDataset, paths: list[str], recursive: bool = False) -> None:
    if not paths:
        return
    try:
        store.bounded(store.fs.rm, paths, recursive=recursive)
    except FileNotFoundError:
        pass
    except Exception as exc:
        raise OutputError(f"{store.url}: cannot remove {paths[0]} ({why(exc)})") from None
