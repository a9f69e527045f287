"""What to read: one manifest version opened through `etl.format.manifest`, and selections of it.

A `Catalog` is the opened manifest (Arrow tables, classes, shape, layout, splits, counts). A
`Selection` is what a dataset needs from it: compact, read-only numpy arrays (shard index, row,
label per sample) plus the shard table, small enough to pickle to every worker process.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from etl.deprecations import warn_once
from etl.errors import EtlError, ManifestError, SelectionError, ShardError
from etl.format.codecs import max_pixels
from etl.format.coherence import stored_codes
from etl.format.contents import VersionContents, Where
from etl.format.flat import channels_of, shape_of
from etl.format.manifest import read_manifest
from etl.format.row_checksums import RowChecksums
from etl.format.values import SampleValues
from etl.format.views import View
from etl.storage.cache import BoundedCache
from etl.storage.ranged import RangedRows


def _frozen(array: NDArray[Any]) -> NDArray[Any]:
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class ShardSet:
    """The shards a selection reads, as the manifest's shards table records them."""

    root: Path
    names: tuple[str, ...]
    """Paths relative to `root`, already checked by `etl.format.coherence.check_shard_name`."""
    rows: NDArray[np.int64]
    checksums: tuple[str, ...]
    algorithm: str
    """The checksum algorithm of `checksums` (the manifest's `output.checksum`)."""
    sample_shape: tuple[int, ...]
    version: int
    """The manifest version these shards were selected from (for error messages)."""
    probes: tuple[tuple[int, str], ...] = ()
    """Per shard, (row, checksum) of one sample stored in it: what `ShardReader` checks each
    time it opens the shard, so a file swapped with another of the same shape, or rewritten,
    is an error and not a shard of wrong samples (see NOTE [ probe ] in
    `loaders.read.shard_checks`)."""
    sizes: tuple[int, ...] = ()
    """Per shard, its file's bytes (the shards table's)."""
    cache: BoundedCache | None = None
    """For a dataset in object storage read through a byte-limited cache: where each shard
    is fetched (and held) before it is opened (`etl.storage.cache`)."""
    ranged: RangedRows | None = None
    """For a dataset in object storage read with ranged GETs: where rows are read instead of
    from shard files (`etl.storage.ranged`)."""
    url: str = ""
    """For a dataset in object storage, its URL (`root` is then its mirror in the cache)."""
    row_sums: RowChecksums | None = None
    """With `verify="rows"` or "once": each selected row's recorded checksum, checked as it
    is read."""
    seen_rows: Any = None
    """With `verify="once"`: a bool tensor in shared memory, per `row_sums` key, whether some
    process of the loader checked that row already (DataLoader workers share it)."""

    def seen(self) -> NDArray[np.bool_] | None:
        """`seen_rows` as this process's numpy view (None: every read row is checked)."""
        return None if self.seen_rows is None else self.seen_rows.numpy()

    roots: tuple[Path, ...] = ()
    """Per shard, its dataset's root and (`versions`) version, when the set joins the shards
    of several datasets (a `Mixture`'s members, read through one reader); else `root`."""
    versions: tuple[int, ...] = ()
    probe_spans: tuple[tuple[int, int], ...] = ()
    """Where shards are flat (format versions 2 and 3), per shard the (byte offset in its
    data, bytes) of its probe row: rows have no one size there."""
    encoded: bool = False
    """Whether samples are stored encoded (format version 3, `etl.format.codecs`): each shard
    is one flat array of their stored bytes, whatever `sample_shape` says of their pixels."""

    @property
    def flat(self) -> bool:
        """Whether each shard is one flat array and a sample's place is its `Selection.places`
        row: samples that keep their aspect ratio (format version 2) or stored encoded (3)."""
        return 0 in self.sample_shape or self.encoded

    @property
    def ragged(self) -> bool:
        """The former name of `flat` (the layout; "ragged" is a sample of its own size)."""
        warn_once("ShardSet.ragged", "ShardSet.flat", stacklevel=3)
        return self.flat

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The shape a shard file is checked against (`etl.format.shards.check_shard`)."""
        return (0,) if self.encoded else self.sample_shape

    def path(self, shard: int) -> Path:
        return (self.roots[shard] if self.roots else self.root) / self.names[shard]

    def unreadable(self, shard: int, cause: Exception) -> ShardError:
        """The error for a shard that cannot be read: the cause, which samples of the version
        live in it, and the command that repairs them (the manifest is read again only now)."""
        name = self.names[shard]
        reason = str(cause) if isinstance(cause, EtlError) else f"{self.path(shard)}: {cause}"
        root = self.roots[shard] if self.roots else self.root
        version = self.versions[shard] if self.versions else self.version
        try:
            samples = read_manifest(root, version, verify=False).samples
            ids = samples.filter(pc.field("shard") == name).column("sample_id").to_pylist()
        except EtlError:
            ids = []
        listed = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        held = f"; it holds {len(ids)} sample(s) of version {version} ({listed})"
        return ShardError(
            f"{reason}{held if ids else ''}; repair: etl audit {self.url or root} "
            f"--version {version} --repair --config pipeline.yaml"
        )

    def __len__(self) -> int:
        return len(self.names)


@dataclass(frozen=True, eq=False)
class Selection:
    """Samples to read, ordered by (shard, row) so that neighbouring indices are neighbours on disk.

    Index `i` of a dataset built on this selection is sample `positions[i]` of `Catalog.table`
    (`catalog.table.take(selection.positions)` gives the matching manifest rows).
    """

    shards: ShardSet
    shard_idx: NDArray[np.int32]
    rows: NDArray[np.int32]
    labels: NDArray[np.int32]
    positions: NDArray[np.int64]
    classes: tuple[str, ...]
    layout: str
    version: int
    values: SampleValues | None = None
    """The per-sample columns its batches carry (`Catalog.with_columns`), in its order."""
    view: str = ""
    """The fingerprint of the view it was selected by (`Catalog.select_view`): a resume state
    records it, so a run resumed on a view that changed is refused."""
    places: NDArray[np.int64] | None = None
    """Where shards are flat (samples that keep their aspect ratio, format version 2, or
    stored encoded, 3): per sample, in this order, (byte offset in its shard's data, height,
    width)."""
    stored: NDArray[np.int64] | None = None
    """Where samples are stored encoded (format version 3): per sample, in this order, (stored
    bytes, codec: its index in `etl.format.codecs.CODECS`)."""

    @property
    def own_sizes(self) -> bool:
        """Whether each sample has its own height and width (they keep their aspect ratio):
        batches are padded and carry each one's size (`SIZE_COLUMNS`)."""
        return 0 in self.shards.sample_shape

    @cached_property
    def sample_shape(self) -> tuple[int, ...]:
        """The stored sample shape; where samples keep their aspect ratio, the largest of each
        side among the selected (the shape of a padded batch that holds any of them)."""
        shape = self.shards.sample_shape
        if self.places is None:
            return shape
        height, width = (int(self.places[:, k].max(initial=1)) for k in (1, 2))
        return shape_of(height, width, channels_of(shape, self.layout), self.layout)

    @property
    def channels(self) -> int:
        return channels_of(self.shards.sample_shape, self.layout)

    def __len__(self) -> int:
        return len(self.positions)

    def sample_sizes(self) -> NDArray[np.int64]:
        """[len, 2]: the stored (height, width) of every sample, one for all in a fixed-size
        selection, each its own where samples keep their aspect ratio."""
        if self.places is not None:
            return self.places[:, 1:].copy()
        shape = self.sample_shape
        sides = shape[:2] if self.layout == "HWC" else shape[1:]
        return np.tile(np.asarray(sides, np.int64), (len(self), 1))

    @cached_property
    def fingerprint(self) -> str:
        """A digest of which manifest rows this selection holds, in which order (resume states
        record it, so a state is never applied to another split or filter)."""
        return hashlib.blake2b(self.positions.tobytes(), digest_size=8).hexdigest()

    def manifest_rows(self, indices: Any) -> pa.Table:
        """The manifest rows of indices into this selection, in their order: index, sample_id,
        source, class_name, label, split, shard and row, then the version's per-sample columns
        (a caption, boxes: `columns:` in pipeline.yaml). Negative indices count from the end.

        The version's manifest is read (and checked against its commit record) once per process
        and selection, on the first call.
        """
        index = np.asarray(indices, dtype=np.int64).reshape(-1)
        try:
            positions = self.positions[index]
        except IndexError:
            raise IndexError(f"index out of range for a selection of {len(self)}") from None
        table = _MANIFEST_ROWS.get(self)
        if table is None:
            manifest = read_manifest(self.shards.root, self.version)
            declared = [f.name for f in manifest.meta.column_fields]
            wanted = [*MANIFEST_ROW_COLUMNS, *declared]
            table = _MANIFEST_ROWS[self] = manifest.samples.select(wanted)
        rows = table.take(pa.array(positions))
        return rows.add_column(0, "index", pa.array(index % max(len(self), 1)))


MANIFEST_ROW_COLUMNS = ("sample_id", "source", "class_name", "label", "split", "shard", "row")
"""The manifest columns `Selection.manifest_rows` returns."""

_MANIFEST_ROWS: weakref.WeakKeyDictionary[Selection, pa.Table] = weakref.WeakKeyDictionary()
"""Manifest columns read for `manifest_rows`, per selection object (never pickled to workers)."""


class Catalog(VersionContents):
    """One committed version of a packed dataset (`etl.format.contents.VersionContents`: classes,
    shape, layout, splits, counts), from which datasets select samples."""

    def select(
        self,
        split: str | Sequence[str] | None = None,
        classes: Sequence[str | int] | None = None,
        where: Where | None = None,
    ) -> Selection:
        """The samples that pass every given filter (all samples if none is given).

        `split` names one split or several; `classes` are class names or label numbers.
        An unknown split or class name is an error (a ValueError) that lists the valid ones.
        """
        return self._selection(np.flatnonzero(self.mask(split, classes, where)))

    def select_view(self, view: View) -> Selection:
        """The samples of `view` (`etl.format.views`), which must be of this version when it
        pins one."""
        if view.version is not None and view.version != self.version:
            raise SelectionError(
                f"{self.manifest.path}: is version {self.version}, the view pins {view.version}"
            )
        selection = self._selection(np.flatnonzero(view.mask(self)))
        return replace(selection, view=view.fingerprint(self.version))

    def with_columns(self, selection: Selection, names: Sequence[str] | None) -> Selection:
        """`selection` whose batches carry the per-sample columns `names` (None: none): a
        SelectionError for a name the version does not declare."""
        if names is None:
            return selection
        if isinstance(names, str):
            raise TypeError(f"columns is a list of names, e.g. columns=[{names!r}]")
        declared = {f.name for f in self.manifest.meta.column_fields}
        values = SampleValues.of(self.table, selection.positions, list(names), declared)
        return replace(selection, values=values)

    def _check_declared(self, places: NDArray[np.int64], positions: NDArray[np.int64]) -> None:
        """ManifestError naming the sample whose declared size is over the reader's cap."""
        worst = _largest_over_cap(places)
        if worst is not None:
            source = self.table.column("source")[int(positions[worst])].as_py()
            height, width = (int(v) for v in places[worst, 1:])
            raise ManifestError(
                f"{self.root}: sample {source!r} declares {height}x{width} pixels, over the "
                f"reader's cap of {max_pixels():,} (ETL_MAX_PIXELS raises it): not opened"
            )

    def _selection(self, positions: NDArray[np.int64]) -> Selection:
        shards = self.manifest.shards
        codes = self.manifest.shard_index[positions]
        present = np.bincount(codes, minlength=shards.num_rows) > 0
        used = np.flatnonzero(present)
        shard_idx = (np.cumsum(present) - 1)[codes]  # renumbered 0.. over the shards used
        rows = self.table.column("row").to_numpy()[positions]
        shard_rows = shards.column("rows").to_numpy()[used]
        order = _disk_order(shard_idx, rows)
        names = shards.column("shard").to_pylist()
        checksums = shards.column("checksum").to_pylist()
        # The first selected sample of each shard used, in (shard, row) order: its probe.
        by_disk = shard_idx[order]
        firsts = np.flatnonzero(np.r_[len(order) > 0, by_disk[1:] != by_disk[:-1]])
        probe_rows = rows[order][firsts].tolist()
        taken = pa.array(positions[order][firsts], pa.int64())
        probe_sums = self.table.column("checksum").take(taken).to_pylist()
        shard_set = ShardSet(
            root=self.root,
            names=tuple(names[i] for i in used),
            rows=_frozen(shard_rows.astype(np.int64)),
            checksums=tuple(checksums[i] for i in used),
            algorithm=self.manifest.meta.checksum,
            sample_shape=self.sample_shape,
            version=self.version,
            probes=tuple(zip(probe_rows, probe_sums, strict=True)),
            sizes=tuple(shards.column("bytes").to_numpy()[used].tolist()),
        )
        labels = self.table.column("label").to_numpy()
        places = stored = None
        meta = self.manifest.meta
        if meta.ragged:
            taken = pa.array(positions[order], pa.int64())
            columns = self.table.select(["sample_offset", "sample_height", "sample_width"])
            places = np.stack(
                [c.to_numpy().astype(np.int64) for c in columns.take(taken).columns], axis=1
            ).reshape(-1, 3)
            channels = channels_of(self.sample_shape, self.layout)
            sizes = places[firsts, 1] * places[firsts, 2] * channels
            if meta.encoded:
                self._check_declared(places, positions[order])
                stored = _stored(self.table.take(taken))
                sizes = stored[firsts, 0]
            spans = zip(places[firsts, 0].tolist(), sizes.tolist(), strict=True)
            shard_set = replace(shard_set, probe_spans=tuple(spans), encoded=meta.encoded)
        return Selection(
            shards=shard_set,
            shard_idx=_frozen(shard_idx[order].astype(np.int32)),
            rows=_frozen(rows[order].astype(np.int32)),
            labels=_frozen(labels[positions[order]].astype(np.int32)),
            positions=_frozen(positions[order].astype(np.int64)),
            classes=self.classes,
            layout=self.layout,
            version=self.version,
            places=None if places is None else _frozen(places),
            stored=None if stored is None else _frozen(stored),
        )


def _largest_over_cap(places: NDArray[np.int64]) -> int | None:
    """The position in `places` of the largest declared size, where it is over the reader's
    cap (NOTE [ bounded decodes ] in etl.format.codecs); None where none is."""
    pixels = places[:, 1] * places[:, 2]
    if not len(pixels) or int(pixels.max()) <= max_pixels():
        return None
    return int(np.argmax(pixels))


def _stored(samples: pa.Table) -> NDArray[np.int64]:
    """[n, 2]: each sample's (stored bytes, codec code) of a version stored encoded."""
    codes = stored_codes(samples.column("sample_codec")).astype(np.int64)
    nbytes = samples.column("sample_bytes").to_numpy().astype(np.int64)
    return np.stack([nbytes, codes], axis=1).reshape(-1, 2)


def open_catalog(
    path: Path | str, version: int | None = None, verify_manifest: bool = True
) -> Catalog:
    """Open a dataset directory, a version directory or a manifest.arrow file.

    The latest version unless `version` pins one. Raises `ManifestError` for an unknown format
    version, a file changed since its commit (unless `verify_manifest=False`), a missing or
    mistyped column, a label outside the classes, a shard path outside the dataset, or rows past
    the end of a shard.
    """
    return Catalog(read_manifest(path, version, verify=verify_manifest))


def _disk_order(shard_idx: NDArray[np.intp], rows: NDArray[np.int64]) -> NDArray[np.intp]:
    """The order that sorts samples by (shard, row): one stable sort of a combined 64-bit key,
    twice as fast as a two-key lexsort on a 10M-row selection (and faster than scattering into
    a table of stored rows, whose page faults cost more than the sort). Equal keys (two
    samples sharing a stored row) keep their manifest order."""
    key = shard_idx.astype(np.int64) << 32 | rows.astype(np.int64)
    return np.argsort(key, kind="stable")
