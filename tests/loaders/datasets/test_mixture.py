"""Mixtures (`loaders.datasets.mixture`): views of two packed datasets read as one by weight. Every
batch holds the members' stored pixels (against the arrays the datasets were written from);
a member is read without repeat or skip within each of its own epochs; the share of each
member over many epochs matches its weight within sampling error; resume is exact, with the
same or another world size, and refuses other weights. The order oracle is plain numpy
bookkeeping of what each epoch delivered, never the code's own counts."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from etl.errors import ShardError
from loaders import DeviceLoader, Mixture, PackedDataset, View, make_loader
from loaders.order.mixture_orders import mixture_order
from tests.helpers.packed import Packed, make_packed


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[Packed, Packed]:
    root = tmp_path_factory.mktemp("mix")
    a = make_packed(root / "a", shard_sizes=(7, 5, 9), classes=("ant", "bee", "cat"), seed=1)
    b = make_packed(root / "b", shard_sizes=(4, 6), classes=("cat", "dog"), seed=2)
    return a, b


def members(
    two: tuple[Packed, Packed], **options: Any
) -> tuple[list[PackedDataset], list[Packed], list[list[int]]]:
    """Three views: a's train, a's val, all of b; with each member's manifest positions."""
    a, b = two
    datasets = [
        PackedDataset.open(View(str(a.root), split="train"), **options),
        PackedDataset.open(View(str(a.root), split="val"), **options),
        PackedDataset.open(View(str(b.root)), **options),
    ]
    packs = [a, a, b]
    return datasets, packs, [list(ds.selection.positions) for ds in datasets]


@pytest.mark.parametrize(
    ("workers", "verify", "joined"),
    [(0, False, True), (2, False, True), (0, "rows", True), (2, "once", True), (2, None, False)],
)
def test_batches_hold_each_members_samples(
    two: tuple[Packed, Packed], workers: int, verify: bool | str | None, joined: bool
) -> None:
    """One gather across the members' shards (their rows' checksums joined too), or (members
    that check rows differently, `None` here: "rows", "once", unchecked) one gather a member."""
    if verify is None:
        datasets, packs, positions = members(two)
        datasets[0] = PackedDataset.open(View(str(two[0].root), split="train"), verify="rows")
        datasets[2] = PackedDataset.open(View(str(two[1].root)), verify=False)
    else:
        datasets, packs, positions = members(two, verify=verify)
    mix = Mixture(datasets, weights=[0.5, 0.2, 0.3])
    assert (mix._joined is not None) == joined
    assert mix.classes == ("ant", "bee", "cat", "dog")
    loader = make_loader(
        mix, batch_size=6, num_workers=workers, workers_as="processes", with_indices=True, seed=3
    )
    seen = 0
    for batch in loader:
        which = mix.member_of(batch.indices)
        for i, (index, m) in enumerate(zip(batch.indices.tolist(), which.tolist(), strict=True)):
            local = index - int(mix.offsets[m])
            at = positions[m][local]
            assert np.array_equal(batch.images[i].numpy(), packs[m].images[at])
            name = packs[m].classes[packs[m].labels[at]]
            assert mix.classes[int(batch.labels[i])] == name
        seen += len(batch.indices)
    assert seen == len(mix) == sum(len(d) for d in datasets)
    for batch in DeviceLoader(loader, device="cpu", dtype=torch.float32):
        assert batch.images.dtype == torch.float32 and batch.images.shape[1] == 3  # NCHW


@pytest.mark.parametrize("workers", [0, 2])
def test_a_changed_pixel_is_named_through_the_joined_reader(tmp_path: Path, workers: int) -> None:
    """Members opened as by default (each row checked the first time it is read) share one
    reader, whose joined checksums name a changed pixel byte by shard and row, whichever member
    reads it; the same dataset in two members is one set of rows."""
    a = make_packed(tmp_path / "a", shard_sizes=(6, 5), seed=4)
    b = make_packed(tmp_path / "b", shard_sizes=(5,), seed=5)
    shard = a.root / a.shards[0]
    data = bytearray(shard.read_bytes())
    row_bytes = a.images[0].nbytes
    data[len(data) - row_bytes] ^= 0x01  # its last row, 5 (of 6; the probe is row 0)
    shard.write_bytes(bytes(data))
    datasets = [
        PackedDataset.open(View(str(a.root), split="train")),
        PackedDataset.open(View(str(a.root))),
        PackedDataset.open(View(str(b.root))),
    ]
    mix = Mixture(datasets, weights=[0.3, 0.4, 0.3])
    assert mix._joined is not None
    sums = mix._joined.reader.shards.row_sums
    assert sums is not None and len(sums.arrays()[0]) == 11 + 5
    loader = make_loader(
        mix, batch_size=4, num_workers=workers, workers_as="processes", pin_memory=False
    )
    with pytest.raises(ShardError, match=rf"{a.shards[0]}: row 5 does not match the checksum"):
        for epoch in range(8):  # a member's own epoch may span mixture epochs
            loader.set_epoch(epoch)
            list(loader)


def test_members_repeat_nothing_within_their_own_epochs() -> None:
    sizes, weights = (7, 30, 3), np.array([0.6, 0.1, 0.3])
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    streams: list[list[int]] = [[], [], []]
    for epoch in range(12):
        order = mixture_order(sizes, weights, 40, seed=9, epoch=epoch)
        assert len(order) == 40
        assert np.array_equal(order, mixture_order(sizes, weights, 40, seed=9, epoch=epoch))
        for index in order.tolist():
            m = int(np.searchsorted(offsets[1:], index, side="right"))
            streams[m].append(index - int(offsets[m]))
    for m, size in enumerate(sizes):
        whole = len(streams[m]) // size
        assert whole >= 1
        for k in range(whole):
            assert sorted(streams[m][k * size : (k + 1) * size]) == list(range(size)), (m, k)
    drawn = mixture_order(sizes, weights, 40, seed=9, epoch=0, replacement=True)
    assert ((drawn >= 0) & (drawn < sum(sizes))).all()


def test_shares_follow_the_weights_within_sampling_error() -> None:
    sizes, weights = (50, 20, 30), np.array([0.7, 0.2, 0.1])
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    total, epochs = 1000, 40
    counts = np.zeros(3)
    for epoch in range(epochs):
        order = mixture_order(sizes, weights, total, seed=1, epoch=epoch)
        counts += np.bincount(np.searchsorted(offsets[1:], order, side="right"), minlength=3)
    n = total * epochs
    sigma = np.sqrt(n * weights * (1 - weights))
    assert (np.abs(counts - n * weights) < 5 * sigma).all(), (counts / n, weights)


def test_resume_is_exact_with_any_world_size(two: tuple[Packed, Packed]) -> None:
    datasets, _, _ = members(two)
    mix = Mixture(datasets, weights=[2, 1, 1], samples_per_epoch=40)

    def epoch_of(loader: object, epoch: int) -> list[int]:
        loader.set_epoch(epoch)  # type: ignore[attr-defined]
        return [i for b in loader for i in b.indices.tolist()]  # type: ignore[attr-defined]

    whole = epoch_of(make_loader(mix, batch_size=4, with_indices=True, seed=5), 2)
    loader = make_loader(mix, batch_size=4, with_indices=True, seed=5)
    loader.set_epoch(2)
    batches = iter(loader)
    first = [i for _ in range(3) for i in next(batches).indices.tolist()]
    state = json.loads(json.dumps(loader.state_dict()))
    again = make_loader(mix, batch_size=4, with_indices=True, seed=5)
    again.load_state_dict(state)
    assert sorted(first + epoch_of(again, 2)) == sorted(whole)
    assert first + epoch_of(make_resumed(mix, state), 2) == whole

    # two ranks of batch 2 keep the global batch of 4: together they deliver the rest
    rest: list[int] = []
    for rank in (0, 1):
        part = make_loader(mix, batch_size=2, with_indices=True, seed=5, rank=rank, world_size=2)
        part.load_state_dict(state)
        rest += epoch_of(part, 2)
    assert sorted(first + rest) == sorted(whole)

    other = Mixture([datasets[1], datasets[0], datasets[2]], weights=[1, 1, 1])
    with pytest.raises(ValueError, match="loader state is for mixture members"):
        make_loader(other, batch_size=4, seed=5).load_state_dict(state)


def make_resumed(mix: Mixture, state: dict[str, object]) -> object:
    loader = make_loader(mix, batch_size=4, with_indices=True, seed=5)
    loader.load_state_dict(state)
    return loader


def test_bad_mixtures_are_one_clear_error(two: tuple[Packed, Packed], tmp_path: Path) -> None:
    datasets, _, _ = members(two)
    with pytest.raises(ValueError, match="one weight per member"):
        Mixture(datasets, weights=[1, 1])
    with pytest.raises(ValueError, match="weights must be numbers >= 0"):
        Mixture(datasets, weights=[1, -1, 1])
    with pytest.raises(ValueError, match="weights at step 8 are all 0"):
        Mixture(datasets, weights=[1, 1, 1], schedule={8: [0, 0, 0]})
    with pytest.raises(ValueError, match="steps are ints >= 0"):
        Mixture(datasets, weights=[1, 1, 1], schedule={-2: [1, 1, 1]})
    with pytest.raises(ValueError, match="name 4 members of 3"):
        Mixture(datasets, weights=[1, 1, 1], schedule={3: [1, 1, 1, 1]})
    grey = make_packed(tmp_path / "grey", sample_shape=(6, 5, 1))
    with pytest.raises(ValueError, match=r"samples of \[1, 3\] channels"):
        Mixture([datasets[0], PackedDataset.open(grey.root)], weights=[1, 1])
    mix = Mixture(datasets, weights=[1, 1, 1])
    with pytest.raises(ValueError, match="order is its own"):
        make_loader(mix, batch_size=4, shuffle="blocks")


def member_streams(mix: Mixture, indices: list[int]) -> list[list[int]]:
    """Each member's local indices, in the order they were delivered."""
    streams: list[list[int]] = [[] for _ in mix.members]
    for index, m in zip(indices, mix.member_of(indices).tolist(), strict=True):
        streams[m].append(index - int(mix.offsets[m]))
    return streams


def no_repeat_no_skip(mix: Mixture, indices: list[int]) -> None:
    """Each member's delivered stream is whole permutations of its samples, then a part of one
    with no sample twice."""
    for m, stream in enumerate(member_streams(mix, indices)):
        size = mix.sizes[m]
        for k in range(0, len(stream), size):
            block = stream[k : k + size]
            assert len(set(block)) == len(block), (m, k, block)


def delivered(loader: Any, epoch: int, batches: int | None = None) -> list[int]:
    loader.set_epoch(epoch)
    found: list[int] = []
    for batch in itertools.islice(loader, batches):  # a batch taken counts as delivered
        found += batch.indices.tolist()
    return found


def test_a_schedule_changed_on_resume_takes_over_at_that_step(two: tuple[Packed, Packed]) -> None:
    datasets, _, _ = members(two)
    before = Mixture(datasets, weights=[1, 1, 1], samples_per_epoch=60)
    loader = make_loader(before, batch_size=4, with_indices=True, seed=2)
    loader.set_epoch(1)
    batches = iter(loader)
    first = [i for _ in range(5) for i in next(batches).indices.tolist()]
    state = json.loads(json.dumps(loader.state_dict()))

    # from step 5 (of epoch 1: global step 15 + 5 = 20) only the third member
    after = Mixture(datasets, weights=[1, 1, 1], samples_per_epoch=60, schedule={20: [0, 0, 1]})
    resumed = make_loader(after, batch_size=4, with_indices=True, seed=2)
    resumed.load_state_dict(state)
    rest = delivered(resumed, 1)
    assert set(after.member_of(rest).tolist()) == {2}
    # the same as a run with that schedule from the start: it agreed before step 20
    whole = delivered(make_loader(after, batch_size=4, with_indices=True, seed=2), 1)
    assert first + rest == whole
    no_repeat_no_skip(
        after, delivered(make_loader(after, batch_size=4, with_indices=True, seed=2), 0) + whole
    )

    # a member appended at the end starts its stream then
    extra = PackedDataset.open(View(str(two[1].root), split="val"))
    grown = Mixture(
        [*datasets, extra], weights=[1, 1, 1, 0], samples_per_epoch=60, schedule={20: [0, 0, 0, 1]}
    )
    resumed = make_loader(grown, batch_size=4, with_indices=True, seed=2)
    resumed.load_state_dict(state)
    rest = delivered(resumed, 1)
    assert set(grown.member_of(rest).tolist()) == {3}
    epoch0 = delivered(make_loader(before, batch_size=4, with_indices=True, seed=2), 0)
    no_repeat_no_skip(grown, epoch0 + first + rest)
    appended = member_streams(grown, rest)[3]
    assert len(rest) == 60 - len(first) and len(appended) >= len(extra)
    assert sorted(appended[: len(extra)]) == list(range(len(extra)))  # from its stream's start


def gloo_rank(rank: int, world: int, port: int, roots: list[str], job: dict[str, Any]) -> None:
    """One rank of a mixture run: `job["batches"]` batches of `job["batch"]` (all of the
    epoch when None) from `job["state"]` if given; writes what it read and rank 0's state."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        datasets = [
            PackedDataset.open(View(roots[0], split="train")),
            PackedDataset.open(View(roots[0], split="val")),
            PackedDataset.open(View(roots[1])),
        ]
        schedule = {int(k): v for k, v in job["schedule"].items()}
        mix = Mixture(datasets, weights=[1, 1, 1], samples_per_epoch=60, schedule=schedule)
        loader = make_loader(mix, batch_size=job["batch"], with_indices=True, seed=4)
        if job["state"] is not None:
            loader.load_state_dict(job["state"])
        read = delivered(loader, 1, job["batches"])
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, {"read": read, "state": loader.state_dict()})
        if rank == 0:
            Path(job["out"]).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_elastic_resume_across_a_schedule_change_with_gloo(
    two: tuple[Packed, Packed], tmp_path: Path
) -> None:
    """2 ranks of batch 2 read 3 steps with equal weights; 4 ranks of batch 1 resume their
    state with a schedule that, from step 3 on, reads the third member only. Together they
    read what one process with that schedule from the start reads, step by step."""
    import torch.multiprocessing as mp

    from tests.helpers.stores import free_port

    roots = [str(two[0].root), str(two[1].root)]
    out = tmp_path / "run.json"

    def run(world: int, job: dict[str, Any]) -> list[dict[str, Any]]:
        job = {**job, "out": str(out)}
        mp.spawn(gloo_rank, args=(world, free_port(), roots, job), nprocs=world)
        found: list[dict[str, Any]] = json.loads(out.read_text())
        return found

    before = run(2, {"batch": 2, "batches": 3, "state": None, "schedule": {}})
    after = run(
        4, {"batch": 1, "batches": None, "state": before[0]["state"], "schedule": {"18": [0, 0, 1]}}
    )
    datasets, _, _ = members(two)
    plan = Mixture(datasets, weights=[1, 1, 1], samples_per_epoch=60, schedule={18: [0, 0, 1]})
    whole = delivered(make_loader(plan, batch_size=4, with_indices=True, seed=4), 1)
    steps = [whole[k : k + 4] for k in range(0, 60, 4)]
    for s in range(3):  # steps of 2 ranks x 2
        assert sorted(
            before[0]["read"][2 * s : 2 * s + 2] + before[1]["read"][2 * s : 2 * s + 2]
        ) == sorted(steps[s])
    for s in range(3, 15):  # steps of 4 ranks x 1
        assert sorted(r["read"][s - 3] for r in after) == sorted(steps[s])
    assert set(plan.member_of([r["read"][0] for r in after]).tolist()) == {2}


def test_preview_and_sheet_show_what_a_mixture_would_yield(two: tuple[Packed, Packed]) -> None:
    datasets, packs, positions = members(two)
    mix = Mixture(datasets, weights=[0.5, 0.2, 0.3], samples_per_epoch=50)
    seen = delivered(make_loader(mix, batch_size=5, with_indices=True, seed=1), 0)
    seen += delivered(make_loader(mix, batch_size=5, with_indices=True, seed=1), 1)
    report = mix.preview(steps=20, batch_size=5, seed=1)  # the same 100 samples
    assert report["samples"] == len(seen) == 100
    expected: list[dict[str, int]] = [{}, {}, {}]
    for m, local in enumerate(member_streams(mix, seen)):
        for i in local:
            at = positions[m][i]
            name = packs[m].classes[packs[m].labels[at]]
            expected[m][name] = expected[m].get(name, 0) + 1
    assert report["counts"] == expected
    assert report["share"] == [sum(c.values()) / 100 for c in expected]
    assert report["weight"] == pytest.approx([0.5, 0.2, 0.3])

    sheet = mix.sheet(batches=2, batch_size=4, seed=1)
    first = delivered(make_loader(mix, batch_size=4, with_indices=True, seed=1), 0, 2)
    assert sorted(c["index"] for c in sheet.info) == sorted(first)  # the first two batches
    assert len(sheet.info) == 8 and sheet.image.size[0] > 0
    assert [c["member"] for c in sheet.info] == mix.member_of(
        [c["index"] for c in sheet.info]
    ).tolist()


@pytest.mark.parametrize("workers", [0, 2])
def test_members_of_several_sizes_meet_in_the_device_crop(
    two: tuple[Packed, Packed], tmp_path: Path, workers: int
) -> None:
    """Members of 6x5 and 9x12 samples: a batch is padded to 9x12 with each sample's own size
    beside it, and the device crops draw from each sample's own image, never the padding:
    per sample, the same crop as a plain crop of that image alone (the batch path of one
    size, itself checked against torchvision in tests/loaders/augment)."""
    import torch.nn.functional as F

    from loaders import CenterCrop, RandomResizedCrop
    from loaders.augment.crops import resize_center_crop
    from loaders.augment.draws import crop_boxes, flips

    big = make_packed(tmp_path / "big", shard_sizes=(5, 6), sample_shape=(9, 12, 3), seed=3)
    small = PackedDataset.open(two[0].root)
    mix = Mixture([small, PackedDataset.open(big.root)], weights=[1, 1])
    assert mix.sample_shape == (9, 12, 3) and mix._joined is None
    packs, positions = [two[0], big], [small.selection.positions, None]

    def original(index: int) -> torch.Tensor:
        m = int(mix.member_of([index])[0])
        local = index - int(mix.offsets[m])
        at = positions[m][local] if positions[m] is not None else local
        image = torch.from_numpy(packs[m].images[at]).permute(2, 0, 1)
        return image

    plain = make_loader(
        mix, batch_size=6, num_workers=workers, workers_as="processes", seed=2, with_indices=True
    )
    for batch in plain:
        heights, widths = batch.columns["sample.height"], batch.columns["sample.width"]
        for i, index in enumerate(batch.indices.tolist()):
            own = original(index)
            h, w = int(heights[i]), int(widths[i])
            assert (h, w) == tuple(own.shape[1:])
            assert torch.equal(batch.images[i].permute(2, 0, 1)[:, :h, :w], own)
            assert not batch.images[i][h:].any() and not batch.images[i][:, w:].any()
    with pytest.raises(ValueError, match="samples of several sizes, padded"):
        next(iter(DeviceLoader(plain, device="cpu")))

    crop = RandomResizedCrop(4, seed=5)
    for augment in (crop, CenterCrop(4)):
        plain.set_epoch(0)  # the crops below are epoch 0's (a whole pass goes on to the next)
        loader = DeviceLoader(plain, device="cpu", dtype=torch.float32, augment=augment)
        seen = 0
        for batch in loader:
            for i, index in enumerate(batch.indices.tolist()):
                own = original(index)[None].float()
                if augment is crop:
                    top, left, h, w = crop_boxes(5, 0, np.array([index]), *own.shape[2:])[0]
                    part = own[:, :, top : top + h, left : left + w]
                    want = F.interpolate(part, (4, 4), mode="bilinear", align_corners=False)[0]
                    if flips(5, 0, np.array([index]))[0]:
                        want = want.flip(-1)
                else:
                    want = resize_center_crop(own, 4, (4, 4))[0]
                # DeviceLoader scales to 0-1 (scale=1/255 by default)
                assert torch.allclose(batch.images[i], want / 255, atol=1e-5), (augment, index)
                seen += 1
        assert seen == len(mix)


def test_the_batched_crop_of_a_padded_batch_equals_the_loop(
    two: tuple[Packed, Packed], tmp_path: Path
) -> None:
    """The one-`grid_sample` path CUDA takes, run on the CPU: per-sample boxes in a padded
    batch give what the per-sample loop gives."""
    from loaders.augment.crops import resized_crop
    from loaders.augment.draws import crop_boxes, flips

    big = make_packed(tmp_path / "big", shard_sizes=(7,), sample_shape=(9, 12, 3), seed=4)
    mix = Mixture([PackedDataset.open(two[0].root), PackedDataset.open(big.root)], weights=[1, 1])
    batch = mix.gather(list(range(len(mix))))
    index = batch.indices.numpy()
    heights, widths = (batch.columns[name].numpy() for name in ("sample.height", "sample.width"))
    boxes = crop_boxes(1, 3, index, heights, widths)
    assert (boxes[:, 0] + boxes[:, 2] <= heights).all() and (
        boxes[:, 1] + boxes[:, 3] <= widths
    ).all()
    flip = torch.from_numpy(flips(1, 3, index))
    nchw = batch.images.permute(0, 3, 1, 2)
    box = torch.from_numpy(boxes)
    looped = resized_crop(nchw, box, flip, (5, 4), batched=False)
    batched = resized_crop(nchw, box, flip, (5, 4), batched=True)
    assert torch.allclose(looped, batched, atol=1e-3)
