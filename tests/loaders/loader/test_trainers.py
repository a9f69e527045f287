"""The loaders as every trainer takes them: PyTorch Lightning (one process and DDP on two),
Hugging Face accelerate under torchrun, and plain torch code typed against DataLoader.

The trainers run for real, in subprocesses (tests/loaders/loader/trainers/*.py), on gloo over
127.0.0.1. What each rank's steps received is identified by content (the sha1 of each image, against
the images `make_packed` wrote), never by the loaders' own bookkeeping.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.ipc as ipc
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

from loaders import DeviceLoader, PackedDataset, PackedLoader, make_loader, stream_loader
from loaders.datasets.stream import PackedStream
from loaders.read.catalog import open_catalog
from tests.helpers.cli import cli
from tests.helpers.packed import Packed, make_packed
from tests.loaders.order.test_distributed import free_port

SCRIPTS = Path(__file__).parent / "trainers"
SPLITS = ("val", "test", "train", "train", "train")
"""Sample i's split is SPLITS[i % 5]: train, val and test all present."""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    root = tmp_path_factory.mktemp("trainers") / "ds"
    return make_packed(root, shard_sizes=(11, 9, 14, 8), split_of=lambda i: SPLITS[i % 5])


@pytest.fixture(scope="module")
def encoded(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    """The same kind of dataset with every sample stored zlib-encoded (format version 3): the
    trainers read it decoded in their workers, and each image is still identified by content."""
    root = tmp_path_factory.mktemp("trainers-zlib") / "ds"
    return make_packed(
        root, shard_sizes=(11, 9, 14, 8), split_of=lambda i: SPLITS[i % 5], codec="zlib"
    )


@pytest.fixture(autouse=True)
def _quiet_cpu_note() -> None:
    warnings.filterwarnings("ignore", "CUDA is not available", RuntimeWarning)


def digest_of(packed: Packed) -> dict[str, int]:
    """sha1 of each written image -> its manifest position (what the scripts record)."""
    found = {hashlib.sha1(image.tobytes()).hexdigest(): p for p, image in enumerate(packed.images)}
    assert len(found) == len(packed.images), "random images are distinct"
    return found


def positions(packed: Packed, digests: list[str]) -> list[int]:
    known = digest_of(packed)
    return [known[d] for d in digests]


def run(args: list[str], world: int = 1, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """A script alone, or under torchrun with `world` processes on 127.0.0.1."""
    launcher = [sys.executable]
    if world > 1:
        launcher += [
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={world}",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
        ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if world > 1:
        # The ranks train on the CPU (gloo): on a machine with fewer GPUs than ranks, accelerate's
        # barrier still names cuda:<local rank> and rank 1 fails on a one-GPU machine.
        env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run(
        [*launcher, *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    return done


def check_ok(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def seen_by_rank(out: Path, world: int, name: str = "seen") -> list[Any]:
    return [json.loads((out / f"{name}-{rank}.json").read_text()) for rank in range(world)]


def assert_each_once(packed: Packed, split: str, parts: list[list[int]]) -> None:
    """The ranks' parts of one epoch: equal lengths, and together every sample of the split
    once, but for the padding that evens them out (as DistributedSampler pads)."""
    expected = set(packed.indices(split))
    assert expected and all(parts)
    world, n = len(parts), len(expected)
    assert {len(part) for part in parts} == {-(-n // world)}, "equal parts keep DDP in step"
    union = [p for part in parts for p in part]
    assert set(union) == expected
    repeated = Counter(union) - Counter(expected)
    assert sum(repeated.values()) == world * -(-n // world) - n


# --- Lightning -----------------------------------------------------------------------------


LIGHTNING_SETUPS = pytest.mark.parametrize(
    ("world", "workers"),
    [(1, 0), (1, 2), (2, 0)],
    ids=["one-process", "one-process-2-workers", "ddp-2-processes"],
)
"""Processes and DataLoader workers each Lightning test runs with."""


def lightning(packed: Packed, out: Path, *extra: str, world: int = 1) -> None:
    out.mkdir(parents=True, exist_ok=True)
    script = str(SCRIPTS / "lightning_run.py")
    check_ok(run([script, str(packed.root), str(out), *extra], world))


@LIGHTNING_SETUPS
def test_lightning_fits_validates_and_tests_with_the_loaders_as_they_are(
    packed: Packed, tmp_path: Path, world: int, workers: int
) -> None:
    """The loaders come back from train/val/test_dataloader unchanged; Lightning injects no
    sampler over ours (each rank reads its own part), and each epoch covers each split."""
    lightning(packed, tmp_path, f"--workers={workers}", world=world)
    ranks = seen_by_rank(tmp_path, world)
    for epoch in ("0", "1"):
        assert_each_once(packed, "train", [positions(packed, r["train"][epoch]) for r in ranks])
        assert_each_once(packed, "val", [positions(packed, r["val"][epoch]) for r in ranks])
    # trainer.validate and trainer.test after fit (Lightning's epoch counter then reads 2).
    assert_each_once(packed, "val", [positions(packed, r["val"]["2"]) for r in ranks])
    assert_each_once(packed, "test", [positions(packed, r["test"]["2"]) for r in ranks])
    first = [positions(packed, r["train"]["0"]) for r in ranks]
    assert first != [positions(packed, r["train"]["1"]) for r in ranks], "set_epoch reached us"


@LIGHTNING_SETUPS
def test_lightning_killed_mid_epoch_resumes_from_its_own_checkpoint(
    packed: Packed, tmp_path: Path, world: int, workers: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checkpoints every 2 steps, SIGKILL during step 5, `fit(ckpt_path=...)` from step 4: the
    resumed run trains on exactly the batches the killed run had not finished, then on whole
    epochs in the uninterrupted run's order, on every rank. And `etl trace` on the resumed
    run's last checkpoint names, for every step and rank, what that rank trained on there
    (the killed run's steps before the checkpoint included)."""
    lightning(packed, tmp_path / "whole", f"--workers={workers}", world=world)
    killed = tmp_path / "killed"
    killed.mkdir()
    script = str(SCRIPTS / "lightning_run.py")
    extra = ["--save-every=2", "--kill-after-step=5", f"--workers={workers}"]
    done = run([script, str(packed.root), str(killed), *extra], world)
    assert done.returncode == (-9 if world == 1 else 1), "the run died as a killed node does"
    per_epoch = len(packed.indices("train")) // 4 // world  # steps (batches of 4 a rank)
    epoch, done_in_epoch = divmod(4, per_epoch)
    checkpoint = killed / f"epoch={epoch}-step=4.ckpt"
    assert checkpoint.exists(), sorted(p.name for p in killed.iterdir())
    lightning(
        packed, tmp_path / "resumed", f"--resume={checkpoint}", f"--workers={workers}",
        "--save-every=2", world=world,
    )  # fmt: skip

    for rank in range(world):
        whole = seen_by_rank(tmp_path / "whole", world)[rank]["train"]
        died = seen_by_rank(killed, world)[rank]["train"]
        resumed = seen_by_rank(tmp_path / "resumed", world)[rank]["train"]
        assert [len(v) for v in whole.values()] == [per_epoch * 4] * 2
        assert died[str(epoch)] == whole[str(epoch)][: len(died[str(epoch)])]
        assert sum(len(v) for v in died.values()) == 5 * 4, "the killed run's five steps"
        resumed_epoch = whole[str(epoch)][done_in_epoch * 4 :]
        assert resumed[str(epoch)] == resumed_epoch, "after step 4: nothing lost, none twice"
        assert {e: v for e, v in resumed.items() if e != str(epoch)} == {
            e: v for e, v in whole.items() if int(e) > epoch
        }, "then whole epochs, in the uninterrupted run's order"
    check_traced_from_checkpoint(packed, killed, tmp_path / "resumed", world, capsys)


def check_traced_from_checkpoint(
    packed: Packed, killed: Path, resumed: Path, world: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every step of every rank up to the resumed run's last checkpoint, traced by `etl trace`
    from that checkpoint, is the batch that rank received (identified by content): steps 0-3
    of the killed run, then the resumed run's."""

    last = max(resumed.glob("*.ckpt"), key=lambda p: int(p.stem.rsplit("step=", 1)[1]))
    saved_at = int(last.stem.rsplit("step=", 1)[1])
    table = ipc.open_file(packed.root / "versions" / "v000001" / "manifest.arrow").read_all()
    position_of = {sid: p for p, sid in enumerate(table.column("sample_id").to_pylist())}
    for rank in range(world):
        steps = []
        for run_dir, first, stop in ((killed, 0, 4), (resumed, 4, saved_at)):
            seen = seen_by_rank(run_dir, world)[rank]["train"]
            flat = [d for e in sorted(seen, key=int) for d in seen[e]]
            steps += [flat[i : i + 4] for i in range(0, len(flat), 4)][: stop - first]
        assert len(steps) == saved_at > 4
        for step, digests in enumerate(steps):
            args = ["trace", str(last), "--step", str(step), "--rank", str(rank), "--json"]
            code, out, err = cli(args, capsys)
            assert code == 0, err
            traced = [position_of[s["sample_id"]] for s in json.loads(out)["samples"]]
            assert traced == positions(packed, digests), (rank, step)


# --- accelerate ----------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_accelerate_prepare_keeps_the_shares_and_save_state_resumes_exactly(
    packed: Packed, tmp_path: Path, workers: int
) -> None:
    """`Accelerator.prepare(model, optimizer, loader)` under torchrun with 2 processes: each
    rank keeps its own part (accelerate would otherwise split it again), and
    `save_state` after 2 steps then `load_state` in new processes gives the rest."""
    script = str(SCRIPTS / "accelerate_run.py")
    for phase in (["full"], ["save", "--steps=2"], ["resume"]):
        check_ok(run([script, str(packed.root), str(tmp_path), *phase, f"--workers={workers}"], 2))
    full, saved, resumed = (seen_by_rank(tmp_path, 2, name) for name in ("full", "save", "resume"))
    assert_each_once(packed, "train", [positions(packed, part) for part in full])
    for rank in range(2):
        assert len(saved[rank]) == 2 * 4
        assert saved[rank] + resumed[rank] == full[rank]


def test_trainers_take_a_dataset_stored_encoded(encoded: Packed, tmp_path: Path) -> None:
    """Once with samples stored encoded, decoded in DataLoader workers: Lightning (one process,
    2 workers) fits and validates over each split's samples each epoch, and accelerate under
    torchrun (2 processes) keeps each rank's share and resumes exactly from `save_state`."""
    lightning(encoded, tmp_path / "lightning", "--workers=2")
    (ranks,) = [seen_by_rank(tmp_path / "lightning", 1)]
    for epoch in ("0", "1"):
        assert_each_once(encoded, "train", [positions(encoded, r["train"][epoch]) for r in ranks])
        assert_each_once(encoded, "val", [positions(encoded, r["val"][epoch]) for r in ranks])
    script, out = str(SCRIPTS / "accelerate_run.py"), tmp_path / "accelerate"
    out.mkdir()
    for phase in (["full"], ["save", "--steps=2"], ["resume"]):
        check_ok(run([script, str(encoded.root), str(out), *phase, "--workers=2"], 2))
    full, saved, resumed = (seen_by_rank(out, 2, name) for name in ("full", "save", "resume"))
    assert_each_once(encoded, "train", [positions(encoded, part) for part in full])
    for rank in range(2):
        assert saved[rank] + resumed[rank] == full[rank]


# --- Keras ---------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_keras_fit_reads_a_new_order_each_epoch_and_validates(
    packed: Packed, tmp_path: Path, workers: int
) -> None:
    """`model.fit(loader, validation_data=loader, epochs=3)` with Keras 3 on the torch backend,
    which never calls set_epoch: each epoch every train sample once, in that epoch's order
    (what a loader told the epoch reads), and the validation split whole each epoch."""
    check_ok(run([str(SCRIPTS / "keras_run.py"), str(packed.root), str(tmp_path),
                  "--epochs=3", f"--workers={workers}"]))  # fmt: skip
    seen = json.loads((tmp_path / "seen.json").read_text())
    ds = PackedDataset.open(packed.root, split="train")
    reference = make_loader(ds, batch_size=4, shuffle=True, seed=3, with_indices=True)
    for epoch in range(3):
        reference.set_epoch(epoch)
        told = [int(p) for b in reference for p in ds.selection.positions[b.indices.numpy()]]
        assert positions(packed, seen["train"][str(epoch)]) == told, epoch
        assert_each_once(packed, "val", [positions(packed, seen["val"][str(epoch)])])
    orders = [tuple(seen["train"][str(e)]) for e in range(3)]
    assert len(set(orders)) == 3, "a new order each epoch"
    assert max(seen["loss"]) < 10, "the loss of a 3-class problem, never weighted by an index"


def test_keras_refuses_batches_whose_indices_it_would_read_as_weights(
    packed: Packed, tmp_path: Path
) -> None:
    done = run([str(SCRIPTS / "keras_run.py"), str(packed.root), str(tmp_path), "--with-indices"])
    assert done.returncode != 0 and not (tmp_path / "seen.json").exists()
    assert "Keras reads a batch's third field as sample_weight" in done.stderr


# --- transformers' Trainer -----------------------------------------------------------------


def flat(batches: list[list[int]]) -> list[int]:
    return [p for batch in batches for p in batch]


def hf(packed: Packed, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """hf_run.py (PackedTrainer as docs/training.md sets it up) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    return run([str(SCRIPTS / "hf_run.py"), str(packed.root), str(out), *extra])


def hf_seen(packed: Packed, out: Path) -> tuple[list[list[int]], list[list[int]]]:
    """(each train batch, each evaluation batch) the model was called with, by content."""
    lines = [json.loads(line) for line in (out / "seen.jsonl").read_text().splitlines()]
    train = [positions(packed, line["images"]) for line in lines if line["train"]]
    evaluated = [positions(packed, line["images"]) for line in lines if not line["train"]]
    return train, evaluated


HF_SETUPS = pytest.mark.parametrize(
    ("workers", "accum", "save", "kills"),
    [(0, 1, 2, (3, 9)), (2, 1, 2, (3, 9)), (0, 2, 1, (2, 5)), (2, 2, 1, (2, 5))],
    ids=["0-workers", "2-workers", "0-workers-accumulating-2", "2-workers-accumulating-2"],
)
"""Workers, gradient accumulation, checkpoint every `save` optimizer steps, and the steps the
two killed runs die after: one in epoch 0, one in the middle of epoch 1 (6 batches an epoch)."""


@HF_SETUPS
def test_transformers_trainer_resumes_exactly_through_its_own_checkpoints(
    packed: Packed,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    workers: int,
    accum: int,
    save: int,
    kills: tuple[int, int],
) -> None:
    """`PackedTrainer(...).train(resume_from_checkpoint=...)` as the docs show it, killed
    (SIGKILL) after a checkpoint in epoch 0 and in the middle of epoch 1, resumed in a fresh
    process: the batches it trains on, in order, are the uninterrupted run's; each epoch's are
    every train sample once, in a new order; the validation split is evaluated whole after
    each epoch; and `etl trace` on the resumed run's last checkpoint names the samples of
    every step since the run began, the killed run's included."""
    options = [f"--workers={workers}", f"--accum={accum}", f"--save-steps={save}"]
    check_ok(hf(packed, tmp_path / "whole", *options))
    whole, evaluated = hf_seen(packed, tmp_path / "whole")
    per_epoch = len(whole) // 2
    epochs = [flat(whole[e * per_epoch : (e + 1) * per_epoch]) for e in range(2)]
    for epoch in epochs:
        assert_each_once(packed, "train", [epoch])
    assert epochs[0] != epochs[1], "a new order in epoch 1"
    assert len(evaluated) == 2 * 3
    for e in range(2):
        assert_each_once(packed, "val", [flat(evaluated[e * 3 : (e + 1) * 3])])

    for kill in kills:
        killed, resumed = tmp_path / f"killed-{kill}", tmp_path / f"resumed-{kill}"
        assert hf(packed, killed, *options, f"--kill-after-step={kill}").returncode == -9
        last = (kill - 1) // save * save  # the checkpoint due at the kill is not written
        checkpoint = killed / f"checkpoint-{last}"
        assert checkpoint.is_dir(), sorted(p.name for p in killed.iterdir())
        resumed.mkdir()
        check_ok(hf(packed, killed, *options, f"--resume={checkpoint}"))
        (killed / "seen.jsonl").rename(resumed / "seen.jsonl")
        trained, _ = hf_seen(packed, resumed)
        died_after = kill * accum  # batches the killed run trained on
        assert trained[:died_after] == whole[:died_after], "the killed run, as far as it got"
        assert trained[died_after:] == whole[last * accum :], "resumed: nothing lost, none twice"

    final = killed / f"checkpoint-{len(whole) // accum}"
    for step, batch in enumerate(whole):
        code, out, err = cli_trace(final, step, capsys)
        assert code == 0, err
        assert traced_positions(packed, out) == batch, step


def cli_trace(record: Path, step: int, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return cli(["trace", str(record), "--step", str(step), "--json"], capsys)


def traced_positions(packed: Packed, out: str) -> list[int]:
    table = ipc.open_file(packed.root / "versions" / "v000001" / "manifest.arrow").read_all()
    position_of = {sid: p for p, sid in enumerate(table.column("sample_id").to_pylist())}
    return [position_of[s["sample_id"]] for s in json.loads(out)["samples"]]


# --- PyTorch Ignite ------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_ignite_resumes_exactly_through_its_own_checkpoints(
    packed: Packed, tmp_path: Path, capsys: pytest.CaptureFixture[str], workers: int
) -> None:
    """`Engine.run(loader, max_epochs=2)`, which never calls set_epoch, the loader in Ignite's
    `Checkpoint` beside the model: each epoch every sample once in a new order; killed in the
    middle of epoch 1 and resumed from the last checkpoint in a fresh process, the iterations
    train on exactly the uninterrupted run's batches; `etl trace` on the last checkpoint names
    every iteration's samples."""
    script = str(SCRIPTS / "ignite_run.py")

    def trained(out: Path) -> list[list[int]]:
        lines = (out / "seen.jsonl").read_text().splitlines()
        return [positions(packed, json.loads(line)) for line in lines]

    whole_dir, killed = tmp_path / "whole", tmp_path / "killed"
    for out in (whole_dir, killed):
        out.mkdir()
    check_ok(run([script, str(packed.root), str(whole_dir), f"--workers={workers}"]))
    whole = trained(whole_dir)
    half = len(whole) // 2
    for epoch in (whole[:half], whole[half:]):
        assert_each_once(packed, "train", [flat(epoch)])
    assert whole[:half] != whole[half:], "a new order in epoch 1"
    extra = [f"--workers={workers}", "--save-every=2"]
    done = run([script, str(packed.root), str(killed), *extra, "--kill-after-iteration=9"])
    assert done.returncode == -9
    last = killed / "checkpoints" / "checkpoint_8.pt"
    check_ok(run([script, str(packed.root), str(killed), *extra, f"--resume={last}"]))
    resumed = trained(killed)
    assert resumed[:9] == whole[:9] and resumed[9:] == whole[8:]
    final = killed / "checkpoints" / f"checkpoint_{len(whole)}.pt"
    for step, batch in enumerate(whole):
        code, out, err = cli_trace(final, step, capsys)
        assert code == 0, err
        assert traced_positions(packed, out) == batch, step


# --- Ray Train -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workers", "dist_sampler"), [(0, 1), (0, 0), (2, 1)],
    ids=["add-dist-sampler", "no-dist-sampler", "2-workers"],
)  # fmt: skip
def test_ray_train_keeps_the_shares_and_resumes_exactly(
    packed: Packed,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    workers: int,
    dist_sampler: int,
) -> None:
    """`TorchTrainer` on 2 workers with `prepare_data_loader(loader, add_dist_sampler=...)`:
    our order is a DistributedSampler, so Ray keeps it either way and each rank reads its own
    part of each epoch; Ray's wrapper reads a batch ahead, which the state leaves out, so a
    state saved after step 4 resumes, in a new Ray run, with exactly the rest; `etl trace` on
    the resumed run's last state names every step of every rank."""
    script = str(SCRIPTS / "ray_run.py")
    options = [f"--workers={workers}", f"--dist-sampler={dist_sampler}"]
    whole_dir, resumed_dir = tmp_path / "whole", tmp_path / "resumed"
    whole_dir.mkdir()
    check_ok(run([script, str(packed.root), str(whole_dir), *options, "--save-at=4"]))
    whole = seen_by_rank(whole_dir, 2)
    for epoch in ("0", "1"):
        assert_each_once(packed, "train", [flat(positions_of_steps(packed, r, epoch))
                                           for r in whole])  # fmt: skip
    shutil.copytree(whole_dir, resumed_dir, ignore=shutil.ignore_patterns("seen-*", "ray"))
    check_ok(run([script, str(packed.root), str(resumed_dir), *options, "--resume"]))
    resumed = seen_by_rank(resumed_dir, 2)
    per_epoch = len(whole[0]["seen"]["0"])
    for rank in range(2):
        assert resumed[rank]["seen"]["1"] == whole[rank]["seen"]["1"][4 - per_epoch :]
        state_file = tmp_path / f"state-{rank}.json"
        state_file.write_text(json.dumps(resumed[rank]["state"]))
        steps = [b for e in ("0", "1") for b in positions_of_steps(packed, whole[rank], e)]
        for step, batch in enumerate(steps):
            code, out, err = cli(
                ["trace", str(state_file), "--step", str(step), "--rank", str(rank), "--json"],
                capsys,
            )
            assert code == 0, err
            assert traced_positions(packed, out) == batch, (rank, step)


def positions_of_steps(packed: Packed, seen: dict[str, Any], epoch: str) -> list[list[int]]:
    return [positions(packed, step) for step in seen["seen"][epoch]]


# --- plain torch ---------------------------------------------------------------------------


def steps_of(loader: DataLoader[Any]) -> int:
    """Code typed against DataLoader: what it may rely on."""
    assert isinstance(loader, DataLoader)
    return sum(1 for _ in loader)


def test_plain_torch_code_takes_the_loader_as_a_dataloader(packed: Packed) -> None:
    ds = PackedDataset.open(packed.root, split="train")
    n = len(ds)
    loader = make_loader(ds, batch_size=5, shuffle=True, num_workers=0, seed=1)
    assert isinstance(loader, DataLoader) and isinstance(loader, PackedLoader)
    assert loader.batch_size == 5 and loader.drop_last is False and loader.num_workers == 0
    assert isinstance(loader.sampler, DistributedSampler)
    assert isinstance(loader.batch_sampler, BatchSampler)
    assert loader.batch_sampler.sampler is loader.sampler
    assert len(loader) == -(-n // 5) == steps_of(loader)
    assert loader.pin_memory is torch.cuda.is_available() and loader.persistent_workers is False

    model = torch.nn.Linear(int(np.prod(ds.sample_shape)), len(ds.classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    epochs = 3
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, 1.0, epochs=epochs, steps_per_epoch=len(loader)
    )
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images.flatten(1) / 255.0), labels)
            loss.backward()
            optimizer.step()
            schedule.step()  # raises once stepped past epochs * steps_per_epoch
    assert schedule.last_epoch == epochs * len(loader)

    dropped = make_loader(
        ds, batch_size=5, shuffle="blocks", drop_last=True, num_workers=2, workers_as="processes"
    )
    assert dropped.drop_last is True and dropped.num_workers == 2
    assert len(dropped) == n // 5 == steps_of(dropped)
    assert dropped.prefetch_factor == 2  # torch's default with workers


def test_stream_loader_is_a_dataloader_too(packed: Packed) -> None:
    stream = PackedStream(open_catalog(packed.root).select("train"), batch_size=4, seed=2)
    loader = stream_loader(stream)
    assert isinstance(loader, DataLoader) and loader.batch_size is None  # the stream batches
    assert len(loader) == steps_of(loader)
    with pytest.raises(ValueError, match="PackedStream brings its own batch size"):
        PackedLoader(stream, shuffle=True)


def test_inner_loader_state_leaves_out_the_batch_a_device_loader_holds(packed: Packed) -> None:
    """A user who saves the state of the loader they built, not of the DeviceLoader around
    it, resumes at the first batch the loop has not received."""
    ds = PackedDataset.open(packed.root, split="train")
    loader = make_loader(ds, batch_size=3, shuffle=True, seed=4)
    on_device = DeviceLoader(loader, device="cpu")
    for received, _ in enumerate(on_device, start=1):
        assert loader.state_dict() == on_device.state_dict()
        assert loader.state_dict()["position"] == 3 * received
        if received == 2:
            break
    assert loader.state_dict()["position"] == 6, "the batch pulled ahead is not counted"
