"""Crops made where a batch is gathered (a DataLoader worker, or the loop without workers):
each sample decoded, at the smallest DCT scale that still covers its crop where it is a JPEG,
then cropped and resized on the CPU, so workers ship fixed-size uint8 batches (a 224 batch, not
the whole photo) into the same shared-memory ring and pinned memory as raw rows.

    train = PackedDataset.open("artifacts", split="train").with_crop(RandomResizedCrop(224))
    for images, labels in make_loader(train, batch_size=256, num_workers=8): ...

The parameters are `loaders.augment.crops`'s (`RandomResizedCrop`: torchvision's boxes and flips, a
pure function of (seed, epoch, dataset index); `CenterCrop`: resize the shorter side, take the
middle), so a run that crops in its workers draws the same boxes a `DeviceLoader` would.

NOTE [ resampling in a worker ]: a box is cut from the decoded image and resized with
`F.interpolate(..., "bilinear", align_corners=False, antialias=False)` on uint8 channels-last
(torch's vectorised path: 0.08 ms a 224 sample on one core, against 0.55 ms in float32), which
rounds to the nearest level: within 1 of the device path's float result for the same box. A
JPEG whose box is at least `reducing_gap` (2) times the output on both sides is decoded at
1/2, 1/4 or 1/8 scale first (`etl.format.codecs.dct_factor`) and the box scaled with it: the
pixels then differ from a full decode's as a resample from a smaller image does, and are the
same on every run with the same decoder (the loader's state records it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from numpy.typing import NDArray

from etl.format.codecs import (
    JPEG,
    RAW,
    REDUCING_GAP,
    DecodeFailure,
    dct_factor,
    decode,
    decode_jpeg,
)
from etl.format.flat import shape_of
from loaders.augment.crops import CenterCrop, RandomResizedCrop, resized_sides
from loaders.augment.draws import crop_boxes, flips
from loaders.read.catalog import Selection
from loaders.read.flat_rows import decode_failure
from loaders.read.reader import ShardReader
from loaders.read.threads import run_each
from loaders.read.timing import stage

Crop = RandomResizedCrop | CenterCrop


@dataclass(frozen=True)
class WorkerCrop:
    """A crop of `loaders.augment.crops` made in the gathering process
    (`PackedDataset.with_crop`)."""

    crop: Crop
    reducing_gap: float = REDUCING_GAP

    def record(self) -> dict[str, Any]:
        """What a run's record keeps of it (`loaders.loader.trace`): the crop, and the decoder that
        made its pixels (a resumed run on another decoder may see pixels a level apart)."""
        crop = {"kind": type(self.crop).__name__, **asdict(self.crop)}
        return {"crop": crop, "reducing_gap": self.reducing_gap, "decoder": decoder_name()}

    @property
    def size(self) -> tuple[int, int]:
        size = self.crop.size
        return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))

    def boxes(
        self,
        epoch: int,
        index: NDArray[np.int64],
        heights: NDArray[np.int64],
        widths: NDArray[np.int64],
    ) -> tuple[NDArray[np.float64], NDArray[np.bool_], NDArray[np.int64] | None]:
        """(boxes [n, 4] (top, left, h, w) in source pixels, flips, resized sides [n, 2] or
        None) of samples `index` of (heights, widths): a random crop's boxes are whole pixels
        of the source; a centre crop is a resize to `resized` then the middle `size`, and its
        box is where that lands on the source."""
        crop = self.crop
        if isinstance(crop, RandomResizedCrop):
            boxes = crop_boxes(crop.seed, epoch, index, heights, widths, crop.scale, crop.ratio)
            return boxes.astype(np.float64), flips(crop.seed, epoch, index, crop.flip), None
        oh, ow = self.size
        resize = crop.resize or min(oh, ow)
        sides = np.array(
            [
                resized_sides(h, w, resize)
                for h, w in zip(heights.tolist(), widths.tolist(), strict=True)
            ],
            np.int64,
        ).reshape(-1, 2)
        if (sides[:, 0] < oh).any() or (sides[:, 1] < ow).any():
            raise ValueError(f"a centre crop of {(oh, ow)} does not fit in a resize to {resize}")
        return np.zeros((len(index), 4)), np.zeros(len(index), bool), sides


def crop_sample(
    data: NDArray[np.uint8],
    codec: int,
    height: int,
    width: int,
    channels: int,
    layout: str,
    box: NDArray[np.float64],
    resized: NDArray[np.int64] | None,
    flip: bool,
    crop: WorkerCrop,
    out: NDArray[np.uint8],
) -> None:
    """One stored sample (its bytes and `codec`, `height` x `width`) decoded, cropped and
    resized into `out` (`crop.size`, in `layout`): a random crop's `box`, or with `resized`
    (rh, rw) the centre crop of a resize to them. DecodeFailure for bytes that do not decode."""
    oh, ow = crop.size
    if resized is not None:  # centre crop: the whole image is what is resampled
        needed = (int(resized[0]), int(resized[1]))
        region = (0, 0, height, width)
    else:
        region = tuple(int(v) for v in box)  # type: ignore[assignment]
        needed = (oh, ow)
    factor = 1
    if codec == JPEG:
        factor = dct_factor((region[2], region[3]), needed, crop.reducing_gap)
        image = decode_jpeg(data, (height, width, channels), factor=factor)
    else:
        image = decode(data, codec, shape_of(height, width, channels, layout))
    hwc = image if layout == "HWC" or codec == JPEG else image.transpose(1, 2, 0)
    top, left, h, w = (_scaled(v, factor) for v in region)
    h, w = max(1, min(h, hwc.shape[0] - top)), max(1, min(w, hwc.shape[1] - left))
    if not hwc.flags.writeable:  # a raw sample is a view of the read-only shard: its box
        hwc, top, left = hwc[top : top + h, left : left + w].copy(), 0, 0
    # NOTE: a view of the box; `_resample` copies it channels-last (torch's copy of a box
    # view: 1.2-1.35x faster a 224 crop than numpy copying it first, measured here)
    source = torch.from_numpy(hwc).permute(2, 0, 1)[None][:, :, top : top + h, left : left + w]
    if resized is not None:
        scaled = _resample(source, needed)
        top, left = round((needed[0] - oh) / 2.0), round((needed[1] - ow) / 2.0)
        result = scaled[:, :, top : top + oh, left : left + ow]
    else:
        result = _resample(source, (oh, ow))
    if flip:
        result = result.flip(-1)
    target = torch.from_numpy(out)
    target.copy_(result[0].permute(1, 2, 0) if layout == "HWC" else result[0])


def _scaled(value: int, factor: int) -> int:
    """A source pixel coordinate at 1/`factor` scale (libjpeg's scaled sides round up)."""
    return value // factor if factor > 1 else value


def _resample(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bilinear resize of a uint8 [1, C, h, w] to `size` (NOTE [ resampling in a worker ])."""
    if tuple(image.shape[2:]) == size:
        return image
    lasting = image.contiguous(memory_format=torch.channels_last)
    return F.interpolate(lasting, size=size, mode="bilinear", align_corners=False, antialias=False)


def decoder_name() -> str:
    """Which JPEG decoder a worker runs (recorded in a loader's state: a resumed run on another
    decoder may see pixels a level or two apart)."""
    import simplejpeg

    return f"simplejpeg {simplejpeg.__version__}"


def cropped_batch(
    reader: ShardReader,
    sel: Selection,
    index: NDArray[np.int64],
    crop: WorkerCrop,
    epoch: int,
    out: NDArray[np.uint8],
) -> None:
    """The crops of samples `index` of `sel` for `epoch` into `out` ([B, *crop.size, C], or
    [B, C, *crop.size] in CHW): each sample's stored bytes checked as any read checks them,
    then decoded (at a reduced scale where it pays), cropped and resized."""
    layout, channels = sel.layout, sel.channels
    shard_idx, rows = sel.shard_idx[index], sel.rows[index]
    if sel.places is None:  # fixed-size raw rows: gathered, then cropped
        whole = np.empty((len(index), *sel.sample_shape), np.uint8)
        reader.gather(shard_idx, rows, whole)
        height, width = sel.sample_shape[:2] if layout == "HWC" else sel.sample_shape[1:]
        sides = np.full(len(index), height, np.int64), np.full(len(index), width, np.int64)
        boxes, mirrored, resized = crop.boxes(epoch, index, *sides)
        crops = [
            partial(crop_sample, whole[j].reshape(-1), RAW, height, width, channels, layout,
                    boxes[j], resized[j] if resized is not None else None, bool(mirrored[j]),
                    crop, out[j])
            for j in range(len(index))
        ]  # fmt: skip
        with stage("crop"):
            run_each(crops)
        return
    places = sel.places[index]
    stored = sel.stored[index] if sel.stored is not None else None
    boxes, mirrored, resized = crop.boxes(epoch, index, places[:, 1], places[:, 2])
    calls: list[Callable[[], None]] = []

    def one(j: int, data: NDArray[np.uint8], height: int, width: int, codec: int) -> None:
        try:
            crop_sample(data, codec, height, width, channels, layout, boxes[j],
                        resized[j] if resized is not None else None, bool(mirrored[j]), crop,
                        out[j])  # fmt: skip
        except DecodeFailure as exc:
            shard = reader.shards
            raise decode_failure(shard, int(shard_idx[j]), int(rows[j]), exc) from None

    def take(j: int, data: NDArray[np.uint8], height: int, width: int, codec: int) -> None:
        calls.append(partial(one, j, data, height, width, codec))

    # NOTE: the reader checks each sample's stored bytes and hands them over (a view of its
    # shard's map, which the view keeps mapped, or bytes a ranged read fetched); the decodes
    # and crops then run on the loader's threads (`loaders.read.threads`), all finished here.
    reader.gather_flat(shard_idx, rows, places, layout, None, stored, take)
    with stage("crop"):
        run_each(calls)
