"""The map-style dataset: index -> (uint8 image in the stored layout, int label).

A batch is fetched with `__getitems__` straight into one contiguous buffer, not sample by sample
through a collate function; where that buffer lives is `loaders.batch.types`' decision. Only the
selection's compact arrays travel to worker processes; each worker maps the shards it reads
(see `loaders.read.reader`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from numpy.typing import NDArray
from torch.utils.data import Dataset

from etl.format.views import View
from etl.storage.location import StoreOptions
from loaders.augment.worker_crop import REDUCING_GAP, Crop, WorkerCrop, cropped_batch
from loaders.batch.forms import EncodedBatch
from loaders.batch.types import (
    AnyBatch,
    ModelInputs,
    Samples,
)
from loaders.datasets.opening import how_opened, open_selection
from loaders.memory.batch_memory import BatchMemory
from loaders.read.batch_plan import batch_reads, own_size_sample, prefetch_reads
from loaders.read.catalog import Selection, Where
from loaders.read.reader import ShardReader
from loaders.read.row_checks import Verify

Transform = Callable[[torch.Tensor], torch.Tensor]


def collate_batch(batch: Any) -> Any:
    """The collate function for `PackedDataset`: `__getitems__` already made the batch.

    It hands on the batch `Samples` wraps, without a copy (and anything else as it is: a
    stream's batches). DataLoader's default collate works too, stacking the samples again.
    """
    return batch.batch if isinstance(batch, Samples) else batch


@dataclass(frozen=True)
class CollateInputs:
    """`collate_batch`, the batch then made `ModelInputs` (`make_loader(..., as_inputs=True)`)
    of samples stored in `layout`."""

    layout: str

    def __call__(self, batch: Any) -> ModelInputs:
        return ModelInputs.of(collate_batch(batch), self.layout)


def passes_batches(collate_fn: Any) -> bool:
    """Whether `collate_fn` hands on the batch `__getitems__` made (rather than making new
    tensors of the samples): the loader's fast paths hold."""
    return collate_fn is collate_batch or isinstance(collate_fn, CollateInputs)


class PackedDataset(Dataset[tuple[torch.Tensor, int]]):
    """Samples of a `Selection`, in (shard, row) order: sequential indices read sequentially.

    `transform` (optional) maps one uint8 image tensor to a tensor; it runs per sample, also in
    `__getitems__`, which then stacks the results (prefer `DeviceLoader`'s batched conversion).
    `verify_shards` checks each opened shard's checksum against the manifest, once per
    process (`PackedDataset.open(verify="shards")`); by default `PackedDataset.open` instead
    checks each row against its sample's checksum the first time any process of the loader
    reads it (`verify="once"`) or every time (`"rows"`): a changed byte in the pixels is then
    an error, never a wrong sample.
    `release_every` bounds resident memory per process (see `ShardReader`). `readahead` (on by
    default) has a batch that is not in the page cache read from disk all at once (see
    `ShardReader` and NOTE [ readahead ] in `loaders.read.reader`). `drop_behind` (with
    `release_every`) drops what was read from the page cache at each release: for a dataset
    larger than memory, which would otherwise evict everything else cached.

    Under a plain `DataLoader(dataset, batch_size=B)` with the default collate, batches are
    `[images, labels]` (uint8 [B, *sample_shape], int64 [B]); `make_loader` yields the same as
    a `Batch` without copying the samples twice.
    """

    def __init__(
        self,
        selection: Selection,
        transform: Transform | None = None,
        verify_shards: bool = False,
        release_every: int | None = None,
        readahead: bool = True,
        drop_behind: bool = False,
    ) -> None:
        self.selection = selection
        self.transform = transform
        self.reader = ShardReader(
            selection.shards, verify_shards, release_every, readahead, drop_behind
        )
        self.memory = BatchMemory()
        """Where batches are gathered (`make_loader` sets pinning and the workers' ring)."""
        self.opened: dict[str, Any] | None = None
        """How `open` was called (dataset, version, split, classes, where=): what a run's
        record keeps to open it again (`loaders.loader.trace`); None for a view or a callable
        where=."""
        self.with_indices = False
        """Whether gathered batches carry each sample's index (an `IndexedBatch`)."""
        self.crop: WorkerCrop | None = None
        """A crop made as batches are gathered (`with_crop`)."""
        self._epoch = torch.zeros(1, dtype=torch.int64)

    @classmethod
    def open(
        cls,
        path: Path | str | View,
        split: str | Sequence[str] | None = None,
        classes: Sequence[str | int] | None = None,
        where: Where | None = None,
        version: int | None = None,
        transform: Transform | None = None,
        verify: Verify = "once",
        release_every: int | None = None,
        verify_manifest: bool = True,
        readahead: bool = True,
        drop_behind: bool = False,
        store: StoreOptions | None = None,
        columns: Sequence[str] | None = None,
        **renamed: Any,
    ) -> PackedDataset:
        """Open a dataset directory or manifest and select samples (see `Catalog.select`);
        or open a `View` (`etl.format.views`: its dataset, version and rows, `View.load` for a
        view file), whose fingerprint a resume state then records.

        `columns` names per-sample columns of the version (`columns:` in pipeline.yaml) that
        its batches carry: each batch is then a `ColumnBatch` (images, labels, indices,
        columns), a column a tensor where its values have one shape, else a list.

        `verify_manifest=False` opens a version whose files no longer match its commit record
        (see `open_catalog`); `verify` is about shard bytes (see the class): "once" (the
        default) checks each row against its sample's checksum the first time any process of
        the loader reads it (the first epoch pays what "rows" does; the next ones a flag a
        row), "rows" every row read, "shards" hashes each shard whole once per process, False
        checks only the header, size and one probe row of each shard (`load.verify_rows`).

        `path` may be a URL (`s3://bucket/ds`): the version and the shards the selection reads
        are fetched into the cache, each verified, and read from there (`etl.storage.store`),
        as `store` (`etl.storage.location.StoreOptions`: cache folder, fsspec options, time
        limit, a bounded cache or ranged reads) says. Its fields were keywords of their own
        (`cache_dir`, `storage_options`, `store_timeout`, `cache_limit`, `ranged`), which
        still work and warn once.
        """
        selection, checks = open_selection(
            path, split, classes, where, version, verify, verify_manifest, store, columns, renamed
        )
        dataset = cls(
            selection, transform, checks == "shards", release_every, readahead, drop_behind
        )
        dataset.opened = how_opened(path, selection.version, split, classes, where)
        return dataset

    @property
    def classes(self) -> tuple[str, ...]:
        return self.selection.classes

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.selection.sample_shape

    @property
    def layout(self) -> str:
        return self.selection.layout

    @property
    def labels(self) -> NDArray[np.int32]:
        """Label of every index (what the class-balanced sampler needs)."""
        return self.selection.labels

    @property
    def shard_idx(self) -> NDArray[np.int32]:
        """Shard of every index (what the block-shuffle sampler needs)."""
        return self.selection.shard_idx

    def __len__(self) -> int:
        return len(self.selection)

    @property
    def pin_output(self) -> bool:
        """Whether batches (images and labels, with a `transform` too) come in pinned memory
        (num_workers=0 with CUDA; with workers DataLoader's pin thread pins them)."""
        return self.memory.pin

    def with_crop(self, crop: Crop | None, reducing_gap: float = REDUCING_GAP) -> PackedDataset:
        """A shallow copy whose samples are cropped where batches are gathered (DataLoader
        workers): `RandomResizedCrop` or `CenterCrop` of `loaders.augment.crops`, drawn per (seed,
        epoch, index), each sample decoded at the smallest scale that covers its crop
        (`loaders.augment.worker_crop`). Batches are then uint8 of the crop's size; None: no
        crop."""
        twin = copy.copy(self)
        twin.crop = None if crop is None else WorkerCrop(crop, reducing_gap)
        twin._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        if self.opened is not None and twin.crop is not None:  # a run's record says how
            twin.opened = {**self.opened, **twin.crop.record()}
        return twin

    def set_epoch(self, epoch: int) -> None:
        """The epoch a crop is drawn for: set by `PackedLoader` as each epoch begins, and
        seen by its workers, persistent ones too (shared memory)."""
        self._epoch[0] = epoch

    def with_memory(self, memory: BatchMemory, with_indices: bool = False) -> PackedDataset:
        """A shallow copy that gathers its batches into `memory` (see `loaders.batch.types`), with
        each sample's index when `with_indices`."""
        twin = copy.copy(self)
        twin.memory = memory
        twin.with_indices = with_indices
        return twin

    def manifest_rows(self, indices: Any) -> pa.Table:
        """The manifest rows of dataset indices (see `Selection.manifest_rows`)."""
        return self.selection.manifest_rows(indices)

    @property
    def ragged(self) -> bool:
        """Whether samples keep their aspect ratio, each its own size (format version 2):
        `dataset[i]` is then the sample at its own size, and a batch is padded to its largest
        sides and carries each sample's (`SIZE_COLUMNS`), which `DeviceLoader`'s crops use."""
        return self.selection.own_sizes

    @property
    def sample_sizes(self) -> NDArray[np.int64]:
        """[len, 2]: the stored (height, width) of every sample (`Selection.sample_sizes`)."""
        return self.selection.sample_sizes()

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        """(image, label); with `columns`, (image, label, index, {column: value}). Where
        samples keep their aspect ratio, the image is at its own size."""
        i = _check_index(index, len(self))
        sel = self.selection
        if sel.places is not None:
            return self._own_size(i)
        if sel.values is not None:
            return Samples(self.gather([i]))[0]
        image = torch.from_numpy(self.reader.row(int(sel.shard_idx[i]), int(sel.rows[i])))
        if self.transform is not None:
            image = self.transform(image)
        return image, int(sel.labels[i])

    def _own_size(self, i: int) -> tuple[Any, ...]:
        """`dataset[i]` of a dataset whose samples keep their aspect ratio."""
        sel = self.selection
        image = torch.from_numpy(own_size_sample(self.reader, sel, i))
        if self.transform is not None:
            image = self.transform(image)
        if sel.values is None:
            return image, int(sel.labels[i])
        columns = {name: value[0] for name, value in sel.values.batch(np.array([i])).items()}
        return image, int(sel.labels[i]), i, columns

    def __getitems__(self, indices: Sequence[int]) -> Samples:
        """A whole batch gathered into one buffer, as the sequence of samples DataLoader
        expects; `collate_batch` unwraps the batch (see `gather`)."""
        with self.memory.gathering():
            return Samples(self.gather(indices))

    def prefetch(self, indices: Sequence[int] | NDArray[np.integer]) -> None:
        """Start reading the samples of `indices` from disk and return at once (see
        `ShardReader.prefetch`); a bad index is left for the gather to name."""
        index = np.asarray(indices, dtype=np.int64)
        if len(index) and -len(self) <= index.min() and index.max() < len(self):
            prefetch_reads(self.reader, self.selection, index)

    def gather(self, indices: Sequence[int] | NDArray[np.integer]) -> AnyBatch:
        """A whole batch gathered into one contiguous buffer, in the order of `indices`."""
        index = np.asarray(indices, dtype=np.int64)
        sel = self.selection
        try:  # numpy checks the range and counts negative indices from the end, as we do
            labels = sel.labels[index].astype(np.int64)
        except IndexError:
            raise IndexError(f"index out of range for a dataset of {len(self)} samples") from None
        if self.crop is not None:
            return self._cropped(index % len(self), labels, self.crop)
        memory = self.memory
        carried = self.with_indices or sel.values or sel.own_sizes or memory.form is EncodedBatch
        given = index % max(len(self), 1) if carried else None
        columns = sel.values.batch(given) if sel.values is not None and given is not None else None
        plan = batch_reads(self.reader, sel, index, columns, memory.form)
        if self.transform is None:
            return self.memory.batch(plan.shape, labels, plan.fill, given, plan.columns, plan.form)
        if sel.places is not None:  # each sample at its own size through the transform
            transformed = [self._own_size(int(i))[0] for i in index % len(self)]
            return self.memory.stacked(transformed, labels, given, columns)
        raw = np.empty(plan.shape, dtype=np.uint8)
        plan.fill(raw)
        transformed = [self.transform(torch.from_numpy(x)) for x in raw]
        return self.memory.stacked(transformed, labels, given, columns)

    def _cropped(
        self, index: NDArray[np.int64], labels: NDArray[np.int64], crop: WorkerCrop
    ) -> AnyBatch:
        """`gather` with `with_crop`: fixed-size crops, each sample decoded and cut here (a
        worker), then through the `transform` if there is one."""
        sel = self.selection
        given = index if self.with_indices or sel.values else None
        columns = sel.values.batch(index) if sel.values is not None else None
        shape = (len(index), *_crop_shape(crop.size, sel.channels, sel.layout))
        epoch = int(self._epoch[0])
        read = partial(cropped_batch, self.reader, sel, index, crop, epoch)
        if self.transform is None:
            return self.memory.batch(shape, labels, read, given, columns)
        raw = np.empty(shape, dtype=np.uint8)
        read(raw)
        transformed = [self.transform(torch.from_numpy(x)) for x in raw]
        return self.memory.stacked(transformed, labels, given, columns)


def _crop_shape(size: tuple[int, int], channels: int, layout: str) -> tuple[int, int, int]:
    return (*size, channels) if layout == "HWC" else (channels, *size)


def _check_index(index: int, length: int) -> int:
    i = int(index)
    if not -length <= i < length:
        raise IndexError(f"index {index} out of range for a dataset of {length} samples")
    return i % length
