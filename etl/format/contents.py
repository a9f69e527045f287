"""The one read-only view of a committed version: what it holds (classes, shape, layout,
splits, counts) and which rows a filter keeps. `loaders.read.catalog.Catalog` (for training) and
`etl.explore.dataset.Dataset` (for looking) are both this view, so a split, a class or a count
means the same in each, and a bad filter is the same error."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from etl.errors import SelectionError
from etl.format.coherence import ENCODED_COLUMNS, RAGGED_COLUMNS
from etl.format.manifest import Manifest
from etl.format.predicate import sql_mask
from etl.format.schema import ordered_splits
from etl.format.table_ops import bool_mask, value_codes

Where: TypeAlias = "str | pc.Expression | Callable[[pa.Table], Any]"
"""A row predicate on the samples table: a SQL `WHERE` condition (text, run by duckdb, e.g.
"split = 'train' AND len(caption) > 20"), a pyarrow compute Expression, or a callable that takes
the table and returns one boolean per row (numpy or Arrow; null counts as False). The table
holds the manifest's columns and the version's per-sample ones (`columns:`)."""


class VersionContents:
    """One committed version of a packed dataset, opened and checked by `read_manifest`."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest

    @property
    def root(self) -> Path:
        return self.manifest.root

    @property
    def version(self) -> int:
        return self.manifest.version

    @cached_property
    def table(self) -> pa.Table:
        """The samples table: one row per packed sample, sorted by `source` (docs/FORMAT.md);
        without the `sample_*` columns its format version lacks."""
        samples, meta = self.manifest.samples, self.manifest.meta
        absent = (() if meta.ragged else RAGGED_COLUMNS) + (() if meta.encoded else ENCODED_COLUMNS)
        return samples.drop_columns([c for c in absent if c in samples.column_names])

    @property
    def rejects(self) -> pa.Table:
        """One row per listed source that was not packed: source, reason, message, ..."""
        return self.manifest.rejects

    @property
    def shards(self) -> pa.Table:
        """One row per shard this version references: shard, rows, bytes, checksums."""
        return self.manifest.shards

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

    @cached_property
    def _split_codes(self) -> tuple[tuple[str, ...], NDArray[np.int32]]:
        """The split names present and each sample's index into them: one hashing pass over
        the split column, after which every split count and filter is integer work."""
        return value_codes(self.table.column("split"))

    @cached_property
    def splits(self) -> tuple[str, ...]:
        """The splits that hold samples: train, val, test, then any others by name."""
        return tuple(ordered_splits(self._split_codes[0]))

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def split_counts(self) -> dict[str, int]:
        """Samples per split, in `splits` order."""
        names, codes = self._split_codes
        found = dict(zip(names, np.bincount(codes, minlength=len(names)).tolist(), strict=True))
        return {split: found[split] for split in self.splits}

    def class_counts(self, split: str | None = None) -> dict[str, int]:
        """Samples per class name (every class listed, zeros included), in one split or all."""
        labels = self.table.column("label").to_numpy()
        if split is not None:
            labels = labels[self._in_splits([split])]
        found = np.bincount(labels, minlength=len(self.classes))
        return {name: int(n) for name, n in zip(self.classes, found, strict=True)}

    def counts(self, mask: NDArray[np.bool_] | None = None) -> dict[str, dict[str, int]]:
        """Samples per split and class: {split: {class: n}}, every class listed (zeros too);
        one counting pass over (split, label) pairs, not one filter per split. With `mask`
        (one boolean per sample, `mask()` or a view's), only the samples it keeps."""
        names, codes = self._split_codes
        n_classes = len(self.classes)
        pairs = codes.astype(np.int64) * n_classes + self.table.column("label").to_numpy()
        if mask is not None:
            pairs = pairs[mask]
        found = np.bincount(pairs, minlength=len(names) * n_classes).reshape(-1, n_classes)
        by_split = {name: found[i] for i, name in enumerate(names)}
        return {
            split: {c: int(n) for c, n in zip(self.classes, by_split[split], strict=True)}
            for split in self.splits
        }

    def _in_splits(self, wanted: Sequence[str]) -> NDArray[np.bool_]:
        names, codes = self._split_codes
        return np.isin(np.asarray(names, dtype=object), list(wanted)).astype(bool)[codes]

    def mask(
        self,
        split: str | Sequence[str] | None = None,
        classes: Sequence[str | int] | None = None,
        where: Where | None = None,
    ) -> NDArray[np.bool_]:
        """One boolean per sample: in `split` (one name or several), of `classes` (names or
        label numbers) and passing `where`. An unknown split or class is a SelectionError
        that lists the valid ones."""
        table = self.table
        mask = np.ones(table.num_rows, dtype=bool)
        if split is not None:
            wanted = [split] if isinstance(split, str) else list(split)
            unknown = sorted(set(wanted) - set(self.splits))
            if unknown:
                raise SelectionError(
                    f"{self.manifest.path}: no split {unknown} in version {self.version}; "
                    f"splits are {list(self.splits)}"
                )
            mask &= self._in_splits(wanted)
        if classes is not None:
            wanted_labels = np.zeros(len(self.classes), dtype=bool)
            wanted_labels[self.labels_of(classes)] = True
            mask &= wanted_labels[table.column("label").to_numpy()]  # a lookup, not a search
        if where is not None:
            mask &= self._where_mask(where)
        return mask

    def labels_of(self, classes: Sequence[str | int]) -> NDArray[np.int64]:
        """The labels of class names or label numbers; SelectionError for an unknown one."""
        index = {name: i for i, name in enumerate(self.classes)}
        labels = [index.get(c, -1) if isinstance(c, str) else int(c) for c in classes]
        pairs = zip(classes, labels, strict=True)
        unknown = [c for c, label in pairs if not 0 <= label < len(self.classes)]
        if unknown:
            raise SelectionError(
                f"no class {unknown}; classes: {list(self.classes)} (label i is classes[i]; "
                f"the classes are numbered 0 to {len(self.classes) - 1})"
            )
        return np.asarray(labels, dtype=np.int64)

    def _where_mask(self, where: Where) -> NDArray[np.bool_]:
        table = self.table
        if isinstance(where, str):
            return sql_mask(table, where, self.manifest.path)
        if isinstance(where, pc.Expression):
            # NOTE: Table.filter keeps rows, not a mask; a row-number column carries them through.
            numbered = table.append_column("__row", pa.array(np.arange(table.num_rows)))
            kept = numbered.filter(where).column("__row").to_numpy()
            mask = np.zeros(table.num_rows, dtype=bool)
            mask[kept] = True
            return mask
        mask = bool_mask(where(table))
        if mask.shape != (table.num_rows,):
            raise SelectionError(
                f"where= returned {mask.shape[0] if mask.ndim else 'a scalar'} values for "
                f"{table.num_rows} rows; it must return one boolean per row"
            )
        return mask
