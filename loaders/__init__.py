"""Read packed datasets (uint8 .npy shards + Arrow manifest) into PyTorch at memory speed.

    from loaders import PackedDataset, make_loader, DeviceLoader
    train = PackedDataset.open("artifacts", split="train")
    loader = make_loader(train, batch_size=256, shuffle=True)  # a torch DataLoader
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in DeviceLoader(loader, dtype=torch.float32, mean=..., std=...):
            ...

This namespace is what a training job uses; the rest lives in the submodules, in data-flow
order: `catalog` (manifest -> selection), `reader` (shards -> memory), `span` (the gather's
copy plan), `batches` (the batch types; the memory batches are gathered into: reused buffers,
pinned memory, the workers' shared ring), `dataset` and `stream` (torch datasets), `orders`
(pure sample orders), `samplers` (torch samplers over them), `quality` (shuffle quality),
`resume` (the state a training job saves, and its checks), `dist` (rank and world size),
`loader` (the DataLoader), `ragged` (samples of several sizes back to back), `augment`
(batched crops and flips on the device), `device` (to the GPU).
"""

from etl.errors import ManifestError, SelectionError, ShardError
from etl.format.views import View
from loaders.augment import CenterCrop, RandomResizedCrop, Resize
from loaders.batches import Batch, ColumnBatch, IndexedBatch
from loaders.buckets import AspectBuckets, BucketSampler, ResizeToBucket
from loaders.catalog import Catalog, open_catalog
from loaders.dataset import PackedDataset
from loaders.device import DeviceLoader
from loaders.factories import make_loader, stream_loader
from loaders.loader import PackedLoader
from loaders.mixture import Mixture
from loaders.ragged import RaggedImages
from loaders.samplers import (
    BlockShuffleSampler,
    ClassBalancedSampler,
    MixtureSampler,
    OrderSampler,
    ShuffleSampler,
)
from loaders.stream import PackedStream

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
