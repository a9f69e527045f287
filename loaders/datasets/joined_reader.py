"""One reader over every member's shards of a `Mixture` (the same files mapped once,
whichever members select from them), with the members' row checksums joined, so a mixture
batch is one gather as a single dataset's is (`join_members`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from etl.format.row_checksums import RowChecksums
from loaders.datasets.packed import PackedDataset
from loaders.order.orders import Order
from loaders.read.catalog import ShardSet
from loaders.read.reader import ShardReader
from loaders.read.row_checks import shared, unseen


@dataclass(frozen=True, eq=False)
class JoinedMembers:
    """Every member's shards in one `ShardSet` read by one `ShardReader` (the same files
    mapped once, whichever members select from them), and each mixture index's shard, row
    and label in it: a mixture batch is then one gather, as a single dataset's is."""

    reader: ShardReader
    shard_idx: NDArray[np.int32]
    rows: NDArray[np.int32]
    labels: NDArray[np.int64]


def checked_rows_of(
    joined: ShardSet, sets: Sequence[ShardSet], remaps: Sequence[NDArray[np.int32]]
) -> ShardSet:
    """`joined` with its members' row checksums (`sets`, each numbered by `remaps` into the
    joined shards), one entry a row read by several members, and flags of its own with
    `verify="once"`."""
    keys, digests, known = [], [], []
    for shards, remap in zip(sets, remaps, strict=True):
        assert shards.row_sums is not None
        member_keys, member_digests = shards.row_sums.arrays()
        shard = remap[member_keys >> 32].astype(np.int64)
        keys.append((shard << 32) | (member_keys & 0xFFFFFFFF))
        digests.append(member_digests)
        member_known = shards.row_sums.known
        known.append(np.ones(len(member_keys), bool) if member_known is None else member_known)
    merged, first = np.unique(np.concatenate(keys), return_index=True)
    all_known = np.concatenate(known)[first]
    sums = shared(
        RowChecksums(
            merged,
            np.concatenate(digests)[first],
            joined.algorithm,
            None if all_known.all() else all_known,
        )
    )
    return replace(
        joined,
        row_sums=sums,
        seen_rows=None if sets[0].seen_rows is None else unseen(len(merged)),
    )


def join_members(members: Sequence[PackedDataset], labels: Sequence[Order]) -> JoinedMembers | None:
    """The joined reader of `members`, or None where they cannot share one: shards read
    through a bounded cache or by ranged GETs, rows checked by some members and not others
    (or "rows" and "once"), another checksum algorithm, or readers set up otherwise."""
    sets = [m.selection.shards for m in members]
    if len({m.reader.settings for m in members}) > 1 or len({s.algorithm for s in sets}) > 1:
        return None
    if len({s.sample_shape for s in sets}) > 1 or any(s.flat for s in sets):
        return None  # a reader reads one sample shape
    if any(s.cache is not None or s.ranged is not None for s in sets):
        return None
    if len({(s.row_sums is None, s.seen_rows is None) for s in sets}) > 1:
        return None
    at: dict[tuple[Path, str], int] = {}
    names: list[str] = []
    roots: list[Path] = []
    versions: list[int] = []
    rows: list[int] = []
    sums: list[str] = []
    probes: list[tuple[int, str] | None] = []
    sizes: list[int | None] = []
    remaps = []
    for shards in sets:
        remap = []
        for i, name in enumerate(shards.names):
            key = (shards.root, name)
            if key not in at:
                at[key] = len(names)
                names.append(name)
                roots.append(shards.root)
                versions.append(shards.version)
                rows.append(int(shards.rows[i]))
                sums.append(shards.checksums[i])
                probes.append(shards.probes[i] if shards.probes else None)
                sizes.append(shards.sizes[i] if shards.sizes else None)
            remap.append(at[key])
        remaps.append(np.asarray(remap, dtype=np.int32))
    first = sets[0]
    joined = replace(
        first,
        names=tuple(names),
        rows=np.asarray(rows, dtype=np.int64),
        checksums=tuple(sums),
        probes=tuple(p for p in probes if p is not None) if all(probes) else (),
        sizes=tuple(s for s in sizes if s is not None) if all(s is not None for s in sizes)
        else (),
        roots=tuple(roots),
        versions=tuple(versions),
    )  # fmt: skip
    if first.row_sums is not None:
        joined = checked_rows_of(joined, sets, remaps)
    reader = members[0].reader.like(joined)
    selections = [m.selection for m in members]
    return JoinedMembers(
        reader,
        np.concatenate([r[s.shard_idx] for r, s in zip(remaps, selections, strict=True)]),
        np.concatenate([s.rows for s in selections]),
        np.concatenate([lab[s.labels] for lab, s in zip(labels, selections, strict=True)]),
    )
