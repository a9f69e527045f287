"""What to read: one manifest version opened through `etl.format.manifest`, and selections of it.

A `Catalog` is the opened manifest (Arrow tables, classes, shape, layout, splits, counts). A
`Selection` is what a dataset needs from it: compact, read-only numpy arrays (shard index, row,
label per sample) plus the shard table, small enough to pickle to every worker process.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from etl.errors import EtlError, ShardError
from etl.format.manifest import Manifest, read_manifest

Where: TypeAlias = "pc.Expression | Callable[[pa.Table], Any]"
"""A row predicate on the samples table: a pyarrow compute Expression, or a callable that takes
the table and returns one boolean per row (numpy or Arrow; null counts as False)."""


def _frozen(array: NDArray[Any]) -> NDArray[Any]:
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class ShardSet:
    """The shards a selection reads, as the manifest's shards table records them."""

    root: Path
    names: tuple[str, ...]
    """Paths relative to `root`, already checked by `etl.format.manifest.check_shard_name`."""
    rows: NDArray[np.int64]
    checksums: tuple[str, ...]
    algorithm: str
    """The checksum algorithm of `checksums` (the manifest's `output.checksum`)."""
    sample_shape: tuple[int, ...]
    version: int
    """The manifest version these shards were selected from (for error messages)."""

    def path(self, shard: int) -> Path:
        return self.root / self.names[shard]

    def unreadable(self, shard: int, cause: Exception) -> ShardError:
        """The error for a shard that cannot be read: the cause, which samples of the version
        live in it, and the command that repairs them (the manifest is read again only now)."""
        name = self.names[shard]
        reason = str(cause) if isinstance(cause, EtlError) else f"{self.path(shard)}: {cause}"
        try:
            samples = read_manifest(self.root, self.version, verify=False).samples
            ids = samples.filter(pc.field("shard") == name).column("sample_id").to_pylist()
        except EtlError:
            ids = []
        listed = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        held = f"; it holds {len(ids)} sample(s) of version {self.version} ({listed})"
        return ShardError(
            f"{reason}{held if ids else ''}; repair: etl audit {self.root} "
            f"--version {self.version} --repair --config pipeline.yaml"
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

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.shards.sample_shape

    def __len__(self) -> int:
        return len(self.positions)

    @cached_property
    def fingerprint(self) -> str:
        """A digest of which manifest rows this selection holds, in which order (resume states
        record it, so a state is never applied to another split or filter)."""
        return hashlib.blake2b(self.positions.tobytes(), digest_size=8).hexdigest()

    def manifest_rows(self, indices: Any) -> pa.Table:
        """The manifest rows of indices into this selection, in their order: index, sample_id,
        source, class_name, label, split, shard and row. Negative indices count from the end.

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
            samples = read_manifest(self.shards.root, self.version).samples
            table = _MANIFEST_ROWS[self] = samples.select(list(MANIFEST_ROW_COLUMNS))
        rows = table.take(pa.array(positions))
        return rows.add_column(0, "index", pa.array(index % max(len(self), 1)))


MANIFEST_ROW_COLUMNS = ("sample_id", "source", "class_name", "label", "split", "shard", "row")
"""The manifest columns `Selection.manifest_rows` returns."""

_MANIFEST_ROWS: weakref.WeakKeyDictionary[Selection, pa.Table] = weakref.WeakKeyDictionary()
"""Manifest columns read for `manifest_rows`, per selection object (never pickled to workers)."""


@dataclass(frozen=True)
class Catalog:
    """One committed version of a packed dataset, opened and checked by `etl.format.manifest`."""

    manifest: Manifest

    @property
    def root(self) -> Path:
        return self.manifest.root

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def table(self) -> pa.Table:
        """The samples table (one row per packed sample, manifest order)."""
        return self.manifest.samples

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names; label `i` is `classes[i]`."""
        return self.manifest.meta.classes

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Stored shape of one sample, e.g. (64, 64, 3) for HWC."""
        return self.manifest.meta.sample_shape

    @property
    def layout(self) -> str:
        """'HWC' or 'CHW': the axis order of `sample_shape`."""
        return self.manifest.meta.layout

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(sorted(pc.unique(self.table.column("split")).to_pylist()))

    @property
    def counts(self) -> dict[str, int]:
        """Samples per split."""
        return _value_counts(self.table.column("split"))

    def class_counts(self, split: str | None = None) -> dict[str, int]:
        """Samples per class name (every class listed, zeros included), in one split or all."""
        table = self.table if split is None else self.table.filter(pc.field("split") == split)
        found = np.bincount(table.column("label").to_numpy(), minlength=len(self.classes))
        return {name: int(n) for name, n in zip(self.classes, found, strict=True)}

    def select(
        self,
        split: str | Sequence[str] | None = None,
        classes: Sequence[str | int] | None = None,
        where: Where | None = None,
    ) -> Selection:
        """The samples that pass every given filter (all samples if none is given).

        `split` names one split or several; `classes` are class names or label numbers.
        An unknown split or class name is an error that lists the valid ones.
        """
        table = self.table
        mask = np.ones(table.num_rows, dtype=bool)
        if split is not None:
            wanted = [split] if isinstance(split, str) else list(split)
            unknown = sorted(set(wanted) - set(self.splits))
            if unknown:
                raise ValueError(
                    f"{self.manifest.path}: no split {unknown}; splits are {list(self.splits)}"
                )
            mask &= _bool_mask(pc.is_in(table.column("split"), pa.array(wanted, pa.string())))
        if classes is not None:
            mask &= np.isin(table.column("label").to_numpy(), self._labels_of(classes))
        if where is not None:
            mask &= self._where_mask(where)
        return self._selection(np.flatnonzero(mask))

    def _labels_of(self, classes: Sequence[str | int]) -> NDArray[np.int64]:
        index = {name: i for i, name in enumerate(self.classes)}
        labels = []
        for c in classes:
            label = index.get(c) if isinstance(c, str) else int(c)
            if label is None or not 0 <= label < len(self.classes):
                raise ValueError(f"unknown class {c!r}; classes are {list(self.classes)}")
            labels.append(label)
        return np.asarray(labels, dtype=np.int64)

    def _where_mask(self, where: Where) -> NDArray[np.bool_]:
        table = self.table
        if isinstance(where, pc.Expression):
            # NOTE: Table.filter keeps rows, not a mask; a row-number column carries them through.
            numbered = table.append_column("__row", pa.array(np.arange(table.num_rows)))
            kept = numbered.filter(where).column("__row").to_numpy()
            mask = np.zeros(table.num_rows, dtype=bool)
            mask[kept] = True
            return mask
        result = where(table)
        mask = _bool_mask(result)
        if mask.shape != (table.num_rows,):
            raise ValueError(
                f"where= returned {mask.shape[0] if mask.ndim else 'a scalar'} values for "
                f"{table.num_rows} rows; it must return one boolean per row"
            )
        return mask

    def _selection(self, positions: NDArray[np.int64]) -> Selection:
        samples, shards = self.manifest.samples, self.manifest.shards
        codes = _codes(samples.column("shard"), shards.column("shard"))[positions]
        used, shard_idx = np.unique(codes, return_inverse=True)
        rows = samples.column("row").to_numpy()[positions]
        order = np.lexsort((rows, shard_idx))
        names = shards.column("shard").to_pylist()
        checksums = shards.column("checksum").to_pylist()
        shard_set = ShardSet(
            root=self.root,
            names=tuple(names[i] for i in used),
            rows=_frozen(shards.column("rows").to_numpy()[used].astype(np.int64)),
            checksums=tuple(checksums[i] for i in used),
            algorithm=self.manifest.meta.checksum,
            sample_shape=self.sample_shape,
            version=self.version,
        )
        return Selection(
            shards=shard_set,
            shard_idx=_frozen(shard_idx[order].astype(np.int32)),
            rows=_frozen(rows[order].astype(np.int32)),
            labels=_frozen(samples.column("label").to_numpy()[positions][order].astype(np.int32)),
            positions=_frozen(positions[order].astype(np.int64)),
            classes=self.classes,
            layout=self.layout,
            version=self.version,
        )


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


def _codes(values: pa.ChunkedArray, names: pa.ChunkedArray) -> NDArray[np.int64]:
    """Position of each value in `names` (the manifest guarantees every value is there)."""
    found = pc.index_in(values, value_set=names.combine_chunks())
    return found.to_numpy(zero_copy_only=False).astype(np.int64)


def _bool_mask(result: Any) -> NDArray[np.bool_]:
    if isinstance(result, pa.ChunkedArray | pa.Array):
        return np.asarray(pc.fill_null(result, False).to_numpy(zero_copy_only=False), dtype=bool)
    return np.asarray(result, dtype=bool)


def _value_counts(column: pa.ChunkedArray) -> dict[str, int]:
    counts = pc.value_counts(column).to_pylist()
    return {c["values"]: int(c["counts"]) for c in sorted(counts, key=lambda c: c["values"])}
