"""Audit a packed dataset: prove that every stored byte is what the manifest says.

`audit` here runs the checks in order.

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

Modules:
- `dataset`: everything but the shard contents: manifest values, records, orphans
- `report`:  findings, the options of an audit and its report, as data
- `shards`:  hashing shard files in workers, and their findings
- `sources`: re-hashing the sources, or listing a source of records again
"""

from __future__ import annotations

import math
import secrets
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from etl.engine.parallel import engine
from etl.errors import ConfigError, ManifestError
from etl.format.manifest import (
    MANIFEST_FILE,
    Manifest,
    list_versions,
    read_manifest,
    refuse_other_format,
    resolve,
    version_dir,
)
from etl.maintenance.audit.dataset import (
    check_dataset,
    check_manifest,
    check_record,
    open_manifest,
    shard_records,
)
from etl.maintenance.audit.report import (
    ERROR,
    FINDINGS,
    FINDINGS_SCHEMA,
    NOTE,
    SAMPLE_KINDS,
    SHARD_KINDS,
    AuditOptions,
    AuditReport,
    Finding,
)
from etl.maintenance.audit.shards import verify_shards
from etl.maintenance.audit.sources import verify_records, verify_sources
from etl.progress import Progress
from etl.sources.registry import kind_named
from etl.storage.cache_files import safe_folder, shared_by_default
from etl.storage.location import open_location
from etl.storage.store import StoreDataset, default_cache_dir

__all__ = [
    "ERROR",
    "FINDINGS",
    "FINDINGS_SCHEMA",
    "NOTE",
    "SAMPLE_KINDS",
    "SHARD_KINDS",
    "AuditOptions",
    "AuditReport",
    "Finding",
    "audit",
    "check_manifest",
    "shard_records",
]


def audit(
    path: Path | str,
    options: AuditOptions | None = None,
    progress: Progress | None = None,
) -> AuditReport:
    """Check one version of the dataset at `path` (a dataset folder, version folder or
    manifest.arrow). Raises ManifestError only when `path` is not a dataset this tool can read
    (no such folder, no version, no version `options.version`, another format version); damage
    to the dataset itself, the manifest included, is reported as findings.

    `progress` hears phases "verify" (total in bytes) and "sources" (in files); and for a
    dataset in object storage (`path` a URL: `_audit_store`) "download" (in shards) first.
    """
    options = options or AuditOptions()
    progress = progress or Progress()
    location = open_location(path, options.store)
    if location.store is not None:
        return _audit_store(location.store.url, options, progress)
    started = time.perf_counter()
    root, number = resolve(Path(path), options.version)
    refuse_other_format(version_dir(root, number) / MANIFEST_FILE)
    report = _new_report(root, number, options)
    check_record(root, number, report)
    try:
        manifest = open_manifest(root, number)
    except ManifestError as exc:
        report.findings.append(Finding("manifest", str(exc)))
        check_dataset(root, number, None, report)
        report.notes.append(
            f"shards and samples not checked: version {number}'s manifest cannot be read; "
            "audit an older version with --version"
        )
        report.seconds = time.perf_counter() - started
        return report

    _check_version(manifest, root, number, options, progress, report)
    report.seconds = time.perf_counter() - started
    return report


def _new_report(root: Path, number: int, options: AuditOptions) -> AuditReport:
    """The report of auditing version `number` as `options` say, before any check: a sample
    drawn with no seed given gets one, which the report names so the draw can be repeated."""
    seed = options.seed
    if options.mode == "sample" and seed is None:
        seed = secrets.randbits(32)
    return AuditReport(
        root=root,
        version=number,
        latest=list_versions(root)[-1],
        mode=options.mode,
        checksum=None,
        source_root=options.source_root or (options.records.path if options.records else None),
        sample_rate=options.sample_rate,
        seed=seed,
    )


def _check_version(
    manifest: Manifest,
    root: Path,
    number: int,
    options: AuditOptions,
    progress: Progress,
    report: AuditReport,
) -> None:
    """The checks of a version whose manifest reads: its shards and samples (all, or the
    sample drawn), the dataset's files meanwhile, and the sources' bytes where given."""
    kind = manifest.meta.config.get("source_kind", "folder")
    known = kind_named(kind)
    if options.source_root is not None and not (known is not None and known.by_path):
        raise ConfigError(
            f"{root}: packed from a {kind} source, whose samples are records, not files under "
            "a folder: pass --config pipeline.yaml to list them again"
        )
    report.checksum = manifest.meta.checksum
    report.format_version = manifest.meta.format_version
    report.samples_total = manifest.samples.num_rows
    report.shards_total = manifest.shards.num_rows
    selected = _select_samples(manifest.samples.num_rows, options.sample_rate, report.seed)
    local_root = options.source_root if isinstance(options.source_root, Path) else None
    readable = [manifest.path, *([local_root] if local_root else [])]
    with engine(options.run_config(0), readable=readable):
        verify_shards(
            manifest,
            selected,
            options,
            progress,
            report,
            meanwhile=lambda: check_dataset(root, number, manifest, report),
        )
        if options.source_root is not None:
            verify_sources(manifest, selected, options, progress, report)
        elif options.records is not None:
            verify_records(manifest, selected, options.records, progress, report)
    if options.mode == "sample":
        drawn = manifest.samples.column("sample_id").take(pa.array(selected))
        report.notes.append(_sampling_note(report, report.seed, drawn))


def _audit_store(url: str, options: AuditOptions, progress: Progress) -> AuditReport:
    """Audit a dataset in object storage: the version's files and every shard it references
    are downloaded as the store holds them, unverified, into a scratch mirror beside the cache
    (never the cache itself), audited there as a local dataset in the mode asked, and removed.
    What is checked is what the store serves now, byte for byte; the report names the URL.
    Orphan shards in the store are not looked for (only the version's shards are fetched)."""
    cache = default_cache_dir()
    safe_folder(cache, cache, options.store.shared_cache or shared_by_default())
    scratch = Path(tempfile.mkdtemp(prefix=".audit-", dir=cache))
    try:
        store = StoreDataset(url, scratch, options.store.reach, options.store.timeout)
        number = store.fetch_version(options.version)
        try:
            shards = read_manifest(store.root, number).shards
            names = tuple(shards.column("shard").to_pylist())
            sizes = tuple(shards.column("bytes").to_pylist())
        except ManifestError:
            names, sizes = (), ()  # the audit of the copy reports the manifest
        progress.start("download", len(names))
        try:
            store.download_as_stored(names, sizes, progress.advance)
        finally:
            progress.stop()
        report = audit(store.root, replace(options, version=number), progress)
        report.root, report.latest = url, store.latest_version()
        report.notes.append(
            f"audited a copy of {url} version {number} fetched from the store just now; "
            "orphan shards in the store were not looked for"
        )
        return report
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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
