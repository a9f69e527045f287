"""Where the loader's time went (`loaders.loader.stats`): the loop's waits as the loop itself
measures them around `next()`, its steps, the batches made here split into stages (a crop's
time counted as crop), worker processes' batches unseen, one line per epoch on the "loaders"
logger, and the numbers through Lightning's loggers and transformers' logs."""

from __future__ import annotations

import csv
import logging
import time
from pathlib import Path

import pytest
import torch

from loaders import PackedDataset, RandomResizedCrop, make_loader
from tests.helpers.codecs import pack_photos
from tests.helpers.random_dataset import write_random_dataset

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:CUDA is not available:RuntimeWarning"),
]


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("raw")
    write_random_dataset(root, 60, (8, 8, 3), per_shard=20)
    return root


def test_waits_and_steps_are_what_the_loop_measured(raw: Path) -> None:
    """A loop whose step sleeps 30 ms: the loader's wait is the time the loop spent inside
    `next()` (timed by the loop itself), its steps at least the sleeps, every batch made here
    with its rows' reads counted, nothing as decode or crop."""
    loader = make_loader(PackedDataset.open(raw), batch_size=10, shuffle=True)
    batches, waited = iter(loader), 0.0
    while True:
        start = time.perf_counter()
        batch = next(batches, None)
        waited += time.perf_counter() - start
        if batch is None:
            break
        time.sleep(0.03)
    stats = loader.stats()
    assert stats["batches"] == stats["made_here"] == 6
    assert stats["step_s"] >= 6 * 0.03 - 0.03  # the last step is outside the pass
    assert 0 < stats["wait_s"] <= waited
    assert waited - stats["wait_s"] < 0.005 + 0.1 * waited  # only the generators' own time
    assert stats["waited"] == pytest.approx(
        stats["wait_s"] / (stats["wait_s"] + stats["step_s"]), abs=1e-3
    )
    assert stats["stages_s"]["read"] > 0 and stats["stages_s"]["decode"] == 0
    assert stats["stages_s"]["crop"] == 0 and stats["slowest_stage"] == "read"


def test_a_crop_is_counted_as_crop(tmp_path: Path) -> None:
    """JPEG samples cropped where batches are made: the crop stage holds most of the making,
    the read of their stored bytes the rest; an epoch later the figures are that epoch's."""
    root = pack_photos(tmp_path, "jpeg", count=12)
    ds = PackedDataset.open(root).with_crop(RandomResizedCrop(16, seed=1))
    loader = make_loader(ds, batch_size=4, shuffle=True)
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert len(list(loader)) == 3
        stats = loader.stats()
        assert stats["batches"] == stats["made_here"] == 3
        stages = stats["stages_s"]
        assert stages["crop"] > 0 and stages["read"] > 0 and stages["decode"] == 0
        assert sum(stages.values()) <= stats["make_s"] + 1e-6


def test_stored_jpeg_decoded_as_stored_is_counted_as_decode(tmp_path: Path) -> None:
    root = pack_photos(tmp_path, "jpeg", count=8)
    loader = make_loader(PackedDataset.open(root), batch_size=4)
    assert len(list(loader)) == 2
    stages = loader.stats()["stages_s"]
    assert stages["decode"] > 0 and stages["crop"] == 0


def test_worker_processes_leave_only_the_loop_side(raw: Path) -> None:
    loader = make_loader(PackedDataset.open(raw), batch_size=10, num_workers=2,
                         workers_as="processes", persistent_workers=False)  # fmt: skip
    assert len(list(loader)) == 6
    stats = loader.stats()
    assert stats["batches"] == 6 and stats["made_here"] == 0 and stats["make_s"] == 0
    from loaders.loader.stats import line

    assert "made in worker processes" in line(stats)


def test_one_line_per_epoch_on_the_loaders_logger(
    raw: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loader = make_loader(PackedDataset.open(raw), batch_size=10, log_stats=True)
    with caplog.at_level(logging.INFO, logger="loaders"):
        for epoch in range(2):
            loader.set_epoch(epoch)
            list(loader)
        for i, _batch in enumerate(loader):  # a pass left early logs nothing
            if i == 1:
                break
    lines = [r.getMessage() for r in caplog.records if r.name == "loaders"]
    assert len(lines) == 2, lines
    assert all(line.startswith("the loop waited ") and "over 6 batches" in line for line in lines)
    assert all("the slowest stage is read" in line for line in lines)


def test_lightning_logs_the_stats_each_epoch(raw: Path, tmp_path: Path) -> None:
    """`LoaderStats` in a real Lightning fit: its CSV logger has each epoch's row with the
    loader's batches (as many as the epoch had) and its share of time waited."""
    L = pytest.importorskip("lightning")
    from lightning.pytorch.loggers import CSVLogger

    from loaders.trainers.lightning import LoaderStats

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8 * 8 * 3, 3)

        def training_step(self, batch: object, _: int) -> torch.Tensor:
            images, labels = batch  # type: ignore[misc]
            logits = self.net(images.flatten(1).float() / 255)
            return torch.nn.functional.cross_entropy(logits, labels % 3)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    loader = make_loader(PackedDataset.open(raw), batch_size=10, shuffle=True)
    trainer = L.Trainer(
        max_epochs=2, logger=CSVLogger(tmp_path), callbacks=[LoaderStats()],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Tiny(), loader)
    metrics = next(tmp_path.rglob("metrics.csv"))
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("loader/batches")]
    assert [float(r["loader/batches"]) for r in rows] == [6.0, 6.0]
    assert all(0 <= float(r["loader/waited"]) <= 1 for r in rows)
    assert all(float(r["loader/read_s"]) > 0 for r in rows)


def test_transformers_trainer_logs_carry_the_stats(raw: Path, tmp_path: Path) -> None:
    """`PackedTrainer` trains a tiny ViT: every log in its history carries the loader's
    batches so far this epoch (the steps logged) and its share of time waited."""
    transformers = pytest.importorskip("transformers")
    from loaders.trainers.hf import PackedTrainer

    train = PackedDataset.open(raw)
    config = transformers.ViTConfig(
        image_size=(8, 8), patch_size=2, num_channels=3, hidden_size=8, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=16, num_labels=len(train.classes),
    )  # fmt: skip
    torch.manual_seed(0)
    args = transformers.TrainingArguments(
        str(tmp_path), num_train_epochs=1, per_device_train_batch_size=10, logging_steps=2,
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    model = transformers.ViTForImageClassification(config)
    trainer = PackedTrainer(model=model, args=args, train_dataset=train)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in logged] == [2, 4, 6]
    assert all(e["loader/batches"] in (e["step"], e["step"] + 1) for e in logged), logged
    assert all(0 <= e["loader/waited"] <= 1 and e["loader/read_s"] > 0 for e in logged)
