"""Which samples a run read at step N (NOTE [ a run's history ] in `loaders.order.history`): every
answer compared with the dataset indices the loaders actually delivered while the run went,
through resumes with the same and another world size."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaders import DeviceLoader, PackedDataset, make_loader
from loaders.loader.trace import samples_at, steps_of
from loaders.order.history import decode
from tests.helpers.cli import cli
from tests.helpers.packed import Packed


@pytest.fixture(autouse=True)
def _quiet_cpu_note() -> None:
    warnings.filterwarnings("ignore", "CUDA is not available", RuntimeWarning)


Read = dict[tuple[int, int], list[int]]
"""(step, rank) -> the dataset indices delivered there."""


def steps(batches: Iterator[Any], read: Read, first: int, rank: int, count: int | None) -> int:
    """Take `count` batches (all, with None), recording each one's indices; the next step."""
    step = first
    for batch in batches:
        read[(step, rank)] = batch[2].tolist()
        step += 1
        if count is not None and step - first == count:
            break
    return step


def loader_of(ds: PackedDataset, shuffle: Any, drop_last: bool, **options: Any) -> Any:
    return make_loader(
        ds, batch_size=options.pop("batch_size", 5), shuffle=shuffle, seed=3,
        drop_last=drop_last, with_indices=True, **options,
    )  # fmt: skip


def check_traced(read: Read, state: dict[str, Any], tracer: Any) -> None:
    for (step, rank), indices in read.items():
        assert samples_at(tracer, state, step, rank).tolist() == indices, (step, rank)
    for sample in sorted({i for indices in read.values() for i in indices})[:12]:
        expected = sorted(at for at, indices in read.items() if sample in indices)
        assert steps_of(tracer, state, sample) == expected, sample


@pytest.mark.parametrize("shuffle", ["random", False, "blocks", "shards", "balanced"])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("through", ["loader", "DeviceLoader", "2 workers"])
def test_every_step_of_a_run_resumed_twice_is_traced_to_what_it_read(
    packed: Packed, shuffle: Any, drop_last: bool, through: str
) -> None:
    """Epoch 0 whole, epoch 1 cut after 4 batches and its state saved; a new loader resumes
    it, reads epoch 2 whole and 2 batches of epoch 3, and saves again: every step of all of
    it is traced, from that last state, to the indices delivered."""
    ds = PackedDataset.open(packed.root)
    workers = 2 if through == "2 workers" else 0
    read: Read = {}

    def batches(loader: Any) -> Iterator[Any]:
        return iter(DeviceLoader(loader, device="cpu") if through == "DeviceLoader" else loader)

    first = loader_of(ds, shuffle, drop_last, num_workers=workers, workers_as="processes")
    step = steps(batches(first), read, 0, 0, None)
    first.set_epoch(1)
    wrapper = DeviceLoader(first, device="cpu") if through == "DeviceLoader" else first
    step = steps(iter(wrapper), read, step, 0, 4)
    saved = wrapper.state_dict()
    assert saved["step"] == step

    second = loader_of(ds, shuffle, drop_last, num_workers=workers, workers_as="processes")
    second.load_state_dict(saved)
    second.set_epoch(1)
    step = steps(batches(second), read, step, 0, None)
    second.set_epoch(2)
    step = steps(batches(second), read, step, 0, None)
    second.set_epoch(3)
    step = steps(iter(second), read, step, 0, 2)
    final = second.state_dict()
    assert final["step"] == step == len(read)
    # whole epochs read one after another are one entry: epochs 0-1 (1 cut by the save), the
    # resumed rest of 1, epochs 2-3 (3 cut by the save)
    assert [(s.epoch, s.epochs) for s in decode(final["history"])] == [(0, 2), (1, 1), (2, 2)]

    check_traced(read, final, loader_of(ds, shuffle, drop_last))
    with pytest.raises(ValueError, match=f"step {step} was not read"):
        samples_at(second, final, step)


def test_an_elastic_resume_from_two_ranks_to_four_is_traced_per_rank(packed: Packed) -> None:
    """Two ranks (batches of 4) read 5 steps of epoch 0; four ranks (batches of 2, the same
    global batch) resume from rank 0's state and read the rest of epoch 0 and all of epoch 1:
    each rank's every step is traced to what that rank read."""
    ds = PackedDataset.open(packed.root)
    read: Read = {}
    saved = {}
    for rank in (0, 1):
        loader = loader_of(ds, "random", False, batch_size=4, rank=rank, world_size=2)
        steps(iter(loader), read, 0, rank, 5)
        saved[rank] = loader.state_dict()
    assert saved[0]["history"] == saved[1]["history"] and saved[0]["step"] == 5
    final = {}
    for rank in range(4):
        loader = loader_of(ds, "random", False, batch_size=2, rank=rank, world_size=4)
        loader.load_state_dict(saved[0])
        step = steps(iter(loader), read, 5, rank, None)
        loader.set_epoch(1)
        step = steps(iter(loader), read, step, rank, None)
        final[rank] = loader.state_dict()
    assert len({f["history"] for f in final.values()}) == 1
    check_traced(read, final[2], loader_of(ds, "random", False))
    every = [i for (s, _), indices in read.items() if s < 5 + 8 for i in indices]
    assert sorted(set(every)) == list(range(len(ds))), "epoch 0: every sample, by some rank"


def test_a_state_without_history_or_with_a_damaged_one_is_refused(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root)
    loader = loader_of(ds, "random", False)
    for _ in loader:
        pass
    state = loader.state_dict()
    bare = {k: v for k, v in state.items() if k not in ("step", "history")}
    loader.load_state_dict(bare)  # a state saved before tracing existed still loads
    with pytest.raises(ValueError, match="has no history"):
        samples_at(loader, bare, 0)
    for damaged in ("1:2:x", "0:0:0:0:0:5", 7, "0:0:0:0:1"):
        with pytest.raises(ValueError, match="'history' is damaged"):
            loader.load_state_dict({**state, "history": damaged})


def test_etl_trace_answers_from_a_checkpoint_without_the_training_code(
    packed: Packed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The state inside a checkpoint (torch.save of a trainer's dict) or a JSON file records
    the run: `etl trace --step` names what was read at that step, `--sample` when a sample
    was read, each equal to what the loader delivered."""
    import torch

    ds = PackedDataset.open(packed.root, split="train")
    loader = loader_of(ds, "random", False)
    read: Read = {}
    step = steps(iter(loader), read, 0, 0, None)
    loader.set_epoch(1)
    steps(iter(loader), read, step, 0, 3)
    state = loader.state_dict()
    checkpoint = tmp_path / "last.ckpt"
    torch.save({"epoch": 1, "loops": {"fit": {"train_dataloader": state}}}, checkpoint)
    as_json = tmp_path / "state.json"
    as_json.write_text(json.dumps(state))
    table = ds.manifest_rows(list(range(len(ds))))
    sources = table.column("source").to_pylist()
    asked = len(read) - 2  # a step of epoch 1
    for record in (checkpoint, as_json):
        code, out, err = cli(["trace", str(record), "--step", str(asked), "--json"], capsys)
        assert code == 0, err
        answer = json.loads(out)
        assert [s["index"] for s in answer["samples"]] == read[(asked, 0)]
        assert [s["source"] for s in answer["samples"]] == [sources[i] for i in read[(asked, 0)]]
    picture = tmp_path / "step.png"
    asking = ["trace", str(checkpoint), "--step", str(asked), "--sheet", str(picture)]
    code, out, err = cli(asking, capsys)
    assert code == 0 and f"wrote {picture}" in out, err
    from PIL import Image

    with Image.open(picture) as drawn:
        assert drawn.width >= 96 * len(set(read[(asked, 0)])) and drawn.height >= 96
    chosen = read[(2, 0)][0]
    code, out, err = cli(["trace", str(checkpoint), "--sample", sources[chosen], "--json"], capsys)
    assert code == 0, err
    expected = [{"step": s, "rank": r} for (s, r), got in sorted(read.items()) if chosen in got]
    assert json.loads(out)["read"] == expected
    code, out, err = cli(["trace", str(checkpoint), "--step", str(len(read))], capsys)
    assert code == 2 and f"step {len(read)} was not read" in err and "Traceback" not in err
    unsafe = tmp_path / "unsafe.ckpt"
    torch.save({"loader": state, "hparams": Path("not/allowed")}, unsafe)  # weights_only refuses
    code, out, err = cli(["trace", str(unsafe), "--step", "0"], capsys)
    assert code == 2 and "cannot read it" in err and "Traceback" not in err, err
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"epoch": 0}))
    code, out, err = cli(["trace", str(bare), "--step", "0"], capsys)
    assert code == 2 and "holds no loader state with a run's history" in err


def test_etl_trace_reads_no_checkpoint_with_a_torch_whose_safe_load_can_be_bypassed(
    packed: Packed,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under a torch older than 2.6 (its weights_only=True load could be made to run code,
    CVE-2025-32434) a checkpoint is refused in one line, unread, while the same state as
    JSON still answers."""
    import torch

    ds = PackedDataset.open(packed.root, split="train")
    loader = loader_of(ds, "random", False)
    steps(iter(loader), {}, 0, 0, 2)
    checkpoint, as_json = tmp_path / "last.ckpt", tmp_path / "state.json"
    torch.save({"loader": loader.state_dict()}, checkpoint)
    as_json.write_text(json.dumps(loader.state_dict()))
    loads: list[object] = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a))
    monkeypatch.setattr(torch, "__version__", "2.5.1+cpu")
    code, out, err = cli(["trace", str(checkpoint), "--step", "0"], capsys)
    assert code == 2 and "CVE-2025-32434" in err and "torch>=2.6" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and not loads
    code, out, err = cli(["trace", str(as_json), "--step", "0", "--json"], capsys)
    assert code == 0 and json.loads(out)["samples"], err


def test_whole_epochs_are_one_entry_and_an_epoch_cut_short_begins_another(packed: Packed) -> None:
    """30 epochs, the 21st left after 3 batches: two entries (epochs 0-20, 21-29), whatever
    the run's length, and every step still traced to what was read."""
    ds = PackedDataset.open(packed.root)
    loader = loader_of(ds, "random", False)
    read: Read = {}
    step = 0
    for epoch in range(30):
        loader.set_epoch(epoch)
        step = steps(iter(loader), read, step, 0, 3 if epoch == 20 else None)
    state = loader.state_dict()
    assert [(s.epoch, s.epochs) for s in decode(state["history"])] == [(0, 21), (21, 9)]
    check_traced(read, state, loader_of(ds, "random", False))

    from etl.progress import Progress

    class Counted(Progress):
        def start(self, phase: str, total: int) -> None:
            self.total, self.done = total, 0

        def advance(self, n: int) -> None:
            self.done += n

    counted = Counted()
    steps_of(loader_of(ds, "random", False), state, 0, counted)
    assert counted.total == counted.done == 30, "one order drawn per epoch, each counted"


def test_a_run_on_a_view_of_a_view_is_traced_from_its_record(
    packed: Packed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A view's run records its chain of predicates; `etl trace` opens the same view again
    (its fingerprint checked) and answers as the loader read."""
    from loaders import View

    train = View(str(packed.root), split="train")
    view = View(base=train, classes=["ant", "cat"])
    ds = PackedDataset.open(view)
    loader = loader_of(ds, "random", False)
    read: Read = {}
    steps(iter(loader), read, 0, 0, None)
    record = tmp_path / "state.json"
    record.write_text(json.dumps(loader.state_dict()))
    assert json.loads(loader.state_dict()["run"])["view"]["chain"][1] == {"classes": ["ant", "cat"]}
    last = len(read) - 1
    code, out, err = cli(["trace", str(record), "--step", str(last), "--json"], capsys)
    assert code == 0, err
    assert [s["index"] for s in json.loads(out)["samples"]] == read[(last, 0)]
    assert {s["class_name"] for s in json.loads(out)["samples"]} <= {"ant", "cat"}
    sheet = tmp_path / "step.png"
    code, _, err = cli(["trace", str(record), "--step", "0", "--sheet", str(sheet)], capsys)
    assert code == 0, err
    assert sheet.read_bytes().startswith(b"\x89PNG")


def test_etl_trace_gives_each_samples_crop_made_in_the_workers(
    packed: Packed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that cropped in its workers (`with_crop(RandomResizedCrop)`): `etl trace --step`
    gives each sample's box and flip, and the batch the run got at that step is those boxes
    of the stored samples, resized (within 1 level: the worker rounds to uint8). A run that
    did not crop there says its crops are not recorded."""
    import torch
    import torch.nn.functional as F

    from loaders import RandomResizedCrop

    ds = PackedDataset.open(packed.root, split="train")
    loader = loader_of(ds.with_crop(RandomResizedCrop((4, 3), seed=9)), "random", False)
    seen: dict[int, Any] = {}
    step = 0
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        for images, _, indices in loader:
            seen[step] = (images.clone(), indices.tolist())
            step += 1
    record = tmp_path / "state.json"
    record.write_text(json.dumps(loader.state_dict()))
    asked = step - 2  # a step of epoch 1
    code, out, err = cli(["trace", str(record), "--step", str(asked), "--json"], capsys)
    assert code == 0, err
    answer = json.loads(out)
    images, indices = seen[asked]
    assert [s["index"] for s in answer["samples"]] == indices
    for k, (index, crop) in enumerate(zip(indices, answer["crops"], strict=True)):
        top, left, height, width = crop["box"]
        stored = torch.from_numpy(packed.images[ds.selection.positions[index]]).permute(2, 0, 1)
        box = stored[None, :, top : top + height, left : left + width].float()
        made = F.interpolate(box, size=(4, 3), mode="bilinear", align_corners=False)[0]
        made = made.flip(-1) if crop["flip"] else made
        got = images[k].permute(2, 0, 1).float()
        assert float((got - made).abs().max()) <= 1.0001, (index, crop)
    code, out, err = cli(["trace", str(record), "--step", str(asked)], capsys)
    assert code == 0 and " -> 4x3" in out and "box " in out
    plain = loader_of(ds, "random", False)
    list(plain)
    record.write_text(json.dumps(plain.state_dict()))
    code, out, _ = cli(["trace", str(record), "--step", "1"], capsys)
    assert code == 0 and "crops: not recorded" in out


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mixture_reweighted_and_resumed_elastically_is_traced_to_what_it_read(
    packed: Packed, tmp_path: Path, workers: int
) -> None:
    """A mixture of three members read for an epoch and a half; resumed with a schedule that
    gives the third member everything from step 20; resumed again on two ranks (the same
    global batch) with other weights and a member appended. Every step of every rank is traced,
    from the last states and a loader over any mixture of those members, to what it read."""
    from loaders import Mixture, View
    from tests.helpers.packed import make_packed

    other = make_packed(tmp_path / "b", shard_sizes=(4, 6), classes=("cat", "dog"), seed=2)
    members = [
        PackedDataset.open(View(str(packed.root), split="train")),
        PackedDataset.open(View(str(packed.root), split="val")),
        PackedDataset.open(other.root),
    ]

    def mixed(mix: Any, **options: Any) -> Any:
        return make_loader(
            mix, batch_size=options.pop("batch_size", 4), seed=2, with_indices=True,
            num_workers=workers, workers_as="processes", **options,
        )  # fmt: skip

    read: Read = {}
    first = mixed(Mixture(members, weights=[1, 1, 1], samples_per_epoch=30))
    step = steps(iter(first), read, 0, 0, None)  # epoch 0: 8 steps
    first.set_epoch(1)
    step = steps(iter(first), read, step, 0, 5)
    saved = json.loads(json.dumps(first.state_dict()))

    after = Mixture(members, weights=[1, 1, 1], samples_per_epoch=30, schedule={20: [0, 0, 1]})
    second = mixed(after)
    second.load_state_dict(saved)
    step = steps(iter(second), read, step, 0, None)
    second.set_epoch(2)
    step = steps(iter(second), read, step, 0, 3)
    saved = json.loads(json.dumps(second.state_dict()))

    extra = PackedDataset.open(View(str(other.root), split="train"))
    grown = Mixture([*members, extra], weights=[3, 1, 0, 1], samples_per_epoch=30)
    final = {}
    for rank in (0, 1):
        loader = mixed(grown, batch_size=2, rank=rank, world_size=2)
        loader.load_state_dict(saved)
        at = steps(iter(loader), read, step, rank, None)
        loader.set_epoch(3)
        at = steps(iter(loader), read, at, rank, 4)
        final[rank] = loader.state_dict()
    assert (
        final[0]["history"] == final[1]["history"] and final[0]["mixtures"] == final[1]["mixtures"]
    )
    assert len(json.loads(final[0]["mixtures"])) == 3  # one context per resume
    tracer = mixed(Mixture([*members, extra], weights=[1, 1, 1, 1]))
    check_traced(read, final[1], tracer)
    with pytest.raises(ValueError, match="mixture's and the loader is not"):
        samples_at(loader_of(PackedDataset.open(packed.root), "random", False), final[0], 0)


def test_a_mixture_reweighted_at_an_epoch_boundary_begins_a_new_entry(packed: Packed) -> None:
    """Whole epochs read one after another are one entry, but not across a resume that
    changed the weights: epoch 1, read under other weights, is traced under those."""
    from loaders import Mixture, View

    members = [PackedDataset.open(View(str(packed.root), split=s)) for s in ("train", "val")]
    read: Read = {}
    first = make_loader(Mixture(members, weights=[1, 1]), batch_size=4, seed=1, with_indices=True)
    step = steps(iter(first), read, 0, 0, None)
    saved = json.loads(json.dumps(first.state_dict()))
    second = make_loader(Mixture(members, weights=[0, 1]), batch_size=4, seed=1, with_indices=True)
    second.load_state_dict(saved)
    second.set_epoch(1)
    steps(iter(second), read, step, 0, None)
    final = second.state_dict()
    assert [s.epoch for s in decode(final["history"])] == [0, 1]
    check_traced(read, final, second)


def test_etl_trace_answers_for_a_mixture_from_its_record(
    packed: Packed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mixture's run records its members as opened and each resume's weights: `etl trace`
    opens the members again and names what each step read, each sample with its member."""
    from loaders import Mixture, View

    members = [PackedDataset.open(View(str(packed.root), split=s)) for s in ("train", "val")]
    members.append(PackedDataset.open(packed.root, classes=["bee"]))
    read: Read = {}
    loader = make_loader(
        Mixture(members, weights=[2, 1, 1]), batch_size=4, seed=7, with_indices=True
    )
    step = steps(iter(loader), read, 0, 0, None)
    saved = json.loads(json.dumps(loader.state_dict()))
    again = make_loader(
        Mixture(members, weights=[0, 0, 1]), batch_size=4, seed=7, with_indices=True
    )
    again.load_state_dict(saved)
    again.set_epoch(1)
    steps(iter(again), read, step, 0, 3)
    record = tmp_path / "state.json"
    record.write_text(json.dumps(again.state_dict()))
    mix = again.dataset
    for at in (1, step + 2):
        code, out, err = cli(["trace", str(record), "--step", str(at), "--json"], capsys)
        assert code == 0, err
        answer = json.loads(out)["samples"]
        assert [s["index"] for s in answer] == read[(at, 0)]
        assert [s["member"] for s in answer] == mix.member_of(read[(at, 0)]).tolist()
        assert all(s["version"] == members[s["member"]].selection.version for s in answer)
        for s in answer:  # named as the member's own manifest names it
            local = s["index"] - int(mix.offsets[s["member"]])
            row = members[s["member"]].manifest_rows([local]).to_pylist()[0]
            assert (s["sample_id"], s["source"]) == (row["sample_id"], row["source"])
    assert {s["member"] for s in json.loads(out)["samples"]} == {2}  # weights [0, 0, 1]
    code, out, err = cli(
        ["trace", str(record), "--step", "0", "--sheet", str(tmp_path / "s.png")], capsys
    )
    assert code == 0, err
    assert (tmp_path / "s.png").read_bytes().startswith(b"\x89PNG")
    first = read[(0, 0)][0]
    source = mix.manifest_rows([first]).to_pylist()[0]["source"]
    code, out, err = cli(["trace", str(record), "--sample", source, "--json"], capsys)
    assert code == 0, err
    every = np.flatnonzero(
        mix.manifest_rows(range(len(mix))).column("source").to_numpy(zero_copy_only=False) == source
    )
    assert len(every) >= 1 and first in every  # a bee is in the train or val member too
    expected = sorted({at for at, indices in read.items() if set(every) & set(indices)})
    assert [(r["step"], r["rank"]) for r in json.loads(out)["read"]] == expected


@pytest.mark.timeout(60)
def test_a_damaged_mixtures_field_is_refused_in_one_line(packed: Packed) -> None:
    """A state's 'mixtures' that is not JSON, not a mapping, or a context missing its keys:
    one ValueError naming the field, on load or when traced, never a KeyError."""
    from loaders import Mixture, View

    members = [PackedDataset.open(View(str(packed.root), split=s)) for s in ("train", "val")]
    loader = make_loader(Mixture(members, weights=[1, 1]), batch_size=4, seed=1)
    for _ in loader:
        pass
    state = json.loads(json.dumps(loader.state_dict()))
    for damaged in ("{not json", "[1, 2]", 7):
        with pytest.raises(ValueError, match="'mixtures' is damaged"):
            loader.load_state_dict({**state, "mixtures": damaged})
    missing = {**state, "mixtures": json.dumps({"0": {"anchor": [0, 0, [0, 0]]}})}
    with pytest.raises(ValueError, match="'mixtures' is damaged"):
        samples_at(loader, missing, 0)
    # bounded: nested past the parser's depth, more contexts than history entries, an epoch
    # of 10^15 samples (its order would be drawn whole)
    context = json.loads(state["mixtures"])["0"]
    hostile = [
        "[" * 100_000 + "]" * 100_000,
        json.dumps({str(k): context for k in range(5000)}),
        json.dumps({"0": {**context, "per_epoch": 10**15}}),
    ]
    for damaged in hostile:
        with pytest.raises(ValueError, match="'mixtures' is damaged"):
            samples_at(loader, {**state, "mixtures": damaged}, 0)


@pytest.mark.timeout(60)
def test_a_hostile_history_is_refused_in_one_line_before_any_order_is_drawn(
    packed: Packed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A state's history is someone's word: a 60-byte one that claims 10^12 epochs of one step
    (once: all memory), epochs of another length than the rebuilt loader's, 200,000 entries,
    entries whose epochs overlap the next are each one line and exit code 2, in well under
    the time limit;
    the run's own history answers, and --max-epochs below its epochs refuses it."""
    ds = PackedDataset.open(packed.root, split="train")
    loader = loader_of(ds, "random", False)
    read: Read = {}
    step = 0
    for epoch in range(3):
        loader.set_epoch(epoch)
        step = steps(iter(loader), read, step, 0, None)
    state = loader.state_dict()
    source = ds.manifest_rows([0]).column("source")[0].as_py()
    hostile = {
        "10^12 epochs": ("0:0:0:0:1:4:1000000000000:1", 10**15, "more than 100,000"),
        "a wrong span": ("0:0:0:0:1:5:3:100", 300, "steps an epoch"),
        "200,000 entries": (";".join(f"{k}:0:0:0:1:5" for k in range(200_000)), 10**6, "4096"),
        "overlapping": ("0:0:0:0:1:5:3:4;5:1:0:0:1:5", 20, "run past the next entry"),
    }
    for name, (history, at, said) in hostile.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({**state, "history": history, "step": at}))
        code, _, err = cli(["trace", str(path), "--sample", source], capsys)
        lines = [line for line in err.splitlines() if not line.startswith("opening ")]
        assert code == 2 and len(lines) == 1 and said in err and "Traceback" not in err, name
    path = tmp_path / "own.json"
    path.write_text(json.dumps(state))
    code, out, err = cli(["trace", str(path), "--sample", source, "--json"], capsys)
    assert code == 0 and len(json.loads(out)["read"]) == 3, err
    code, _, err = cli(["trace", str(path), "--sample", source, "--max-epochs", "2"], capsys)
    assert code == 2 and "covers 3 epochs" in err and "--max-epochs" in err, err


def test_a_state_naming_a_crop_the_loaders_do_not_have_is_one_line(
    packed: Packed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run record whose crop is of an unknown kind, or has a key the crop does not take:
    `etl trace --step` is exit code 2 and one line naming the crop, never a KeyError's or a
    TypeError's traceback."""
    from loaders import RandomResizedCrop

    ds = PackedDataset.open(packed.root, split="train").with_crop(RandomResizedCrop(4, seed=1))
    loader = loader_of(ds, "random", False)
    steps(iter(loader), {}, 0, 0, 2)
    state = loader.state_dict()
    record = json.loads(state["run"])
    for crop in ({**record["crop"], "kind": "Warp"}, {**record["crop"], "bogus": 1}, {"size": 4}):
        path = tmp_path / "state.json"
        path.write_text(json.dumps({**state, "run": json.dumps({**record, "crop": crop})}))
        code, _, err = cli(["trace", str(path), "--step", "1"], capsys)
        lines = [line for line in err.splitlines() if not line.startswith("opening ")]
        assert code == 2 and len(lines) == 1 and "crop" in err and "Traceback" not in err, err


def test_a_sheet_that_cannot_be_written_there_is_one_line(
    packed: Packed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`etl trace --sheet` into a missing folder, or with a name that is not a PNG's: exit
    code 2 and one line naming it, nothing written."""
    ds = PackedDataset.open(packed.root, split="train")
    loader = loader_of(ds, "random", False)
    steps(iter(loader), {}, 0, 0, 2)
    state = tmp_path / "state.json"
    state.write_text(json.dumps(loader.state_dict()))
    for sheet, said in (
        (tmp_path / "nowhere" / "s.png", "no such folder"),
        (tmp_path / "s.txt", "PNG"),
    ):
        code, _, err = cli(["trace", str(state), "--step", "1", "--sheet", str(sheet)], capsys)
        lines = [line for line in err.splitlines() if not line.startswith("opening ")]
        assert code == 2 and len(lines) == 1 and said in err and "Traceback" not in err, err
        assert not sheet.exists()
