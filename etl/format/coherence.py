"""What every reader of a version may rely on, checked when it is opened: shard paths inside the
dataset, sealed shard checksums, labels within the classes, rows within their shards. Checked
vectorised, `CHECK_ROWS` samples at a time."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from etl.errors import ManifestError
from etl.format.codecs import CODECS
from etl.format.flat import channels_of
from etl.format.shards import HEADER_BYTES, SHARDS_DIR
from etl.format.table_ops import positions_in

RAGGED_COLUMNS = ("sample_offset", "sample_height", "sample_width")
"""The manifest columns that place a sample that keeps its aspect ratio (format version 2)."""
ENCODED_COLUMNS = ("sample_codec", "sample_bytes")
"""The manifest columns of samples stored encoded (format version 3): each one's codec and
stored bytes (`etl.format.codecs`)."""


class Described(Protocol):
    """What the check reads of a version's metadata (`etl.format.schema.ManifestMeta`)."""

    @property
    def dtype(self) -> str: ...
    @property
    def layout(self) -> str: ...
    @property
    def sample_shape(self) -> tuple[int, ...]: ...
    @property
    def classes(self) -> Sequence[str]: ...
    @property
    def ragged(self) -> bool: ...
    @property
    def encoded(self) -> bool: ...


class Version(Protocol):
    """What the check reads of a version (`etl.format.manifest.Manifest`), which imports this
    module: a protocol here, so the two do not import each other."""

    @property
    def meta(self) -> Described: ...
    @property
    def samples(self) -> pa.Table: ...
    @property
    def shards(self) -> pa.Table: ...
    def release_pages(self) -> None: ...


CHECK_ROWS = 1 << 18
"""Samples looked at a time by a pass over a whole version (the coherence check, the shard
index): its arrays stay a few MB and the mapped pages it read are let go of after each slice,
so opening 10M rows costs what opening 1M does. A hash lookup per slice is also faster than
one over the whole column (0.08 s instead of 0.6 s for 10M shard names)."""


SHARD_FILE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*\.npy")
"""A shard's file name: letters, digits, '_', '-' and '.', not hidden, ending in '.npy'
(what `etl.format.shards.shard_name` writes, and a hand-made dataset's plain names)."""


def check_shard_name(name: object, where: Path | str) -> str:
    """A shard path must stay inside the dataset: 'shards/<name>.npy' with a plain file name
    (no '/', '\\', '..', NUL or control character: NOTE [ names from a store ] in
    etl.storage.store); its file name."""
    text = name if isinstance(name, str) else ""
    file = text.removeprefix(f"{SHARDS_DIR}/")
    if file == text or not SHARD_FILE.fullmatch(file):
        raise ManifestError(f"{where}: shard path {name!r} is not of the form 'shards/<name>.npy'")
    return file


def check_coherent(where: Path, manifest: Version) -> None:
    """Refuse a manifest that points outside the dataset or past the end of a shard, or labels
    a sample outside its classes: what a loader relies on. Vectorised, a slice of
    `CHECK_ROWS` at a time: a 10M-row manifest is checked in a fraction of a second.
    The values no loader reads (sample ids, per-sample checksums, source hashes) are the
    audit's to check (`etl.maintenance.audit.dataset.check_manifest`). Two samples may share
    a stored row: identical content is stored once when `validate.duplicates` is 'allow'."""
    meta, samples, shards = manifest.meta, manifest.samples, manifest.shards
    if meta.dtype != "uint8" or meta.layout not in ("HWC", "CHW") or len(meta.sample_shape) != 3:
        raise ManifestError(f"{where}: unsupported sample format {meta.dtype} {meta.layout}")
    names = shards.column("shard")
    for name in names.to_pylist():
        check_shard_name(name, where)
    unsealed = ~is_hex(shards.column("checksum"))
    if unsealed.any():
        name = names[int(np.argmax(unsealed))].as_py()
        raise ManifestError(f"{where}: shards.arrow column 'checksum' of {name!r} is not a digest")
    if len(names.unique()) != len(names):
        raise ManifestError(f"{where}: shards.arrow lists a shard twice")
    limits = shards.column("rows").to_numpy()
    data_bytes = shards.column("bytes").to_numpy() - HEADER_BYTES
    channels = channels_of(meta.sample_shape, meta.layout)
    for start in range(0, samples.num_rows, CHECK_ROWS):
        piece = samples.slice(start, CHECK_ROWS)
        index = _check_rows(where, piece, start, len(meta.classes), names, limits)
        if meta.ragged:
            _check_places(where, piece, start, index, channels, data_bytes, meta.encoded)
        manifest.release_pages()


def _check_rows(
    where: Path,
    samples: pa.Table,
    first: int,
    classes: int,
    names: pa.ChunkedArray,
    limits: NDArray[np.int64],
) -> NDArray[np.int64]:
    """`check_coherent` of the samples from row `first` on; each one's shard's index."""
    labels = samples.column("label").to_numpy()
    bad = (labels < 0) | (labels >= classes)
    _refuse_first(where, samples, first, bad, f"column 'label' is outside the {classes} classes")
    index = positions_in(samples.column("shard"), names)
    unknown = index < 0
    if unknown.any():
        name = samples.column("shard")[int(np.argmax(unknown))].as_py()
        raise ManifestError(f"{where}: sample refers to shard {name!r} not in shards.arrow")
    rows = samples.column("row").to_numpy()
    bad = (rows < 0) | (rows >= limits[index])
    if bad.any():
        i = int(np.argmax(bad))
        shard = samples.column("shard")[i].as_py()
        what = f"column 'row' ({rows[i]}) is outside shard {shard!r}"
        _refuse_first(where, samples, first, bad, f"{what}, which has {limits[index[i]]} rows")
    return index


def _check_places(
    where: Path,
    samples: pa.Table,
    first: int,
    index: NDArray[np.int64],
    channels: int,
    data_bytes: NDArray[np.int64],
    encoded: bool = False,
) -> None:
    """Samples of a flat shard (format version 2 and 3): a size and an offset each (and where
    they are stored encoded, a known codec and a byte count), whose bytes lie inside their
    shard's data."""
    values = {}
    for name in (*RAGGED_COLUMNS, *(ENCODED_COLUMNS if encoded else ())):
        column = samples.column(name)
        _refuse_first(
            where, samples, first, column.is_null().to_numpy(zero_copy_only=False),
            f"column {name!r} is empty (null)",
        )  # fmt: skip
        if name != "sample_codec":
            values[name] = column.to_numpy().astype(np.int64)
    height, width = values["sample_height"], values["sample_width"]
    _refuse_first(where, samples, first, (height <= 0) | (width <= 0), "a sample has no pixels")
    stored = height * width * channels
    if encoded:
        codes = stored_codes(samples.column("sample_codec"))
        _refuse_first(where, samples, first, codes < 0, "column 'sample_codec' names no codec")
        stored = values["sample_bytes"]
        raw = (codes == 0) & (stored != height * width * channels)
        _refuse_first(where, samples, first, raw | (stored <= 0), "a sample's bytes do not fit")
    offset, end = values["sample_offset"], values["sample_offset"] + stored
    bad = (offset < 0) | (end > data_bytes[index])
    _refuse_first(where, samples, first, bad, "column 'sample_offset' is outside its shard")


def stored_codes(column: pa.ChunkedArray | pa.Array) -> NDArray[np.int8]:
    """Each `sample_codec` value's index in `etl.format.codecs.CODECS`; -1 for one it lacks."""
    found = pc.index_in(column, value_set=pa.array(CODECS, pa.string()))
    return np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), dtype=np.int8)


def is_hex(column: pa.ChunkedArray, width: str = "16,64") -> NDArray[np.bool_]:
    """Which values are lowercase hex digests of `width` digits (a regex count: "64", "16,64")."""
    ok = pc.match_substring_regex(column, f"^[0-9a-f]{{{width}}}$")
    return np.asarray(ok.to_numpy(zero_copy_only=False), dtype=bool)


def _refuse_first(
    where: Path, samples: pa.Table, first: int, bad: NDArray[np.bool_], what: str
) -> None:
    """One ManifestError naming the first row where `bad` holds (and its source), for samples
    that start at row `first` of the version."""
    if bad.any():
        i = int(np.argmax(bad))
        source = samples.column("source")[i].as_py()
        raise ManifestError(f"{where}: {what} at row {first + i} (source {source!r})")
