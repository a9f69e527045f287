"""The batch types every loader here yields, and how a gathered batch becomes one. Where a
batch's memory comes from is `loaders.memory.batch_memory`'s choice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, overload

import numpy as np
import torch
from numpy.typing import NDArray

Fill = Callable[[NDArray[np.uint8]], None]
"""Writes a batch into the C-contiguous uint8 array it is given (shaped like the batch)."""


class _BatchFields(NamedTuple):
    images: torch.Tensor
    """uint8 [B, *sample_shape] in the stored layout (HWC or CHW), unless a transform changed it."""
    labels: torch.Tensor
    """int64 [B]."""


class _IndexedFields(NamedTuple):
    images: torch.Tensor
    labels: torch.Tensor
    indices: torch.Tensor
    """int64 [B]: indices into the dataset the loader reads."""


class _ColumnFields(NamedTuple):
    images: torch.Tensor
    labels: torch.Tensor
    indices: torch.Tensor
    columns: dict[str, torch.Tensor | list[Any]]
    """Per column, a tensor [B, ...] when its values all have one shape (numbers, lists of one
    length), else a list of B Python values (text, structs, ragged lists, nulls): see
    `etl.format.values`."""


class _Rebuilt:
    """What every batch type adds to its fields: made from one iterable of them as a tuple is,
    and moved as a tensor is.

    NOTE [ batches rebuilt from an iterable ]: trainers move a batch to the device by rebuilding
    whatever tuple they get as `type(batch)(generator)` (transformers' `_prepare_input`), as
    plain tuples are built; a NamedTuple wants its fields one by one and refuses. So one
    positional argument is the iterable of the fields; a tensor there is a mistake (it would
    make a batch of its rows), never taken as one."""

    __slots__ = ()

    def __new__(cls, *given: Any, **named: Any) -> Any:
        if len(given) == 1 and not named:
            (fields,) = given
            if isinstance(fields, torch.Tensor | np.ndarray):
                raise TypeError(
                    f"{cls.__name__}() takes its fields ({', '.join(cls._fields)}), or one "  # type: ignore[attr-defined]
                    "iterable of them; got a single tensor"
                )
            given = tuple(fields)
        return super().__new__(cls, *given, **named)

    def to(self, *args: Any, **kwargs: Any) -> Any:
        """The batch with every tensor in it `.to(*args, **kwargs)`, as `Tensor.to` (a
        device, a dtype, `non_blocking=`), of its own type; lists stay as they are."""
        return type(self)(_moved(field, args, kwargs) for field in self)  # type: ignore[attr-defined]


def _moved(value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(*args, **kwargs)
    if isinstance(value, dict):
        return {name: _moved(v, args, kwargs) for name, v in value.items()}
    return value


class Batch(_Rebuilt, _BatchFields):
    """A batch as every loader here yields it: `images, labels = batch` works, and so does
    `Batch(iterable_of_fields)` (NOTE [ batches rebuilt from an iterable ])."""

    __slots__ = ()


class IndexedBatch(_Rebuilt, _IndexedFields):
    """A batch with the dataset index of each sample (`make_loader(..., with_indices=True)`):
    `images, labels, indices = batch`; `dataset.manifest_rows(indices)` names the samples."""

    __slots__ = ()


class ColumnBatch(_Rebuilt, _ColumnFields):
    """A batch with per-sample columns (a dataset opened with `columns=[...]`):
    `images, labels, indices, columns = batch`."""

    __slots__ = ()


AnyBatch = Batch | IndexedBatch | ColumnBatch


class ModelInputs(dict[str, torch.Tensor]):
    """A batch as Hugging Face models take it, `model(**inputs)` (`make_loader(...,
    as_inputs=True)`): "pixel_values", uint8 [B, C, H, W] (samples stored HWC come as a view
    with channels_last strides, not copied), and "labels", int64 [B]. `PackedTrainer`
    (`loaders.trainers.hf`) makes the model's floats of it on the device. A `dict`, so trainers
    that ask `"labels" in batch`, `batch.get(...)` or rebuild it as `type(batch)({...})` get
    what they expect; it pickles as the batch it views (a ring slot travels as its number)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.source: tuple[AnyBatch, str] | None = None

    @classmethod
    def of(cls, batch: AnyBatch, layout: str) -> ModelInputs:
        """The inputs of a batch of samples stored in `layout` ("HWC" or "CHW")."""
        if isinstance(batch, ColumnBatch):
            raise ValueError(
                "batches with per-sample columns (columns=, or samples of several sizes) are "
                "not model inputs: open the dataset without columns, with a crop to one size"
            )
        images = batch.images.permute(0, 3, 1, 2) if layout == "HWC" else batch.images
        inputs = cls(pixel_values=images, labels=batch.labels)
        inputs.source = (batch, layout)
        return inputs

    def __reduce__(self) -> Any:
        if self.source is not None:
            return (ModelInputs.of, self.source)
        return (type(self), (dict(self),))


SIZE_COLUMNS = ("sample.height", "sample.width")
"""The columns of a padded batch (samples of several sizes, a `Mixture` of several shapes)
that say each sample's own size; names no declared per-sample column can have.
`DeviceLoader` hands them to the augmentation, which crops from each sample's own image."""

STORED_COLUMNS = ("sample.bytes", "sample.codec")
"""The columns of a batch of samples still encoded, back to back (`PackedLoader.send_encoded`):
each one's stored bytes and codec (`etl.format.codecs.CODECS`), beside `SIZE_COLUMNS`; the
device decodes them (`loaders.device.decode`)."""

Columns = dict[str, NDArray[Any] | list[Any]]
"""A batch's per-sample column values as `SampleValues.batch` gives them."""


def make_batch(
    images: torch.Tensor,
    labels: NDArray[np.int64],
    indices: NDArray[np.int64] | None,
    pin: bool = False,
    columns: Columns | None = None,
    form: type[ColumnBatch] = ColumnBatch,
) -> AnyBatch:
    """A Batch, or an IndexedBatch when `indices` are given, or a ColumnBatch with `columns`
    (and indices), of type `form` (one of `loaders.batch.forms`' for samples of several sizes);
    with `pin`, its labels (and column tensors) in pinned memory like its images
    (a pageable label copy would wait for the image copy before it: see `DeviceLoader`).
    Indices stay pageable: they are read on the CPU."""
    label_tensor = torch.from_numpy(labels)
    if pin:
        label_tensor = label_tensor.pin_memory()
    if columns is not None:
        assert indices is not None, "a batch with columns carries its indices"
        tensors = {name: _column_tensor(value, pin) for name, value in columns.items()}
        return form(images, label_tensor, torch.from_numpy(indices), tensors)
    if indices is None:
        return Batch(images, label_tensor)
    return IndexedBatch(images, label_tensor, torch.from_numpy(indices))


def _column_tensor(value: NDArray[Any] | list[Any], pin: bool) -> torch.Tensor | list[Any]:
    if isinstance(value, list):
        return value
    tensor = torch.from_numpy(np.ascontiguousarray(value))
    return tensor.pin_memory() if pin else tensor


class Samples(Sequence[tuple[Any, ...]]):
    """A gathered batch as `Dataset.__getitems__` must return it: a sequence of samples.

    `samples[i]` is `(image, label)` (with its index for an IndexedBatch), a view of the batch,
    so DataLoader's default collate (or any collate_fn) works on it; `collate_batch` hands on
    the batch itself, without a copy.
    """

    def __init__(self, batch: AnyBatch) -> None:
        self.batch = batch

    def __len__(self) -> int:
        return len(self.batch.labels)

    @overload
    def __getitem__(self, i: int) -> tuple[Any, ...]: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[tuple[Any, ...]]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        batch = self.batch
        if isinstance(batch, ColumnBatch):
            columns = {name: value[i] for name, value in batch.columns.items()}
            return (batch.images[i], int(batch.labels[i]), int(batch.indices[i]), columns)
        images, labels, *rest = batch
        return (images[i], int(labels[i]), *(int(r[i]) for r in rest))
