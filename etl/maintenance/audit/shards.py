"""Verifying shard files: the worker that hashes one shard (`audit_shard`) and the phase that
runs it over every shard and turns its outcomes into findings."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from etl.engine.parallel import parallel_map
from etl.errors import ShardError, WorkerError, described
from etl.format.checksums import TAMPER_DIGEST, new_hasher, row_digest
from etl.format.flat import channels_of
from etl.format.manifest import (
    Manifest,
)
from etl.format.shards import open_shard
from etl.maintenance.audit.report import AuditOptions, AuditReport, Finding
from etl.progress import Progress

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
    spans: tuple[tuple[int, int], ...]
    """Their (byte offset in the data, bytes), aligned with check_rows: row x sample bytes,
    or where samples keep their aspect ratio, each one's own."""


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
        raise WorkerError(f"while auditing {task.shard}: {described(exc)}") from exc


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
        spans = task.spans if mode != "fast" else ()
        digests, bad, rows_verified = _hash_file(
            data, header, [a for _, a, _ in checks], spans, task.expected, one_row
        )
        hashed = len(header) + len(data)
        for kind, name, want in checks:
            if digests[name] != want:
                message = f"whole-file {name} differs from shards.arrow"
                problems.append((kind, message, want, digests[name]))
        whole_file_ok = not problems
    if mode == "sample" or (mode == "fast" and not whole_file_ok):
        for index, (start, length) in enumerate(task.spans):
            got = one_row(data[start : start + length])
            if got != task.expected[index]:
                bad.append((index, got))
        rows_verified = len(task.check_rows)
        if mode == "sample":  # fast mode counted the whole file already
            hashed += sum(length for _, length in task.spans)
    return ShardOutcome(
        task.shard, tuple(problems), True, tuple(bad), rows_verified, hashed, whole_file_ok
    )


def _hash_file(
    data: memoryview,
    header: bytes,
    algorithms: Sequence[str],
    spans: Sequence[tuple[int, int]],
    expected: Sequence[str],
    one_row: Callable[[Any], str],
) -> tuple[dict[str, str], list[tuple[int, str]], int]:
    """Whole-file digests of header + data by algorithm, the (index, digest) of the rows at
    `spans` (ascending) that differ from `expected`, and how many rows were hashed: all in one
    pass over the data, each row hashed once the chunks holding it were read."""
    hashers = {name: new_hasher(name) for name in algorithms}
    for h in hashers.values():
        h.update(header)
    bad: list[tuple[int, str]] = []
    j = 0
    for start in range(0, len(data), CHUNK_BYTES):
        stop = min(len(data), start + CHUNK_BYTES)
        chunk = data[start:stop]
        for h in hashers.values():
            h.update(chunk)
        while j < len(spans) and sum(spans[j]) <= stop:
            offset, length = spans[j]
            got = one_row(data[offset : offset + length])
            if got != expected[j]:
                bad.append((j, got))
            j += 1
    while j < len(spans):  # past the end of the data (the size was checked): no digest
        bad.append((j, ""))
        j += 1
    return {name: h.hexdigest() for name, h in hashers.items()}, bad, j


def sample_spans(
    manifest: Manifest, at: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(byte offset in its shard's data, bytes) of the samples at positions `at`."""
    meta, samples = manifest.meta, manifest.samples
    taken = pa.array(at, pa.int64())
    if not meta.ragged:
        size = math.prod(meta.sample_shape)
        rows = samples.column("row").take(taken).to_numpy().astype(np.int64)
        return rows * size, np.full(len(at), size, np.int64)
    channels = channels_of(meta.sample_shape, meta.layout)
    place = samples.select(["sample_offset", "sample_height", "sample_width"]).take(taken)
    offset, height, width = (c.to_numpy().astype(np.int64) for c in place.columns)
    if meta.encoded:  # each its stored bytes
        return offset, samples.column("sample_bytes").take(taken).to_numpy().astype(np.int64)
    return offset, height * width * channels


def verify_shards(
    manifest: Manifest,
    selected: NDArray[np.int64],
    options: AuditOptions,
    progress: Progress,
    report: AuditReport,
    meanwhile: Callable[[], None],
) -> None:
    """Hash the shards in workers; `meanwhile` runs in this process as soon as they start."""
    tasks, members, codes = _shard_tasks(manifest, selected)

    def planned(task: ShardTask) -> int:
        return sum(n for _, n in task.spans) if options.mode == "sample" else task.bytes

    tasks.sort(key=planned, reverse=True)  # biggest first: balances the workers
    by_name = {t.shard: t for t in tasks}
    total = sum(planned(t) for t in tasks)
    run = options.run_config(total)
    in_process = run.n_jobs == 1 or run.backend == "sequential"
    if in_process:
        meanwhile()  # nothing to overlap with: keep it out of the timed phase
    started = time.perf_counter()
    progress.start("verify", total)
    meta = manifest.meta
    try:
        results = []
        with parallel_map(
            audit_shard, tasks, run, options.mode, meta.stored_shape, meta.checksum
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
    code_of = {name: code for code, name in enumerate(manifest.shards.column("shard").to_pylist())}
    for outcome in sorted(results, key=lambda o: o.shard):
        _record(outcome, manifest, members, (codes, code_of[outcome.shard]), report)


def _shard_tasks(
    manifest: Manifest, selected: NDArray[np.int64]
) -> tuple[list[ShardTask], dict[str, NDArray[np.int64]], NDArray[np.int64]]:
    """(a task per shard, each shard's selected samples, each sample's shard code): the
    selected samples grouped by shard in row order, with their expected checksums and spans."""
    samples = manifest.samples
    codes = shard_codes(samples.column("shard"), manifest.shards.column("shard").to_pylist())
    rows = samples.column("row").to_numpy()
    order = selected[np.lexsort((rows[selected], codes[selected]))]
    expected = samples.column("checksum").take(pa.array(order)).to_pylist()
    starts, lengths = sample_spans(manifest, order)
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
                spans=tuple(zip(starts[lo:hi].tolist(), lengths[lo:hi].tolist(), strict=True)),
            )
        )
    return tasks, members, codes


def _record(
    outcome: ShardOutcome,
    manifest: Manifest,
    members: dict[str, NDArray[np.int64]],
    shard_code: tuple[NDArray[np.int64], int],
    report: AuditReport,
) -> None:
    """One shard's outcome in the report: its counts, its problems, and a finding for each
    sample it names (every sample of an unreadable shard: those whose code in `shard_code`'s
    array is its code)."""
    samples = manifest.samples
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
        codes, code = shard_code
        flagged = [(int(i), None) for i in np.flatnonzero(codes == code)]
        why = f"its shard is unreadable ({problems[0][0]}: {problems[0][1]})"
        kind = "sample_unreadable"
    for index, got in flagged:
        report.findings.append(
            Finding(
                kind,
                why,
                shard=outcome.shard,
                row=samples.column("row")[index].as_py(),
                sample_id=samples.column("sample_id")[index].as_py(),
                source=samples.column("source")[index].as_py(),
                expected=samples.column("checksum")[index].as_py(),
                actual=got,
            )
        )


def shard_codes(column: pa.ChunkedArray, names: Sequence[str]) -> NDArray[np.int64]:
    """Each sample's shard as its index in shards.arrow (read_manifest checked they all exist)."""
    codes = pc.index_in(column, value_set=pa.array(names, pa.string()))
    return np.asarray(codes.to_numpy(zero_copy_only=False), dtype=np.int64)
