"""The training job's contract: exact resume through every wrapper, in either loop order, and
states that refuse to be applied to anything but the loader they came from.

Samples are identified by content against `packed.images` (what was written), independent of
the loaders' own bookkeeping.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from loaders import (
    DeviceLoader,
    PackedDataset,
    PackedLoader,
    PackedStream,
    make_loader,
    stream_loader,
)
from loaders.read.catalog import open_catalog
from tests.helpers.packed import Packed, commit_subset, make_packed
from tests.loaders.order.test_distributed import free_port, write_gathered

EPOCH = 3


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    return make_packed(tmp_path_factory.mktemp("ds"), shard_sizes=(30, 25, 41, 19))


@pytest.fixture(autouse=True)
def _quiet_cpu_note() -> None:
    warnings.filterwarnings("ignore", "CUDA is not available", RuntimeWarning)


def identify(packed: Packed, candidates: Iterable[int], batches: Iterable[Any]) -> list[int]:
    """Manifest position of every image delivered (HWC or CHW on the device), by content."""
    by_bytes = {packed.images[p].tobytes(): p for p in candidates}
    found = []
    for batch in batches:
        images, labels = batch[0], batch[1]
        if images.shape[1:] != packed.images.shape[1:]:
            images = images.permute(0, 2, 3, 1)  # DeviceLoader's NCHW back to the stored HWC
        for image, label in zip(images, labels, strict=True):
            p = by_bytes[image.contiguous().numpy().tobytes()]
            assert packed.labels[p] == label.item()
            found.append(p)
    return found


def first_batches(loader: Iterable[Any], k: int) -> list[Any]:
    """The first k batches of an epoch, the loop then left as a training job that stops is."""
    taken = []
    for batch in loader:
        taken.append([t.clone() for t in batch])
        if len(taken) == k:
            break
    return taken


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(json.dumps(state)))


Wrap = Callable[[PackedLoader], Any]
WRAPPERS: dict[str, Wrap] = {
    "PackedLoader": lambda loader: loader,
    "DeviceLoader": lambda loader: DeviceLoader(loader, device="cpu"),
}


@pytest.mark.parametrize("wrap", list(WRAPPERS))
@pytest.mark.parametrize("load_first", [True, False], ids=["load-then-set_epoch", "set-then-load"])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("k", [1, 17])
def test_map_style_resume_is_exact_through_every_wrapper(
    packed: Packed, wrap: str, load_first: bool, num_workers: int, k: int
) -> None:
    ds = PackedDataset.open(packed.root)
    positions = ds.selection.positions.tolist()

    def build() -> Any:
        loader = make_loader(
            ds,
            batch_size=4,
            shuffle="blocks",
            seed=5,
            num_workers=num_workers,
            workers_as="processes",
        )
        return WRAPPERS[wrap](loader)

    reference = build()
    reference.set_epoch(EPOCH)
    whole = identify(packed, positions, reference)

    first = build()
    first.set_epoch(EPOCH)
    seen = identify(packed, positions, first_batches(first, k))
    state = roundtrip(first.state_dict())
    assert state["position"] == 4 * k, "the batch a DeviceLoader holds ahead is not counted"

    second = build()
    if load_first:  # the usual loop: restore, then `for epoch in range(start, n)`
        second.load_state_dict(state)
        second.set_epoch(EPOCH)
    else:
        second.set_epoch(EPOCH)
        second.load_state_dict(state)
    assert len(second) == len(reference), "len() is a whole epoch's, as DataLoader's"
    assert seen + identify(packed, positions, second) == whole
    second.set_epoch(EPOCH + 1)
    assert sorted(identify(packed, positions, second)) == sorted(whole), "then whole epochs"


@pytest.mark.parametrize("wrap", list(WRAPPERS))
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("k", [1, 5])
def test_stream_resume_is_exact_through_every_wrapper(
    packed: Packed, wrap: str, num_workers: int, k: int
) -> None:
    selection = open_catalog(packed.root).select()
    positions = selection.positions.tolist()

    def build() -> Any:
        stream = PackedStream(selection, batch_size=4, seed=2, window=2)
        return WRAPPERS[wrap](stream_loader(stream, num_workers=num_workers))

    reference = build()
    reference.set_epoch(EPOCH)
    whole = identify(packed, positions, reference)
    assert set(whole) == set(positions)

    first = build()
    first.set_epoch(EPOCH)
    seen = identify(packed, positions, first_batches(first, k))
    state = roundtrip(first.state_dict())
    assert state["batches"] == k

    second = build()
    second.load_state_dict(state)
    second.set_epoch(EPOCH)
    assert len(second) == len(reference), "len() is a whole epoch's, as DataLoader's"
    assert seen + identify(packed, positions, second) == whole, "the same order, resumed"
    second.set_epoch(EPOCH)  # a whole pass goes on to the next epoch unless told
    assert sorted(identify(packed, positions, second)) == sorted(whole), "then from the start"


def test_stream_resume_reaches_persistent_workers(packed: Packed) -> None:
    selection = open_catalog(packed.root).select()
    positions = selection.positions.tolist()
    stream = PackedStream(selection, batch_size=4, seed=2, window=2)
    loader = stream_loader(stream, num_workers=2, persistent_workers=True)
    loader.set_epoch(1)
    whole = identify(packed, positions, loader)  # the workers exist from here on
    loader.set_epoch(1)
    seen = identify(packed, positions, first_batches(loader, 3))
    state = loader.state_dict()
    loader.load_state_dict(state)
    assert seen + identify(packed, positions, loader) == whole
    loader.set_epoch(1)  # a whole pass goes on to the next epoch unless told
    assert identify(packed, positions, loader) == whole, "the resume point is spent"


def test_a_resumed_epoch_refuses_another_epoch_until_it_is_done(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    loader = make_loader(ds, batch_size=4, shuffle=True)
    loader.set_epoch(2)
    first_batches(loader, 3)
    mid = loader.state_dict()
    for _ in loader:
        pass
    done = loader.state_dict()
    assert done["position"] == len(ds)

    again = make_loader(ds, batch_size=4, shuffle=True)
    again.load_state_dict(mid)
    with pytest.raises(ValueError, match=r"resumes epoch 2 at position 12; call set_epoch\(2\)"):
        again.set_epoch(3)
    again.load_state_dict(done)  # an epoch saved when finished: the next one starts afresh
    again.set_epoch(3)
    assert sum(len(b[1]) for b in again) == len(ds)


def test_mismatched_states_are_refused_naming_the_field(packed: Packed, tmp_path: Path) -> None:
    ds = PackedDataset.open(packed.root)
    state = make_loader(ds, batch_size=4, shuffle=True, seed=1).state_dict()

    def refused(loader: PackedLoader, given: dict[str, Any], pattern: str) -> None:
        with pytest.raises(ValueError, match=pattern):
            loader.load_state_dict(given)

    refused(make_loader(ds, batch_size=4, shuffle=True, seed=2), state, "seed 1, this loader has 2")
    refused(make_loader(ds, batch_size=8, shuffle=True, seed=1), state, "batch_size 4 on 1")
    halves = make_loader(ds, batch_size=2, shuffle=True, seed=1, rank=0, world_size=2)
    halves.load_state_dict(state)  # the same global batch on two ranks: elastic resume
    refused(make_loader(ds, batch_size=4, shuffle="blocks", seed=1), state, "order 'random")
    refused(make_loader(ds, batch_size=4, shuffle=True, seed=1, drop_last=True), state, "drop_l")
    val = PackedDataset.open(packed.root, split="val")
    refused(make_loader(val, batch_size=4, shuffle=True, seed=1), state, "for selection")
    for key in ("rank", "position", "dataset_version"):
        partial = {k: v for k, v in state.items() if k != key}
        refused(make_loader(ds, batch_size=4, shuffle=True, seed=1), partial, f"no '{key}'")
    bad = {**state, "position": -4}
    refused(make_loader(ds, batch_size=4, shuffle=True, seed=1), bad, "'position' must be an int")
    with pytest.raises(TypeError, match="a loader state is a dict"):
        make_loader(ds).load_state_dict([1, 2])  # type: ignore[arg-type]

    copy = make_packed(tmp_path / "copy", shard_sizes=(30, 25, 41, 19))
    commit_subset(copy, list(range(len(copy.labels))), version=2)
    newer = PackedDataset.open(copy.root)  # the same samples, version 2
    refused(make_loader(newer, batch_size=4, shuffle=True, seed=1), state, "dataset_version 1")
    with pytest.raises(TypeError, match="version must be an int"):
        PackedDataset.open(copy.root, version="1")  # type: ignore[arg-type]

    selection = open_catalog(packed.root).select()
    streamed = stream_loader(PackedStream(selection, batch_size=4), num_workers=0)
    saved = streamed.state_dict()
    other = stream_loader(PackedStream(selection, batch_size=4), num_workers=2)
    refused(other, saved, "for workers 0, this loader has 2")
    refused(streamed, state, "for order")


def test_state_survives_torch_save_without_pickle(packed: Packed, tmp_path: Path) -> None:
    ds = PackedDataset.open(packed.root)
    loader = make_loader(ds, batch_size=4, shuffle=True)
    first_batches(loader, 2)
    torch.save(loader.state_dict(), tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    assert all(isinstance(v, int | str) for v in state.values())
    make_loader(ds, batch_size=4, shuffle=True).load_state_dict(state)


def test_torchrun_before_init_process_group_is_an_error(
    packed: Packed, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    ds = PackedDataset.open(packed.root)
    with pytest.raises(RuntimeError, match=r"rank 1 of 2 .* init_process_group"):
        make_loader(ds, shuffle=True)
    with pytest.raises(RuntimeError, match="init_process_group"):
        PackedStream(ds.selection)
    explicit = make_loader(ds, batch_size=4, rank=1, world_size=2)
    assert len(explicit) == -(-len(ds) // 2 // 4)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert len(make_loader(ds, batch_size=4)) == -(-len(ds) // 4)


# --- Elastic resume: real gloo processes -------------------------------------------------

ELASTIC_STEPS = 3
GLOBAL_BATCH = 8


def run_elastic_rank(rank: int, world: int, root: str, port: int, state: str, out: str) -> None:
    """One gloo rank: resume `state` (if any) or start epoch 1, read ELASTIC_STEPS batches (all
    of the rest when resuming), save rank 0's state, gather what each rank read."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        ds = PackedDataset.open(root)
        size = GLOBAL_BATCH // world  # the same global batch on any number of ranks
        loader = make_loader(ds, batch_size=size, shuffle=True, seed=11, with_indices=True)
        if state:
            loader.load_state_dict(json.loads(Path(state).read_text()))
            loader.set_epoch(1)
            read = [p for b in loader for p in ds.selection.positions[b.indices].tolist()]
        else:
            loader.set_epoch(1)
            read = []
            for batch in loader:
                read += ds.selection.positions[batch.indices].tolist()
                if len(read) == size * ELASTIC_STEPS:
                    break
            if rank == 0:
                Path(out + ".state").write_text(json.dumps(loader.state_dict()))
        write_gathered(out, read)
    finally:
        dist.barrier()
        dist.destroy_process_group()


def read_in_ranks(world: int, root: Path, state: str, out: Path) -> list[list[int]]:

    args = (world, str(root), free_port(), state, str(out))
    mp.spawn(run_elastic_rank, args=args, nprocs=world)
    return [list(r) for r in json.loads(out.read_text())]


@pytest.mark.slow
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_elastic_resume_sees_every_sample_once(
    packed: Packed, tmp_path: Path, before: int, after: int
) -> None:
    out = tmp_path / "read.json"
    first = read_in_ranks(before, packed.root, "", out)
    assert all(len(r) == GLOBAL_BATCH // before * ELASTIC_STEPS for r in first)
    rest = read_in_ranks(after, packed.root, str(out) + ".state", tmp_path / "rest.json")
    n = len(packed.labels)
    seen = [p for r in first + rest for p in r]
    assert sorted(set(seen)) == list(range(n)), "every sample of the epoch"
    remaining = n - GLOBAL_BATCH * ELASTIC_STEPS
    assert len(seen) - n == -remaining % after, "repeated only to pad the last ranks equal"
    assert len({len(r) for r in rest}) == 1, "the new ranks have equal parts"


# --- Torch's conventions --------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_plain_dataloader_with_default_collate(packed: Packed, num_workers: int) -> None:
    ds = PackedDataset.open(packed.root, split="train")
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=num_workers)
    images, labels = [], []
    for batch in loader:  # default_collate: [images, labels]
        assert isinstance(batch, list) and batch[0].dtype == torch.uint8
        images.append(batch[0].numpy())
        labels.append(batch[1].numpy())
    positions = ds.selection.positions
    np.testing.assert_array_equal(np.concatenate(images), packed.images[positions])
    np.testing.assert_array_equal(np.concatenate(labels), packed.labels[positions])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_make_loader_takes_a_collate_fn(packed: Packed, num_workers: int) -> None:
    ds = PackedDataset.open(packed.root)

    def as_dict(samples: Any) -> dict[str, Any]:
        images = torch.stack([image for image, _ in samples]).float() / 255
        return {"pixels": images, "labels": torch.tensor([label for _, label in samples])}

    loader = make_loader(
        ds, batch_size=8, shuffle=True, seed=4, num_workers=num_workers, workers_as="processes"
    )
    custom = make_loader(
        ds,
        batch_size=8,
        shuffle=True,
        seed=4,
        num_workers=num_workers,
        workers_as="processes",
        collate_fn=as_dict,
    )
    pairs = list(zip(loader, custom, strict=True))
    assert len(pairs) == len(custom)
    for plain, mine in pairs:
        assert torch.equal(mine["pixels"], plain.images.float() / 255)
        assert torch.equal(mine["labels"], plain.labels)
    custom.set_epoch(1)
    iterator = iter(custom)
    next(iterator)
    assert custom.state_dict()["position"] == 8, "counted without looking into the batches"


def test_generator_drives_the_order_and_seed_is_the_default(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)

    def order(**kwargs: Any) -> list[int]:
        loader = make_loader(ds, batch_size=8, shuffle=True, with_indices=True, **kwargs)
        return [i for b in loader for i in b.indices.tolist()]

    g = torch.Generator()
    assert order(generator=g.manual_seed(1)) == order(generator=g.manual_seed(1))
    assert order(generator=g.manual_seed(1)) != order(generator=g.manual_seed(2))
    torch.manual_seed(1)
    default = order()
    torch.manual_seed(2)
    assert order() == default == order(seed=0), "the order is seed's, never torch's global RNG"
    with pytest.raises(ValueError, match="seed= or generator=, not both"):
        make_loader(ds, shuffle=True, seed=3, generator=g)
    stream = PackedStream(ds.selection)
    with pytest.raises(ValueError, match=r"PackedStream\(seed=...\)"):
        stream_loader(stream, generator=g)


# --- What a batch is: sample ids, and DeviceLoader's checks ---------------------------------


def manifest_lookup(root: Path) -> dict[str, tuple[str, int]]:
    """sample_id -> (shard, row), read with plain pyarrow."""
    import pyarrow.ipc as ipc

    (manifest,) = sorted(root.glob("versions/v*/manifest.arrow"))[-1:]
    table = ipc.open_file(manifest).read_all()
    return {
        s: (shard, row)
        for s, shard, row in zip(
            table.column("sample_id").to_pylist(),
            table.column("shard").to_pylist(),
            table.column("row").to_pylist(),
            strict=True,
        )
    }


@pytest.mark.parametrize("kind", ["map", "stream", "device"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_carry_indices_that_name_their_samples(
    packed: Packed, kind: str, num_workers: int
) -> None:
    ds = PackedDataset.open(packed.root, split="train")
    if kind == "stream":
        stream = PackedStream(ds.selection, batch_size=8, seed=1)
        loader: Any = stream_loader(stream, num_workers=num_workers, with_indices=True)
    else:
        loader = make_loader(
            ds,
            batch_size=8,
            shuffle=True,
            num_workers=num_workers,
            workers_as="processes",
            with_indices=True,
        )
    if kind == "device":
        loader = DeviceLoader(loader, device="cpu")
    where = manifest_lookup(packed.root)
    checked = 0
    for images, labels, indices in loader:
        rows = ds.manifest_rows(indices)
        assert rows.column("index").to_pylist() == indices.tolist()
        assert rows.column("label").to_pylist() == labels.tolist()
        for image, sample_id in zip(images, rows.column("sample_id").to_pylist(), strict=True):
            shard, row = where[sample_id]
            stored = np.load(packed.root / shard, mmap_mode="r")[row]
            if kind == "device":
                image = image.permute(1, 2, 0)
            np.testing.assert_array_equal(image.numpy(), stored)
            checked += 1
    assert checked >= len(ds)
    rows = ds.manifest_rows([0, -1])
    assert rows.column("source").to_pylist() == [
        packed_source(packed, int(ds.selection.positions[i])) for i in (0, -1)
    ]
    assert set(rows.column("split").to_pylist()) == {"train"}


def packed_source(packed: Packed, position: int) -> str:
    import pyarrow.ipc as ipc

    (manifest,) = sorted(packed.root.glob("versions/v*/manifest.arrow"))[-1:]
    return str(ipc.open_file(manifest).read_all().column("source")[position].as_py())


def test_device_loader_refuses_what_it_would_convert_wrongly(packed: Packed) -> None:
    chw = PackedDataset.open(packed.root, transform=lambda x: x.permute(2, 0, 1).contiguous())
    with pytest.raises(ValueError, match=r"shape \(4, 3, 6, 5\).*layout='CHW'"):
        next(iter(DeviceLoader(make_loader(chw, batch_size=4), device="cpu")))
    images, _ = next(iter(DeviceLoader(make_loader(chw, batch_size=4), "cpu", layout="CHW")))
    assert images.shape == (4, 3, 6, 5)
    stored = torch.from_numpy(
        packed.images[PackedDataset.open(packed.root).selection.positions[:4]]
    )
    assert torch.equal(images, stored.permute(0, 3, 1, 2))

    floats = PackedDataset.open(packed.root, transform=lambda x: x.float() / 255)
    with pytest.raises(TypeError, match=r"converts uint8 images .* got torch.float32"):
        next(iter(DeviceLoader(make_loader(floats, batch_size=4), "cpu", dtype=torch.float32)))
    passed, _ = next(iter(DeviceLoader(make_loader(floats, batch_size=4), "cpu")))
    assert passed.dtype == torch.float32 and float(passed.max()) <= 1.0

    ds = PackedDataset.open(packed.root)
    as_dicts = make_loader(ds, batch_size=4, collate_fn=lambda s: {"n": len(s)})
    with pytest.raises(TypeError, match="batches of \\(images, labels"):
        next(iter(DeviceLoader(as_dicts, "cpu")))
