"""Read packed datasets (uint8 .npy shards + Arrow manifest) into PyTorch at memory speed.

    from loaders import PackedDataset, make_loader, DeviceLoader
    train = PackedDataset.open("artifacts", split="train")
    loader = make_loader(train, batch_size=256, shuffle=True)  # a torch DataLoader
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in DeviceLoader(loader, dtype=torch.float32, mean=..., std=...):
            ...

This namespace is what a training script needs (`__all__`); the rest is imported from its
room (`from loaders.order.samplers import ShuffleSampler`).

Modules:
- `batch/`:    the batch types everyone shares
- `read/`:     shards to bytes in one process: catalog, reader, span, checks
- `memory/`:   where a batch lives: buffers, the workers' ring, pinning
- `augment/`:  crop draws, tensor crops, and crops made as batches are gathered
- `order/`:    which sample when: orders, samplers, buckets, a run's history
- `datasets/`: `PackedDataset`, `PackedStream`, `Mixture`
- `loader/`:   `PackedLoader`, `make_loader`, the named shuffles, workers, trace queries
- `device/`:   `DeviceLoader`, and samples decoded on the device
- `trainers/`: trainers that cannot take a loader as it is (transformers' `Trainer`)
"""

from __future__ import annotations

from etl.deprecations import forwarding
from etl.errors import ManifestError, SelectionError, ShardError
from etl.format.views import View
from loaders.augment.crops import CenterCrop, RandomResizedCrop, Resize
from loaders.datasets.mixture import Mixture
from loaders.datasets.packed import PackedDataset
from loaders.datasets.stream import PackedStream
from loaders.device.loader import DeviceLoader
from loaders.loader.factories import make_loader, stream_loader
from loaders.loader.packed import PackedLoader
from loaders.order.aspect_buckets import AspectBuckets, ResizeToBucket

__all__ = [
    "AspectBuckets",
    "CenterCrop",
    "DeviceLoader",
    "ManifestError",
    "Mixture",
    "PackedDataset",
    "PackedLoader",
    "PackedStream",
    "RandomResizedCrop",
    "Resize",
    "ResizeToBucket",
    "SelectionError",
    "ShardError",
    "View",
    "make_loader",
    "stream_loader",
]

FORMER_NAMES = {
    "Batch": "loaders.batch.types",
    "BlockShuffleSampler": "loaders.order.samplers",
    "BucketSampler": "loaders.order.aspect_buckets",
    "Catalog": "loaders.read.catalog",
    "ClassBalancedSampler": "loaders.order.samplers",
    "ColumnBatch": "loaders.batch.types",
    "IndexedBatch": "loaders.batch.types",
    "MixtureSampler": "loaders.order.samplers",
    "OrderSampler": "loaders.order.samplers",
    "RaggedImages": "loaders.batch.ragged",
    "ShuffleSampler": "loaders.order.samplers",
    "open_catalog": "loaders.read.catalog",
}
"""Names that left the front door for their rooms (#72), by the module that holds them now:
`from loaders import X` still works for a release and warns once."""


__getattr__ = forwarding("loaders", FORMER_NAMES)
