"""Mixtures: several datasets or views read as one, each sample's source drawn by weight, with
every guarantee of a single dataset's loader (batched gathers, workers, pinned memory, exact
and elastic resume, DDP shares).

Its order is `loaders.order.mixture_orders`' (NOTE [ mixture order ] there), drawn by
`loaders.order.samplers.MixtureSampler`; one reader joins its members' shards
(`loaders.datasets.joined_reader`).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray
from torch.utils.data import Dataset

from etl.format.flat import channels_of
from loaders.batch.forms import BackToBackBatch, PaddedBatch
from loaders.batch.types import (
    SIZE_COLUMNS,
    AnyBatch,
    ColumnBatch,
    Columns,
    IndexedBatch,
    Samples,
)
from loaders.datasets.joined_reader import join_members
from loaders.datasets.member_reads import (
    check_members,
    fill_back_to_back,
    fill_padded,
    fill_rows,
    member_parts,
    part_sizes,
)
from loaders.datasets.packed import PackedDataset
from loaders.memory.batch_memory import BatchMemory
from loaders.order.mixture_orders import schedule_of
from loaders.order.orders import Order
from loaders.order.samplers import MixtureSampler


class Mixture(Dataset[tuple[Any, ...]]):
    """Datasets (or views opened as datasets) read as one by weight: give it to `make_loader`
    as a dataset, and its order is the mixture's (`MixtureSampler`).

    Members must store one layout and channel count. Members of several sample sizes are
    padded into one batch (the largest of each side) that says each sample's own size
    (`SIZE_COLUMNS`), which `DeviceLoader`'s crops draw from. Labels are renumbered into
    `classes`, the members' class lists merged in order, so one label means one class name
    across members. `member_of(indices)` says which member each sample of a batch came from
    (`with_indices=True`).

    `schedule` ({step: weights}) changes the weights from a global step on (a step is a
    global batch: batch_size x world size samples): a curriculum, an annealing phase. A run
    resumed with another schedule, other weights, or members appended at the end goes on
    from where each member's stream stood, under the new weights from the resumed step."""

    def __init__(
        self,
        members: Sequence[PackedDataset],
        weights: Sequence[float],
        samples_per_epoch: int | None = None,
        replacement: bool = False,
        schedule: Mapping[int, Sequence[float]] | None = None,
    ) -> None:
        if len(members) < 1 or len(members) != len(weights):
            raise ValueError(
                f"a mixture needs one weight per member: {len(members)} members, "
                f"{len(weights)} weights"
            )
        self.schedule = schedule_of(weights, schedule)
        check_members(members, self.schedule)
        ragged = any(m.selection.own_sizes for m in members)
        self.sizes_differ = ragged or len({m.sample_shape for m in members}) > 1
        """Members store samples of several sizes (several shapes, or samples that keep their
        aspect ratio): batches are padded to the largest, or hold them back to back, and carry
        each sample's size (see `gather`)."""
        self._shape = tuple(int(d) for d in np.max([m.sample_shape for m in members], axis=0))
        self.members = tuple(members)
        self.weights = self.schedule[0][1]
        self.sizes = tuple(len(m) for m in members)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.samples_per_epoch = int(samples_per_epoch or sum(self.sizes))
        if self.samples_per_epoch < 1:
            raise ValueError(f"samples_per_epoch must be >= 1, got {samples_per_epoch}")
        self.replacement = bool(replacement)
        classes = list(dict.fromkeys(c for m in members for c in m.classes))
        self.classes = tuple(classes)
        self._labels = [
            np.asarray([classes.index(c) for c in m.classes], dtype=np.int64) for m in members
        ]
        self._joined = join_members(self.members, self._labels)
        self.memory = BatchMemory()
        self.with_indices = False

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The members' sample shape; with several sizes, the largest of each side (the
        padded batch's)."""
        return self._shape

    @property
    def layout(self) -> str:
        return self.members[0].layout

    def sampler(
        self,
        seed: int,
        rank: int | None,
        world_size: int | None,
        drop_last: bool,
        batch_size: int = 1,
    ) -> MixtureSampler:
        """The mixture's order for a loader of `batch_size` a rank."""
        return MixtureSampler(
            self.sizes,
            self.schedule,
            self.samples_per_epoch,
            batch_size,
            self.replacement,
            seed,
            rank,
            world_size,
            drop_last,
            tuple(self.member_prints()),
        )

    def member_prints(self) -> list[str]:
        """Each member's version and selection (and view) fingerprint: a state is refused by
        a mixture whose members differ, but may have members appended."""
        return [
            hashlib.blake2b(
                f"{m.selection.version}:{m.selection.fingerprint}:{m.selection.view}".encode(),
                digest_size=6,
            ).hexdigest()
            for m in self.members
        ]

    def preview(self, steps: int, batch_size: int = 256, seed: int = 0) -> dict[str, Any]:
        """What the first `steps` global batches of `batch_size` would hold, before training:
        each member's share (and its weight at step 0), and samples per member and class.
        Computed from the order alone: no pixel is read."""
        sampler = self.sampler(seed, 0, 1, False, batch_size)
        wanted, epoch, have = steps * batch_size, 0, 0
        taken: list[Order] = []
        while have < wanted:
            taken.append(sampler.global_order(epoch)[: wanted - have])
            have += len(taken[-1])
            epoch += 1
        order = np.concatenate(taken) if taken else np.zeros(0, dtype=np.int64)
        member = self.member_of(order)
        counts: list[dict[str, int]] = []
        for m, dataset in enumerate(self.members):
            local = order[member == m] - self.offsets[m]
            labels = dataset.selection.labels[local]
            found = np.bincount(labels, minlength=len(dataset.classes))
            counts.append({c: int(n) for c, n in zip(dataset.classes, found, strict=True) if n})
        shares = np.bincount(member, minlength=len(self.members)) / max(len(order), 1)
        return {
            "samples": len(order),
            "share": [float(s) for s in shares],
            "weight": [float(w) for w in self.weights],
            "counts": counts,
        }

    def sheet(self, batches: int = 2, batch_size: int = 8, seed: int = 0) -> Any:
        """A contact sheet of the first `batches` batches (`etl.explore.drawing`, which needs
        Pillow: the `etl` extra), each cell captioned with its member and class."""
        from etl.explore.dataset import to_image
        from etl.explore.drawing import Cell, draw_sheet  # NOTE: Pillow, here only

        order = self.sampler(seed, 0, 1, False, batch_size).global_order(0)
        chosen = order[: batches * batch_size]
        batch = self.with_memory(BatchMemory(), with_indices=True).gather(chosen)
        assert isinstance(batch, IndexedBatch | ColumnBatch), "asked with_indices"
        cells = [
            Cell(
                image=to_image(batch.images[i].numpy(), self.layout),
                caption=(f"member {m}", self.classes[int(batch.labels[i])]),
                info={"member": m, "index": int(batch.indices[i])},
            )
            for i, m in enumerate(self.member_of(batch.indices).tolist())
        ]
        return draw_sheet(cells, columns=batch_size, title=f"{batches} batches of {batch_size}")

    def manifest_rows(self, indices: Any) -> pa.Table:
        """The manifest rows of mixture indices, in their order, each with its `member`."""
        index = np.asarray(indices, dtype=np.int64)
        member = self.member_of(index)
        parts, at = [], []
        for m, dataset in enumerate(self.members):
            here = np.flatnonzero(member == m)
            if len(here):
                rows = dataset.manifest_rows(index[here] - self.offsets[m])
                names = ("sample_id", "source", "class_name", "split")
                rows = rows.select(list(names)).append_column("member", pa.array([m] * len(here)))
                parts.append(rows)
                at.append(here)
        if not parts:
            return pa.table(
                {"sample_id": [], "source": [], "class_name": [], "split": [], "member": []}
            )
        table = pa.concat_tables(parts)
        return table.take(np.argsort(np.concatenate(at), kind="stable"))

    def member_of(self, indices: Any) -> NDArray[np.int64]:
        """The member each mixture index belongs to."""
        index = np.asarray(indices, dtype=np.int64)
        return np.searchsorted(self.offsets[1:], index, side="right").astype(np.int64)

    def with_memory(self, memory: BatchMemory, with_indices: bool = False) -> Mixture:
        twin = copy.copy(self)
        twin.memory = memory
        twin.with_indices = with_indices
        return twin

    def __getitems__(self, indices: Sequence[int]) -> Samples:
        with self.memory.gathering():
            return Samples(self.gather(indices))

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return Samples(self.gather([index]))[0]

    def gather(self, indices: Sequence[int] | NDArray[np.integer]) -> AnyBatch:
        """A batch of mixture indices in one buffer: in their order with one gather across
        every member's shards (`JoinedMembers`), or, where members cannot share a reader (in object
        storage, `verify="rows"`, other reader settings), grouped by member, one gather each
        (the order within a member kept)."""
        index = np.asarray(indices, dtype=np.int64)
        if len(index) and (index.min() < 0 or index.max() >= len(self)):
            raise IndexError(f"index out of range for a mixture of {len(self)} samples")
        given = index if self.with_indices else None
        joined = self._joined
        if joined is not None:
            shard_idx, rows = joined.shard_idx[index], joined.rows[index]
            write = partial(joined.reader.gather, shard_idx, rows)
            shape: tuple[int, ...] = (len(index), *self.sample_shape)
            return self.memory.batch(shape, joined.labels[index], write, given)
        member = self.member_of(index)
        grouped = np.argsort(member, kind="stable")
        index, member = index[grouped], member[grouped]
        labels, parts = member_parts(self.members, self.offsets, self._labels, index, member)
        shape = (len(index), *self.sample_shape)
        if not self.sizes_differ:
            given = index if self.with_indices else None
            fill = partial(fill_rows, self.members, parts)
            return self.memory.batch(shape, labels, fill, given)
        heights, widths = part_sizes(self.members, parts, member)
        sizes: Columns = {SIZE_COLUMNS[0]: heights, SIZE_COLUMNS[1]: widths}
        form: type[ColumnBatch] = PaddedBatch
        if self.memory.form is not PaddedBatch:  # back to back (Mixtures send none encoded)
            channels = channels_of(self.sample_shape, self.layout)
            ends = np.concatenate([[0], np.cumsum(heights * widths * channels)])
            shape, form = (int(ends[-1]),), BackToBackBatch
            fill = partial(fill_back_to_back, self.members, parts, ends)
        else:
            fill = partial(fill_padded, self.members, parts)
        return self.memory.batch(shape, labels, fill, index, sizes, form)

    def prefetch(self, indices: Sequence[int] | NDArray[np.integer]) -> None:
        index = np.asarray(indices, dtype=np.int64)
        if not len(index) or index.min() < 0 or index.max() >= len(self):
            return
        if self._joined is not None:
            j = self._joined
            j.reader.prefetch(j.shard_idx[index], j.rows[index])
            return
        member = self.member_of(index)
        for m in np.unique(member).tolist():
            self.members[m].prefetch(index[member == m] - self.offsets[m])
