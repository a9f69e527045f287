"""Train a tiny model with Hugging Face accelerate on a packed dataset, the loader passed to
`Accelerator.prepare` as it is; record what each rank saw. Run by
tests/loaders/loader/test_trainers.py under `torchrun --nproc_per_node 2`.

    accelerate_run.py DATA OUT full             # one whole epoch
    accelerate_run.py DATA OUT save --steps K   # K steps, then accelerator.save_state(OUT/state)
    accelerate_run.py DATA OUT resume           # accelerator.load_state(OUT/state), the rest

Writes OUT/<phase>-<rank>.json: the sha1 of every image a step received, in order.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn

from loaders import PackedDataset, make_loader

EPOCH = 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("phase", choices=["full", "save", "resume"])
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)

    accelerator = Accelerator(cpu=True)
    dataset = PackedDataset.open(args.data, split="train")
    loader = make_loader(
        dataset,
        batch_size=4,
        shuffle=True,
        seed=3,
        num_workers=args.workers,
        workers_as="processes",
    )
    model = nn.Linear(math.prod(dataset.sample_shape), len(dataset.classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    assert prepared is loader, "accelerate must keep the loader: it is split between ranks"
    if args.phase == "resume":
        accelerator.load_state(str(out / "state"))
    prepared.set_epoch(EPOCH)

    seen: list[str] = []
    for step, (images, labels) in enumerate(prepared):
        seen += [hashlib.sha1(i.contiguous().numpy().tobytes()).hexdigest() for i in images]
        loss = nn.functional.cross_entropy(model(images.flatten(1).float() / 255), labels)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if args.phase == "save" and step + 1 == args.steps:
            accelerator.save_state(str(out / "state"))
            break
    (out / f"{args.phase}-{accelerator.process_index}.json").write_text(json.dumps(seen))
    accelerator.wait_for_everyone()
    # NOTE: the DDP-wrapped model holds the gloo process group; left to the interpreter's
    # teardown, its C++ threads can die with "terminate called without an active exception"
    # (SIGABRT, seen once in CI). Free it while the interpreter is whole, then destroy.
    del model, optimizer
    accelerator.free_memory()
    accelerator.end_training()


if __name__ == "__main__":
    main()
