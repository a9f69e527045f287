"""Batch memory: reused buffers are never handed out while a batch still uses them."""

from __future__ import annotations

import gc
import mmap
import multiprocessing
import os
import pickle
import resource
import sys
import warnings

import numpy as np
import pytest
import torch

from loaders import DeviceLoader, PackedDataset, PackedStream, make_loader, stream_loader
from loaders.memory.batch_memory import BatchMemory
from loaders.memory.buffer_pool import BufferPool
from loaders.memory.ring import SharedRing, shared_bytes
from loaders.read.span import prefault
from tests.helpers.packed import Packed


@pytest.fixture(autouse=True)
def _quiet_cpu_note() -> None:
    warnings.filterwarnings("ignore", "CUDA is not available", RuntimeWarning)


def images_of(ds: PackedDataset, packed: Packed, indices: list[int]) -> np.ndarray:
    return packed.images[ds.selection.positions[indices]]


def test_pool_reuses_a_buffer_only_when_nothing_refers_to_it() -> None:
    pool = BufferPool(keep=2)
    first = pool.lend((10, 10))
    address = first.ctypes.data
    kept = torch.from_numpy(first)[2:4]  # a view keeps the buffer
    del first
    second = pool.lend((10, 10))
    assert second.ctypes.data != address
    del kept
    gc.collect()
    third = pool.lend((6, 10))  # a smaller request may reuse a larger buffer
    assert third.ctypes.data == address and third.shape == (6, 10)


def test_batches_of_varying_sizes_keep_their_buffers() -> None:
    """Padded batches vary in size: a request too big for an idle buffer leaves it idle, and
    a request takes the smallest that fits."""
    pool = BufferPool(keep=4)
    small, big = pool.lend((10, 10)), pool.lend((40, 10))
    addresses = small.ctypes.data, big.ctypes.data
    del small, big
    gc.collect()
    larger = pool.lend((50, 10))  # fits neither: a new one, both kept
    assert larger.ctypes.data not in addresses
    again = pool.lend((8, 10))
    assert again.ctypes.data == addresses[0]  # the smallest that fits
    assert pool.lend((30, 10)).ctypes.data == addresses[1]


def test_kept_batches_are_never_overwritten(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    rng = np.random.default_rng(0)
    picks = [rng.integers(0, len(ds), 9).tolist() for _ in range(12)]
    kept = []
    for i, pick in enumerate(picks):
        images, _ = ds.gather(pick)
        if i % 3 == 0:
            kept.append((pick, images.numpy()))  # only a numpy view of the tensor survives
        del images
    for pick, array in kept:
        np.testing.assert_array_equal(array, images_of(ds, packed, pick))
    addresses = {ds.gather(picks[0]).images.data_ptr() for _ in range(5)}
    assert len(addresses) == 1, "a dropped batch's buffer is reused"


def test_workers_fill_ring_slots_and_the_main_process_frees_them(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    # Not pinned: with CUDA present DataLoader's pin thread copies each batch out of its slot.
    loader = make_loader(
        ds,
        batch_size=8,
        num_workers=2,
        workers_as="processes",
        persistent_workers=True,
        pin_memory=False,
    )
    ring = loader.dataset.memory.ring
    assert ring is not None and len(ring) == 2 * 2 + 4
    base = ring.data.data_ptr()
    in_ring = 0
    for start, (images, labels) in zip(range(0, len(ds), 8), loader, strict=True):
        idx = list(range(start, min(start + 8, len(ds))))
        np.testing.assert_array_equal(images.numpy(), images_of(ds, packed, idx))
        np.testing.assert_array_equal(labels.numpy(), packed.labels[ds.selection.positions[idx]])
        in_ring += base <= images.data_ptr() < base + ring.data.nbytes
    assert in_ring == -(-len(ds) // 8), "every batch came through the ring"
    del images, labels
    gc.collect()
    assert (ring.owner == 0).all(), "every slot is free once its batch is gone"


def test_batches_kept_past_the_ring_fall_back_and_stay_intact(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    loader = make_loader(ds, batch_size=4, shuffle=True, num_workers=2, workers_as="processes")
    ring = loader.dataset.memory.ring
    assert ring is not None
    batches = []
    for _ in range(2):  # more batches than slots, all held
        loader.set_epoch(0)
        batches.append(list(loader))
    assert len(batches[0]) > len(ring)
    order = loader.sampler.order() if loader.sampler is not None else None
    assert order is not None
    for epoch in batches:
        for k, (images, _) in enumerate(epoch):
            idx = order[4 * k : 4 * k + 4].tolist()
            np.testing.assert_array_equal(images.numpy(), images_of(ds, packed, idx))


def test_stream_workers_use_the_ring(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    loader = stream_loader(PackedStream(ds.selection, batch_size=6, window=2), num_workers=2)
    ring = loader.dataset.memory.ring
    assert ring is not None
    by_bytes = {packed.images[p].tobytes(): p for p in ds.selection.positions.tolist()}
    seen = []
    for images, labels in loader:
        for image, label in zip(images, labels, strict=True):
            p = by_bytes[image.numpy().tobytes()]
            assert packed.labels[p] == label.item()
            seen.append(p)
    assert sorted(seen) == sorted(ds.selection.positions.tolist())


def ring_batch(ring: SharedRing, shape: tuple[int, ...], value: int) -> tuple[int, bytes]:
    """What a worker sends, made in this process: claim, fill, pickle."""
    slot = ring.claim(int(np.prod(shape)))
    assert slot is not None
    sent = ring.write(slot, shape, lambda out: out.fill(value), np.arange(shape[0]))
    return slot, pickle.dumps(sent)


def test_received_slots_are_freed_only_by_the_receiving_process() -> None:
    ring = SharedRing(2, 64, multiprocessing.get_context("fork"))
    slot, blob = ring_batch(ring, (4, 4, 4), 9)
    assert ring.owner[slot] == os.getpid()
    images, labels = pickle.loads(blob)
    assert ring.owner[slot] == -1 and (images == 9).all() and labels.tolist() == [0, 1, 2, 3]
    pid = os.fork()
    if pid == 0:  # a child that inherited the batch drops it: the slot must stay taken
        del images
        gc.collect()
        os._exit(0 if ring.owner[slot] == -1 else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert ring.owner[slot] == -1
    del images
    gc.collect()
    assert ring.owner[slot] == 0


def test_a_full_ring_gives_none_and_slots_of_dead_workers_come_back() -> None:
    ring = SharedRing(2, 64, multiprocessing.get_context("fork"))
    assert ring.claim(65) is None, "too big for a slot"
    assert ring.claim(64) is not None and ring.claim(64) is not None
    assert ring.claim(8) is None
    child = multiprocessing.get_context("fork").Process(target=lambda: None)
    child.start()
    child.join()
    ring.owner[1] = child.pid  # claimed by a worker that exited before its batch was read
    assert ring.claim(8) == 1


def test_a_slot_from_an_unknown_ring_is_refused() -> None:
    ring = SharedRing(1, 64, multiprocessing.get_context("fork"))
    _, blob = ring_batch(ring, (2, 4), 1)
    del ring
    gc.collect()
    with pytest.raises(RuntimeError, match="ring this process does not have"):
        pickle.loads(blob)


def test_worker_errors_free_the_slot() -> None:
    ring = SharedRing(1, 64, multiprocessing.get_context("fork"))
    slot = ring.claim(16)
    assert slot is not None

    def fail(out: np.ndarray) -> None:
        raise OSError("disk")

    with pytest.raises(OSError, match="disk"):
        ring.write(slot, (4, 4), fail, np.zeros(4, dtype=np.int64))
    assert ring.owner[slot] == 0


def test_memory_pickles_without_idle_buffers() -> None:
    memory = BatchMemory()
    batch = memory.batch((2, 3), np.zeros(2, dtype=np.int64), lambda out: out.fill(1))
    del batch
    assert memory._pool._idle
    assert pickle.loads(pickle.dumps(memory))._pool._idle == []


def test_device_loader_over_workers_sees_every_batch_intact(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    device = DeviceLoader(
        make_loader(ds, batch_size=4, num_workers=2, workers_as="processes"), device="cpu"
    )
    kept = list(device)  # DeviceLoader holds a batch ahead; the list holds them all
    assert len(kept) == -(-len(ds) // 4)
    for k, (images, labels) in enumerate(kept):
        idx = list(range(4 * k, min(4 * k + 4, len(ds))))
        expected = torch.from_numpy(images_of(ds, packed, idx)).permute(0, 3, 1, 2)
        assert torch.equal(images, expected)
        assert labels.tolist() == packed.labels[ds.selection.positions[idx]].tolist()


@pytest.mark.skipif(sys.platform != "linux", reason="MADV_POPULATE_WRITE is Linux's")
def test_prefault_maps_a_fresh_shared_slot_in_one_call() -> None:
    """A worker's first copy into a ring slot takes no page fault per page once prefaulted."""

    def faults_writing(prefaulted: bool) -> int:
        slot = shared_bytes(8 << 20).numpy()
        if prefaulted:
            prefault(slot)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        slot[:] = 7
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    pages = (8 << 20) // mmap.PAGESIZE
    assert faults_writing(False) > pages // 2, "a fresh mapping faults as it is written"
    assert faults_writing(True) < pages // 20


def _in_ring(ring: SharedRing, images: torch.Tensor) -> bool:
    """Whether a batch's images lie in the ring's shared memory (no copy was made of them)."""
    start = ring.data.data_ptr()
    return start <= images.data_ptr() < start + ring.data.numel()


def test_a_uint8_transform_in_workers_fills_ring_slots(packed: Packed) -> None:
    """A per-sample uint8 transform (a crop in the workers, say) stacks its samples straight
    into a ring slot, not into a fresh tensor; a float transform still gets its own stack."""
    ds = PackedDataset.open(packed.root, transform=lambda image: image.flip(0))
    loader = make_loader(ds, batch_size=4, num_workers=2, workers_as="processes", with_indices=True)
    ring = loader.dataset.memory.ring
    assert ring is not None
    batches = 0
    for images, _, indices in loader:
        assert _in_ring(ring, images)
        want = images_of(ds, packed, indices.tolist())[:, ::-1]
        assert np.array_equal(images.numpy(), want)
        batches += 1
        del images
    assert batches == -(-len(ds) // 4)
    floats = PackedDataset.open(packed.root, transform=lambda image: image.float() / 255)
    float_loader = make_loader(
        floats, batch_size=4, num_workers=2, workers_as="processes", with_indices=True
    )
    for images, _, indices in float_loader:
        want = images_of(floats, packed, indices.tolist()) / 255
        assert images.dtype == torch.float32 and np.allclose(images.numpy(), want)


def test_a_ring_travels_without_what_belongs_to_its_reader() -> None:
    """What a spawned worker gets: the shared tensors and the lock, not the reader's CUDA
    registration, its queue of slots waiting for copies, or its thread lock."""
    ring = SharedRing(2, 64, multiprocessing.get_context("spawn"))
    ring._dropped.append(1)
    state = ring.__getstate__()
    assert {"pinned", "_dropped", "_copying", "_guard", "_numpy"}.isdisjoint(state)
    twin = SharedRing.__new__(SharedRing)
    twin.__setstate__(state)
    assert twin.pinned is None and twin._dropped == [] and not twin._copying
    assert twin.data.data_ptr() == ring.data.data_ptr()


MADV_DONTFORK = 10


@pytest.mark.skipif(sys.platform != "linux", reason="madvise and /proc/self/smaps are Linux's")
def test_a_ring_kept_from_forks_is_given_back_to_them() -> None:
    """A driver may mark page-locked memory not to be inherited on fork; forked workers would
    then fault writing their batch. The registration undoes it, and a forked child then
    writes into the ring where the parent reads it."""
    import ctypes
    import ctypes.util

    from loaders.memory.pinning import Registration, _dont_fork, _inherited_on_fork

    memory = shared_bytes(4 * mmap.PAGESIZE)
    registration = Registration(memory, 0.0)
    assert _dont_fork(registration) is False
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    rc = libc.madvise(
        ctypes.c_void_p(memory.data_ptr()), ctypes.c_size_t(memory.numel()), MADV_DONTFORK
    )
    assert rc == 0, os.strerror(ctypes.get_errno())
    assert _dont_fork(registration) is True
    assert _inherited_on_fork(registration)
    assert _dont_fork(registration) is False
    pid = os.fork()
    if pid == 0:
        memory.numpy()[:] = 7
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert (memory.numpy() == 7).all()
    registration.closed = True  # never registered with CUDA: nothing to undo


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answer")
def test_without_cuda_a_ring_is_not_registered_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import loaders.memory.ring
    from loaders.memory.pinning import register

    monkeypatch.setattr(loaders.memory.ring, "_said_not_pinned", False)

    assert register(shared_bytes(64)) == "CUDA is not available"
    ring = SharedRing(2, 64, multiprocessing.get_context("fork"))
    with pytest.warns(RuntimeWarning, match="not page-locked .CUDA is not available"):
        assert ring.pin() is False
    assert ring.pin() is False and ring.pinned is None
