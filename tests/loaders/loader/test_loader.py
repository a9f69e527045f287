from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import loaders.loader.packed
import loaders.memory.batch_memory
from loaders import DeviceLoader, PackedDataset, make_loader
from loaders.augment.crops import _params_on
from loaders.batch.types import Batch
from loaders.device.loader import bound_device, prepare_images
from loaders.loader.named_orders import SHUFFLES
from tests.helpers.packed import Packed, make_packed
from tests.helpers.page_cache import cached_fraction, cold_packed, wait_for


@pytest.fixture(autouse=True)
def _quiet_cpu_note() -> None:
    warnings.filterwarnings("ignore", "CUDA is not available", RuntimeWarning)


def positions_of(ds: PackedDataset, packed: Packed, batches: list[Batch]) -> list[int]:
    """Which manifest sample each delivered image is, found by content (independent of order)."""
    by_bytes = {packed.images[p].tobytes(): p for p in ds.selection.positions.tolist()}
    found = []
    for images, labels in batches:
        for image, label in zip(images, labels, strict=True):
            p = by_bytes[image.numpy().tobytes()]
            assert packed.labels[p] == label.item()
            found.append(p)
    return found


def test_sequential_loader_reads_the_split_in_order(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root, split="train")
    loader = make_loader(ds, batch_size=6)
    batches = list(loader)
    assert len(batches) == len(loader) == -(-len(ds) // 6)
    assert all(isinstance(b, Batch) for b in batches)
    assert positions_of(ds, packed, batches) == ds.selection.positions.tolist()


@pytest.mark.parametrize("shuffle", [True, *SHUFFLES])
def test_every_shuffle_name_covers_the_split(packed: Packed, shuffle: bool | str) -> None:
    ds = PackedDataset.open(packed.root, split="train")
    loader = make_loader(ds, batch_size=7, shuffle=shuffle, seed=4)
    found = positions_of(ds, packed, list(loader))
    if shuffle == "balanced":
        assert len(found) == len(ds)
        shares = Counter(packed.labels[found].tolist())
        assert set(shares) == set(packed.labels[ds.selection.positions].tolist())
        assert max(shares.values()) - min(shares.values()) <= 1, shares
    else:
        assert sorted(found) == sorted(ds.selection.positions.tolist())


def test_bad_arguments_say_what_is_valid(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    with pytest.raises(ValueError, match="expected a bool or one of"):
        make_loader(ds, shuffle="sorted")
    with pytest.raises(ValueError, match="not both"):
        make_loader(ds, shuffle=True, sampler=torch.utils.data.SequentialSampler(ds))


def test_workers_give_the_same_samples_as_the_main_process(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    plain = list(make_loader(ds, batch_size=8, shuffle="blocks", seed=2))
    workers = make_loader(
        ds,
        batch_size=8,
        shuffle="blocks",
        seed=2,
        num_workers=2,
        workers_as="processes",
        persistent_workers=True,
    )
    first = list(workers)
    workers.set_epoch(0)
    second = list(workers)
    expected = positions_of(ds, packed, plain)
    assert positions_of(ds, packed, first) == expected
    assert positions_of(ds, packed, second) == expected, "same epoch, same order"
    workers.set_epoch(1)
    third = positions_of(ds, packed, list(workers))
    assert third != expected and sorted(third) == sorted(expected)


@pytest.mark.parametrize(
    ("num_workers", "drop_last", "stop_after"), [(0, False, 3), (2, False, 4), (2, True, 1)]
)
def test_resume_mid_epoch_gives_exactly_the_rest(
    packed: Packed, num_workers: int, drop_last: bool, stop_after: int
) -> None:
    ds = PackedDataset.open(packed.root)

    def loader() -> loaders.loader.packed.PackedLoader:
        return make_loader(
            ds,
            batch_size=5,
            shuffle=True,
            seed=9,
            num_workers=num_workers,
            workers_as="processes",
            drop_last=drop_last,
        )

    reference = loader()
    reference.set_epoch(3)
    whole = positions_of(ds, packed, list(reference))

    first = loader()
    first.set_epoch(3)
    seen: list[Batch] = []
    for batch in first:  # workers have prefetched well past this point
        seen.append(batch)
        if len(seen) == stop_after:
            break
    state = json.loads(json.dumps(first.state_dict()))
    assert state["epoch"] == 3 and state["position"] == 5 * stop_after

    second = loader()
    second.load_state_dict(state)
    assert len(second) == len(reference), "a whole epoch, as DataLoader's len()"
    rest = positions_of(ds, packed, list(second))
    assert positions_of(ds, packed, seen) + rest == whole
    assert second.state_dict()["position"] == len(whole)
    second.set_epoch(4)
    assert second.state_dict()["position"] == 0 and len(list(second)) == len(reference)


def test_resume_needs_a_loaders_sampler(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    loader = make_loader(ds, sampler=torch.utils.data.RandomSampler(ds))
    with pytest.raises(TypeError, match="resuming needs"):
        loader.state_dict()


def test_without_cuda_pinning_is_off_and_said_once(
    packed: Packed, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loaders.memory.batch_memory, "_said_no_cuda", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ds = PackedDataset.open(packed.root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make_loader(ds, pin_memory=True)
        make_loader(ds)
        make_loader(ds, pin_memory=False)
    assert [str(w.message) for w in caught] == [
        "CUDA is not available: pin_memory is off and batches stay in pageable CPU memory"
    ]
    assert not loader.pin_memory and not loader.dataset.pin_output
    assert not next(iter(loader)).images.is_pinned()


# --- the device wrapper, on the CPU --------------------------------------------------------


def reference_float(images: np.ndarray, layout: str, mean: list[float], std: list[float]):
    """(x / 255 - mean) / std in float64, NCHW: computed without torch."""
    x = images.astype(np.float64) / 255
    if layout == "HWC":
        x = x.transpose(0, 3, 1, 2)
    m = np.asarray(mean).reshape(1, -1, 1, 1)
    s = np.asarray(std).reshape(1, -1, 1, 1)
    return (x - m) / s


@pytest.mark.parametrize("layout", ["HWC", "CHW"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_device_loader_converts_and_normalises(
    tmp_path: Path, layout: str, channels_last: bool
) -> None:
    shape = (6, 5, 3) if layout == "HWC" else (3, 6, 5)
    packed = make_packed(tmp_path, sample_shape=shape, layout=layout)
    ds = PackedDataset.open(packed.root)
    mean, std = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]
    device = DeviceLoader(
        make_loader(ds, batch_size=8),
        device="cpu",
        dtype=torch.float32,
        mean=mean,
        std=std,
        channels_last=channels_last,
    )
    assert device.copy_stream is None and len(device) == -(-len(ds) // 8)
    done = 0
    for images, labels in device:
        positions = ds.selection.positions[done : done + len(labels)]
        done += len(labels)
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 6, 5)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        assert images.is_contiguous(memory_format=fmt)
        expected = reference_float(packed.images[positions], layout, mean, std)
        np.testing.assert_allclose(images.numpy(), expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(labels.numpy(), packed.labels[positions])
    assert done == len(ds)


def test_device_loader_keeps_uint8_and_forwards_resume(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    device = DeviceLoader(make_loader(ds, batch_size=4, shuffle=True), device="cpu")
    device.set_epoch(2)
    images, _ = next(iter(device))
    assert images.dtype == torch.uint8 and images.shape[1:] == (3, 6, 5)
    assert device.state_dict()["epoch"] == 2
    with pytest.raises(ValueError, match="float dtype"):
        DeviceLoader(make_loader(ds), mean=[0.5, 0.5, 0.5])


def test_prepare_images_half_precision_and_layout_errors() -> None:
    images = torch.randint(0, 256, (2, 4, 4, 3), dtype=torch.uint8)
    out = prepare_images(images, "HWC", torch.bfloat16, channels_last=True)
    assert out.dtype == torch.bfloat16 and out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, images.permute(0, 3, 1, 2).to(torch.bfloat16))
    with pytest.raises(ValueError, match="unknown layout"):
        prepare_images(images, "NHWC")


def test_spawned_workers_reopen_shards_from_the_pickled_selection(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root, verify="shards")
    ds[0]  # a memmap open in the parent must not travel
    loader = make_loader(
        ds,
        batch_size=8,
        shuffle=True,
        num_workers=1,
        workers_as="processes",
        multiprocessing_context="spawn",
    )
    expected = positions_of(ds, packed, list(make_loader(ds, batch_size=8, shuffle=True)))
    assert positions_of(ds, packed, list(loader)) == expected


@pytest.mark.parametrize(("num_workers", "gather_pinned"), [(0, True), (2, False)])
def test_with_cuda_batches_are_pinned_once(
    packed: Packed, monkeypatch: pytest.MonkeyPatch, num_workers: int, gather_pinned: bool
) -> None:
    """`pin_memory` means what torch says (batches arrive pinned); without workers they are
    gathered into pinned memory, with workers DataLoader's pin thread copies them there."""
    # Only the routing can run here: pinned allocation itself needs a CUDA build and device.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    loader = make_loader(
        PackedDataset.open(packed.root), num_workers=num_workers, workers_as="processes"
    )
    assert loader.dataset.pin_output is gather_pinned
    assert loader.pin_memory is True
    unpinned = make_loader(PackedDataset.open(packed.root), pin_memory=False)
    assert not unpinned.dataset.pin_output and not unpinned.pin_memory


@pytest.mark.parametrize("shuffle", ["random", "blocks"])
def test_in_process_batches_are_what_dataloader_yields(packed: Packed, shuffle: str) -> None:
    """Without workers PackedLoader calls the dataset itself; torch's own DataLoader iterator
    over the same loader must agree with it."""
    ds = PackedDataset.open(packed.root)
    ours = make_loader(ds, batch_size=6, shuffle=shuffle, seed=4, drop_last=True)
    theirs = make_loader(ds, batch_size=6, shuffle=shuffle, seed=4, drop_last=True)
    for epoch in (0, 1):
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        got, expected = list(ours), list(DataLoader.__iter__(theirs))
        assert len(got) == len(expected) == len(ds) // 6
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(5))
    torch_loader = make_loader(ds, batch_size=6, sampler=sampler)
    sampler.generator.manual_seed(5)
    first = positions_of(ds, packed, list(torch_loader))
    sampler.generator.manual_seed(5)
    assert first == positions_of(ds, packed, list(DataLoader.__iter__(torch_loader)))
    assert sorted(first) == sorted(ds.selection.positions.tolist())


@pytest.mark.parametrize(("readahead", "ahead"), [(True, 1), (True, 0), (False, 0)])
def test_in_process_loader_reads_the_next_batch_while_this_one_is_used(
    tmp_path: Path, readahead: bool, ahead: int
) -> None:
    """From a cold page cache, with batches of one shard each: once the first batch is handed
    out, the next shard is read from disk while the caller still holds the first (its
    training step), by the loader's thread (`prefetch_factor=1`) or by the kernel on advice
    (`readahead`, with `prefetch_factor=0`), and the one after it is not; with neither,
    nothing is read before it is asked for. The batches are np.load's samples either way."""
    built, paths, expected = cold_packed(tmp_path)
    ds = PackedDataset.open(built.root, readahead=readahead)
    batches = iter(make_loader(ds, batch_size=64, prefetch_factor=ahead))
    first = next(batches)
    reads = readahead or ahead > 0
    read_ahead = wait_for(lambda: cached_fraction(paths[1]) > 0.95, 10 if reads else 0.5)
    assert read_ahead is reads
    assert cached_fraction(paths[2]) < 0.05
    images = np.concatenate([b.images.numpy() for b in (first, *batches)])
    np.testing.assert_array_equal(images, np.concatenate(expected))


def test_cuda_without_an_index_is_bound_to_the_current_device_when_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`bound_device` fixes the index once (the CUDA run checks the batches themselves)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert bound_device("cuda") == torch.device("cuda", 3)
    assert bound_device("cuda:1") == torch.device("cuda", 1)
    assert bound_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bound_device(None) == torch.device("cpu")


def test_device_loader_refuses_batches_on_another_device_in_one_line(packed: Packed) -> None:
    on_meta = [(torch.empty((4, 6, 5, 3), dtype=torch.uint8, device="meta"), torch.zeros(4))]
    with pytest.raises(ValueError, match=r"^DeviceLoader on cpu takes batches in CPU memory"):
        next(iter(DeviceLoader(on_meta, device="cpu", layout="HWC")))


def test_crop_parameters_stay_exact_on_their_way() -> None:
    """Boxes and flips travel as one int64 tensor: no value is rounded or reordered."""
    boxes = np.array([[1, 2, 30, 40], [0, 0, 2**40, 7]], dtype=np.int64)
    mirrored = np.array([True, False])
    box, flip = _params_on(None, boxes, mirrored)
    assert torch.equal(box, torch.from_numpy(boxes)) and flip.tolist() == [True, False]


def test_make_loader_takes_packed_loaders_keywords_declared_once(tmp_path: Path) -> None:
    """`LoaderOptions` names exactly PackedLoader's keywords beside the dataset, the batch
    size and the batch sampler (make_loader makes its own), and `make_loader` refuses any
    other keyword as a function of its own would, naming it."""
    import inspect

    from loaders.loader.factories import LoaderOptions

    params = inspect.signature(loaders.loader.packed.PackedLoader.__init__).parameters
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = {n for n, p in params.items() if p.kind in kinds} - {"self", "dataset", "batch_size"}
    assert set(LoaderOptions.__annotations__) == named - {"batch_sampler"}
    ds = PackedDataset.open(make_packed(tmp_path / "ds").root)
    loader = make_loader(ds, num_workers=0, seed=3, drop_last=True)
    assert (loader.batch_size, loader.order.seed, loader.drop_last) == (256, 3, True)
    for wrong in ("batch_sampler", "in_order", "shufle"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{wrong}'"):
            make_loader(ds, **{wrong: None})  # type: ignore[arg-type]
