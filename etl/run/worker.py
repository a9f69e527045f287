"""What a run's worker processes run: hashing a chunk of files, packing a task's sources into
its shard's temp file. Called by `etl.run.execute`, which sends each task with plain data made
once in the parent (`PackSpec`, `etl.sources.kind.SourceSpec`): unpickling a task imports this
module and what reading, decoding and writing need, never pydantic, the config models, pyarrow
or joblib's scheduler (tested; `benchmarks/pack/worker_start.py` times it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from etl.engine.fill import FillSpec, fill_shard, fill_spec, read_failure
from etl.format import parts
from etl.format.codecs import CODECS
from etl.format.flat import sides_of
from etl.images.rejects import Reject
from etl.run.tasks import PackTask, Texts
from etl.sources import readers
from etl.sources.kind import SourceSpec

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from etl.config import PipelineConfig


@dataclass(frozen=True)
class PackSpec:
    """What a pack worker needs of the validated config: the fill, and the slots it writes."""

    fill: FillSpec
    stored_shape: tuple[int, ...]
    """`PipelineConfig.stored_shape`: the shape a shard writer takes each sample in."""
    slot_bytes: int
    """`PipelineConfig.slot_bytes`: the most bytes one stored sample can take."""


def pack_spec(config: PipelineConfig) -> PackSpec:
    """The plain copy of `config` every pack task is sent with, made once in the parent."""
    return PackSpec(fill_spec(config), config.stored_shape, config.slot_bytes)


@dataclass(frozen=True)
class PackResult:
    """What became of one task's sources, as columns: the parent joins them to the rows it
    planned (`PackTask.start`), so no per-image object travels back or waits here.

    NOTE: a dict per sample cost ~1 KB in the parent for every image of the shards in flight
    (87k of them in a shard of 32x32 images)."""

    shard: str
    start: int
    slot: int
    capacity: int
    """As in the task: where its sources sit in the shard, and the shard's planned size."""
    rows: NDArray[np.int64]
    """Per source, its slot in the shard, or -1 where it became a reject."""
    heights: NDArray[np.int64]
    widths: NDArray[np.int64]
    """Per source, the decoded image's size (0 for a reject)."""
    sample_bytes: NDArray[np.int64]
    sample_heights: NDArray[np.int64]
    sample_widths: NDArray[np.int64]
    """Per source, its stored sample's bytes (encoded, where it is) and its size in pixels (0
    for a reject): each its own where samples keep their aspect ratio."""
    checksums: Texts
    """Per stored source, in order, the checksum of its row."""
    rejects: tuple[tuple[int, str, str], ...]
    """(index in the task, reason, message) of each source that became a reject."""
    codecs: NDArray[np.int8]
    """Per source, how its sample is stored: its index in `etl.format.codecs.CODECS`."""

    @property
    def items(self) -> int:
        return len(self.rows)


# --- hashing ---------------------------------------------------------------------------------


def hash_chunk(
    chunk: tuple[int, Sequence[tuple[str, str, int]]],
    algorithm: str,
    source_spec: SourceSpec,
    keep: str | None = None,
) -> tuple[int, list[tuple[str, str | None, str, str]]]:
    """Worker: for a chunk (its start, its (source, locator, listed size)s): its start, and
    (source, digest or None, reject reason, message) for each file. `keep`: where objects are
    kept for the pack phase (`etl.sources.kept`)."""
    start, files = chunk
    out: list[tuple[str, str | None, str, str]] = []
    sizes = {path: size for _, path, size in files}
    kept = Path(keep) if keep else None
    locators = (path for _, path, _ in files)
    digests = readers.digest_many(source_spec, locators, algorithm, sizes, kept)
    for (source, _, _), value in zip(files, digests, strict=True):
        if isinstance(value, OSError):
            out.append((source, None, *read_failure(value)))
        else:
            out.append((source, value, "", ""))
    return start, out


# --- packing ---------------------------------------------------------------------------------


def pack_batch(
    task: PackTask,
    spec: PackSpec,
    root: str,
    token: str,
    durable: bool,
    keep: str | None = None,
) -> PackResult:
    """Worker: store `task`'s sources at their slots of the shard's temp file for this run
    (`token`), in order. Runs in a joblib worker process. `durable` fsyncs the rows written
    (a cluster: see `pack`); `keep`: where the hash phase kept objects (`etl.sources.kept`)."""
    n = len(task)
    rows = np.full(n, -1, dtype=np.int64)
    heights, widths = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    stored = np.zeros((3, n), dtype=np.int64)
    codecs = np.zeros(n, dtype=np.int8)
    layout = spec.fill.recipe.layout
    checksums: list[str] = []
    rejects: list[tuple[int, str, str]] = []
    temp = parts.temp_name(task.shard, token)
    writer = parts.SlotWriter(
        Path(root),
        task.shard,
        temp,
        task.slot,
        spec.stored_shape,
        spec.fill.checksum,
        durable,
        spec.slot_bytes,
    )
    with writer:
        sources = list(zip(task.sources, task.locators, task.hashes, strict=True))
        kept = Path(keep) if keep else None
        outcomes = fill_shard(writer, spec.fill, sources, CHANGED_DURING_RUN, kept)
        for i, outcome in enumerate(outcomes):
            if isinstance(outcome, Reject):
                rejects.append((i, outcome.reason, outcome.message))
            else:
                rows[i], heights[i], widths[i] = outcome.row, outcome.height, outcome.width
                stored[:, i] = outcome.nbytes, *sides_of(outcome.shape, layout)
                codecs[i] = CODECS.index(outcome.codec)
                checksums.append(outcome.checksum)
    return PackResult(
        task.shard,
        task.start,
        task.slot,
        task.capacity,
        rows,
        heights,
        widths,
        stored[0],
        stored[1],
        stored[2],
        Texts.of(checksums),
        tuple(rejects),
        codecs,
    )


CHANGED_DURING_RUN = "file changed while the run was in progress; run again"
