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

from etl.engine.prepared import Prepared, prepared_path, take_prepared, write_prepared
from etl.errors import WorkerError, described
from etl.format.checksums import digest
from etl.format.codecs import encode
from etl.images.recipe import Recipe, recipe_of
from etl.images.rejects import Reject
from etl.images.stages import load_function, process_image
from etl.sources import readers
from etl.sources.kept import kept_path, room_for
from etl.sources.kind import SourceSpec
from etl.storage.location import is_url

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
    source. `keep`: where the hash phase kept objects from a store (`etl.sources.kept`), and
    the samples it made of them (`etl.engine.prepared`), used where their hash is the plan's."""
    functions = stage_functions(spec.recipe)
    ready = [_prepared_file(keep, locator) for _, locator, _ in sources]
    unread = (locator for (_, locator, _), path in zip(sources, ready, strict=True) if not path)
    outcomes = readers.read_many(spec.source, unread, keep)
    for (source, locator, content_hash), path in zip(sources, ready, strict=True):
        try:
            kept = take_prepared(path) if path is not None else None
            if kept is not None and kept[0] == content_hash:
                sample = kept[1]
            else:
                data = next(outcomes) if path is None else _read(spec, locator, keep)
                sample = make_sample(data, content_hash, spec, functions, changed)
            outcome = _append(writer, sample)
        except OSError:
            raise  # the shard's write: a read failure is a reject in make_sample
        except Exception as exc:
            raise WorkerError(
                f"while packing {source} into {writer.name}: {described(exc)}"
            ) from exc
        yield outcome


def make_sample(
    data: bytes | OSError,
    content_hash: str,
    spec: FillSpec,
    functions: dict[str, Callable[..., Any]],
    changed: str,
) -> Prepared | Reject:
    """One source's read -> its stored row (pixels, or encoded bytes), or why it is none."""
    if isinstance(data, OSError):
        return Reject(*read_failure(data))
    if digest(data, spec.checksum) != content_hash:
        return Reject("changed", changed)
    try:
        array, (height, width) = process_image(data, spec.recipe, functions)
    except Reject as exc:
        return exc
    if not spec.encoded:
        return Prepared(array, array.shape, "raw", height, width)
    layout = spec.recipe.layout
    name, encoded = encode(array, spec.codec, spec.quality, spec.min_ratio, layout)
    return Prepared(encoded, array.shape, name, height, width)


def _append(writer: RowWriter, sample: Prepared | Reject) -> Stored | Reject:
    if isinstance(sample, Reject):
        writer.skip()
        return sample
    row, checksum = writer.append(sample.stored)
    return Stored(
        row, checksum, sample.height, sample.width, sample.shape, sample.codec, sample.stored.nbytes
    )


def _read(spec: FillSpec, locator: str, keep: Path | None) -> bytes | OSError:
    return next(readers.read_many(spec.source, [locator], keep))


def _prepared_file(keep: Path | None, locator: str) -> Path | None:
    """The sample the hash phase made of the object at `locator`, where there is one."""
    if keep is None or not is_url(locator):
        return None
    path = prepared_path(kept_path(keep, locator))
    return path if path.is_file() else None


def prepare_kept(
    keep: Path,
    locator: str,
    content_hash: str,
    spec: FillSpec,
    functions: dict[str, Callable[..., Any]],
) -> None:
    """Hash phase: make the sample of the object the hash phase just kept (`content_hash`:
    of the bytes it kept) and keep that instead, where the scratch disk has room. Anything that
    goes wrong leaves the object as it was, for the pack phase to decode and report."""
    path = kept_path(keep, locator)
    try:
        data = path.read_bytes()
    except OSError:
        return  # not kept: no room, or a local file
    try:
        sample = make_sample(data, content_hash, spec, functions, "")
    except Exception:
        return
    if isinstance(sample, Reject) and sample.reason == "changed":
        return
    nbytes = 0 if isinstance(sample, Reject) else sample.stored.nbytes
    if not room_for(keep, nbytes):
        return
    try:
        write_prepared(prepared_path(path), content_hash, sample)
    except OSError:
        return
    path.unlink(missing_ok=True)  # the sample stands for the object now


def warm(_: int) -> None:
    """Worker: nothing. Unpickling this function imported this module, what filling a shard
    needs (decoders, stages, readers), while the parent lists: that import is the point."""
