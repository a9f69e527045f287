"""`etl compact` on a dataset in object storage: the local policy, published as a run publishes.

A store has no rename and no lock (NOTE [ publishing to a store ] in etl.storage.publish), so
the order of the steps is what keeps every reader and writer safe, and every step safe to kill:

1. In the run's work folder, under its lock (`etl.run.to_store`): the latest version's files
   and the sparse shards it rewrites are fetched (verified), the compacted version is written
   there with tagged shards and published with one conditional put of its record, like a run's
   version. A writer that published first wins; compaction then stops with one line.
2. A retired version first gets a retirement record (NOTE [ a grace period ]): from then on
   no reader lists it (`StoreDataset.committed`), but it stays whole for the grace. The first
   compaction after removes its commit record (then nobody opens it), its files and staging
   folder, then the retirement record.
3. A shard is removed only if no kept version names it and it was written for a version no
   later than the latest: a writer packing the next version now writes shards of a later
   version, and names old shards only through the latest version, which is always kept.

A compaction killed at any point leaves the store's kept versions whole; what it left (a
version folder without a record, shards no kept version names) is removed by the next one.
A training job reading a retired version finishes its epoch within the grace period.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from etl.errors import OutputError
from etl.format.lock import DatasetLock
from etl.format.manifest import (
    VERSIONS_DIR,
    Manifest,
    read_manifest,
    version_number,
)
from etl.format.retirement import (
    GRACE,
    Retirement,
    record_name,
)
from etl.format.shards import shard_version
from etl.maintenance.housekeeping import (
    CompactReport,
    check_min_dead,
    plan_compaction,
    referenced_shards,
    retire,
    rewrite,
    still_named_by_rewrite,
)
from etl.progress import Progress
from etl.run.to_store import empty_work, finish_killed_attempt, publish_from_work, reached
from etl.storage.location import StoreOptions
from etl.storage.publish import sweep
from etl.storage.retired import (
    remove_objects,
    remove_version,
    retirements,
    stored_shards,
)
from etl.storage.store import StoreDataset
from etl.storage.transport import why


def compact_store(
    url: str,
    keep_last: int = 1,
    keep: Iterable[int] = (),
    min_dead_fraction: float = 0.5,
    dry_run: bool = False,
    options: StoreOptions | None = None,
    progress: Progress | None = None,
    grace: float = GRACE,
) -> CompactReport:
    """`etl.maintenance.housekeeping.compact` for the dataset at `url` in object storage,
    reached with `options` (a config's `output.store()`)."""
    check_min_dead(min_dead_fraction)
    store, work = reached(url, options or StoreOptions())
    local = store.root
    with DatasetLock(store.folder(work)):
        if not dry_run:  # a dry run writes nothing to the store
            finish_killed_attempt(store, work)
        empty_work(local)
        try:
            versions = store.versions()
            latest = store.fetch_version(versions[-1])
            manifest = read_manifest(local, latest)
            report = plan_compaction(
                url, versions, manifest, keep_last, keep, min_dead_fraction, dry_run
            )
            records, removed = retire(report, retirements(store), grace)
            new_version, sparse = report.new_version, report.rewritten_shards
            if new_version and not dry_run:
                _publish_rewrite(store, work, manifest, sparse, progress or Progress())
            newest = new_version or latest
            readable = [*report.kept_versions, *report.retired_versions]
            named = referenced_shards(
                local, [store.fetch_version(v) for v in readable if v != new_version]
            )
            if new_version:
                if dry_run:
                    named |= still_named_by_rewrite(manifest, sparse)
                else:
                    named |= referenced_shards(local, [new_version])
            if not dry_run:
                for record in records:
                    _put(store, store.in_store(VERSIONS_DIR, record_name(record.version)), record)
                for number in removed:
                    remove_version(store, number)
                _remove_unlisted_versions(store, newest, set(report.retired_versions))
            for name, size in stored_shards(store).items():
                written_for = shard_version(PurePosixPath(name).name)
                if written_for is not None and written_for <= newest and name not in named:
                    report.deleted_shards.append(name)
                    report.freed_bytes += size
            if not dry_run:
                remove_objects(store, [store.in_store(name) for name in report.deleted_shards])
                sweep(store)
        finally:
            empty_work(local)
    return report


def _publish_rewrite(
    store: StoreDataset, work: Path, latest: Manifest, sparse: list[str], progress: Progress
) -> None:
    """Fetch the `sparse` shards of `latest` (verified), write their live rows as the next
    version in the work folder and publish it (LockError if another writer published that
    version first)."""
    manifest, version = latest, latest.meta.version + 1
    table = manifest.shards
    names = table.column("shard").to_pylist()
    checksums = dict(zip(names, table.column("checksum").to_pylist(), strict=True))
    sizes = dict(zip(names, table.column("bytes").to_pylist(), strict=True))
    store.fetch_shards(
        sparse, [checksums[name] for name in sparse], manifest.meta.checksum,
        [sizes[name] for name in sparse],
    )  # fmt: skip
    writer = secrets.token_hex(4)
    rewrite(manifest, sparse, version, writer)
    publish_from_work(store, work, version, writer, progress)


def _put(store: StoreDataset, path: str, record: Retirement) -> None:
    try:
        store.bounded(store.fs.pipe_file, path, record.to_bytes())
    except Exception as exc:
        raise OutputError(f"{path}: cannot put it ({why(exc)})") from None


def _remove_unlisted_versions(store: StoreDataset, newest: int, retired: set[int]) -> None:
    """Remove what killed compactions left in `versions/`: the files of a version no later
    than `newest` whose record is gone (no writer can publish such a version any more), but
    never a `retired` one's in its grace period."""
    listed = set(store.committed()) | retired
    try:
        names = store.bounded(store.fs.ls, store.in_store(VERSIONS_DIR), detail=False)
    except FileNotFoundError:
        return
    except Exception as exc:
        raise OutputError(f"{store.url}: cannot list its versions ({why(exc)})") from None
    leftovers = []
    for path in names:
        number = version_number(PurePosixPath(path).name)
        if number is not None and number <= newest and number not in listed:
            leftovers.append(path)
    remove_objects(store, leftovers, recursive=True)
