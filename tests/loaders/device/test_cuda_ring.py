"""Workers' batches pinned where they are made: the ring page-locked for CUDA in place, each slot
freed only after the copy that read it ran (NOTE [ a ring pinned in place ] in
`loaders.memory.pinning`, NOTE [ freed after the copy ] in `loaders.memory.ring`). Skipped without
CUDA.

As in tests/loaders/device/test_cuda.py, `--break-mechanism NAME` removes one mechanism (`BREAKS`)
and runs only the tests guarding it, which must then fail; every batch is compared with what
`make_packed` wrote.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import loaders.memory.ring
from loaders import DeviceLoader, PackedDataset, RandomResizedCrop, make_loader
from loaders.memory.pinning import _clear_last_cuda_error
from loaders.memory.ring import SharedRing
from tests.helpers.packed import Packed, make_packed

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SLEEP = 20_000_000
"""`torch.cuda._sleep` cycles: ~10 ms at 2 GHz, far longer than a batch's copy here."""


def _free_at_once(ring: SharedRing, slot: int, receiver: int) -> None:
    ring.arrays()[1][slot] = 0  # what a ring not pinned does: free when dropped


BREAKS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "ring_pinned": lambda mp: mp.setattr(loaders.memory.ring, "register", lambda memory: "broken"),
    "freed_after_copy": lambda mp: mp.setattr(SharedRing, "_drop", _free_at_once),
}


@pytest.fixture(autouse=True)
def _quiet_refusal() -> None:
    warnings.filterwarnings("ignore", "the loader's shared-memory ring", RuntimeWarning)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    shards = (64, 57, 71)  # 192 samples: 24 batches of 8 an epoch, more than the ring's slots
    return make_packed(tmp_path_factory.mktemp("ds"), shard_sizes=shards, sample_shape=(32, 40, 3))


def written(packed: Packed, ds: PackedDataset, indices: torch.Tensor) -> torch.Tensor:
    """The HWC images `make_packed` wrote for dataset indices: the independent oracle."""
    return torch.from_numpy(packed.images[ds.selection.positions[indices.cpu().numpy()]])


def ring_of(loader: Any) -> SharedRing:
    ring = loader.dataset.memory.ring
    assert ring is not None, "a loader with workers has a ring"
    return ring


def in_ring(ring: SharedRing, images: torch.Tensor) -> bool:
    start = ring.data.data_ptr()
    return start <= images.data_ptr() < start + ring.data.numel()


def flip_rows(image: torch.Tensor) -> torch.Tensor:
    return image.flip(0)  # a uint8 per-sample transform, as a crop in the workers would be


@pytest.mark.guards("ring_pinned")
@pytest.mark.parametrize("transform", [None, flip_rows], ids=["gathered", "uint8 transform"])
@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_worker_batches_arrive_pinned_in_the_ring_without_a_copy(
    packed: Packed, persistent: bool, transform: Any
) -> None:
    """Every batch from the workers is pinned where the worker wrote it: the pin thread
    copied nothing (the images lie in the ring), over two epochs of fresh or persistent
    workers, with one registration for the ring's life."""
    ds = PackedDataset.open(packed.root, transform=transform)
    loader = make_loader(
        ds, batch_size=8, shuffle=True, num_workers=2,
        workers_as="processes", persistent_workers=persistent,
        with_indices=True,
    )  # fmt: skip
    ring = ring_of(loader)
    registrations = []
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        count = 0
        for images, labels, indices in loader:
            assert images.is_pinned() and labels.is_pinned()
            assert in_ring(ring, images), "the pin thread copied the batch"
            want = written(packed, ds, indices)
            assert torch.equal(images, want.flip(1) if transform else want)
            count += 1
        assert count == len(loader)
        registrations.append(ring.pinned)
    assert registrations[0] is not None and registrations[0] is registrations[1]


@pytest.mark.guards("freed_after_copy")
@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_a_slot_is_not_reused_before_the_copy_that_reads_it_ran(
    packed: Packed, persistent: bool
) -> None:
    """The loop queues a long kernel, then the non-blocking copy of the batch, then drops it:
    the copy runs long after. A worker given that slot meanwhile would overwrite the batch
    before the copy read it."""
    ds = PackedDataset.open(packed.root)
    loader = make_loader(
        ds, batch_size=8, shuffle=True, num_workers=2,
        workers_as="processes", persistent_workers=persistent,
        with_indices=True,
    )  # fmt: skip
    arrived, expected = [], []
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        for images, _, indices in loader:
            torch.cuda._sleep(SLEEP)  # the stream is busy: the copy below waits
            arrived.append(images.to("cuda", non_blocking=True))
            expected.append(written(packed, ds, indices))
            del images
    torch.cuda.synchronize()
    assert ring_of(loader).pinned is not None
    assert len(arrived) == 2 * len(loader)
    for got, want in zip(arrived, expected, strict=True):
        assert torch.equal(got.cpu(), want)


@pytest.mark.guards("freed_after_copy")
def test_a_slot_outlives_lightnings_own_batch_transfer(packed: Packed, tmp_path: Path) -> None:
    """Lightning copies each batch itself (`.to(device, non_blocking=True)`) on the current
    stream, held here behind a long kernel: the batch a training step sees is the one
    written, and the event that frees its slot is recorded at the next fetch."""
    import lightning as L

    ds = PackedDataset.open(packed.root)
    loader = make_loader(
        ds, batch_size=8, shuffle=True, num_workers=2, workers_as="processes", with_indices=True
    )
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    class Check(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            torch.cuda._sleep(SLEEP)
            return batch

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            images, _, indices = batch
            assert images.is_cuda
            seen.append((images.clone(), indices.clone()))
            return (self.weight * 0).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    trainer = L.Trainer(
        accelerator="gpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(Check(), train_dataloaders=loader)
    torch.cuda.synchronize()
    assert len(seen) == 2 * len(loader)
    for images, indices in seen:
        assert torch.equal(images.cpu(), written(packed, ds, indices))


@pytest.mark.guards("freed_after_copy")
def test_a_slot_outlives_a_copy_in_an_accelerate_loop(packed: Packed) -> None:
    """accelerate on the GPU: `prepare` keeps the loader as it is (it is split between ranks
    already: `_is_accelerate_prepared`), and the loop copies each batch to the accelerator's
    device itself, non-blocking, behind a long kernel; every batch a step sees is the one
    written, over fresh workers' epochs."""
    from accelerate import Accelerator

    accelerator = Accelerator()
    ds = PackedDataset.open(packed.root)
    loader = make_loader(
        ds, batch_size=8, shuffle=True, num_workers=2, workers_as="processes", with_indices=True
    )
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    assert prepared is loader and accelerator.device.type == "cuda"
    arrived, expected = [], []
    for epoch in (0, 1):
        prepared.set_epoch(epoch)
        for images, _, indices in prepared:
            torch.cuda._sleep(SLEEP)
            arrived.append(images.to(accelerator.device, non_blocking=True))
            expected.append(written(packed, ds, indices))
            del images
    torch.cuda.synchronize()
    assert ring_of(loader).pinned is not None and len(arrived) == 2 * len(loader)
    for got, want in zip(arrived, expected, strict=True):
        assert torch.equal(got.cpu(), want)


def test_an_augmented_device_loader_over_workers_equals_the_cpu(packed: Packed) -> None:
    """DeviceLoader's side-stream copy and batched crop over batches pinned in the ring: what
    the CPU computes from the images written."""
    ds = PackedDataset.open(packed.root)
    crop = RandomResizedCrop(24, seed=3)
    loader = make_loader(
        ds, batch_size=8, shuffle=True, num_workers=2, workers_as="processes", with_indices=True
    )
    device = DeviceLoader(loader, dtype=torch.float32, augment=crop)
    count = 0
    for images, _, indices in device:
        nchw = written(packed, ds, indices).permute(0, 3, 1, 2)
        reference = crop(nchw, indices, 0)
        torch.testing.assert_close(images.cpu() * 255, reference, atol=2e-3, rtol=0)
        count += 1
    assert count == len(loader) and ring_of(loader).pinned is not None


def test_a_real_refusal_is_reported_and_leaves_no_stale_cuda_error() -> None:
    """CUDA refuses a range registered already: `register` says so, and the error it left
    as CUDA's last error does not surface in the next kernel launch."""
    from loaders.memory.pinning import register
    from loaders.memory.ring import shared_bytes

    memory = shared_bytes(1 << 20)
    cudart = torch.cuda.cudart()
    assert int(cudart.cudaHostRegister(memory.data_ptr(), memory.numel(), 0)) == 0
    try:
        outcome = register(memory)
        assert isinstance(outcome, str) and "CUDA error" in outcome, outcome
        assert torch.ones(4, device="cuda").sum().item() == 4  # no stale error raised here
    finally:
        cudart.cudaHostUnregister(memory.data_ptr())


def test_a_ring_not_registered_keeps_todays_path_and_says_why_once(
    packed: Packed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where CUDA refuses (as above), batches are copied into pinned memory by the pin
    thread, intact, each slot freed when its batch is dropped, and the loader says why once."""
    monkeypatch.setattr(loaders.memory.ring, "_said_not_pinned", False)
    monkeypatch.setattr(loaders.memory.ring, "register", lambda memory: "CUDA error 712, say")
    ds = PackedDataset.open(packed.root)
    loader = make_loader(ds, batch_size=8, num_workers=2, workers_as="processes", with_indices=True)
    ring = ring_of(loader)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            for images, _, indices in loader:
                assert images.is_pinned() and not in_ring(ring, images)
                assert torch.equal(images, written(packed, ds, indices))
    notes = [w for w in said if "not page-locked" in str(w.message)]
    assert len(notes) == 1 and "CUDA error 712" in str(notes[0].message)
    assert ring.pinned is None


def test_a_ring_is_registered_once_and_unregistered_with_its_loader(packed: Packed) -> None:
    """Five epochs of fresh workers: one registration, kept; the loader gone, the range is
    no longer registered (CUDA refuses to unregister it again). (The kernel's VmLck and
    VmPin do not count the driver's pins: both read 0 on an H100 machine, 2026-11-28.)"""
    ds = PackedDataset.open(packed.root)
    loader = make_loader(ds, batch_size=8, shuffle=True, num_workers=2, workers_as="processes")
    ring = ring_of(loader)
    registrations = []
    for epoch in range(5):
        loader.set_epoch(epoch)
        assert sum(1 for _ in loader) == len(loader)  # no batch kept: each slot comes back
        registrations.append(ring.pinned)
    registration = registrations[0]
    assert registration is not None and not registration.closed
    assert all(r is registration for r in registrations), "registered again"
    address = registration.address
    del loader, ring, ds
    gc.collect()
    assert registration.closed
    torch.cuda.synchronize()
    again = int(torch.cuda.cudart().cudaHostUnregister(address))
    _clear_last_cuda_error()
    assert again != 0, "the ring was still registered after its loader was collected"


@pytest.fixture(scope="module")
def aspect_kept(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.helpers.aspect import pack_aspect

    return pack_aspect(tmp_path_factory.mktemp("aspect"), count=24, seed=7)


@pytest.mark.guards("freed_after_copy")
def test_padded_batches_of_own_size_samples_survive_a_held_copy(aspect_kept: Any) -> None:
    """Samples that keep their aspect ratio, padded in the workers' ring slots, copied behind
    a long kernel: what arrives equals the same batches read without workers."""
    ds = PackedDataset.open(aspect_kept)
    options: Any = {"batch_size": 4, "shuffle": True, "seed": 1, "with_indices": True}
    arrived = []
    for images, _, _, _ in make_loader(ds, num_workers=2, workers_as="processes", **options):
        torch.cuda._sleep(SLEEP)
        arrived.append(images.to("cuda", non_blocking=True))
        del images
    torch.cuda.synchronize()
    reference = [batch.images for batch in make_loader(ds, pin_memory=False, **options)]
    assert len(arrived) == len(reference) > 2
    for got, want in zip(arrived, reference, strict=True):
        assert torch.equal(got.cpu(), want)
    assert np.all([a.dim() == 4 for a in arrived])
