"""Train a tiny model with PyTorch Ignite on a packed dataset, the loader given to
`Engine.run` as make_loader returns it and saved in Ignite's own checkpoints; record what each
iteration got. Run by tests/loaders/loader/test_trainers.py.

    python ignite_run.py DATA OUT [--epochs N] [--workers W] [--save-every S]
        [--kill-after-iteration K] [--resume CHECKPOINT]

Appends to OUT/seen.jsonl one line per iteration: the sha1 of each image it trained on,
flushed at once. Checkpoints (model, optimizer, engine, loader) go to OUT/checkpoints every S
iterations; with --kill-after-iteration the process kills itself (SIGKILL) right after that
iteration, before anything else runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
from pathlib import Path
from typing import Any

import torch
from ignite.engine import Engine, Events
from ignite.handlers import Checkpoint, DiskSaver
from run_args import run_parser  # beside this script
from torch import nn

from loaders import PackedDataset, make_loader


def main() -> None:
    parser = run_parser()
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--kill-after-iteration", type=int, default=0)
    parser.add_argument("--resume")
    a = parser.parse_args()
    record = Path(a.out) / "seen.jsonl"

    train = PackedDataset.open(a.data, split="train")
    loader = make_loader(
        train, batch_size=4, shuffle=True, seed=3, num_workers=a.workers, workers_as="processes"
    )
    torch.manual_seed(0)
    model = nn.Linear(math.prod(train.sample_shape), len(train.classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(engine: Engine, batch: Any) -> float:
        images, labels = batch
        digests = [hashlib.sha1(i.contiguous().numpy().tobytes()).hexdigest() for i in images]
        with record.open("a") as out:
            out.write(json.dumps(digests) + "\n")
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(images.flatten(1).float() / 255), labels)
        loss.backward()
        optimizer.step()
        if engine.state.iteration == a.kill_after_iteration:
            os.kill(os.getpid(), signal.SIGKILL)
        return loss.item()

    trainer = Engine(step)
    to_save = {"model": model, "optimizer": optimizer, "trainer": trainer, "loader": loader}
    saver = DiskSaver(Path(a.out) / "checkpoints", require_empty=False)
    checkpoint = Checkpoint(to_save, saver, n_saved=None)
    trainer.add_event_handler(Events.ITERATION_COMPLETED(every=a.save_every), checkpoint)
    if a.resume:
        Checkpoint.load_objects(to_save, torch.load(a.resume, weights_only=True))
    trainer.run(loader, max_epochs=a.epochs)


if __name__ == "__main__":
    main()
