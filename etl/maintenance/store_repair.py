"""`etl audit s3://... --repair`: a dataset in object storage repaired as a run adds a version.

In the run's work folder, under its lock (`etl.run.to_store`): the audited version's files are
fetched, and the shards the audit found damaged as the store holds them (their verified rows
are copied, the rest decoded again from the source); `etl.maintenance.repair` writes the
repaired version there with tagged shards, and it is published with one conditional put of
its record (NOTE [ publishing to a store ]). A writer that published first wins; the repair
then stops with one line, and a new audit of the latest version says what is left to do.
"""

from __future__ import annotations

import secrets
from dataclasses import replace
from pathlib import Path

from etl.config import Backend, PipelineConfig
from etl.errors import EtlError
from etl.format.lock import DatasetLock
from etl.format.manifest import read_manifest
from etl.maintenance.audit.report import AuditReport
from etl.maintenance.repair import RepairReport, repair
from etl.progress import Progress
from etl.run.to_store import empty_work, finish_killed_attempt, publish_from_work, reached


def repair_in_store(
    report: AuditReport,
    config: PipelineConfig,
    source_root: Path | str | None = None,
    *,
    jobs: int | None = None,
    backend: Backend = "loky",
    address: str | None = None,
    progress: Progress | None = None,
) -> RepairReport:
    """`etl.maintenance.repair.repair` for the dataset at the URL `report.root`."""
    url = str(report.root)
    progress = progress or Progress()
    store, work = reached(url, config.output.store())
    local = store.root
    with DatasetLock(store.folder(work)):
        finish_killed_attempt(store, work)
        empty_work(local)
        try:
            latest = store.latest_version()
            if report.version != latest:
                raise EtlError(
                    f"{url}: the audit checked version {report.version} but the latest is "
                    f"{latest}; repair builds on the latest version: audit it"
                )
            store.fetch_version(latest)
            damaged = sorted({f.shard for f in report.findings if f.shard})
            shards = read_manifest(local, latest).shards
            size_of = dict(
                zip(
                    shards.column("shard").to_pylist(),
                    shards.column("bytes").to_pylist(),
                    strict=True,
                )
            )
            sizes = [size_of.get(name, 0) for name in damaged]
            store.download_as_stored(damaged, sizes, lambda done: None)
            writer = secrets.token_hex(4)
            fixed = repair(
                replace(report, root=local),
                config,
                source_root,
                jobs=jobs,
                backend=backend,
                address=address,
                progress=progress,
                writer=writer,
            )
            if fixed.committed:
                assert fixed.version is not None
                publish_from_work(store, work, fixed.version, writer, progress)
        finally:
            empty_work(local)
    return fixed
