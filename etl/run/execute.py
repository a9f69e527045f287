"""A run's two parallel phases, over `etl.engine.parallel`: hashing the listed files, and
packing the planned shards, a batch of sources a task, each shard sealed here once its batches
are in (`etl.format.parts`). What the workers run is `etl.run.worker`: they read, hash, decode
and write pixels straight into shard files; only small metadata rows travel back to the
parent, so its memory does not grow with the dataset and the same design runs on a cluster.

A bad image is not a failure: it comes back as a reject with its reason. Anything else a worker
raises (a full disk, a bug) stops the run, re-raised with the shard and file it was working on.
"""

from __future__ import annotations

import os
import secrets
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.config import PipelineConfig, RunConfig, SourceConfig
from etl.engine.parallel import Starting, parallel_map
from etl.format import parts
from etl.format.shards import SHARDS_DIR, ShardInfo, fsync_dir
from etl.run.tasks import Chunks, PackTask
from etl.run.worker import PackResult, hash_chunk, pack_batch, pack_spec
from etl.sources.entries import FileColumns
from etl.sources.listed_rejects import SourceReject
from etl.sources.registry import spec_of

if TYPE_CHECKING:
    from numpy.typing import NDArray

HASH_CHUNK = 256
"""Files per hashing task: large enough to amortise dispatch, small enough to balance load."""


# --- hashing ----------------------------------------------------------------------------------


def hash_sources(
    files: FileColumns,
    algorithm: str,
    run: RunConfig,
    on_progress: Callable[[int], None] = lambda n: None,
    *,
    source_config: SourceConfig,
    starting: Starting | None = None,
    keep: Path | None = None,
) -> tuple[pa.Array, list[SourceReject]]:
    """Content hashes of `files` of `source_config`, one per file in their order (null where
    it could not be read); unreadable files become rejects (io_error, or the reason
    `readers.Refused` gives).

    Chunks of (source, path) are made as workers take them and their hashes kept as Arrow
    arrays placed by position, so hashing 10M files holds no Python object per file in this
    process, and no second copy of the sources. `starting`: see `parallel_map`. `keep`: a
    folder where objects read from a store are kept for the pack phase (`etl.sources.kept`)."""
    table = files.table.select(["source", "path", "size"])

    def chunk(start: int, stop: int) -> tuple[int, list[tuple[str, str, int]]]:
        columns = table.slice(start, stop - start).to_pydict()
        paths = (os.fsdecode(path) for path in columns["path"])
        return start, list(zip(columns["source"], paths, columns["size"], strict=True))

    chunks: Chunks[tuple[int, list[tuple[str, str, int]]]] = Chunks(len(table), HASH_CHUNK, chunk)
    found: dict[int, pa.Array] = {}
    failures: list[tuple[str, str, str]] = []
    kept = str(keep) if keep is not None else None
    source = spec_of(source_config)
    hashing = parallel_map(hash_chunk, chunks, run, algorithm, source, kept, starting=starting)
    with hashing as chunk_results:
        for start, results in chunk_results:
            found[start] = pa.array([value for _, value, _, _ in results], pa.string())
            failures += [
                (s, reason, message) for s, value, reason, message in results if value is None
            ]
            on_progress(len(results))
    hashes = pa.chunked_array([found[start] for start in sorted(found)], pa.string())
    return hashes.combine_chunks(), _hash_rejects(files, failures)


def _hash_rejects(files: FileColumns, failures: list[tuple[str, str, str]]) -> list[SourceReject]:
    """Rejects of the files that could not be hashed, with their listed stat."""
    if not failures:
        return []
    failed = pa.array([source for source, _, _ in failures], pa.string())
    rows = FileColumns(files.table.filter(pc.is_in(files.table.column("source"), value_set=failed)))
    stat = {f.source: f for f in rows}
    return [
        SourceReject(
            source,
            reason,
            message,
            stat[source].size,
            stat[source].mtime_ns,
            None,
            stat[source].ctime_ns,
            stat[source].inode,
        )
        for source, reason, message in failures
    ]


# --- packing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sealed:
    """A shard whose every task has finished, published (`etl.format.parts.seal`)."""

    name: str
    shard: ShardInfo | None
    """None when every source of the shard was rejected: no file was published."""
    gaps: NDArray[np.int64]
    """The slots rejects left empty, sorted: a sample's row is its slot less the gaps before
    it (`etl.run.results.ShardGaps`)."""
    offsets: NDArray[np.int64] | None = None
    """Where samples keep their aspect ratio, each slot's byte offset in the shard's data."""


@dataclass
class _Filling:
    """A shard whose tasks are still coming back: how many of its slots have, its gaps, and
    (samples of their own size) each slot's bytes."""

    capacity: int
    ragged: bool
    done: int = 0
    gaps: list[NDArray[np.int64]] = field(default_factory=list)
    sizes: NDArray[np.int64] | None = None

    def add(self, result: PackResult) -> None:
        self.done += result.items
        if result.rejects:
            self.gaps.append(result.slot + np.flatnonzero(result.rows < 0))
        if self.ragged:
            if self.sizes is None:
                self.sizes = np.zeros(self.capacity, np.int64)
            self.sizes[result.slot : result.slot + result.items] = result.sample_bytes


SEAL_THREADS = 2
"""Shards sealed at once in the parent: a seal reads its shard back from the page cache and
hashes it (about 0.6 ms per MiB here), mostly outside the GIL, while the workers go on."""


def pack(
    tasks: Sequence[PackTask],
    config: PipelineConfig,
    root: Path,
    on_progress: Callable[[int], None] = lambda n: None,
    starting: Starting | None = None,
    keep: Path | None = None,
) -> Generator[PackResult | Sealed, None, None]:
    """Run `pack_batch` over every task; yields each task's result as it finishes, and each
    shard once sealed (after the results of all its tasks). Every shard is on disk (fsynced,
    and the rename of it) once the last item has been taken.

    NOTE [ who fsyncs ]: an fsync waits for the disk, and a worker waiting on it packs nothing.
    On one machine the seal fsyncs each shard in a thread here, while the workers go on packing;
    its fsync covers the rows of every task (one page cache). On a Dask cluster a machine's
    writes are flushed only by that machine, so each task fsyncs its own rows as well.
    """
    in_workers = config.run.backend == "dask"
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    filling: dict[str, _Filling] = {}
    sealing: deque[Future[Sealed]] = deque()

    def seal(name: str, state: _Filling) -> Sealed:
        gaps = np.sort(np.concatenate(state.gaps)) if state.gaps else np.zeros(0, np.int64)
        temp = parts.temp_name(name, token)
        sample_shape, checksum = config.sample_shape, config.output.checksum
        if state.sizes is not None:
            info, offsets = parts.seal_flat(
                root, name, temp, state.sizes, config.slot_bytes, checksum
            )
            return Sealed(name, info, gaps, offsets)
        info = parts.seal(root, name, temp, state.capacity, gaps, sample_shape, checksum)
        return Sealed(name, info, gaps)

    spec = pack_spec(config)
    args = (spec, str(root), token, in_workers, str(keep) if keep is not None else None)
    with (
        parallel_map(pack_batch, tasks, config.run, *args, starting=starting) as results,
        ThreadPoolExecutor(SEAL_THREADS, thread_name_prefix="seal") as sealer,
    ):
        for result in results:
            state = filling.setdefault(result.shard, _Filling(result.capacity, config.flat))
            state.add(result)
            on_progress(result.items)
            yield result
            if state.done == state.capacity:
                sealing.append(sealer.submit(seal, result.shard, filling.pop(result.shard)))
            while sealing and (sealing[0].done() or len(sealing) > 2 * SEAL_THREADS):
                yield sealing.popleft().result()
        while sealing:
            yield sealing.popleft().result()
    if filling:
        raise RuntimeError(f"accounting bug: shards {sorted(filling)} were never filled")
    if (root / SHARDS_DIR).is_dir():  # the renames of the shards sealed
        fsync_dir(root / SHARDS_DIR)
