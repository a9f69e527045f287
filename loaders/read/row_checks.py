"""Which rows a loader checks against the checksums the manifest recorded for their samples,
and where those checksums live: the default open checks each row the first time any process
of the loader reads it (`verify="once"`, NOTE [ verify once ] in `loaders.read.shard_checks`), so a
changed byte in a shard is an error naming its shard and row, never a wrong sample."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import numpy as np
import pyarrow as pa
import torch

from etl.deprecations import warn_once
from etl.format.row_checksums import RowChecksums
from loaders.read.catalog import Catalog, Selection, open_catalog

Verify = bool | Literal["once", "rows", "shards"]
"""What a loader checks of the bytes it reads: "once" each row the first time any process of
the loader reads it, "rows" every row read, "shards" each shard whole once per process, False
only what every open checks (header, size, one probe row a shard). True is the old name of
"shards"."""

Checks = Literal["once", "rows", "shards", "off"]
"""A `Verify` by its one name each."""


def checks_of(verify: object) -> Checks:
    """`verify` by its name ("off" for False); True warns once that it is now "shards"."""
    if verify is True:
        warn_once("verify=True", 'verify="shards"')
        return "shards"
    if verify is False:
        return "off"
    if verify in ("once", "rows", "shards"):
        return verify
    raise ValueError(
        f"verify must be True, False, 'rows' or 'once' ('shards' is True's new name), "
        f"not {verify!r}"
    )


def row_checksums(catalog: Catalog, selection: Selection) -> RowChecksums:
    """The recorded checksum of each selected sample, by (shard, row), in shared memory."""
    keys = (selection.shard_idx.astype(np.int64) << 32) | selection.rows.astype(np.int64)
    order = np.argsort(keys, kind="stable")
    taken = pa.array(selection.positions[order], pa.int64())
    hex_digests = catalog.table.column("checksum").take(taken)
    return shared(RowChecksums.from_hex(keys[order], hex_digests, selection.shards.algorithm))


def shared(sums: RowChecksums) -> RowChecksums:
    """`sums` with its keys and digests in shared memory (a DataLoader worker started by spawn
    or forkserver then gets a handle to them, not a copy)."""
    keys, digests = sums.arrays()
    return RowChecksums(
        torch.from_numpy(np.ascontiguousarray(keys)).share_memory_(),
        torch.from_numpy(np.ascontiguousarray(digests)).share_memory_(),
        sums.algorithm,
        sums.known,
    )


def checked_rows(selection: Selection, sums: RowChecksums, once: bool) -> Selection:
    """`selection` with each row it reads checked against `sums`; with `once`, only the first
    time any process of its loader reads it (one flag a row, shared with the workers)."""
    seen = unseen(len(sums.arrays()[0])) if once else None
    return replace(selection, shards=replace(selection.shards, row_sums=sums, seen_rows=seen))


def unseen(rows: int) -> torch.Tensor:
    """`verify="once"`'s flags: per row, whether some process of the loader checked it."""
    return torch.zeros(rows, dtype=torch.bool).share_memory_()


def as_verified(selection: Selection, checks: Checks) -> Selection:
    """`selection` checked as `checks` says, for a reader built on it alone (`PackedStream`):
    the row checks it carries are kept (a `PackedDataset.open` made them), or made from its
    version's manifest, read again; "off" drops them, "shards" keeps what it carries."""
    if checks == "off":
        return replace(selection, shards=replace(selection.shards, row_sums=None, seen_rows=None))
    shards = selection.shards
    if checks == "shards" or shards.row_sums is not None:
        return selection
    catalog = open_catalog(shards.root, shards.version)
    return checked_rows(selection, row_checksums(catalog, selection), once=checks == "once")
