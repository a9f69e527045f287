"""The one way a shard is filled, for a run and for repair alike: each source read back through
its kind's reader, checked against the content hash the plan recorded, run through the image
stages and appended to the shard. A bad image is a reject with its reason, not a failure."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from etl.config import CallStage, PipelineConfig
from etl.errors import WorkerError, described
from etl.format.checksums import digest
from etl.format.codecs import encode
from etl.images.rejects import Reject
from etl.images.stages import load_function, process_image
from etl.sources import readers


def read_failure(exc: OSError) -> tuple[str, str]:
    """(reject reason, message) of a source that could not be read."""
    if isinstance(exc, readers.Refused):
        return exc.reason, str(exc)
    return "io_error", f"cannot read: {exc.strerror or exc}"


def stage_functions(config: PipelineConfig) -> dict[str, Callable[..., Any]]:
    """The user functions of `config`'s call stages, imported once per worker task."""
    return {
        stage.function: load_function(stage.function)
        for stage in config.stages
        if isinstance(stage, CallStage)
    }


class RowWriter(Protocol):
    """Where filled rows go: a whole shard (`etl.format.shards.ShardWriter`) or a run's slots
    of one (`etl.format.parts.SlotWriter`)."""

    name: str

    def append(self, sample: NDArray[np.uint8]) -> tuple[int, str]: ...

    def skip(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Stored:
    """A source stored in a shard: its row (or slot), the row's checksum, the source's size in
    pixels, the sample's shape (decoded), and how it is stored: its codec and bytes
    (`etl.format.codecs`; raw: the pixels' bytes)."""

    row: int
    checksum: str
    height: int
    width: int
    shape: tuple[int, ...]
    codec: str = "raw"
    nbytes: int = 0


def fill_shard(
    writer: RowWriter,
    config: PipelineConfig,
    sources: Sequence[tuple[str, str, str]],
    changed: str,
    keep: Path | None = None,
) -> Iterator[Stored | Reject]:
    """The one way a shard is filled, for run and repair: each (source, locator, content hash)
    is read through `readers`, checked against its hash (else a `changed` reject with the
    message `changed`), run through the stages and appended to `writer` (a reject skipped).
    Yields, in order, what became of each. A read failure is a reject; a failure to write the
    shard (an OSError) is raised as it is; anything else is raised as a WorkerError naming the
    source. `keep`: where the hash phase kept objects from a store (`etl.sources.kept`)."""
    functions = stage_functions(config)
    outcomes = readers.read_many(config.source, (locator for _, locator, _ in sources), keep)
    for (source, _, content_hash), data in zip(sources, outcomes, strict=True):
        try:
            outcome = _store(data, content_hash, writer, config, functions, changed)
        except OSError:
            raise  # the shard's write: a read failure is a reject in _store
        except Exception as exc:
            raise WorkerError(
                f"while packing {source} into {writer.name}: {described(exc)}"
            ) from exc
        yield outcome


def _store(
    data: bytes | OSError,
    content_hash: str,
    writer: RowWriter,
    config: PipelineConfig,
    functions: dict[str, Callable[..., Any]],
    changed: str,
) -> Stored | Reject:
    if isinstance(data, OSError):
        writer.skip()
        return Reject(*read_failure(data))
    if digest(data, config.output.checksum) != content_hash:
        writer.skip()
        return Reject("changed", changed)
    try:
        array, (height, width) = process_image(data, config, functions)
    except Reject as exc:
        writer.skip()
        return exc
    codec = config.output.codec
    if not codec.encoded:
        row, checksum = writer.append(array)
        return Stored(row, checksum, height, width, array.shape, "raw", array.nbytes)
    layout = config.output.layout
    name, encoded = encode(array, codec.kind, codec.quality, codec.min_ratio, layout)
    row, checksum = writer.append(encoded)
    return Stored(row, checksum, height, width, array.shape, name, encoded.size)
