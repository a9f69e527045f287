"""Fit, validate and test a tiny LightningModule on a packed dataset, the loaders returned as they
are from all three hooks; record what each rank saw. Run by tests/loaders/loader/test_trainers.py,
alone or under torchrun (then with strategy="ddp" on every process torchrun started).

    python lightning_run.py DATA OUT [--epochs N] [--workers W] [--kill-after-step K]
        [--resume CKPT]

Writes OUT/seen-<rank>.json: per stage and epoch, the sha1 of every image the step received
(in order), so the test identifies samples by content, not by the loaders' own bookkeeping.
With --kill-after-step, Lightning saves a checkpoint every --save-every steps and the process
kills itself right after step K, as a preempted node dies; --resume continues from CKPT.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from loaders import PackedDataset, make_loader


def digests(images: torch.Tensor) -> list[str]:
    return [hashlib.sha1(image.contiguous().numpy().tobytes()).hexdigest() for image in images]


class Tiny(L.LightningModule):
    def __init__(self, data: str, sample_numel: int, classes: int, args: argparse.Namespace):
        super().__init__()
        self.data, self.args = data, args
        self.net = nn.Linear(sample_numel, classes)
        self.seen: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))

    def _record(self, stage: str, batch: Any) -> torch.Tensor:
        images, labels = batch
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        self.seen[stage][self.current_epoch].extend(digests(images))
        logits = self.net(images.flatten(1).float() / 255)
        return nn.functional.cross_entropy(logits, labels)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self._record("train", batch)
        if self.global_step + 1 == self.args.kill_after_step:
            self._dump()
            os.kill(os.getpid(), signal.SIGKILL)  # a node that dies: no cleanup of any kind
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if not self.trainer.sanity_checking:
            self._record("val", batch)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._record("test", batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def _loader(self, split: str, shuffle: bool) -> Any:
        dataset = PackedDataset.open(self.data, split=split)
        workers = self.args.workers
        return make_loader(
            dataset,
            batch_size=4,
            shuffle=shuffle,
            seed=3,
            num_workers=workers,
            workers_as="processes",
            persistent_workers=workers > 0,
        )

    def train_dataloader(self) -> Any:
        return self._loader("train", True)

    def val_dataloader(self) -> Any:
        return self._loader("val", False)

    def test_dataloader(self) -> Any:
        return self._loader("test", False)

    def _dump(self) -> None:
        out = Path(self.args.out) / f"seen-{self.global_rank}.json"
        out.write_text(json.dumps(self.seen))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--kill-after-step", type=int, default=0)
    parser.add_argument("--save-every", type=int, default=0)
    parser.add_argument("--resume")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers per loader")
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    sample = PackedDataset.open(args.data)
    model = Tiny(args.data, math.prod(sample.sample_shape), len(sample.classes), args)
    callbacks = []
    if args.save_every:
        callbacks.append(
            ModelCheckpoint(dirpath=args.out, every_n_train_steps=args.save_every, save_top_k=-1)
        )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=bool(callbacks),
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, ckpt_path=args.resume)
    if not args.resume:
        trainer.validate(model)
        trainer.test(model)
    model._dump()
    if torch.distributed.is_initialized():
        # NOTE: a gloo group left for the interpreter's exit to tear down aborted a rank now
        # and then (SIGABRT, "terminate called without an active exception"), as in
        # examples/train.py: leave it in step, explicitly.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
