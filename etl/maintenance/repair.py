"""Repair a dataset from an audit: re-pack its damaged samples as a new manifest version.

The one writer of the audit feature; `etl.maintenance.audit` itself never writes. Under the dataset
lock, a
bad sample is decoded again from its source through the same stages as `etl run`, if the source
still has its recorded hash; the samples of a damaged shard that verified are copied as they are
(their bytes checked again), so the new version lists no damaged file and a fresh audit of it is
clean. New shards are named like the pipeline's: shards/v<new version>-NNNNN.npy. Older versions
are never touched: a pinned version stays as it was, damage included.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from etl.config import Backend, PipelineConfig, RunConfig
from etl.engine.parallel import choose_run, engine, parallel_map
from etl.errors import EtlError, ManifestError
from etl.format.commit import clean_leftovers, commit_version
from etl.format.flat import encoding_of, place_of
from etl.format.lock import DatasetLock
from etl.format.manifest import (
    Manifest,
    list_versions,
    read_manifest,
    table_from_rows,
)
from etl.format.shards import ShardInfo, shard_name
from etl.maintenance.audit import (
    SHARD_KINDS,
    AuditReport,
    shard_records,
)
from etl.maintenance.repack import Placed, RepairItem, RepairOutcome, RepairTask, repair_shard
from etl.progress import Progress
from etl.sources import readers
from etl.sources.entries import ListContext
from etl.sources.locate import locate, location
from etl.sources.registry import kind_of, released

HOW: dict[str, str] = {
    "copied": "bytes verified, moved out of a damaged shard",
    "restored": "decoded again, bit-identical to the recorded checksum",
    "record_fixed": "decoded again, equal to the stored bytes: the recorded checksum was wrong",
    "differs": "decoded again, differs from the recorded checksum (another decoder version?)",
}
"""How a repaired sample was stored again (RepairReport.repaired[*]["how"])."""


@dataclass
class RepairReport:
    version: int | None
    """The version committed, or None if nothing could be repaired."""
    repaired: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    shards_written: list[str] = field(default_factory=list)
    bytes_written: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def committed(self) -> bool:
        return self.version is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "committed": self.committed,
            "repaired": self.repaired,
            "failed": self.failed,
            "shards_written": self.shards_written,
            "bytes_written": self.bytes_written,
            "seconds": round(self.seconds, 3),
            "notes": self.notes,
        }


def repair(
    report: AuditReport,
    config: PipelineConfig,
    source_root: Path | str | None = None,
    *,
    jobs: int | None = None,
    backend: Backend = "loky",
    address: str | None = None,
    progress: Progress | None = None,
    writer: str = "",
) -> RepairReport:
    """Re-pack what `report` found damaged, as a new version of `report.root`, under the lock
    (its new shards tagged `writer`, for a version published to a store: `shard_name`).

    Bad samples are decoded again from their source (any kind; `source_root`: where it is now,
    when not where `config` says) through `config`'s stages, if the source still has its
    recorded hash; the verified samples of a damaged shard are copied as they are, so the new
    version lists no damaged file. Refuses (ConfigError) a config whose output-shaping digest
    differs from the manifest's, and (EtlError) a report that is not of the latest version.
    """
    progress = progress or Progress()
    started = time.perf_counter()
    # NOTE: checked before taking the lock, so a refusal writes nothing (not even .lock); a
    # version never changes once committed, so the check still holds under the lock.
    root, manifest = _repairable(report, config)
    config = config.resolved(manifest.meta.config)  # decoded as the version was packed
    with DatasetLock(root):
        latest = list_versions(root)[-1]
        if report.version != latest:
            raise EtlError(
                f"{root}: the audit checked version {report.version} but the latest is {latest}; "
                "repair builds on the latest version: audit it"
            )
        out = RepairReport(version=None)
        items = _repair_items(report, manifest)
        if not items:
            out.notes.append("nothing to repair: no damaged sample or shard")
            return out
        clean_leftovers(root, latest)
        spool = readers.spool_path(root)
        with released(spool):
            located, unlocated = _located(items, config, source_root, spool)
            tasks = _repair_tasks(located, manifest.version + 1, config.samples_per_shard, writer)
            outcomes = [RepairOutcome(None, (), tuple(unlocated))]
            run = choose_run(jobs, backend, address, worth_workers=len(tasks) > 1)
            progress.start("repair", len(items))
            progress.advance(len(unlocated))
            try:
                outcomes += _repaired_shards(tasks, run, config, source_root, manifest, progress)
            finally:
                progress.stop()
        _commit_repair(manifest, items, outcomes, report, out)
    out.seconds = time.perf_counter() - started
    return out


def _repaired_shards(
    tasks: Sequence[RepairTask],
    run: RunConfig,
    config: PipelineConfig,
    source_root: Path | str | None,
    manifest: Manifest,
    progress: Progress,
) -> list[RepairOutcome]:
    """Each task's new shard, written by the run's workers (which read spooled records from
    the output folder, files from the source), progress advanced per sample."""
    spooled = kind_of(config.source).spooled
    where = location(config.source, source_root)
    readable = [] if spooled or not isinstance(where, Path) else [where]
    root = manifest.root
    outcomes = []
    with (
        engine(run, writable_root=root, readable=readable),
        parallel_map(
            repair_shard, tasks, run, config, str(root), manifest.meta.sample_shape
        ) as repaired,
    ):
        for outcome in repaired:
            outcomes.append(outcome)
            progress.advance(len(outcome.stored) + len(outcome.failed))
    return outcomes


def _repairable(report: AuditReport, config: PipelineConfig) -> tuple[Path, Manifest]:
    """The local folder and the manifest of the version `report` audited, once it is one a
    repair can build on: a whole audit of a readable manifest, packed with `config`."""
    if report.mode == "sample":
        raise EtlError("repair needs a full or --fast audit, not a sampled one")
    if not isinstance(report.root, Path):
        raise EtlError(f"{report.root}: repair writes a new version; it needs a local dataset")
    root = report.root
    if not report.manifest_ok:
        raise ManifestError(
            f"{root}: version {report.version}'s manifest is damaged; repair cannot trust it. "
            "Repack with 'etl run --rebuild' or audit an older version"
        )
    manifest = read_manifest(root, report.version)
    config.resolved(manifest.meta.config).check_same_output(
        manifest.meta.config,
        manifest.meta.config_digest,
        f"{root}: version {report.version}",
        "repair needs the config it was packed with",
    )
    return root, manifest


def _repair_items(report: AuditReport, manifest: Manifest) -> list[RepairItem]:
    """The samples to store again, by old shard and row: the bad ones, and every other sample
    of a damaged shard."""
    bad = {f.sample_id for f in report.bad_samples}
    damaged = {f.shard for f in report.findings if f.kind in SHARD_KINDS}
    shard_rows = shard_records(manifest.shards)
    items: list[RepairItem] = []
    for s in manifest.samples.to_pylist():
        if s["sample_id"] in bad or s["shard"] in damaged:
            items.append(
                RepairItem(
                    sample_id=s["sample_id"],
                    source=s["source"],
                    source_hash=s["source_hash"],
                    old_shard=s["shard"],
                    old_shard_rows=shard_rows[s["shard"]][0],
                    old_row=s["row"],
                    expected=s["checksum"],
                    copy=s["sample_id"] not in bad,
                    old_place=place_of(s) if manifest.meta.ragged else None,
                    old_encoding=encoding_of(s),
                )
            )
    items.sort(key=lambda i: (i.old_shard, i.old_row))
    return items


def _located(
    items: list[RepairItem], config: PipelineConfig, source_root: Path | str | None, spool: Path
) -> tuple[list[RepairItem], list[tuple[str, str]]]:
    """`items` with the locators of their sources (record sources are listed again, the
    wanted records spooled), and (sample_id, why) of the bad ones whose source is gone.

    NOTE: the sources of samples that may be copied are located too: a row that fails its
    check when copied is decoded instead."""
    context = ListContext(
        checksum=config.output.checksum,
        spool=spool,
        wanted=frozenset(i.source_hash for i in items),
    )
    found = locate(config.source, {i.source for i in items}, context, source_root)
    kept: list[RepairItem] = []
    unlocated: list[tuple[str, str]] = []
    for item in items:
        if item.source in found.locators:
            kept.append(replace(item, locator=found.locators[item.source]))
        elif item.copy:
            kept.append(item)
        else:
            unlocated.append((item.sample_id, f"source {found.missing[item.source]}"))
    return kept, unlocated


def _repair_tasks(
    items: list[RepairItem], version: int, per_shard: int, writer: str = ""
) -> list[RepairTask]:
    return [
        RepairTask(shard_name(version, n, writer), tuple(items[i : i + per_shard]))
        for n, i in enumerate(range(0, len(items), per_shard))
    ]


def _record_outcomes(
    repaired: Sequence[RepairItem],
    outcomes: Iterable[RepairOutcome],
    report: AuditReport,
    out: RepairReport,
) -> tuple[dict[str, tuple[str, int, str, Placed | None]], list[ShardInfo]]:
    """Each sample's outcome in `out` (failed, or repaired and how), and where each repaired
    sample now is, with the new shards."""
    items = {i.sample_id: i for i in repaired}
    stored_bytes = {f.sample_id: f.actual for f in report.bad_samples}
    moved: dict[str, tuple[str, int, str, Placed | None]] = {}
    new_shards: list[ShardInfo] = []
    for outcome in outcomes:
        for sample_id, reason in outcome.failed:
            item = items[sample_id]
            out.failed.append(
                {
                    "sample_id": sample_id,
                    "source": item.source,
                    "shard": item.old_shard,
                    "row": item.old_row,
                    "reason": reason,
                }
            )
        if outcome.shard is None:
            continue
        info = outcome.shard
        new_shards.append(info)
        out.shards_written.append(info.name)
        out.bytes_written += info.bytes
        for sample_id, row, checksum, how, placed in outcome.stored:
            item = items[sample_id]
            moved[sample_id] = (info.name, row, checksum, placed)
            if how == "decoded":
                if checksum == item.expected:
                    how = "restored"
                elif checksum == stored_bytes.get(sample_id):
                    how = "record_fixed"
                else:
                    how = "differs"
            out.repaired.append(
                {
                    "sample_id": sample_id,
                    "source": item.source,
                    "old": f"{item.old_shard}:{item.old_row}",
                    "new": f"{info.name}:{row}",
                    "how": how,
                }
            )
    return moved, new_shards


def _commit_repair(
    manifest: Manifest,
    repaired: Sequence[RepairItem],
    outcomes: Iterable[RepairOutcome],
    report: AuditReport,
    out: RepairReport,
) -> None:
    """Commit the repaired samples as the next version (nothing where none was), every
    sample's outcome in `out`."""
    moved, new_shards = _record_outcomes(repaired, outcomes, report, out)
    out.repaired.sort(key=lambda r: r["source"])
    out.failed.sort(key=lambda r: r["source"])
    out.shards_written.sort()
    if not moved:
        out.notes.append("nothing committed: no sample could be repaired")
        return
    rows = manifest.samples.to_pylist()
    for row in rows:
        if row["sample_id"] in moved:
            row["shard"], row["row"], row["checksum"], placed = moved[row["sample_id"]]
            if placed is not None:
                place, encoding = placed
                row["sample_offset"], row["sample_height"], row["sample_width"] = place
                if encoding is not None:
                    row["sample_bytes"], row["sample_codec"] = encoding
    meta = replace(manifest.meta, version=manifest.version + 1)
    samples = table_from_rows(rows, meta.samples_schema)
    commit_version(manifest.root, meta, samples, manifest.rejects, new_shards, manifest.shards)
    out.version = meta.version
