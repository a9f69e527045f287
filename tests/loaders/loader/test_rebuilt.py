"""A loader rebuilt from its parts, wrapped, skipped into or never told the epoch reads what the
loader itself would have read (NOTE [ the run lives in the sampler ] in
`loaders.order.run_batches`). Samples are identified by content, against the images
`make_packed` wrote; the reference is the loader read with an explicit `set_epoch` each epoch."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from accelerate import skip_first_batches
from torch.utils.data import DataLoader, default_convert

from loaders import PackedDataset, make_loader
from loaders.batch.types import Batch, IndexedBatch
from loaders.datasets.packed import collate_batch
from tests.helpers.packed import Packed
from tests.loaders.loader.test_loader import positions_of


@pytest.fixture(autouse=True)
def _quiet_cpu_note() -> None:
    warnings.filterwarnings("ignore", "CUDA is not available", RuntimeWarning)


def epochs_told(packed: Packed, epochs: int, **options: Any) -> list[list[int]]:
    """Each epoch's samples, read with `set_epoch` before each (the reference)."""
    ds = PackedDataset.open(packed.root, split="train")
    return read_told(packed, make_loader(ds, batch_size=4, shuffle=True, seed=5, **options), epochs)


def read_told(packed: Packed, loader: Any, epochs: int) -> list[list[int]]:
    ds = PackedDataset.open(packed.root, split="train")
    found = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        found.append(positions_of(ds, packed, list(loader)))
    return found


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataloader_rebuilt_from_the_parts_reads_what_the_loader_would(
    packed: Packed, workers: int
) -> None:
    """`DataLoader(loader.dataset, batch_sampler=loader.batch_sampler)`, as trainers rebuild
    one, with `set_epoch` told to the loader, its sampler or its batch sampler."""
    expected = epochs_told(packed, 3)
    ds = PackedDataset.open(packed.root, split="train")
    loader = make_loader(ds, batch_size=4, shuffle=True, seed=5)
    rebuilt = DataLoader(
        loader.dataset,
        batch_sampler=loader.batch_sampler,
        collate_fn=loader.collate_fn,
        num_workers=workers,
    )
    told = (loader.set_epoch, loader.sampler.set_epoch, loader.batch_sampler.set_epoch)
    for epoch, set_epoch in enumerate(told):
        set_epoch(epoch)
        assert positions_of(ds, packed, list(rebuilt)) == expected[epoch], epoch
    if workers == 0:
        assert loader.state_dict()["step"] == 3 * len(loader), "the rebuilt loader's steps count"
    else:  # its workers drew ahead of the loop: how far the loop got is not known here
        with pytest.raises(ValueError, match="gathered by DataLoader workers"):
            loader.state_dict()


def test_a_rebuilt_loader_with_workers_is_counted_where_told_and_refused_otherwise(
    packed: Packed,
) -> None:
    """Workers draw ahead: a state saved in the middle of such a pass is refused in one line,
    never a wrong position; told how many batches the loop took, it resumes exactly. A
    DataLoader that reads the dataset through a sampler of its own is refused too."""
    expected = epochs_told(packed, 1)[0]
    ds = PackedDataset.open(packed.root, split="train")
    loader = make_loader(ds, batch_size=4, shuffle=True, seed=5)
    rebuilt = DataLoader(
        loader.dataset, batch_sampler=loader.batch_sampler, collate_fn=loader.collate_fn,
        num_workers=2,
    )  # fmt: skip
    batches = iter(rebuilt)
    took = positions_of(ds, packed, [next(batches), next(batches)])
    with pytest.raises(ValueError, match="gathered by DataLoader workers"):
        loader.state_dict()
    loader.batch_sampler.delivered(2)
    state = loader.state_dict()
    del batches
    fresh = make_loader(ds, batch_size=4, shuffle=True, seed=5)
    fresh.load_state_dict(state)
    assert took + positions_of(ds, packed, list(fresh)) == expected

    other = make_loader(ds, batch_size=4, shuffle=True, seed=5)
    own_sampler = DataLoader(other.dataset, batch_size=4, collate_fn=other.collate_fn)
    next(iter(own_sampler))
    with pytest.raises(ValueError, match="a sampler of its own"):
        other.state_dict()


def test_whole_epochs_advance_by_themselves_and_a_cut_one_does_not(packed: Packed) -> None:
    """Keras never calls set_epoch: a pass read to its end is followed by the next epoch; one
    left early (a sanity check, a break) is read again from its start; set_epoch wins."""
    expected = epochs_told(packed, 3)
    ds = PackedDataset.open(packed.root, split="train")
    loader = make_loader(ds, batch_size=4, shuffle=True, seed=5)
    assert positions_of(ds, packed, list(loader)) == expected[0]
    batches = iter(loader)
    cut = positions_of(ds, packed, [next(batches), next(batches)])
    assert cut == expected[1][:8]
    del batches
    assert positions_of(ds, packed, list(loader)) == expected[1], "a cut pass does not count"
    loader.set_epoch(1)
    assert positions_of(ds, packed, list(loader)) == expected[1], "set_epoch wins"
    assert positions_of(ds, packed, list(loader)) == expected[2]
    assert loader.epoch == 2


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_saved_without_set_epoch_resumes_exactly(packed: Packed, workers: int) -> None:
    """Epochs that advanced by themselves are in the state: saved in the middle of the
    second, a fresh loader given the state reads the rest of it, then the third."""
    expected = epochs_told(packed, 3)
    ds = PackedDataset.open(packed.root, split="train")
    loader = make_loader(
        ds, batch_size=4, shuffle=True, seed=5, num_workers=workers, workers_as="processes"
    )
    list(loader)
    batches = iter(loader)
    first = positions_of(ds, packed, [next(batches) for _ in range(3)])
    state = loader.state_dict()
    del batches
    assert (state["epoch"], state["step"]) == (1, len(loader) + 3)
    fresh = make_loader(
        ds, batch_size=4, shuffle=True, seed=5, num_workers=workers, workers_as="processes"
    )
    fresh.load_state_dict(state)
    rest = positions_of(ds, packed, list(fresh))
    assert first + rest == expected[1]
    assert positions_of(ds, packed, list(fresh)) == expected[2]


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_first_batches_is_exact_and_reads_no_skipped_sample(
    packed: Packed, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers' Trainer on resume: `skip_first_batches(loader, k)` (accelerate), then
    `set_epoch` on the result and on its batch sampler's batch sampler, in that order. The
    rebuilt loader reads exactly the epoch's batches after the first k, and the k skipped
    are never gathered."""
    expected = epochs_told(packed, 2)
    ds = PackedDataset.open(packed.root, split="train")
    loader = make_loader(
        ds, batch_size=4, shuffle=True, seed=5, num_workers=workers, workers_as="processes"
    )
    gathered: list[list[int]] = []
    original = type(loader.dataset).__getitems__

    def counted(self: PackedDataset, indices: list[int]) -> Any:
        gathered.append(list(indices))
        return original(self, indices)

    monkeypatch.setattr(type(loader.dataset), "__getitems__", counted)
    skipped = skip_first_batches(loader, 3)
    if hasattr(skipped, "set_epoch"):
        skipped.set_epoch(1)
    skipped.batch_sampler.batch_sampler.set_epoch(1)  # what the Trainer reaches for
    rest = positions_of(ds, packed, list(skipped))
    assert rest == expected[1][12:]
    if workers == 0:  # gathers in workers are not seen here; the result above is
        assert len(gathered) == len(loader) - 3, "no skipped batch was gathered"


def test_batches_survive_being_rebuilt_as_trainers_rebuild_them(packed: Packed) -> None:
    """`type(batch)(generator)` (transformers' `_prepare_input`), default_convert, pickling
    and `.to(...)` keep the batch type and its fields; a lone tensor is refused."""
    ds = PackedDataset.open(packed.root)
    for with_indices in (False, True):
        batch = next(iter(make_loader(ds, batch_size=4, with_indices=with_indices)))
        kind = IndexedBatch if with_indices else Batch
        assert type(batch) is kind
        rebuilt = type(batch)(field for field in batch)
        assert type(rebuilt) is kind and all(a is b for a, b in zip(rebuilt, batch, strict=True))
        assert type(default_convert(batch)) is kind
        moved = batch.to("cpu", dtype=None)
        assert type(moved) is kind and torch.equal(moved.images, batch.images)
        images, labels, *rest = batch
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        assert len(rest) == int(with_indices)
    with pytest.raises(TypeError, match="single tensor"):
        Batch(torch.zeros(2, 3))
    assert collate_batch is not None


def test_the_batch_sampler_is_a_torch_batch_sampler(packed: Packed) -> None:
    """What trainers read off a DataLoader reads as DataLoader's own would."""
    from torch.utils.data import BatchSampler, DistributedSampler

    ds = PackedDataset.open(packed.root, split="train")
    loader = make_loader(ds, batch_size=4, shuffle=True, drop_last=True)
    assert isinstance(loader.batch_sampler, BatchSampler)
    assert isinstance(loader.sampler, DistributedSampler)
    assert loader.batch_sampler.sampler is loader.sampler
    assert (loader.batch_size, loader.drop_last, loader.batch_sampler.batch_size) == (4, True, 4)
    assert len(loader) == len(loader.batch_sampler) == len(ds) // 4
    sizes = [len(b) for b in loader.batch_sampler]
    assert sizes == [4] * (len(ds) // 4)
    assert np.unique(np.concatenate(list(loader.batch_sampler))).size == len(ds) // 4 * 4


@pytest.mark.parametrize("workers", [0, 2])
def test_as_inputs_makes_each_batch_the_dict_a_hugging_face_model_takes(
    packed: Packed, workers: int
) -> None:
    """`pixel_values` uint8 [B, C, H, W] (a view of the stored HWC samples) and `labels`: a
    dict that `"labels" in batch`, `.get` and `type(batch)({...})` treat as one, through the
    workers' ring too."""
    import pickle

    from loaders.batch.types import ModelInputs

    ds = PackedDataset.open(packed.root, split="train")
    plain = list(make_loader(ds, batch_size=4, shuffle=True, seed=5))
    loader = make_loader(ds, batch_size=4, shuffle=True, seed=5, num_workers=workers,
                         workers_as="processes", as_inputs=True)  # fmt: skip
    inputs = list(loader)
    assert len(inputs) == len(plain)
    for batch, reference in zip(inputs, plain, strict=True):
        assert isinstance(batch, ModelInputs) and set(batch) == {"pixel_values", "labels"}
        assert "labels" in batch and batch.get("labels") is batch["labels"]
        assert torch.equal(batch["pixel_values"], reference.images.permute(0, 3, 1, 2))
        assert torch.equal(batch["labels"], reference.labels)
        assert batch["pixel_values"].dtype == torch.uint8
        rebuilt = type(batch)({k: v for k, v in batch.items()})
        assert isinstance(rebuilt, ModelInputs) and rebuilt.keys() == batch.keys()
        again = pickle.loads(pickle.dumps(batch))
        assert torch.equal(again["pixel_values"], batch["pixel_values"])
    with pytest.raises(ValueError, match="as_inputs=True"):
        make_loader(ds, as_inputs=True, with_indices=True)
    with pytest.raises(ValueError, match="as_inputs=True"):
        make_loader(ds, as_inputs=True, collate_fn=list)


def a_stream_loader(packed: Packed, workers: int) -> Any:
    from loaders import stream_loader
    from loaders.datasets.stream import PackedStream
    from loaders.read.catalog import open_catalog

    stream = PackedStream(open_catalog(packed.root).select("train"), batch_size=4, seed=2)
    return stream_loader(stream, num_workers=workers)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_advances_by_itself_and_skips_exactly(packed: Packed, workers: int) -> None:
    """A stream loader read through with no set_epoch reads the next epoch (one left early
    does not); a state loaded for a skipping trainer, then accelerate's skip_first_batches
    over the loader (which reads the batches it skips: a stream has no order to skip in),
    gives exactly the rest of that epoch."""
    expected = read_told(packed, a_stream_loader(packed, workers), 3)
    ds = PackedDataset.open(packed.root, split="train")
    loader = a_stream_loader(packed, workers)
    assert positions_of(ds, packed, list(loader)) == expected[0]
    batches = iter(loader)
    next(batches)
    del batches
    assert positions_of(ds, packed, list(loader)) == expected[1], "a cut pass does not count"
    assert positions_of(ds, packed, list(loader)) == expected[2]

    saved = a_stream_loader(packed, workers)
    saved.set_epoch(1)
    batches = iter(saved)
    took = positions_of(ds, packed, [next(batches) for _ in range(2)])
    state = saved.state_dict()
    del batches
    resumed = a_stream_loader(packed, workers)
    resumed.load_state_dict(state, for_skipping=True)
    assert resumed.to_skip == 2
    rest = positions_of(ds, packed, list(skip_first_batches(resumed, resumed.to_skip)))
    assert took + rest == expected[1]
