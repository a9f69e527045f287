"""Findings, the options of an audit and its report: what `audit` returns, as data."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from etl.config import Backend, RunConfig, SourceConfig
from etl.engine.parallel import choose_run
from etl.format.schema import FORMAT_VERSION
from etl.storage.location import StoreOptions

ERROR = "error"
NOTE = "note"

FINDINGS: dict[str, tuple[str, str]] = {
    "manifest": (ERROR, "a manifest file is unreadable, incomplete or inconsistent"),
    "record_conflict": (ERROR, "two versions' shards.arrow disagree about one (immutable) shard"),
    "shard_missing": (ERROR, "a shard file is missing or cannot be read"),
    "shard_size": (ERROR, "a shard's size differs from its recorded bytes (truncated or padded)"),
    "shard_header": (ERROR, "a shard is not a uint8 .npy of the recorded shape"),
    "shard_checksum": (ERROR, "a shard's whole-file checksum differs from shards.arrow"),
    "shard_blake3": (ERROR, "a shard's whole-file BLAKE3 digest differs from shards.arrow"),
    "sample_checksum": (ERROR, "a sample's stored bytes differ from its manifest checksum"),
    "sample_unreadable": (ERROR, "a sample's shard is missing, truncated or malformed"),
    "orphan_shard": (ERROR, "a .npy file under shards/ that no committed version lists"),
    "source_changed": (ERROR, "a source file's content differs from its recorded source_hash"),
    "source_missing": (ERROR, "a source file vanished or cannot be read"),
    "leftover": (
        NOTE,
        "a temp file or folder of an interrupted run; the next 'etl run' removes it",
    ),
    "stray_file": (NOTE, "a file or folder the dataset format does not define"),
}
"""Every kind of finding: kind -> (severity, meaning). Errors make the audit fail (exit 1)."""

SAMPLE_KINDS = frozenset({"sample_checksum", "sample_unreadable"})
SHARD_KINDS = frozenset(
    {"shard_missing", "shard_size", "shard_header", "shard_checksum", "shard_blake3"}
)
MAX_EXAMPLES = 5
"""Manifest checks that fail on many rows name this many of them."""


@dataclass(frozen=True)
class Finding:
    """One problem. Sample-level findings carry the sample's id, source, shard and row."""

    kind: str
    message: str
    shard: str | None = None
    row: int | None = None
    sample_id: str | None = None
    source: str | None = None
    expected: str | None = None
    actual: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in FINDINGS:
            raise ValueError(f"unknown finding kind {self.kind!r}; add it to FINDINGS")

    @property
    def severity(self) -> str:
        return FINDINGS[self.kind][0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "message": self.message,
            "shard": self.shard,
            "row": self.row,
            "sample_id": self.sample_id,
            "source": self.source,
            "expected": self.expected,
            "actual": self.actual,
        }


FINDINGS_SCHEMA = pa.schema(
    [
        pa.field("version", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("severity", pa.string(), nullable=False),
        pa.field("message", pa.string(), nullable=False),
        pa.field("shard", pa.string()),
        pa.field("row", pa.int64()),
        pa.field("sample_id", pa.string()),
        pa.field("source", pa.string()),
        pa.field("expected", pa.string()),
        pa.field("actual", pa.string()),
    ]
)
"""The machine-readable report as Arrow: one row per finding; the summary is schema metadata."""


PARALLEL_MIN_BYTES = 2 << 30
"""With `jobs=None`, smaller audits run in-process. NOTE: starting loky workers (a fresh Python
each, importing numpy, pyarrow and etl) took 0.5 to 1.5 s on the 2-core test machine, while one
core hashes 1.5 to 2 GiB/s in a full audit: a second worker only wins above a couple of GiB.
Workers are reused within a process, so a library caller auditing repeatedly can pass `jobs`."""


# --- options and report -------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditOptions:
    version: int | None = None
    """Version to audit; None is the latest."""
    fast: bool = False
    """Whole-file checksums only (see NOTE [modes])."""
    deep: bool = False
    """Also each shard's BLAKE3 digest: tamper evidence (see NOTE [modes])."""
    sample_rate: float | None = None
    """Check this fraction (0 < rate <= 1) of the samples, chosen by `seed`."""
    seed: int | None = None
    """Seed of the sample choice; None draws one (the report gives it, to repeat the audit)."""
    source_root: Path | str | None = None
    """Folder (or object-storage prefix) the manifest's `source` paths are relative to; None
    skips the source check."""
    source_options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    """`source.storage_options` for a prefix in object storage."""
    store: StoreOptions = field(default_factory=StoreOptions, repr=False)
    """How the dataset's store is reached when it is audited at a URL (a config's
    `output.store()`, as a run, a compaction and a repair reach it)."""
    records: SourceConfig | None = None
    """A source whose samples are records, not files (lmdb, python, webdataset, parquet):
    listed again, as a run lists it, and each checked sample's content hash compared."""
    jobs: int | None = None
    """joblib workers (-1 every core); None: every core to read PARALLEL_MIN_BYTES or more,
    else in-process."""
    backend: Backend = "loky"
    address: str | None = None
    """Dask scheduler for backend 'dask' (None: a LocalCluster)."""

    def __post_init__(self) -> None:
        if self.fast + self.deep + (self.sample_rate is not None) > 1:
            raise ValueError("fast, deep and sample_rate exclude each other")
        if self.sample_rate is not None and not 0.0 < self.sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate}")

    @property
    def mode(self) -> str:
        if self.sample_rate is not None:
            return "sample"
        return "fast" if self.fast else ("deep" if self.deep else "full")

    def run_config(self, planned_bytes: int) -> RunConfig:
        """Where to run work that reads `planned_bytes` (see PARALLEL_MIN_BYTES)."""
        return choose_run(
            self.jobs, self.backend, self.address, planned_bytes >= PARALLEL_MIN_BYTES
        )


@dataclass
class AuditReport:
    root: Path | str
    """The dataset's folder, or its URL in object storage."""
    version: int
    latest: int
    mode: str
    checksum: str | None
    """`etl.checksum` of the version (None if its manifest could not be read)."""
    format_version: int = FORMAT_VERSION
    """The version's format (1: fixed-size samples; 2: samples that keep their aspect)."""
    manifest_ok: bool = False
    """The audited version's manifest files match their commit record, read and passed every
    integrity check."""
    record_ok: bool = True
    """The audited version's files match its commit record (see etl.format.record)."""
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    samples_total: int = 0
    samples_verified: int = 0
    """Samples whose stored bytes were hashed one by one."""
    shards_total: int = 0
    shards_hashed: int = 0
    """Shards hashed as whole files (full and fast modes)."""
    bytes_hashed: int = 0
    sources_checked: int = 0
    source_root: Path | str | None = None
    sample_rate: float | None = None
    seed: int | None = None
    seconds: float = 0.0
    """Wall time of the whole audit."""
    verify_seconds: float = 0.0
    """Wall time of the shard phase, over which `bytes_per_second` is measured."""

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def clean(self) -> bool:
        return not self.errors

    @property
    def exit_code(self) -> int:
        """0 clean, 1 a problem found (usage errors raise instead: exit 2)."""
        return 0 if self.clean else 1

    @property
    def bad_samples(self) -> list[Finding]:
        return [f for f in self.findings if f.kind in SAMPLE_KINDS]

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_hashed / self.verify_seconds if self.verify_seconds > 0 else 0.0

    def ordered(self) -> list[Finding]:
        """Findings as a reader wants them: errors first, then by kind, shard, row, source."""
        rank = {kind: i for i, kind in enumerate(FINDINGS)}
        return sorted(
            self.findings,
            key=lambda f: (rank[f.kind], f.shard or "", f.row or 0, f.source or "", f.message),
        )

    def counts(self) -> dict[str, int]:
        return dict(sorted(Counter(f.kind for f in self.findings).items()))

    def summary(self) -> dict[str, Any]:
        """Everything but the findings, as JSON-ready values."""
        return {
            "dataset": str(self.root),
            "version": self.version,
            "latest": self.latest,
            "format_version": self.format_version,
            "mode": self.mode,
            "checksum": self.checksum,
            "clean": self.clean,
            "exit_code": self.exit_code,
            "counts": self.counts(),
            "samples": {
                "total": self.samples_total,
                "verified": self.samples_verified,
                "bad": len({f.sample_id for f in self.bad_samples}),
            },
            "shards": {"total": self.shards_total, "hashed": self.shards_hashed},
            "sources": {
                "root": str(self.source_root) if self.source_root else None,
                "checked": self.sources_checked,
            },
            "sample_rate": self.sample_rate,
            "seed": self.seed,
            "bytes_hashed": self.bytes_hashed,
            "seconds": round(self.seconds, 3),
            "verify_seconds": round(self.verify_seconds, 3),
            "bytes_per_second": round(self.bytes_per_second),
            "notes": self.notes,
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "findings": [f.to_dict() for f in self.findings]}

    def findings_table(self) -> pa.Table:
        rows = [{"version": self.version, **f.to_dict()} for f in self.findings]
        return pa.Table.from_pylist(rows, schema=FINDINGS_SCHEMA)
