"""Crops made where a batch is gathered (a DataLoader worker, or the loop without workers):
each sample decoded, at the smallest DCT scale that still covers its crop where it is a JPEG,
then cropped and resized on the CPU, so workers ship fixed-size uint8 batches (a 224 batch, not
the whole photo) into the same shared-memory ring and pinned memory as raw rows.

    train = PackedDataset.open("artifacts", split="train").with_crop(RandomResizedCrop(224))
    for images, labels in make_loader(train, batch_size=256, num_workers=8): ...

The parameters are `loaders.augment.crops`'s (`RandomResizedCrop`: torchvision's boxes and flips, a
pure function of (seed, epoch, dataset index); `CenterCrop`: resize the shorter side, take the
middle), so a run that crops in its workers draws the same boxes a `DeviceLoader` would.

NOTE [ resampling in a worker ]: a box is cut from the decoded image (a view, no copy) and
resized by OpenCV's `cv2.resize(..., INTER_LINEAR)` straight into the batch's slot: bilinear
with half-pixel centres, no antialias, the formula of torch's `F.interpolate(..., "bilinear",
align_corners=False)`, in 11-bit fixed point, so within 1 of the device path's float result
for the same box (tested). OpenCV releases the GIL for the whole resize; torch's uint8
`F.interpolate`, which it replaced, did not scale past one thread here (JPEG 224 + RRC 224 on
2 threads: 3,750 samples/s with it, 6,100 with OpenCV; per 224 crop 0.11 ms against 0.066 ms;
benchmarks/README.md, "Threads by default"). A JPEG whose box is at least `reducing_gap` (2)
times the output on both sides is decoded at 1/2, 1/4 or 1/8 scale first
(`etl.format.codecs.dct_factor`) and the box scaled with it: the pixels then differ from a
full decode's as a resample from a smaller image does, and are the same on every run with the
same decoder and resizer (the loader's state records both).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import cv2
import numpy as np
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
        """What a run's record keeps of it (`loaders.loader.trace`): the crop, and the decoder and
        resizer that made its pixels (a resumed run on others may see pixels a level apart)."""
        crop = {"kind": type(self.crop).__name__, **asdict(self.crop)}
        return {
            "crop": crop,
            "reducing_gap": self.reducing_gap,
            "decoder": decoder_name(),
            "resizer": f"OpenCV {cv2.__version__}",
        }

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
        top, left, h, w = 0, 0, height, width
    else:
        top, left, h, w = map(int, box.tolist())
        needed = (oh, ow)
    if codec == JPEG:
        factor = dct_factor((h, w), needed, crop.reducing_gap)
        image = decode_jpeg(data, (height, width, channels), factor=factor)
        if factor > 1:  # NOTE: the box at 1/factor scale (libjpeg's scaled sides round up)
            top, left, h, w = top // factor, left // factor, h // factor, w // factor
    else:
        image = decode(data, codec, shape_of(height, width, channels, layout))
    hwc = image if layout == "HWC" or codec == JPEG else image.transpose(1, 2, 0)
    h, w = max(1, min(h, hwc.shape[0] - top)), max(1, min(w, hwc.shape[1] - left))
    source = hwc[top : top + h, left : left + w]
    if resized is None:
        into = out if layout == "HWC" else np.empty((oh, ow, channels), np.uint8)
        made = _resample(source, (oh, ow), into)
    else:
        top, left = round((needed[0] - oh) / 2.0), round((needed[1] - ow) / 2.0)
        whole = _resample(source, needed, np.empty((*needed, channels), np.uint8))
        made = whole[top : top + oh, left : left + ow]
    if made is out:
        if flip:  # in place: OpenCV swaps each row's ends
            mat = _mat(out)
            _written(cv2.flip(mat, 1, dst=mat), mat)
        return
    made = made[:, ::-1] if flip else made
    np.copyto(out, made if layout == "HWC" else made.transpose(2, 0, 1))


def _resample(
    image: NDArray[np.uint8], size: tuple[int, int], out: NDArray[np.uint8]
) -> NDArray[np.uint8]:
    """Bilinear resize of an [h, w, C] view to `size` into `out` ([*size, C]), which it returns
    (NOTE [ resampling in a worker ])."""
    if image.shape[:2] == size:
        np.copyto(out, image)
        return out
    mat = _mat(out)
    _written(cv2.resize(_mat(image), size[::-1], dst=mat, interpolation=cv2.INTER_LINEAR), mat)
    return out


def _mat(image: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """An [h, w, C] array as OpenCV takes it (one channel is 2-D there)."""
    return image[..., 0] if image.shape[2] == 1 else image


def _written(made: NDArray[Any], into: NDArray[np.uint8]) -> None:
    """Where OpenCV did not write into `into` (it makes its own output where the one it is
    given does not fit), the result copied there: never a batch slot left unwritten."""
    if made is not into:
        np.copyto(into, made.reshape(into.shape))


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
