from __future__ import annotations

import itertools
import warnings
from collections import Counter

import numpy as np
import pytest

from loaders import PackedStream, stream_loader
from loaders.order.stream_orders import deal_pieces, slot_share, stream_order
from loaders.read.catalog import open_catalog
from tests.helpers.packed import Packed, make_packed


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    sizes = (13, 8, 21, 5, 17, 9, 11)
    return make_packed(tmp_path_factory.mktemp("ds"), shard_sizes=sizes)


@pytest.fixture(autouse=True)
def _quiet_cpu_note() -> None:
    warnings.filterwarnings("ignore", "CUDA is not available", RuntimeWarning)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n_slots", [1, 2, 3, 4, 7, 10, 90])
def test_deal_pieces_cuts_shards_into_equal_stretches(n_slots: int, drop_last: bool) -> None:
    sizes = np.array([13, 8, 21, 5, 17, 9, 11])
    dealt = deal_pieces(sizes, n_slots, seed=1, epoch=0, drop_last=drop_last)
    assert len(dealt) == n_slots
    rows = [(s, r) for pieces in dealt for s, a, b in pieces.tolist() for r in range(a, b)]
    assert len(rows) == len(set(rows)), "no sample dealt twice"
    loads = [int((d[:, 2] - d[:, 1]).sum()) for d in dealt]
    if drop_last:
        assert set(loads) == {sizes.sum() // n_slots}
    else:
        assert len(rows) == sizes.sum() and max(loads) - min(loads) <= 1
    for pieces in dealt:  # a slot reads whole shards but for its first and last
        assert all((b - a) == sizes[s] for s, a, b in pieces[1:-1].tolist())
    again = deal_pieces(sizes, n_slots, seed=1, epoch=0, drop_last=drop_last)
    assert all(np.array_equal(a, b) for a, b in zip(dealt, again, strict=True))


@pytest.mark.parametrize(
    ("world", "workers", "window", "shuffle"),
    list(itertools.product([1, 2, 3], [1, 2, 4], [1, 3], [True, False])),
)
def test_stream_order_covers_each_sample_once_per_epoch(
    world: int, workers: int, window: int, shuffle: bool
) -> None:
    shard_idx = np.repeat(np.arange(7), [13, 8, 21, 5, 17, 9, 11])
    n, slots = len(shard_idx), world * workers
    for epoch in (0, 1):
        everything = []
        for rank, worker in itertools.product(range(world), range(workers)):
            slot = rank * workers + worker
            groups = stream_order(shard_idx, slot, slots, 5, epoch, window, shuffle)
            for group in groups:
                assert len(set(shard_idx[group].tolist())) <= window
            mine = np.concatenate(groups).tolist() if groups else []
            assert len(mine) == slot_share(n, slots) == -(-n // slots), "equal shares"
            everything.extend(mine)
        assert set(everything) == set(range(n))
        assert len(everything) - n == -n % slots, "padding only to equal shares"


def stream_positions(packed: Packed, stream: PackedStream, batches: list) -> list[int]:
    by_bytes = {packed.images[p].tobytes(): p for p in stream.selection.positions.tolist()}
    found = []
    for images, labels in batches:
        for image, label in zip(images, labels, strict=True):
            p = by_bytes[image.numpy().tobytes()]
            assert packed.labels[p] == label.item()
            found.append(p)
    return found


@pytest.mark.parametrize("num_workers", [0, 2])
def test_ranks_and_workers_together_read_every_sample_once(
    packed: Packed, num_workers: int
) -> None:
    selection = open_catalog(packed.root).select(split="train")
    slots = 2 * max(num_workers, 1)
    for epoch in (0, 1):
        found, lengths = [], []
        for rank in range(2):
            stream = PackedStream(
                selection, batch_size=4, seed=3, window=2, rank=rank, world_size=2
            )
            stream.set_epoch(epoch)
            loader = stream_loader(stream, num_workers=num_workers)
            batches = list(loader)
            assert len(batches) == len(loader), "len() is what an epoch yields"
            lengths.append(len(batches))
            short = [b for b in batches if len(b.labels) < 4]
            assert len(short) <= max(num_workers, 1), "only each worker's last batch is short"
            found += stream_positions(packed, stream, batches)
        assert lengths[0] == lengths[1], "ranks yield equal numbers of batches, as DDP needs"
        assert set(found) == set(selection.positions.tolist())
        assert len(found) == slots * -(-len(selection) // slots), "equal shares, padded"


def test_persistent_workers_see_the_new_epoch(packed: Packed) -> None:
    selection = open_catalog(packed.root).select()
    stream = PackedStream(selection, batch_size=8, seed=0)
    loader = stream_loader(stream, num_workers=2, persistent_workers=True)
    first = stream_positions(packed, stream, list(loader))
    loader.set_epoch(0)  # a whole pass goes on to the next epoch unless told
    assert stream_positions(packed, stream, list(loader)) == first
    loader.set_epoch(1)
    second = stream_positions(packed, stream, list(loader))
    assert second != first and sorted(second) == sorted(first)


def test_batches_span_groups_and_drop_last(packed: Packed) -> None:
    selection = open_catalog(packed.root).select()
    stream = PackedStream(selection, batch_size=10, window=1, shuffle=False)
    sizes = [len(b.labels) for b in stream]
    assert sizes == [10] * (len(selection) // 10) + [len(selection) % 10]
    unshuffled = stream_positions(packed, stream, list(stream))
    assert Counter(unshuffled) == Counter(selection.positions.tolist())
    stream.drop_last = True
    assert [len(b.labels) for b in stream] == [10] * (len(selection) // 10)


def test_single_samples_without_batch_size(packed: Packed) -> None:
    selection = open_catalog(packed.root).select(split="val")
    stream = PackedStream(selection, batch_size=None, seed=1)
    items = list(stream_loader(stream))
    by_bytes = {packed.images[p].tobytes(): p for p in selection.positions.tolist()}
    found = [by_bytes[image.numpy().tobytes()] for image, _ in items]
    assert sorted(found) == sorted(selection.positions.tolist())
    assert [label for _, label in items] == packed.labels[found].tolist()


def test_stream_maps_at_most_two_windows_of_shards(packed: Packed) -> None:
    stream = PackedStream(open_catalog(packed.root).select(), batch_size=16, window=2)
    mapped = []
    for _ in stream:
        mapped.append(len(stream.reader.mapped()))
    assert max(mapped) <= 4 and not stream.reader.mapped()
    assert max(mapped) >= 2


def test_spawned_persistent_workers_see_the_new_epoch(packed: Packed) -> None:
    stream = PackedStream(open_catalog(packed.root).select(), batch_size=8, seed=0)
    loader = stream_loader(
        stream, num_workers=1, persistent_workers=True, multiprocessing_context="spawn"
    )
    first = stream_positions(packed, stream, list(loader))
    loader.set_epoch(1)
    second = stream_positions(packed, stream, list(loader))
    assert second != first and sorted(second) == sorted(first)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("num_workers", [0, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_delivery_is_the_order_the_loader_delivers_in(
    packed: Packed, num_workers: int, drop_last: bool
) -> None:
    """`PackedStream.delivery`, which a bounded cache fetches ahead by, names the batches in
    the order the DataLoader hands them out (its workers round-robin), resumed or not."""
    selection = open_catalog(packed.root).select()
    stream = PackedStream(selection, batch_size=4, seed=2, window=2, drop_last=drop_last)
    loader = stream_loader(stream, num_workers=num_workers, with_indices=True)
    loader.set_epoch(1)
    delivered = [batch.indices.tolist() for batch in loader]
    twin = loader.dataset
    assert [b.tolist() for b in twin.delivery()] == delivered
    loader.set_epoch(1)  # a whole pass goes on to the next epoch unless told
    first = iter(loader)
    for _ in range(5):
        next(first)
    state = loader.state_dict()
    del first
    loader.load_state_dict(state)
    loader.set_epoch(1)
    assert [b.tolist() for b in twin.delivery(5)] == delivered[5:]
    assert [batch.indices.tolist() for batch in loader] == delivered[5:]
