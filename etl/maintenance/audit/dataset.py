"""Checking everything but the shard contents: the manifest's values, the commit record, every
version's shard records, orphan shards, leftovers and files the format does not define."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
from numpy.typing import NDArray

from etl.errors import ManifestError
from etl.format import names
from etl.format.checksums import HEX_LENGTH
from etl.format.coherence import is_hex
from etl.format.manifest import (
    MANIFEST_FILE,
    RECORDS_SINCE,
    REJECTS_FILE,
    SHARDS_FILE,
    VERSIONS_DIR,
    Manifest,
    list_versions,
    load_table,
    read_manifest,
    record_problems,
    version_dir,
    version_name,
    version_number,
)
from etl.format.record import RECORD_FILE
from etl.format.retirement import RETIRED_DIR
from etl.format.schema import SHARDS_SCHEMA
from etl.format.shards import HEADER_BYTES, SHARDS_DIR, shard_version
from etl.format.table_ops import bool_mask
from etl.maintenance.audit.report import MAX_EXAMPLES, AuditReport, Finding
from etl.maintenance.audit.sources import unsafe_path
from etl.sources.registry import kind_named


def check_dataset(root: Path, number: int, manifest: Manifest | None, report: AuditReport) -> None:
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


def check_record(root: Path, number: int, report: AuditReport) -> None:
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


def open_manifest(root: Path, number: int) -> Manifest:
    folder = version_dir(root, number)
    for name in (MANIFEST_FILE, SHARDS_FILE, REJECTS_FILE):
        load_table(folder / name)
    manifest = read_manifest(root, number, verify=False)  # the record is check_record's
    with ipc.open_file(folder / SHARDS_FILE) as reader:
        small = reader.schema.metadata or {}
    said = small.get(b"etl.version", str(number).encode())
    if said != str(number).encode():
        raise ManifestError(
            f"{folder / SHARDS_FILE}: says version {said.decode(errors='replace')}, "
            f"lives in {version_name(number)}"
        )
    return manifest


class _Findings:
    """The findings of a manifest's checks, in the version folder `where`."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.found: list[Finding] = []

    def check(self, ok: NDArray[np.bool_], file: str, what: str, label: Sequence[Any]) -> None:
        """A finding naming the first rows where `ok` fails, by `label` (a column: only those
        rows become Python values)."""
        bad = np.flatnonzero(~ok)
        if len(bad):
            examples = ", ".join(_text(label[int(i)]) for i in bad[:MAX_EXAMPLES])
            more = f" (and {len(bad) - MAX_EXAMPLES} more)" if len(bad) > MAX_EXAMPLES else ""
            self.add(file, f"{what}: {examples}{more}")

    def add(self, file: str, what: str) -> None:
        self.found.append(Finding("manifest", f"{self.where}/{file}: {what}"))


def check_manifest(manifest: Manifest) -> list[Finding]:
    """Integrity checks beyond `read_manifest`'s coherence: values the format defines exactly,
    of the samples (and rejects) and of the shards."""
    meta = manifest.meta
    findings = _Findings(f"{VERSIONS_DIR}/{version_name(meta.version)}")
    width = HEX_LENGTH.get(meta.checksum)
    if width is None:
        findings.add(MANIFEST_FILE, f"unknown {meta.checksum!r}")
        return findings.found
    _check_samples(manifest, width, findings)
    _check_shards(manifest, width, findings)
    return findings.found


def _check_samples(manifest: Manifest, width: int, findings: _Findings) -> None:
    """Each sample's id, checksums, source path, class name and order; no source rejected."""
    samples, meta, check = manifest.samples, manifest.meta, findings.check
    sources = samples.column("source")
    check(
        _ids_match(sources, samples.column("sample_id")),
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
    kind = kind_named(meta.config.get("source_kind", "folder"))
    if kind is not None and kind.by_path:  # other kinds' sources are keys, not paths
        check(~unsafe_path(sources), MANIFEST_FILE, "source path leaves the source root", sources)
    labels = np.asarray(samples.column("label").to_numpy(), dtype=np.int64)
    inside = (labels >= 0) & (labels < len(meta.classes))
    named = pc.take(
        pa.array([*meta.classes, ""], pa.string()),
        pa.array(np.where(inside, labels, len(meta.classes))),
    )
    same = bool_mask(pc.equal(named, samples.column("class_name")))
    check(same & inside, MANIFEST_FILE, "class_name is not classes[label]", sources)
    if len(sources) > 1:
        ascending = pc.greater(sources.slice(1), sources.slice(0, len(sources) - 1))
        check(
            np.concatenate([[True], bool_mask(ascending)]),
            MANIFEST_FILE,
            "rows not in strictly ascending source order (each source once)",
            sources,
        )
    rejected = manifest.rejects.column("source")
    both = bool_mask(pc.is_in(rejected, value_set=sources))
    check(~both, REJECTS_FILE, "also in manifest", rejected)


def _check_shards(manifest: Manifest, width: int, findings: _Findings) -> None:
    """Each shard's size for its rows, its checksums, and each listed once."""
    shards, meta, check = manifest.shards, manifest.meta, findings.check
    shard_names = shards.column("shard").to_pylist()
    recorded = shards.column("bytes").to_numpy()
    if meta.ragged:  # each sample its own size: at least a byte a row
        computed = HEADER_BYTES + shards.column("rows").to_numpy()
        check(recorded >= computed, SHARDS_FILE, "bytes < 128 + rows", shard_names)
    else:
        computed = HEADER_BYTES + shards.column("rows").to_numpy() * math.prod(meta.sample_shape)
        check(recorded == computed, SHARDS_FILE, "bytes != 128 + rows * sample bytes", shard_names)
    check(is_hex(shards.column("checksum"), str(width)), SHARDS_FILE, "bad checksum", shard_names)
    check(is_hex(shards.column("blake3"), "64"), SHARDS_FILE, "bad blake3", shard_names)
    if len(set(shard_names)) != len(shard_names):
        findings.add(SHARDS_FILE, "a shard is listed twice")


def _text(value: Any) -> str:
    """A row's label in a finding: an Arrow scalar as its Python value."""
    return str(value.as_py() if isinstance(value, pa.Scalar) else value)


def _ids_match(sources: pa.ChunkedArray, ids: pa.ChunkedArray) -> NDArray[np.bool_]:
    """Whether each row's sample_id is `names.sample_id` of its source, a batch of rows at a
    time: no Python list of every source at 10M rows."""
    ok = np.empty(len(sources), dtype=bool)
    for start in range(0, len(sources), 1 << 16):
        batch = sources.slice(start, 1 << 16).to_pylist()
        want = pa.array([names.sample_id(s) for s in batch], pa.string())
        ok[start : start + len(batch)] = bool_mask(pc.equal(want, ids.slice(start, len(batch))))
    return ok


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
    for v in list_versions(root, retired=True):  # a retired one's shards stay: not orphans
        if v == number:
            if manifest is not None:
                records[v] = shard_records(manifest.shards)
            continue
        path = version_dir(root, v) / SHARDS_FILE
        try:
            table = load_table(path)
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
    latest = max(list_versions(root, retired=True), default=0)
    referenced = {name for shards in records.values() for name in shards}
    complete = len(records) == len(list_versions(root, retired=True)) and not unreadable
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
        elif entry.is_dir() and entry.name == RETIRED_DIR:
            continue  # retirement records (NOTE [ a grace period ]), a compaction's to judge
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
