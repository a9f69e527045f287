"""Batches onto the device: non-blocking copies from pinned memory, the next batch prefetched on
a side CUDA stream, uint8 -> float, mean/std normalisation and channels_last done on the device.

The same code runs on the CPU with `stream = None` (no side stream, `.to()` is a no-op), so the
conversion logic is tested here even without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from etl.deprecations import warn_once
from loaders.augment.crops import Augment, Sizes
from loaders.batch.forms import BackToBackBatch, EncodedBatch, SizedBatch
from loaders.batch.ragged import RaggedImages
from loaders.batch.types import Batch, ColumnBatch, IndexedBatch
from loaders.device.checks import batch_channels, checked_batch
from loaders.device.decode import JpegDecoder, decode_batch, in_batch, jpeg_decoder
from loaders.loader.packed import PackedLoader


def prepare_images(
    images: torch.Tensor,
    layout: str,
    dtype: torch.dtype | None = None,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    channels_last: bool = False,
) -> torch.Tensor:
    """uint8 [B, H, W, C] (HWC) or [B, C, H, W] (CHW) -> [B, C, H, W] for a model.

    With `dtype`, values become `x * scale - shift` (per channel, shape [1, C, 1, 1]); see
    `DeviceLoader` for how scale and shift encode /255 and mean/std.

    NOTE: the layout change happens on uint8, before the float conversion, so it moves a
    quarter of the bytes; and an HWC batch permuted to NCHW already has channels_last strides,
    so with `channels_last` it is not copied at all. The float ops run in place, which keeps
    the memory format.
    """
    if layout not in ("HWC", "CHW"):
        raise ValueError(f"unknown layout {layout!r}; expected 'HWC' or 'CHW'")
    x = images.permute(0, 3, 1, 2) if layout == "HWC" else images
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = x.contiguous(memory_format=fmt)
    if dtype is None:
        return x
    x = x.to(dtype)
    if scale is not None:
        x.mul_(scale)
    if shift is not None:
        x.sub_(shift)
    return x


class DeviceLoader:
    """Iterate `loader` with each batch on `device`, the next batch's copy already under way.

    `dtype` (e.g. torch.float32) converts images to [0, 1] floats; `mean` and `std` (per
    channel, in [0, 1] units, torchvision's convention) then normalise them. Images come out as
    [B, C, H, W], in channels_last memory format if asked. `device` defaults to CUDA when
    present; "cuda" means the current CUDA device when the loader is built (see
    `bound_device`). `layout` defaults to the loader's dataset layout. Batches come from CPU
    memory (pinned: copies that do not block) or already from `device` (made by a transform
    there; see NOTE [ batches already on the device ]).

    With `augment`, a `PackedLoader` is asked to send samples of several sizes back to back
    (`PackedLoader.send_back_to_back`; NOTE [ back to back ] in `loaders.batch.ragged`): each batch
    then moves its own bytes, not its padding. The augmentations here crop from them where
    they lie; another augmentation gets them padded on the device, with `sizes=`.

    `decode="device"` has samples stored encoded (`output.codec`) sent still encoded (a tenth
    of the bytes through the workers, the pin thread and the copy) and decoded here: on CUDA by
    torchvision's `decode_jpeg`, or NVIDIA nvImageCodec's with `decoder="nvimgcodec"`
    (`loaders.device.decode`); the default, "workers", decodes them in the loader's processes.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        channels_last: bool = False,
        layout: str | None = None,
        augment: Augment | None = None,
        decode: str = "workers",
        decoder: str | None = None,
    ) -> None:
        if decode not in ("workers", "device"):
            raise ValueError(f"decode is 'workers' or 'device', got {decode!r}")
        if decoder is not None and decode != "device":
            raise ValueError("decoder= chooses the library of decode='device'")
        if augment is not None and dtype is None:
            dtype = torch.float32  # augmentation resamples in floating point
        if (mean is not None or std is not None) and dtype is None:
            raise ValueError("mean/std normalisation needs a float dtype, e.g. torch.float32")
        self.loader = loader
        self.augment = augment
        self.device = bound_device(device)
        self.dtype = dtype
        self.channels_last = channels_last
        dataset = getattr(loader, "dataset", None)
        self.layout = layout or getattr(dataset, "layout", None) or "CHW"
        self._with_indices = getattr(dataset, "with_indices", True)
        """Whether the loader's batches carry indices because asked (`with_indices=True`),
        not only because a padded batch needs them for its crops."""
        self.copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.channels = batch_channels(dataset, self.layout, mean, std)
        """Channels every batch must have (None: not known here)."""
        self.scale, self.shift = _scale_shift(mean, std, self.channels, self.device, dtype)
        if augment is not None and isinstance(loader, PackedLoader) and self.channels:
            loader.send_back_to_back()
        self.decoder: JpegDecoder | None = None
        self.decoder_name = ""
        """Which decoder makes the pixels of samples stored encoded, with decode="device"."""
        if decode == "device":
            if not isinstance(loader, PackedLoader) or not self.channels:
                raise ValueError("decode='device' takes a PackedLoader (make_loader)")
            if not loader.send_encoded():
                raise ValueError(
                    "decode='device' needs the stored bytes, and this loader's dataset crops "
                    "in its workers (with_crop) or has another collate_fn"
                )
            self.decoder, self.decoder_name = jpeg_decoder(self.device, decoder)
        if isinstance(loader, PackedLoader) and self.device.type == "cuda":
            loader.copies_on(self.device)

    @property
    def stream(self) -> torch.cuda.Stream | None:
        """The former name of `copy_stream` (a loader's `stream` is a dataset stream)."""
        warn_once("DeviceLoader.stream", "DeviceLoader.copy_stream", stacklevel=3)
        return self.copy_stream

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # set_epoch, dataset, sampler: those of the wrapped loader.
        if name in ("set_epoch", "dataset", "sampler"):
            return getattr(self.loader, name)
        raise AttributeError(name)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped loader's state, which leaves out the batch this one has pulled ahead
        (see `PackedLoader.hold_back`): saved after k batches of the loop, it resumes at
        batch k + 1, whether asked of this object or of the loader inside. With
        decode="device", "decoder" says which decoder made the pixels."""
        state = self._packed().state_dict()
        if self.decoder_name:
            state["decoder"] = self.decoder_name
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._packed().load_state_dict(state)

    def _packed(self) -> PackedLoader:
        if not isinstance(self.loader, PackedLoader):
            raise TypeError("DeviceLoader resumes a PackedLoader (make_loader, stream_loader)")
        return self.loader

    def __iter__(self) -> Iterator[Any]:
        if self.copy_stream is not None:
            # The side stream must see what was queued before: scale/shift, the caller's work.
            self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        batches = iter(self.loader)
        ready = self._send(next(batches, None))
        while ready is not None:
            if self.copy_stream is not None:
                # NOTE [ side stream ]: the compute stream waits for the copies issued so far
                # on the side stream; record_stream tells the caching allocator that these
                # tensors, allocated on the side stream, are used on the compute stream, so
                # their memory is not reused before that work is done.
                current = torch.cuda.current_stream(self.device)
                current.wait_stream(self.copy_stream)
                for tensor in ready[:2]:
                    tensor.record_stream(current)
            following = self._send(next(batches, None))
            self._hold(0 if following is None else 1)
            yield ready
            ready = following
        self._hold(0)

    def _hold(self, batches: int) -> None:
        """Tell the loader inside how many of its batches this one holds ahead of the loop."""
        if isinstance(self.loader, PackedLoader):
            self.loader.hold_back(batches)

    def _send(self, batch: Any) -> Any:
        """Issue the copy and conversion of one batch (on the side stream when there is one).

        NOTE [ batches already on the device ]: images (or labels) that a transform made on
        the GPU were made on the consumer's stream. The side stream waits for that stream
        before reading them, and they are recorded as used on the side stream, so the caching
        allocator does not hand their memory to the consumer's next allocation while the side
        stream still reads it.
        """
        if batch is None:
            return None
        batch = checked_batch(batch, self.channels, self.layout, self.dtype, self.device)
        if self.copy_stream is None:
            return self._convert(batch)
        made_there = [t for t in batch[:2] if isinstance(t, torch.Tensor) and t.is_cuda]
        if made_there:
            self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.copy_stream):
            converted = self._convert(batch)
        for tensor in made_there:
            tensor.record_stream(self.copy_stream)
        return converted

    def _convert(self, batch: Any) -> Any:
        """Copy to the device and convert (on whichever stream is current), by the batch's
        form (`loaders.batch.forms`): stored bytes are decoded there first, samples of several
        sizes go through the augmentation (or are made one batch where they have one size)."""
        layout, indices = self.layout, batch[2] if len(batch) >= 3 else None
        if isinstance(batch, EncodedBatch):
            images, layout = self._decoded(batch, indices), "CHW"
        else:
            images = batch[0].to(self.device, non_blocking=True)
        labels = batch[1].to(self.device, non_blocking=True)
        sized = isinstance(batch, SizedBatch)
        sizes = batch.sizes if isinstance(batch, SizedBatch) else None
        columns = batch.other_columns() if sized else getattr(batch, "columns", None)
        ragged = None
        if isinstance(batch, BackToBackBatch | EncodedBatch):
            assert sizes is not None and self.channels is not None  # see checked_batch
            ragged = RaggedImages(images, *sizes, self.channels, layout)
        if self.augment is None and ragged is not None and ragged.one_size():
            images, layout, sizes, ragged = ragged.padded(), "CHW", None, None
        if self.augment is not None:
            images = self._augmented(ragged or images, indices, sizes, layout)
        elif sizes is not None:
            raise ValueError(
                "this batch holds samples of several sizes, padded (a Mixture of several "
                "shapes, or samples that keep their aspect ratio): give DeviceLoader "
                "augment=RandomResizedCrop(...) or CenterCrop(...) to make them one size"
            )
        else:
            images = prepare_images(
                images, layout, self.dtype, self.scale, self.shift, self.channels_last
            )
        if sized and columns is None and not self._with_indices:
            indices = None  # carried for the sizes alone
        return _moved_batch(images, labels, indices, columns, self.device)

    def _decoded(self, batch: EncodedBatch, indices: torch.Tensor | None) -> torch.Tensor:
        """A batch's stored bytes (CPU) decoded on the device: CHW samples back to back; a
        sample that does not decode is named by its shard and row."""
        assert self.decoder_name and self.channels is not None
        (nbytes, codecs), (heights, widths) = batch.stored, batch.sizes
        name = in_batch
        rows_of = getattr(getattr(self.loader, "dataset", None), "manifest_rows", None)
        if indices is not None and rows_of is not None:

            def name(k: int) -> str:  # looked up only for a sample that fails
                index = int(indices[k])
                row = rows_of([index]).to_pylist()[0]
                return f"{row['shard']}: row {row['row']} (index {index})"

        return decode_batch(
            batch.images.cpu(), nbytes, codecs, heights, widths, self.channels, self.layout,
            self.decoder, self.device, name,
        )  # fmt: skip

    def _augmented(
        self,
        images: torch.Tensor | RaggedImages,
        indices: torch.Tensor | None,
        sizes: Sizes | None,
        layout: str,
    ) -> torch.Tensor:
        """Augment NCHW uint8 images (or samples back to back) on the device, then convert
        and normalise in place; a padded batch's `sizes` tell the augmentation each sample's
        own size."""
        assert self.augment is not None and self.dtype is not None
        epoch = int(getattr(self.loader, "epoch", 0))
        if isinstance(images, RaggedImages):  # samples back to back, each its own size
            if getattr(self.augment, "takes_ragged", False):
                out = self.augment(images, indices, epoch).to(self.dtype)  # type: ignore[arg-type]
                return self._normalised(out)
            images, layout = images.padded(), "CHW"
        nchw = images.permute(0, 3, 1, 2) if layout == "HWC" else images
        if sizes is None:
            out = self.augment(nchw, indices, epoch).to(self.dtype)
        else:
            out = self.augment(nchw, indices, epoch, sizes=sizes).to(self.dtype)  # type: ignore[call-arg]
        return self._normalised(out)

    def _normalised(self, out: torch.Tensor) -> torch.Tensor:
        """An augmented float batch, scaled and shifted in place (and channels_last if asked)."""
        if self.scale is not None:
            out.mul_(self.scale)
        if self.shift is not None:
            out.sub_(self.shift)
        if self.channels_last:
            out = out.contiguous(memory_format=torch.channels_last)
        return out


def _scale_shift(
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    channels: int | None,
    device: torch.device,
    dtype: torch.dtype | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The per-channel [1, C, 1, 1] scale and shift on `device` that make uint8 pixels
    normalised floats: (x / 255 - mean) / std == x * (1 / (255 std)) - mean / std, two
    in-place ops (None, None without a dtype: no conversion)."""
    if dtype is None:
        return None, None
    m = torch.tensor(mean if mean is not None else [0.0] * (channels or 1), dtype=torch.float64)
    s = torch.tensor(std if std is not None else [1.0] * (channels or 1), dtype=torch.float64)
    if len(m) != len(s):
        raise ValueError(f"mean has {len(m)} values and std {len(s)}")
    scale = (1 / (255 * s)).view(1, -1, 1, 1).to(device, dtype)
    return scale, (m / s).view(1, -1, 1, 1).to(device, dtype)


def _moved_batch(
    images: torch.Tensor,
    labels: torch.Tensor,
    indices: torch.Tensor | None,
    columns: dict[str, Any] | None,
    device: torch.device,
) -> Any:
    """The batch `DeviceLoader` yields: with columns a ColumnBatch, its tensors copied to
    `device` (a list stays as it is); else an IndexedBatch when indices are left (they stay
    on the CPU, for lookups), else a Batch."""
    if columns is not None and indices is not None:
        moved = {
            name: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
            for name, v in columns.items()
        }
        return ColumnBatch(images, labels, indices, moved)
    if indices is None:
        return Batch(images, labels)
    return IndexedBatch(images, labels, indices)


def bound_device(device: torch.device | str | None) -> torch.device:
    """The device a DeviceLoader sends batches to, its index fixed now: the default is CUDA
    when present, and "cuda" without an index is the current CUDA device.

    NOTE: the side stream, scale and shift are made on that device here; resolving "cuda"
    again when iterating (in whichever thread, after whatever `set_device`) put batches on
    one device and the stream waits on another's: build the loader after
    `torch.cuda.set_device(local_rank)`, or name the device.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    bound = torch.device(device)
    if bound.type == "cuda" and bound.index is None:
        bound = torch.device("cuda", torch.cuda.current_device())
    return bound
