"""The one way a shard is filled, for a run and for repair alike: each source read back through
its kind's reader, checked against the content hash the plan recorded, run through the image
stages and appended to the shard. A bad image is a reject with its reason, not a failure.

A worker gets a `FillSpec`, the validated config's plain copy (`fill_spec`, in the parent):
this module and everything it imports at the top leave pydantic and the config models out."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from numpy.typing import NDArray

from etl.errors import WorkerError, described
from etl.format.checksums import digest
from etl.format.codecs import DecodeFailure, decode, encode, jpeg_as_stored
from etl.images.recipe import Recipe, recipe_of
from etl.images.rejects import Reject
from etl.images.stages import load_function, process_image
from etl.sources import readers
from etl.sources.kind import SourceSpec

if TYPE_CHECKING:
    from etl.config import PipelineConfig


def read_failure(exc: OSError) -> tuple[str, str]:
    """(reject reason, message) of a source that could not be read."""
    if isinstance(exc, readers.Refused):
        return exc.reason, str(exc)
    return "io_error", f"cannot read: {exc.strerror or exc}"


@dataclass(frozen=True)
class FillSpec:
    """What filling a shard needs of a validated config, as plain data."""

    recipe: Recipe
    source: SourceSpec
    checksum: str
    """`output.checksum`: the algorithm of content hashes and row checksums."""
    codec: str
    quality: int
    min_ratio: float
    original: bool
    """`output.codec`: how each sample is stored (`etl.format.codecs.encode`)."""

    @property
    def encoded(self) -> bool:
        return self.codec != "raw"


def fill_spec(config: PipelineConfig) -> FillSpec:
    """The plain copy of `config` that `fill_shard` takes, made once in the parent."""
    from etl.sources.registry import spec_of  # NOTE: here: it imports every kind and the config

    codec = config.output.codec
    return FillSpec(
        recipe_of(config),
        spec_of(config.source),
        config.output.checksum,
        codec.kind,
        codec.quality,
        codec.min_ratio,
        codec.original,
    )


def stage_functions(recipe: Recipe) -> dict[str, Callable[..., Any]]:
    """The user functions of the recipe's call steps, imported once per worker task."""
    return {function: load_function(function) for function in recipe.functions}


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
    spec: FillSpec,
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
    functions = stage_functions(spec.recipe)
    outcomes = readers.read_many(spec.source, (locator for _, locator, _ in sources), keep)
    for (source, _, content_hash), data in zip(sources, outcomes, strict=True):
        try:
            outcome = _store(data, content_hash, writer, spec, functions, changed)
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
    spec: FillSpec,
    functions: dict[str, Callable[..., Any]],
    changed: str,
) -> Stored | Reject:
    if isinstance(data, OSError):
        writer.skip()
        return Reject(*read_failure(data))
    if digest(data, spec.checksum) != content_hash:
        writer.skip()
        return Reject("changed", changed)
    try:
        array, (height, width) = process_image(data, spec.recipe, functions)
    except Reject as exc:
        writer.skip()
        return exc
    if not spec.encoded:
        row, checksum = writer.append(array)
        return Stored(row, checksum, height, width, array.shape, "raw", array.nbytes)
    # NOTE: only a source the stages left at its own size can be its own sample: the others
    # skip the walk of their bytes
    same_size = array.shape[:2] == (height, width)
    original = _original_jpeg(data, array, spec) if spec.original and same_size else None
    if original is not None:
        name, encoded = "jpeg", original
    else:
        layout = spec.recipe.layout
        name, encoded = encode(array, spec.codec, spec.quality, spec.min_ratio, layout)
    row, checksum = writer.append(encoded)
    return Stored(row, checksum, height, width, array.shape, name, encoded.size)


def _original_jpeg(
    data: bytes, array: NDArray[np.uint8], spec: FillSpec
) -> NDArray[np.uint8] | None:
    """The source's own JPEG bytes, metadata stripped, where they pay `min_ratio` and decode
    (as the loaders decode) to exactly the validated `array`: a source that was resized,
    rotated by its EXIF orientation, converted or changed by a call stage decodes to other
    pixels, and is encoded again. None otherwise."""
    stored = jpeg_as_stored(data)
    if stored is None or len(stored) * spec.min_ratio > array.nbytes:
        return None
    try:
        pixels = decode(stored, "jpeg", array.shape)
    except DecodeFailure:
        return None
    return np.frombuffer(stored, np.uint8) if np.array_equal(pixels, array) else None


def warm(_: int) -> None:
    """Worker: nothing. Unpickling this function imported this module, what filling a shard
    needs (decoders, stages, readers), while the parent lists: that import is the point."""
