"""Audit a packed dataset: prove that every stored byte is what the manifest says.

`audit()` only reads: it checks one committed version (the latest unless asked) and returns an
`AuditReport` listing every problem as a `Finding`; nothing is printed, nothing is written, no
lock is taken. `etl.maintenance.repair` turns a report into a repaired version.

NOTE [modes]: what each mode reads and checks. Every mode checks the manifest's integrity (the
three Arrow files validate, read_manifest's coherence, values the format defines exactly), each
shard's existence, size and .npy header, orphan shards, and that every version records a shared
shard identically.

- full (default): each shard's whole-file `checksum` (`etl.checksum`, xxh3_64 by default) and
  each sample's row against its manifest `checksum`, in one pass over each file: a cache-sized
  chunk is read from memory once and fed to every digest.
- deep: full, plus each shard's whole-file `blake3`. xxh3 catches accidents (bit rot, truncated
  copies, a wrong file) but is not cryptographic: bytes crafted to keep their xxh3 digests pass
  a full audit and fail a deep one. BLAKE3 about doubles the CPU time of an audit.
- fast: each shard's whole-file `checksum` only; no per-sample digests, except that a shard
  whose checksum fails is then checked row by row to name its bad samples.
- sample: a random `sample_rate` of the samples, row by row; no whole-file digest. The choice is
  a pure function of (seed, manifest).
- With a source root (any mode), the checked samples' sources are re-hashed against
  `source_hash`.
"""

from __future__ import annotations

import json
import math
import secrets
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
from numpy.typing import NDArray

from etl.config import Backend, FolderSource, ListingSource, PipelineConfig, RunConfig, SourceConfig
from etl.errors import ConfigError, ManifestError, ShardError
from etl.format import names
from etl.format.checksums import HEX_LENGTH, TAMPER_DIGEST, new_hasher, row_digest
from etl.format.manifest import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    RECORDS_SINCE,
    REJECTS_FILE,
    SHARDS_DIR,
    SHARDS_FILE,
    SHARDS_SCHEMA,
    VERSIONS_DIR,
    Manifest,
    is_hex,
    list_versions,
    read_manifest,
    record_problems,
    resolve,
    version_dir,
    version_name,
    version_number,
)
from etl.format.record import RECORD_FILE
from etl.format.shards import HEADER_BYTES, open_shard, shard_version
from etl.progress import Progress
from etl.run.execute import WorkerError, choose_run, engine, parallel_map
from etl.sources import readers
from etl.sources.listing import ListContext, list_sources

# --- findings -----------------------------------------------------------------------------------

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
    source_root: Path | None = None
    """Folder the manifest's `source` paths are relative to; None skips the source check."""
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


@dataclass
class AuditReport:
    root: Path
    version: int
    latest: int
    mode: str
    checksum: str | None
    """`etl.checksum` of the version (None if its manifest could not be read)."""
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
    source_root: Path | None = None
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
            "format_version": FORMAT_VERSION,
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


# --- shard verification (runs in joblib workers) ------------------------------------------------

CHUNK_BYTES = 256 << 10
"""Bytes hashed per step of a full audit. NOTE: small enough to stay in L2 cache, so each chunk
comes from memory once and is then hashed by the whole-file digests and row by row while hot
(measured: 2.0 GiB/s per core at 256 KiB, 1.5 GiB/s at 4 MiB)."""


@dataclass(frozen=True)
class ShardTask:
    """One shard to verify: its shards.arrow record and the rows the manifest points to."""

    shard: str
    path: str
    rows: int
    bytes: int
    checksum: str
    blake3: str
    check_rows: tuple[int, ...]
    """Rows to verify, ascending (a row appears twice if two samples share it)."""
    expected: tuple[str, ...]
    """Their manifest checksums, aligned with check_rows."""


@dataclass(frozen=True)
class ShardOutcome:
    shard: str
    problems: tuple[tuple[str, str, str | None, str | None], ...]
    """(kind, message, expected, actual) about the file as a whole."""
    readable: bool
    """False: missing, wrong size or header; every sample in it is bad."""
    bad: tuple[tuple[int, str], ...]
    """(index into check_rows, actual digest) of rows that differ."""
    rows_verified: int
    bytes_hashed: int
    whole_file_ok: bool | None
    """Whole-file digests all matched (None: not computed)."""


def audit_shard(
    task: ShardTask, mode: str, sample_shape: tuple[int, ...], algorithm: str
) -> ShardOutcome:
    """Worker: check one shard file. Opened once, read through a memmap, never copied."""
    try:
        return _audit_shard(task, mode, sample_shape, algorithm)
    except Exception as exc:
        raise WorkerError(f"while auditing {task.shard}: {type(exc).__name__}: {exc}") from exc


def _audit_shard(
    task: ShardTask, mode: str, sample_shape: tuple[int, ...], algorithm: str
) -> ShardOutcome:
    path = Path(task.path)

    def unreadable(kind: str, message: str) -> ShardOutcome:
        return ShardOutcome(task.shard, ((kind, message, None, None),), False, (), 0, 0, None)

    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return unreadable("shard_missing", "the shard file is missing")
    except OSError as exc:
        return unreadable("shard_missing", f"cannot read: {exc.strerror or exc}")
    if size != task.bytes:
        state = "truncated" if size < task.bytes else "padded"
        return unreadable("shard_size", f"{state}: {size} bytes on disk, {task.bytes} recorded")
    if task.rows == 0:
        return unreadable("shard_header", "shards.arrow records 0 rows")
    try:
        array = open_shard(path, sample_shape, task.rows)
        with open(path, "rb") as f:
            header = f.read(int(array.offset))
    except ShardError as exc:
        return unreadable("shard_header", str(exc).replace(str(path), task.shard))
    except OSError as exc:
        return unreadable("shard_missing", f"cannot read: {exc.strerror or exc}")

    sample_bytes = math.prod(sample_shape)
    one_row = row_digest(algorithm)
    data = array.data.cast("B")  # C-contiguous uint8: a flat view, no copy
    problems: list[tuple[str, str, str | None, str | None]] = []
    bad: list[tuple[int, str]] = []
    rows_verified = 0
    whole_file_ok: bool | None = None
    hashed = 0
    if mode != "sample":
        checks = [("shard_checksum", algorithm, task.checksum)]
        if mode == "deep":
            checks.append(("shard_blake3", TAMPER_DIGEST, task.blake3))
        rows = task.check_rows if mode != "fast" else ()
        digests, bad, rows_verified = _hash_file(
            data, header, sample_bytes, [a for _, a, _ in checks], rows, task.expected, one_row
        )
        hashed = len(header) + len(data)
        for kind, name, want in checks:
            if digests[name] != want:
                message = f"whole-file {name} differs from shards.arrow"
                problems.append((kind, message, want, digests[name]))
        whole_file_ok = not problems
    if mode == "sample" or (mode == "fast" and not whole_file_ok):
        for index, row in enumerate(task.check_rows):
            got = one_row(data[row * sample_bytes : (row + 1) * sample_bytes])
            if got != task.expected[index]:
                bad.append((index, got))
        rows_verified = len(task.check_rows)
        if mode == "sample":  # fast mode counted the whole file already
            hashed += len(task.check_rows) * sample_bytes
    return ShardOutcome(
        task.shard, tuple(problems), True, tuple(bad), rows_verified, hashed, whole_file_ok
    )


def _hash_file(
    data: memoryview,
    header: bytes,
    sample_bytes: int,
    algorithms: Sequence[str],
    rows: Sequence[int],
    expected: Sequence[str],
    one_row: Callable[[Any], str],
) -> tuple[dict[str, str], list[tuple[int, str]], int]:
    """Whole-file digests of header + data by algorithm, the (index, digest) of `rows` that differ
    from `expected`, and how many rows were hashed: all in one pass over the data."""
    hashers = {name: new_hasher(name) for name in algorithms}
    for h in hashers.values():
        h.update(header)
    chunk_rows = max(1, CHUNK_BYTES // sample_bytes)
    total_rows = len(data) // sample_bytes
    bad: list[tuple[int, str]] = []
    j = 0
    for start in range(0, total_rows, chunk_rows):
        stop = min(total_rows, start + chunk_rows)
        chunk = data[start * sample_bytes : stop * sample_bytes]
        for h in hashers.values():
            h.update(chunk)
        while j < len(rows) and rows[j] < stop:
            offset = (rows[j] - start) * sample_bytes
            got = one_row(chunk[offset : offset + sample_bytes])
            if got != expected[j]:
                bad.append((j, got))
            j += 1
    return {name: h.hexdigest() for name, h in hashers.items()}, bad, j


# --- source verification (runs in joblib workers) -----------------------------------------------

SOURCE_CHUNK = 64
"""Source files per hashing task."""


def hash_sources(
    items: Sequence[tuple[int, str, str]], root: str, algorithm: str
) -> tuple[list[tuple[int, str, str | None, str]], int]:
    """Worker: (index, source, recorded hash) -> problems as (index, kind, actual digest,
    message), and the number of files looked at."""
    problems: list[tuple[int, str, str | None, str]] = []
    for index, source, recorded in items:
        path = names.source_path(root, source)  # the caller passes only sources inside the root
        try:
            got = readers.file_digest(path, algorithm, sys.maxsize)
        except FileNotFoundError:
            problems.append((index, "source_missing", None, f"{path!r} no longer exists"))
            continue
        except OSError as exc:
            problems.append((index, "source_missing", None, f"{path!r}: {exc.strerror or exc}"))
            continue
        if got != recorded:
            problems.append((index, "source_changed", got, "content changed since it was packed"))
    return problems, len(items)


# --- the audit ----------------------------------------------------------------------------------


def audit(
    path: Path | str,
    options: AuditOptions | None = None,
    progress: Progress | None = None,
) -> AuditReport:
    """Check one version of the dataset at `path` (a dataset folder, version folder or
    manifest.arrow). Raises ManifestError only when `path` is not a dataset this tool can read
    (no such folder, no version, no version `options.version`, another format version); damage
    to the dataset itself, the manifest included, is reported as findings.

    `progress` hears phases "verify" (total in bytes) and "sources" (in files).
    """
    options = options or AuditOptions()
    progress = progress or Progress()
    started = time.perf_counter()
    root, number = resolve(Path(path), options.version)
    _refuse_other_format(version_dir(root, number) / MANIFEST_FILE)
    seed = options.seed
    if options.mode == "sample" and seed is None:
        seed = secrets.randbits(32)
    report = AuditReport(
        root=root,
        version=number,
        latest=list_versions(root)[-1],
        mode=options.mode,
        checksum=None,
        source_root=options.source_root or (options.records.path if options.records else None),
        sample_rate=options.sample_rate,
        seed=seed,
    )
    _check_record(root, number, report)
    try:
        manifest = _open_manifest(root, number)
    except ManifestError as exc:
        report.findings.append(Finding("manifest", str(exc)))
        _check_dataset(root, number, None, report)
        report.notes.append(
            f"shards and samples not checked: version {number}'s manifest cannot be read; "
            "audit an older version with --version"
        )
        report.seconds = time.perf_counter() - started
        return report

    kind = manifest.meta.config.get("source_kind", "folder")
    if options.source_root is not None and kind not in readers.FILE_KINDS:
        raise ConfigError(
            f"{root}: packed from a {kind} source, whose samples are records, not files under "
            "a folder: pass --config pipeline.yaml to list them again"
        )
    report.checksum = manifest.meta.checksum
    report.samples_total = manifest.samples.num_rows
    report.shards_total = manifest.shards.num_rows
    selected = _select_samples(manifest.samples.num_rows, options.sample_rate, seed)
    readable = [manifest.path, *([options.source_root] if options.source_root else [])]
    with engine(_run_config(options, 0), readable=readable):
        _verify_shards(
            manifest,
            selected,
            options,
            progress,
            report,
            meanwhile=lambda: _check_dataset(root, number, manifest, report),
        )
        if options.source_root is not None:
            _verify_sources(manifest, selected, options, progress, report)
        elif options.records is not None:
            _verify_records(manifest, selected, options.records, progress, report)
    if options.mode == "sample":
        drawn = manifest.samples.column("sample_id").take(pa.array(selected))
        report.notes.append(_sampling_note(report, seed, drawn))
    report.seconds = time.perf_counter() - started
    return report


def source_root_of(config: PipelineConfig) -> Path:
    """The folder a manifest's `source` paths are relative to: source.path for a folder source,
    the listing's folder for a listing. Other kinds have no files to re-hash: ConfigError."""
    if isinstance(config.source, FolderSource):
        return config.source.path
    if isinstance(config.source, ListingSource):
        return config.source.path.parent
    raise ConfigError(
        f"source.kind {config.source.kind!r}: its samples are records, not files under a "
        "folder; only folder and listing sources are read back by path"
    )


PARALLEL_MIN_BYTES = 2 << 30
"""With `jobs=None`, smaller audits run in-process. NOTE: starting loky workers (a fresh Python
each, importing numpy, pyarrow and etl) took 0.5 to 1.5 s on the 2-core test machine, while one
core hashes 1.5 to 2 GiB/s in a full audit: a second worker only wins above a couple of GiB.
Workers are reused within a process, so a library caller auditing repeatedly can pass `jobs`."""


def _check_dataset(root: Path, number: int, manifest: Manifest | None, report: AuditReport) -> None:
    """Everything but the shard contents: the manifest's values, the other versions' shard
    records, orphans and leftovers."""
    records, unreadable_versions = _shard_records(root, number, manifest)
    report.findings += [
        Finding("manifest", f"{VERSIONS_DIR}/{version_name(v)}/{SHARDS_FILE}: {message}")
        for v, message in unreadable_versions.items()
    ]
    report.findings += _scan_folders(root, records, unreadable_versions, report.notes)
    if manifest is not None:
        integrity = check_manifest(manifest)
        report.manifest_ok = report.record_ok and not integrity
        report.findings += integrity + _record_conflicts(manifest, records)


def _check_record(root: Path, number: int, report: AuditReport) -> None:
    """Each file of the version whose bytes changed since its commit (see etl.format.record)."""
    folder = version_dir(root, number)
    problems = record_problems(folder, number)
    report.record_ok = not problems
    report.findings += [Finding("manifest", p) for p in problems]
    if not (folder / RECORD_FILE).exists() and not problems:
        report.notes.append(
            f"version {number} was committed before commit records (etl-memmap < "
            f"{'.'.join(map(str, RECORDS_SINCE))}): its Arrow files are checked for validity "
            "and coherence, not byte for byte"
        )


def _run_config(options: AuditOptions, planned_bytes: int) -> RunConfig:
    return choose_run(
        options.jobs, options.backend, options.address, planned_bytes >= PARALLEL_MIN_BYTES
    )


def _refuse_other_format(manifest_path: Path) -> None:
    """Another format version is not damage: this tool cannot judge it (exit 2). Metadata that
    cannot be read at all is left to `_open_manifest`, which reports it as a finding."""
    try:
        with ipc.open_file(manifest_path) as reader:
            metadata = reader.schema.metadata or {}
        found = json.loads(metadata[b"etl.format_version"])
    except (OSError, pa.ArrowException, KeyError, ValueError):
        return
    if isinstance(found, int) and found != FORMAT_VERSION:
        raise ManifestError(
            f"{manifest_path}: manifest format version {found}, this tool reads "
            f"{FORMAT_VERSION}; audit it with a matching etl-memmap"
        )


def _load_table(path: Path) -> pa.Table:
    """Read an Arrow IPC file and validate every buffer (offsets, UTF-8) before any value is
    looked at: a damaged file must become a finding, not a crash."""
    try:
        with ipc.open_file(path) as reader:
            table = reader.read_all()
        table.validate(full=True)
    except FileNotFoundError:
        raise ManifestError(f"{path}: missing") from None
    except (pa.ArrowException, OSError) as exc:
        raise ManifestError(f"{path}: not a valid Arrow IPC file ({exc})") from None
    return table


def _open_manifest(root: Path, number: int) -> Manifest:
    folder = version_dir(root, number)
    for name in (MANIFEST_FILE, SHARDS_FILE, REJECTS_FILE):
        _load_table(folder / name)
    manifest = read_manifest(root, number, verify=False)  # the record is _check_record's
    with ipc.open_file(folder / SHARDS_FILE) as reader:
        small = reader.schema.metadata or {}
    if small.get(b"etl.version", str(number).encode()) != str(number).encode():
        raise ManifestError(
            f"{folder / SHARDS_FILE}: says version {small[b'etl.version'].decode()}, "
            f"lives in {version_name(number)}"
        )
    return manifest


def check_manifest(manifest: Manifest) -> list[Finding]:
    """Integrity checks beyond `read_manifest`'s coherence: values the format defines exactly."""
    samples, shards, meta = manifest.samples, manifest.shards, manifest.meta
    where = f"{VERSIONS_DIR}/{version_name(meta.version)}"
    found: list[Finding] = []

    def check(ok: NDArray[np.bool_], file: str, what: str, label: Sequence[Any]) -> None:
        bad = np.flatnonzero(~ok)
        if len(bad):
            examples = ", ".join(str(label[i]) for i in bad[:MAX_EXAMPLES])
            more = f" (and {len(bad) - MAX_EXAMPLES} more)" if len(bad) > MAX_EXAMPLES else ""
            found.append(Finding("manifest", f"{where}/{file}: {what}: {examples}{more}"))

    width = HEX_LENGTH.get(meta.checksum)
    if width is None:
        found.append(Finding("manifest", f"{where}/{MANIFEST_FILE}: unknown {meta.checksum!r}"))
        return found
    sources = samples.column("source").to_pylist()
    ids = samples.column("sample_id").to_pylist()
    check(
        np.array(
            [names.sample_id(s) == i for s, i in zip(sources, ids, strict=True)],
            bool,
        ),
        MANIFEST_FILE,
        "sample_id is not xxh3_64 of source",
        sources,
    )
    for column in ("checksum", "source_hash"):
        check(
            is_hex(samples.column(column), str(width)),
            MANIFEST_FILE,
            f"{column} is not {width} lowercase hex digits",
            sources,
        )
    if meta.config.get("source_kind", "folder") in readers.FILE_KINDS:  # keys are no paths
        check(
            ~_unsafe_path(samples.column("source")),
            MANIFEST_FILE,
            "source path leaves the source root",
            sources,
        )
    classes = np.array([*meta.classes, ""], dtype=object)
    labels = samples.column("label").to_numpy()
    named = np.array(samples.column("class_name").to_pylist(), dtype=object)
    check(classes[labels] == named, MANIFEST_FILE, "class_name is not classes[label]", sources)
    if sources != sorted(sources):
        found.append(Finding("manifest", f"{where}/{MANIFEST_FILE}: rows not sorted by source"))
    both = pc.is_in(manifest.rejects.column("source"), value_set=samples.column("source"))
    rejected = manifest.rejects.column("source").to_pylist()
    check(~both.to_numpy(zero_copy_only=False), REJECTS_FILE, "also in manifest", rejected)

    shard_names = shards.column("shard").to_pylist()
    sample_bytes = math.prod(meta.sample_shape)
    recorded = shards.column("bytes").to_numpy()
    computed = HEADER_BYTES + shards.column("rows").to_numpy() * sample_bytes
    check(recorded == computed, SHARDS_FILE, "bytes != 128 + rows * sample bytes", shard_names)
    check(is_hex(shards.column("checksum"), str(width)), SHARDS_FILE, "bad checksum", shard_names)
    check(is_hex(shards.column("blake3"), "64"), SHARDS_FILE, "bad blake3", shard_names)
    if len(set(shard_names)) != len(shard_names):
        found.append(Finding("manifest", f"{where}/{SHARDS_FILE}: a shard is listed twice"))
    return found


def _unsafe_path(column: pa.ChunkedArray) -> NDArray[np.bool_]:
    """Sources that do not name a path inside the source root (see names.is_inside): checked
    with one regex on plain names, one by one on the rare 'hex:' names."""
    bad = pc.match_substring_regex(column, r"^/|(^|/)\.\.(/|$)|^$")
    unsafe = np.asarray(bad.to_numpy(zero_copy_only=False), dtype=bool)
    hexed = pc.starts_with(column, names.HEX_PREFIX).to_numpy(zero_copy_only=False)
    for i in np.flatnonzero(hexed):
        unsafe[i] = not names.is_inside(column[int(i)].as_py())
    return unsafe


ShardRecord = tuple[int, int, str, str]
"""(rows, bytes, checksum, blake3) as shards.arrow records a shard."""


def shard_records(table: pa.Table) -> dict[str, ShardRecord]:
    """shards.arrow as {shard: (rows, bytes, checksum, blake3)}."""
    columns = (
        table.column(n).to_pylist() for n in ("shard", "rows", "bytes", "checksum", "blake3")
    )
    return {
        name: (rows, size, checksum, blake3)
        for name, rows, size, checksum, blake3 in zip(*columns, strict=True)
    }


def _shard_records(
    root: Path, number: int, manifest: Manifest | None
) -> tuple[dict[int, dict[str, ShardRecord]], dict[int, str]]:
    """shards.arrow of every committed version (for orphans and conflicting records), and the
    versions whose shards.arrow cannot be read (other than the audited one, reported already)."""
    records: dict[int, dict[str, ShardRecord]] = {}
    failed: dict[int, str] = {}
    for v in list_versions(root):
        if v == number:
            if manifest is not None:
                records[v] = shard_records(manifest.shards)
            continue
        path = version_dir(root, v) / SHARDS_FILE
        try:
            table = _load_table(path)
            missing = [n for n in SHARDS_SCHEMA.names if n not in table.schema.names]
            if missing:
                raise ManifestError(f"{path}: missing columns {missing}")
            records[v] = shard_records(table)
        except ManifestError as exc:
            failed[v] = str(exc).removeprefix(f"{path}: ")
    return records, failed


def _scan_folders(
    root: Path,
    records: Mapping[int, Mapping[str, ShardRecord]],
    unreadable: Mapping[int, str],
    notes: list[str],
) -> list[Finding]:
    """Orphan shards, leftovers of interrupted runs and files the format does not define."""
    found: list[Finding] = []
    latest = max(list_versions(root), default=0)
    referenced = {name for shards in records.values() for name in shards}
    complete = len(records) == len(list_versions(root)) and not unreadable
    shards_dir = root / SHARDS_DIR
    for entry in sorted(shards_dir.iterdir()) if shards_dir.is_dir() else []:
        name = f"{SHARDS_DIR}/{entry.name}"
        if entry.name.startswith(".tmp-"):
            found.append(Finding("leftover", f"{name}: temp file of an interrupted run"))
        elif entry.is_file() and (shard_version(entry.name) or 0) > latest:
            found.append(
                Finding(
                    "leftover",
                    f"{name}: a shard of version {shard_version(entry.name)}, never committed "
                    "(an interrupted run); 'etl run' or 'etl compact' removes it",
                )
            )
        elif entry.is_file() and entry.name.endswith(".npy"):
            if name not in referenced and complete:
                found.append(
                    Finding(
                        "orphan_shard",
                        "listed by no committed version: left by a killed run or compaction? "
                        "'etl run' removes shards of uncommitted versions, 'etl compact' shards "
                        "no version lists",
                        shard=name,
                    )
                )
        else:
            found.append(Finding("stray_file", f"{name}: not a shard"))
    if not complete:
        notes.append("orphan shards not checked: a version's shards.arrow cannot be read")
    versions_dir = root / VERSIONS_DIR
    for entry in sorted(versions_dir.iterdir()) if versions_dir.is_dir() else []:
        name = f"{VERSIONS_DIR}/{entry.name}"
        if entry.name.startswith(".tmp-"):
            found.append(Finding("leftover", f"{name}: an interrupted commit"))
        elif entry.is_dir() and version_number(entry.name) is not None:
            if not (entry / MANIFEST_FILE).is_file():
                found.append(Finding("manifest", f"{name}: version folder without manifest"))
        else:
            found.append(Finding("stray_file", f"{name}: not a version folder"))
    return found


def _record_conflicts(
    manifest: Manifest, records: Mapping[int, Mapping[str, ShardRecord]]
) -> list[Finding]:
    """Shards are immutable, so every version that lists one must record it identically."""
    found: list[Finding] = []
    mine = records.get(manifest.version, {})
    for v, theirs in sorted(records.items()):
        if v == manifest.version:
            continue
        for name, record in mine.items():
            other = theirs.get(name)
            if other is not None and other != record:
                fields = [
                    f
                    for f, a, b in zip(
                        ("rows", "bytes", "checksum", "blake3"), record, other, strict=True
                    )
                    if a != b
                ]
                found.append(
                    Finding(
                        "record_conflict",
                        f"version {v} records other {', '.join(fields)}: one shards.arrow was "
                        "altered (the whole-file check says which matches the file)",
                        shard=name,
                    )
                )
    return found


def _select_samples(n: int, rate: float | None, seed: int | None) -> NDArray[np.int64]:
    """Indices of the samples to check, ascending: all, or ceil(rate * n) drawn by `seed`."""
    if rate is None:
        return np.arange(n, dtype=np.int64)
    k = min(n, math.ceil(rate * n))
    chosen = np.random.default_rng(seed).choice(n, size=k, replace=False)
    return np.sort(chosen).astype(np.int64)


def _sampling_note(report: AuditReport, seed: int | None, drawn: pa.Array) -> str:
    """The estimate over the `drawn` sample ids: hashed, or in a shard that cannot be read."""
    bad_ids = pa.array([f.sample_id for f in report.bad_samples], pa.string())
    k = len(drawn)
    bad = int(pc.sum(pc.is_in(drawn, value_set=bad_ids)).as_py() or 0)
    if k == 0:
        return f"no sample drawn (seed {seed})"
    if bad:
        estimate = f"about {bad / k:.2%} of samples are bad ({bad} of {k} checked)"
    else:
        # NOTE: exact binomial bound with no failure seen: P(0 bad in k) = (1 - p)^k = 0.05.
        estimate = f"none of {k} bad: below {1 - 0.05 ** (1 / k):.2%} bad at 95% confidence"
    return f"sampled {k} of {report.samples_total} samples, seed {seed}; {estimate}"


def _verify_shards(
    manifest: Manifest,
    selected: NDArray[np.int64],
    options: AuditOptions,
    progress: Progress,
    report: AuditReport,
    meanwhile: Callable[[], None],
) -> None:
    """Hash the shards in workers; `meanwhile` runs in this process as soon as they start."""
    samples, meta = manifest.samples, manifest.meta
    sample_bytes = math.prod(meta.sample_shape)
    codes = _shard_codes(samples.column("shard"), manifest.shards.column("shard").to_pylist())
    rows = samples.column("row").to_numpy()
    order = selected[np.lexsort((rows[selected], codes[selected]))]
    expected = samples.column("checksum").take(pa.array(order)).to_pylist()
    bounds = np.searchsorted(codes[order], np.arange(manifest.shards.num_rows + 1))
    members: dict[str, NDArray[np.int64]] = {}
    tasks: list[ShardTask] = []
    for code, record in enumerate(manifest.shards.to_pylist()):
        lo, hi = int(bounds[code]), int(bounds[code + 1])
        members[record["shard"]] = order[lo:hi]
        tasks.append(
            ShardTask(
                shard=record["shard"],
                path=str(manifest.shard_path(record["shard"])),
                rows=record["rows"],
                bytes=record["bytes"],
                checksum=record["checksum"],
                blake3=record["blake3"],
                check_rows=tuple(rows[order[lo:hi]].tolist()),
                expected=tuple(expected[lo:hi]),
            )
        )

    def planned(task: ShardTask) -> int:
        return len(task.check_rows) * sample_bytes if options.mode == "sample" else task.bytes

    tasks.sort(key=planned, reverse=True)  # biggest first: balances the workers
    by_name = {t.shard: t for t in tasks}
    total = sum(planned(t) for t in tasks)
    run = _run_config(options, total)
    in_process = run.n_jobs == 1 or run.backend == "sequential"
    if in_process:
        meanwhile()  # nothing to overlap with: keep it out of the timed phase
    started = time.perf_counter()
    progress.start("verify", total)
    try:
        results = []
        with parallel_map(
            audit_shard, tasks, run, options.mode, meta.sample_shape, meta.checksum
        ) as outcomes:
            if not in_process:
                # NOTE: joblib dispatches on the call above: workers hash while this process
                # checks the manifest.
                meanwhile()
            for outcome in outcomes:
                results.append(outcome)
                progress.advance(planned(by_name[outcome.shard]))
    finally:
        progress.stop()
    report.verify_seconds = time.perf_counter() - started

    column = {n: samples.column(n) for n in ("sample_id", "source", "row", "checksum")}
    code_of = {name: code for code, name in enumerate(manifest.shards.column("shard").to_pylist())}
    for outcome in sorted(results, key=lambda o: o.shard):
        report.bytes_hashed += outcome.bytes_hashed
        report.samples_verified += outcome.rows_verified
        report.shards_hashed += outcome.whole_file_ok is not None
        problems = outcome.problems
        report.findings += [
            Finding(kind, message, shard=outcome.shard, expected=want, actual=got)
            for kind, message, want, got in problems
        ]
        flagged: list[tuple[int, str | None]]
        if outcome.readable:
            flagged = [(int(members[outcome.shard][j]), got) for j, got in outcome.bad]
            if outcome.whole_file_ok:
                why = "stored bytes match the shard's whole-file digests: the manifest's "
                why += "checksum for this sample is what changed"
            else:
                why = "stored bytes differ from the manifest's checksum"
            kind = "sample_checksum"
        else:
            everyone = np.flatnonzero(codes == code_of[outcome.shard])
            flagged = [(int(i), None) for i in everyone]
            why = f"its shard is unreadable ({problems[0][0]}: {problems[0][1]})"
            kind = "sample_unreadable"
        for index, got in flagged:
            report.findings.append(
                Finding(
                    kind,
                    why,
                    shard=outcome.shard,
                    row=column["row"][index].as_py(),
                    sample_id=column["sample_id"][index].as_py(),
                    source=column["source"][index].as_py(),
                    expected=column["checksum"][index].as_py(),
                    actual=got,
                )
            )


def _verify_records(
    manifest: Manifest,
    selected: NDArray[np.int64],
    source: SourceConfig,
    progress: Progress,
    report: AuditReport,
) -> None:
    """List `source` again (every record read and hashed once, as a run does) and compare
    each checked sample's content hash with the one recorded."""
    progress.start("sources", len(selected))
    try:
        listing = list_sources(source, ListContext(checksum=manifest.meta.checksum))
        progress.advance(len(selected))
    finally:
        progress.stop()
    hashes = {f.source: f.content_hash for f in listing.files}
    rejected = {r.source: r for r in listing.rejects}
    samples = manifest.samples
    sources = samples.column("source").to_pylist()
    recorded = samples.column("source_hash").to_pylist()
    report.sources_checked = len(selected)
    for index in sorted(int(i) for i in selected):
        name, got = sources[index], hashes.get(sources[index])
        if got == recorded[index]:
            continue
        if got is not None:
            kind, message = "source_changed", "content changed since it was packed"
        elif name in rejected:
            now = rejected[name]
            kind, message = "source_missing", f"now rejected ({now.reason}: {now.message})"
        else:
            kind, message = "source_missing", "no longer in the source"
        report.findings.append(_source_finding(samples, index, kind, message, got))


def _source_finding(
    samples: pa.Table, index: int, kind: str, message: str, actual: str | None
) -> Finding:
    """A finding about the source of sample `index`, located by its shard and row."""
    return Finding(
        kind,
        message,
        shard=samples.column("shard")[index].as_py(),
        row=samples.column("row")[index].as_py(),
        sample_id=samples.column("sample_id")[index].as_py(),
        source=samples.column("source")[index].as_py(),
        expected=samples.column("source_hash")[index].as_py(),
        actual=actual,
    )


def _shard_codes(column: pa.ChunkedArray, names: Sequence[str]) -> NDArray[np.int64]:
    """Each sample's shard as its index in shards.arrow (read_manifest checked they all exist)."""
    codes = pc.index_in(column, value_set=pa.array(names, pa.string()))
    return np.asarray(codes.to_numpy(zero_copy_only=False), dtype=np.int64)


def _verify_sources(
    manifest: Manifest,
    selected: NDArray[np.int64],
    options: AuditOptions,
    progress: Progress,
    report: AuditReport,
) -> None:
    assert options.source_root is not None
    samples = manifest.samples
    sources = samples.column("source").to_pylist()
    hashes = samples.column("source_hash").to_pylist()
    unsafe = _unsafe_path(samples.column("source"))
    items = [(int(i), sources[i], hashes[i]) for i in selected if not unsafe[i]]
    sizes = samples.column("source_size").to_numpy()
    chunks = [items[i : i + SOURCE_CHUNK] for i in range(0, len(items), SOURCE_CHUNK)]
    progress.start("sources", len(items))
    problems: list[tuple[int, str, str | None, str]] = []
    try:
        with parallel_map(
            hash_sources,
            chunks,
            _run_config(options, int(sizes[[i for i, _, _ in items]].sum())),
            str(options.source_root),
            manifest.meta.checksum,
        ) as hashed:
            for found, done in hashed:
                problems += found
                progress.advance(done)
    finally:
        progress.stop()
    report.sources_checked = len(items)
    for index, kind, got, message in sorted(problems):
        report.findings.append(_source_finding(samples, index, kind, message, got))
