"""Verifying sources: re-hash the files a manifest was packed from, or list a record source
again, and report each sample whose source changed or vanished."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from etl.config import SourceConfig
from etl.engine.parallel import parallel_map
from etl.format import names
from etl.format.manifest import (
    Manifest,
)
from etl.maintenance.audit.report import AuditOptions, AuditReport, Finding
from etl.progress import Progress
from etl.sources.entries import ListContext
from etl.sources.in_store import located_digest
from etl.sources.registry import list_sources

SOURCE_CHUNK = 64
"""Source files per hashing task."""


def verify_source_chunk(
    items: Sequence[tuple[int, str, str]],
    root: str,
    algorithm: str,
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[list[tuple[int, str, str | None, str]], int]:
    """Worker: (index, source, recorded hash) -> problems as (index, kind, actual digest,
    message), and the number of files looked at."""
    problems: list[tuple[int, str, str | None, str]] = []
    for index, source, recorded in items:
        path = names.source_path(root, source)  # the caller passes only sources inside the root
        try:
            got = located_digest(path, algorithm, sys.maxsize, storage_options)
        except FileNotFoundError:
            problems.append((index, "source_missing", None, f"{path!r} no longer exists"))
            continue
        except OSError as exc:
            problems.append((index, "source_missing", None, f"{path!r}: {exc.strerror or exc}"))
            continue
        if got != recorded:
            problems.append((index, "source_changed", got, "content changed since it was packed"))
    return problems, len(items)


def unsafe_path(column: pa.ChunkedArray) -> NDArray[np.bool_]:
    """Sources that do not name a path inside the source root (see names.is_inside): checked
    with one regex on plain names, one by one on the rare 'hex:' names."""
    bad = pc.match_substring_regex(column, r"^/|(^|/)\.\.(/|$)|^$")
    unsafe = np.asarray(bad.to_numpy(zero_copy_only=False), dtype=bool)
    hexed = pc.starts_with(column, names.HEX_PREFIX).to_numpy(zero_copy_only=False)
    for i in np.flatnonzero(hexed):
        unsafe[i] = not names.is_inside(column[int(i)].as_py())
    return unsafe


def verify_records(
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
        report.findings.append(source_finding(samples, index, kind, message, got))


def source_finding(
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


def verify_sources(
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
    unsafe = unsafe_path(samples.column("source"))
    items = [(int(i), sources[i], hashes[i]) for i in selected if not unsafe[i]]
    sizes = samples.column("source_size").to_numpy()
    chunks = [items[i : i + SOURCE_CHUNK] for i in range(0, len(items), SOURCE_CHUNK)]
    progress.start("sources", len(items))
    problems: list[tuple[int, str, str | None, str]] = []
    try:
        with parallel_map(
            verify_source_chunk,
            chunks,
            options.run_config(int(sizes[[i for i, _, _ in items]].sum())),
            str(options.source_root),
            manifest.meta.checksum,
            options.source_options,
        ) as hashed:
            for found, done in hashed:
                problems += found
                progress.advance(done)
    finally:
        progress.stop()
    report.sources_checked = len(items)
    for index, kind, got, message in sorted(problems):
        report.findings.append(source_finding(samples, index, kind, message, got))
