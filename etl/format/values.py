"""The per-sample column values a dataset hands out with its batches (`columns=["caption"]`):
each column of a selection taken once, in the selection's order, and how it is batched.

A column is batched as an array (a tensor in the loaders) when every selected value has one
shape: a number or bool with no null, or lists of one length (nested lists too: boxes of 4
numbers, an embedding); otherwise as a Python list of its values (text, structs, lists of any
length, values with nulls). Decided once for the whole selection, so every batch of a column
has the same form."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from etl.errors import SelectionError

Value = NDArray[np.generic] | list[object]
"""A batch of one column: an array [B, ...] or a list of B Python values."""


@dataclass(frozen=True, eq=False)
class SampleValues:
    """Named columns of a selection, row i the value of sample i."""

    names: tuple[str, ...]
    arrays: tuple[pa.Array, ...]
    dense: tuple[NDArray[np.generic] | None, ...]
    """Per column, all its values as one array (`dense_values`), or None: batched as lists."""

    @classmethod
    def of(
        cls, table: pa.Table, positions: NDArray[np.int64], names: Sequence[str], declared: set[str]
    ) -> SampleValues:
        """`names` of the `table` rows at `positions`; a name not in `declared` (the version's
        per-sample columns) is a SelectionError listing them."""
        unknown = [name for name in names if name not in declared]
        if unknown:
            raise SelectionError(
                f"no per-sample column {unknown}; this version has {sorted(declared) or 'none'} "
                "(columns: in pipeline.yaml)"
            )
        if len(set(names)) != len(names):
            raise SelectionError(f"columns {list(names)} names a column twice")
        taken = pa.array(positions, pa.int64())
        arrays = tuple(table.column(name).take(taken).combine_chunks() for name in names)
        return cls(tuple(names), arrays, tuple(dense_values(a) for a in arrays))

    def batch(self, index: NDArray[np.int64]) -> dict[str, Value]:
        """Each column's values at `index` (positions in the selection)."""
        found: dict[str, Value] = {}
        for name, array, dense in zip(self.names, self.arrays, self.dense, strict=True):
            if dense is not None:
                found[name] = dense[index]
            else:
                found[name] = array.take(pa.array(index, pa.int64())).to_pylist()
        return found


def dense_values(array: pa.Array) -> NDArray[np.generic] | None:
    """The values of `array` as one numpy array [N, ...], when they all have one shape and no
    null (numbers, bools, lists of one length, nested); None otherwise."""
    if array.null_count:
        return None
    kind = array.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return np.asarray(array.to_numpy(zero_copy_only=False))
    if pa.types.is_list(kind):
        lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
        if len(lengths) and (lengths != lengths[0]).any():
            return None
        inner = dense_values(array.flatten())
        if inner is None:
            return None
        width = int(lengths[0]) if len(lengths) else 0
        return inner.reshape(len(array), width, *inner.shape[1:])
    return None
