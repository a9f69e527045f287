"""`etl run` with output.dir in object storage: pack in a local work folder, then publish.

The work folder, `<cache>/writing/<key>/` (the cache of `etl.storage.store`), holds a local
dataset folder, `dataset/`, with the files of the store's latest version (none of its shards: a
run reads no shard of the version it builds on) and what this run packs; and, while it
publishes, the attempt file (`etl.storage.publish`). A run:

1. takes the work folder's lock (one writer per node and dataset; other nodes are kept out by
   the record's conditional put, NOTE [ publishing to a store ]);
2. removes what a killed attempt from this folder left in the store, and the retired
   versions whose grace is over (`etl.storage.retired`), and empties `dataset/`;
3. fetches the store's latest version into `dataset/` and packs there, as into any folder,
   its new shards tagged with a fresh writer tag;
4. publishes the new version, removes what lost attempts of any node left in the store
   (`sweep`), and empties `dataset/` again.

A run killed at any step leaves the store's versions as they were; the next run converges.
"""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from etl.config import PipelineConfig
from etl.errors import redacted
from etl.format.lock import DatasetLock
from etl.format.manifest import VERSIONS_DIR
from etl.format.shards import SHARDS_DIR
from etl.progress import Progress
from etl.run.report import RunReport
from etl.storage.location import StoreOptions
from etl.storage.publish import ATTEMPT_FILE, Attempt, forget, publish, sweep
from etl.storage.retired import remove_due_retirements
from etl.storage.store import StoreDataset, default_cache_dir
from etl.storage.transport import STORE_TIMEOUT

WORK_DIR = "writing"
"""The work folders' parent under the cache folder."""


def work_folder(store: StoreDataset) -> Path:
    """Where a run to `store` packs: one folder per dataset URL under the cache."""
    return default_cache_dir() / WORK_DIR / store.key


def reached(url: str, options: StoreOptions) -> tuple[StoreDataset, Path]:
    """The dataset at `url` as every writer reaches it (a run, a compaction, a repair), with
    the same `options` (`OutputConfig.store`): the store, mirrored into the `dataset/` folder
    of its work folder, and the work folder."""
    work = work_folder(StoreDataset(url, storage_options=options.reach))
    store = StoreDataset(
        url, storage_options=options.reach, timeout=options.timeout, root=work / "dataset"
    )
    return store, work


@dataclass(frozen=True)
class StoreWork:
    """A run's work folder for the dataset at `url`: `config` packs into its local dataset
    folder, the new shards tagged `writer`, on top of the store's latest version."""

    url: str
    store: StoreDataset
    folder: Path
    config: PipelineConfig
    writer: str
    started: float


@contextmanager
def prepared(config: PipelineConfig, dry_run: bool = False) -> Iterator[StoreWork]:
    """Steps 1-3 for a config whose output.dir is a URL: the work folder locked, a killed
    attempt's leftovers removed, retired versions whose grace is over removed (not in a dry
    run), the store's latest version fetched into it; emptied again after a run that ended
    without an error."""
    started = time.perf_counter()
    url = str(config.output.dir)
    store, work = reached(url, config.output.store())
    local = store.root
    with DatasetLock(store.folder(work)):
        finish_killed_attempt(store, work)
        empty_work(local)
        if not dry_run and remove_due_retirements(store):
            empty_work(local)  # the remaining versions were mirrored to see what they name
        latest = store.committed()
        if latest:
            store.fetch_version(latest[-1])
        output = config.output.model_copy(
            update={"dir": local, "storage_options": {}, "store_timeout": STORE_TIMEOUT}
        )
        here = config.model_copy(update={"output": output})
        yield StoreWork(url, store, work, here, secrets.token_hex(4), started)
        empty_work(local)


def published(work: StoreWork, report: RunReport, dry_run: bool, progress: Progress) -> RunReport:
    """Step 4: the version `report` committed in the work folder published to the store, and
    what lost attempts left there swept; the report as of the store."""
    if report.committed and not dry_run:
        assert report.version is not None
        start = time.perf_counter()
        publish_from_work(work.store, work.folder, report.version, work.writer, progress)
        report.phases["upload"] = time.perf_counter() - start
    if not dry_run:
        sweep(work.store)
    seconds = time.perf_counter() - work.started
    return replace(report, output=redacted(work.url), seconds=seconds)


def publish_from_work(
    store: StoreDataset, work: Path, version: int, writer: str, progress: Progress
) -> None:
    """Publish `version`, written in the work folder with shards tagged `writer`, to `store`;
    the attempt is on disk while it uploads, for the next run to clean up after a kill."""
    attempt = Attempt(version, writer)
    attempt.save(work)
    publish(store, store.root, attempt, progress)
    (work / ATTEMPT_FILE).unlink()


def finish_killed_attempt(store: StoreDataset, work: Path) -> None:
    """Remove from the store what an attempt killed mid-publish uploaded (nothing, if its
    record was published: then it is a version), and forget the attempt."""
    attempt = Attempt.saved(work)
    if attempt is not None:
        forget(store, attempt)
    (work / ATTEMPT_FILE).unlink(missing_ok=True)


def empty_work(local: Path) -> None:
    """`local` without versions or shards: the work of one run, never trusted by the next."""
    for name in (VERSIONS_DIR, SHARDS_DIR):
        shutil.rmtree(local / name, ignore_errors=True)
