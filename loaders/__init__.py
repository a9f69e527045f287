"""Read packed datasets (uint8 .npy shards + Arrow manifest) into PyTorch at memory speed.

    from loaders import PackedDataset, make_loader, DeviceLoader
    train = PackedDataset.open("artifacts", split="train")
    loader = make_loader(train, batch_size=256, shuffle=True)  # "blocks", "balanced", ...
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in DeviceLoader(loader, dtype=torch.float32, mean=..., std=...):
            ...

Modules, in data-flow order: `catalog` (manifest -> selection), `reader` (shards -> memory),
`batches` (the batch type; the memory batches are gathered into: reused buffers, pinned
memory, the workers' shared ring), `dataset` and `stream` (torch datasets), `orders` (pure
sample orders), `samplers` (torch wrappers), `quality` (shuffle quality), `resume` (the state a
training job saves, and its checks), `loader` (DataLoader builders, resume), `augment` (batched
crops and flips on the device), `device` (to the GPU).
"""

from loaders.batches import Batch, IndexedBatch, Samples
from loaders.catalog import Catalog, Selection, ShardSet, open_catalog
from loaders.dataset import PackedDataset, collate_batch
from loaders.device import DeviceLoader, prepare_images
from loaders.dist import rank_and_world
from loaders.loader import SHUFFLES, PackedLoader, make_loader, stream_loader
from loaders.orders import (
    balanced_order,
    block_order,
    partition,
    random_order,
    sequential_order,
)
from loaders.quality import class_mix_distance, shuffle_quality
from loaders.reader import ShardReader, verify_shard
from loaders.samplers import (
    BlockShuffleSampler,
    ClassBalancedSampler,
    OrderBatches,
    OrderSampler,
    ShuffleSampler,
)
from loaders.stream import PackedStream, deal_pieces, slot_share, stream_order

__all__ = [
    "SHUFFLES",
    "Batch",
    "BlockShuffleSampler",
    "Catalog",
    "ClassBalancedSampler",
    "DeviceLoader",
    "IndexedBatch",
    "OrderBatches",
    "OrderSampler",
    "PackedDataset",
    "PackedLoader",
    "PackedStream",
    "Samples",
    "Selection",
    "ShardReader",
    "ShardSet",
    "ShuffleSampler",
    "balanced_order",
    "block_order",
    "class_mix_distance",
    "collate_batch",
    "deal_pieces",
    "make_loader",
    "open_catalog",
    "partition",
    "prepare_images",
    "random_order",
    "rank_and_world",
    "sequential_order",
    "shuffle_quality",
    "slot_share",
    "stream_loader",
    "stream_order",
    "verify_shard",
]
