"""Read packed datasets (uint8 .npy shards + Arrow manifest) into PyTorch at memory speed.

    from loaders import PackedDataset, make_loader, DeviceLoader
    train = PackedDataset.open("artifacts", split="train")
    loader = make_loader(train, batch_size=256, shuffle=True)  # a torch DataLoader
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in DeviceLoader(loader, dtype=torch.float32, mean=..., std=...):
            ...

This namespace is what a training job uses; the rest lives in the submodules.

Modules:
- `batch/`:    the batch types everyone shares
- `read/`:     shards to bytes in one process: catalog, reader, span, checks
- `memory/`:   where a batch lives: buffers, the workers' ring, pinning
- `augment/`:  crop draws, tensor crops, and crops made as batches are gathered
- `order/`:    which sample when: orders, samplers, buckets, a run's history
- `datasets/`: `PackedDataset`, `PackedStream`, `Mixture`
- `loader/`:   `PackedLoader`, `make_loader`, the named shuffles, workers, trace queries
- `device/`:   `DeviceLoader`, and samples decoded on the device
"""

from etl.errors import ManifestError, SelectionError, ShardError
from etl.format.views import View
from loaders.augment.crops import CenterCrop, RandomResizedCrop, Resize
from loaders.batch.ragged import RaggedImages
from loaders.batch.types import Batch, ColumnBatch, IndexedBatch
from loaders.datasets.mixture import Mixture
from loaders.datasets.packed import PackedDataset
from loaders.datasets.stream import PackedStream
from loaders.device.loader import DeviceLoader
from loaders.loader.factories import make_loader, stream_loader
from loaders.loader.packed import PackedLoader
from loaders.order.aspect_buckets import AspectBuckets, BucketSampler, ResizeToBucket
from loaders.order.samplers import (
    BlockShuffleSampler,
    ClassBalancedSampler,
    MixtureSampler,
    OrderSampler,
    ShuffleSampler,
)
from loaders.read.catalog import Catalog, open_catalog

__all__ = [
    "AspectBuckets",
    "Batch",
    "BlockShuffleSampler",
    "BucketSampler",
    "Catalog",
    "CenterCrop",
    "ClassBalancedSampler",
    "ColumnBatch",
    "DeviceLoader",
    "IndexedBatch",
    "ManifestError",
    "Mixture",
    "MixtureSampler",
    "OrderSampler",
    "PackedDataset",
    "PackedLoader",
    "PackedStream",
    "RaggedImages",
    "RandomResizedCrop",
    "Resize",
    "ResizeToBucket",
    "SelectionError",
    "ShardError",
    "ShuffleSampler",
    "View",
    "make_loader",
    "open_catalog",
    "stream_loader",
]
