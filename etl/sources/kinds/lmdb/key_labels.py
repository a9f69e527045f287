"""An LMDB source's labels file (key, label, split) as a lookup that keeps no Python object
per key: 10M keys as a dict of tuples took about 2 GB; here they take 21 B each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xxhash
from numpy.typing import NDArray

from etl.errors import SourceError
from etl.sources.kinds.listing import line_name, listing_batches, listing_cell, table_column

KEY_BYTES = 16
"""A key is looked up by its 128-bit xxh3 hash: two keys that share them are
taken for one (about 1 in 10^24 for 10M keys)."""


class KeyLabels:
    """key -> (label, split) of a CSV/TSV/Parquet file with columns key, label and optionally
    split, keys spelt as `source` (see etl/format/names.py). Keys are sorted hashes (numpy);
    labels and splits are int32 codes into the distinct names, so the cost per key does not
    depend on how long keys or labels are. The file is read a batch at a time.

    A key listed twice or empty is a SourceError naming its line; an empty label reads as
    no label (the record is then a reject)."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise SourceError(f"source.labels: {path} is not a file")
        schema, batches = listing_batches(path, text_columns=("key", "label", "split"))
        for name in ("key", "label"):
            if name not in schema.names:
                raise SourceError(
                    f"{path}: no column {name!r}; columns are {schema.names} "
                    "(expected key, label and optionally split)"
                )
        self.names: list[str] = []
        """Every distinct label, then split, text: what the codes index."""
        codes: dict[str, int] = {}
        hashes: list[NDArray[np.bytes_]] = []
        labels: list[NDArray[np.int32]] = []
        splits: list[NDArray[np.int32]] = []

        def code(text: str | None) -> int:
            if not text:
                return -1
            found = codes.get(text)
            if found is None:
                found = codes[text] = len(self.names)
                self.names.append(text)
            return found

        rows = 0
        for batch in batches:
            keys = table_column(batch, "key", path, required=True)
            label_cells = table_column(batch, "label", path, required=True)
            split_cells = table_column(batch, "split", path, required=False)
            assert keys is not None and label_cells is not None
            hashed = []
            for i, key in enumerate(keys):
                if not key:
                    raise SourceError(f"{path}:{line_name(path, [], rows + i)}: empty key")
                hashed.append(key_hash(key))
            hashes.append(np.array(hashed, dtype=f"S{KEY_BYTES}"))
            labels.append(np.array([code((t or "").strip()) for t in label_cells], np.int32))
            splits.append(np.array([code(t) for t in split_cells or [None] * len(keys)], np.int32))
            rows += len(keys)
        every = np.concatenate([np.empty(0, f"S{KEY_BYTES}"), *hashes])
        order = np.argsort(every, kind="stable")
        self._keys = every[order]
        twice = np.flatnonzero(self._keys[1:] == self._keys[:-1])
        if len(twice):
            first, again = (int(order[twice[0]]), int(order[twice[0] + 1]))
            key = listing_cell(path, "key", again)
            raise SourceError(
                f"{path}:{line_name(path, [], again)}: key {key!r} is listed twice "
                f"(also {line_name(path, [], first)})"
            )
        self._labels = np.concatenate([np.empty(0, np.int32), *labels])[order]
        self._splits = np.concatenate([np.empty(0, np.int32), *splits])[order]

    def __len__(self) -> int:
        return len(self._keys)

    def get(self, key: str) -> tuple[str | None, str | None]:
        """(label, split) of `key`; (None, None) for a key the file does not list."""
        probe = np.array([key_hash(key)], dtype=self._keys.dtype)
        at = int(np.searchsorted(self._keys, probe)[0])
        if at == len(self._keys) or self._keys[at] != probe[0]:
            return None, None
        label, split = int(self._labels[at]), int(self._splits[at])
        return (
            self.names[label] if label >= 0 else None,
            self.names[split] if split >= 0 else None,
        )


def key_hash(key: str) -> bytes:
    return xxhash.xxh3_128_digest(key.encode("utf-8", "surrogateescape"))
