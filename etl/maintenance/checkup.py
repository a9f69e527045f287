"""`etl audit --repair` as a function: repair what an audit found, audit the repaired version,
and write the whole story as one report file (JSON, or Arrow with one row per finding)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from etl.config import PipelineConfig, Source
from etl.errors import EtlError
from etl.format.atomic import replacing
from etl.maintenance.audit import (
    FINDINGS_SCHEMA,
    SHARD_KINDS,
    AuditOptions,
    AuditReport,
    audit,
)
from etl.maintenance.repair import RepairReport, repair
from etl.maintenance.store_repair import repair_in_store
from etl.progress import Progress
from etl.sources.locate import location
from etl.sources.registry import kind_of

REPORT_METADATA = b"etl.audit"
"""Schema metadata key of an Arrow report: everything but the findings, as JSON."""


@dataclass(frozen=True)
class Checkup:
    """An audit, and when it was asked for, the repair it led to and the audit after it."""

    audit: AuditReport
    repair: RepairReport | None = None
    after: AuditReport | None = None

    @property
    def final(self) -> AuditReport:
        """The audit that decides the exit code: of the repaired version, if one was made."""
        return self.after or self.audit

    def to_dict(self) -> dict[str, Any]:
        repaired = None
        if self.repair is not None:
            repaired = self.repair.to_dict()
            if self.after is not None:
                repaired["after"] = self.after.to_dict()
        return {**self.audit.to_dict(), "repair": repaired, "exit_code": self.final.exit_code}

    def write(self, path: Path) -> None:
        """JSON, or Arrow when the name ends in .arrow: one row per finding (of both audits),
        the rest as schema metadata `etl.audit`; written to a temp file and renamed."""
        payload = self.to_dict()
        with replacing(path) as temp:
            if path.suffix != ".arrow":
                temp.write_text(json.dumps(payload, indent=2) + "\n")
                return
            audits = [self.audit] if self.after is None else [self.audit, self.after]
            table = pa.concat_tables([a.findings_table() for a in audits])
            summary = {k: v for k, v in payload.items() if k != "findings"}
            if summary["repair"] and summary["repair"].get("after"):
                after = summary["repair"]["after"]
                summary["repair"]["after"] = {k: v for k, v in after.items() if k != "findings"}
            metadata = {REPORT_METADATA: json.dumps(summary).encode()}
            schema = FINDINGS_SCHEMA.with_metadata(metadata)
            with ipc.new_file(str(temp), schema) as writer:
                writer.write_table(table.cast(schema))


def sources_to_check(
    config: PipelineConfig | None, source: Path | None
) -> tuple[Path | str | None, Source | None]:
    """(the source root whose files an audit re-hashes, the source of records it lists again)
    for `--config` and `--source`: a folder or listing's root (`source`, else the config's
    source.path), or a source of records (lmdb, python, webdataset, parquet), listed again
    where `source` says it is now. EtlError for a root that is not a folder."""
    if config is not None and not kind_of(config.source).by_path:
        moved = location(config.source, source.resolve() if source else None)
        return None, config.source.model_copy(update={"path": moved})
    root = source or (location(config.source) if config else None)
    if isinstance(root, Path) and not root.is_dir():
        raise EtlError(f"source root {root} is not a folder (--source or source.path)")
    return root.resolve() if isinstance(root, Path) else root, None


def needs_repair(report: AuditReport) -> bool:
    """A damaged sample or shard, or a manifest repair must refuse (it says why)."""
    damaged = report.bad_samples or any(f.kind in SHARD_KINDS for f in report.findings)
    return bool(damaged) or not report.manifest_ok


def repair_and_recheck(
    report: AuditReport,
    options: AuditOptions,
    config: PipelineConfig,
    source_root: Path | str | None = None,
    progress: Progress | None = None,
) -> Checkup:
    """Repair what `report` found (see `etl.maintenance.repair.repair`) and audit the version
    it commits with the same options; a clean report is returned as it is."""
    if not needs_repair(report):
        return Checkup(report)
    fix = repair if isinstance(report.root, Path) else repair_in_store
    fixed = fix(
        report,
        config,
        source_root,
        jobs=options.jobs,
        backend=options.backend,
        address=options.address,
        progress=progress,
    )
    if not fixed.committed:
        return Checkup(report, fixed)
    after = audit(report.root, replace(options, version=fixed.version), progress)
    return Checkup(report, fixed, after)
