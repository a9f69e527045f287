"""Train a small CNN on a packed dataset with the public `loaders` API, on the CPU.

    etl sample-data data/sample && etl run pipeline.yaml     # -> artifacts/
    python examples/train.py --data artifacts --epochs 12
    torchrun --nproc_per_node=2 examples/train.py --data artifacts --epochs 12
    python examples/train.py --checkpoint run.pt --checkpoint-every 20   # kill it, run it again

Under torchrun (WORLD_SIZE set) the process group is initialised from the environment with
gloo; `make_loader` then gives each rank its own equal part of the training split (padded by
repetition, like DistributedSampler), and only rank 0 evaluates and prints.

With `--checkpoint`, rank 0 saves the model, optimiser, schedule and loader state every
`--checkpoint-every` steps and after each epoch; a run that finds the file resumes mid-epoch
with exactly the batches not yet trained on (also with another number of ranks).
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from loaders import (
    CenterCrop,
    DeviceLoader,
    PackedDataset,
    PackedLoader,
    RandomResizedCrop,
    make_loader,
)
from loaders.augment.crops import Augment

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
"""Rough per-channel statistics in [0, 1] units; exact values matter little for this task."""


def small_cnn(channels: int, classes: int) -> nn.Module:
    """Four stride-2 conv blocks and global average pooling: any input size >= 16 px."""

    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
        )

    return nn.Sequential(
        block(channels, 16),
        block(16, 32),
        block(32, 64),
        block(64, 64),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, classes),
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="artifacts", help="packed dataset directory")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument(
        "--batch-size", type=int, default=64, help="global: split evenly between ranks"
    )
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", help="file to save to, and to resume from if it exists")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="steps (0: epochs only)")
    parser.add_argument("--stop-after", type=int, default=0, help="stop after N steps (a test)")
    return parser.parse_args()


def on_device(loader: PackedLoader, augment: Augment) -> DeviceLoader:
    """Batches as augmented, normalised float32 NCHW tensors (on the GPU this is where they
    would move: the crops are computed there, a whole batch at a time)."""
    return DeviceLoader(
        loader, device="cpu", dtype=torch.float32, mean=MEAN, std=STD, augment=augment
    )


def evaluate(model: nn.Module, loader: DeviceLoader) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            correct += int((model(images).argmax(dim=1) == labels).sum())
            total += len(labels)
    model.train()
    return correct / max(total, 1)


def main() -> None:
    args = parse_args()
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")  # rank, world size and address from torchrun's env
    train_and_evaluate(args, distributed)
    if distributed:
        # NOTE: the DDP model, its gradient reducer and the loaders' workers go with
        # train_and_evaluate's frame, before the group: a gloo work object that outlived the
        # group aborted a rank at exit now and then ("terminate called without an active
        # exception", exit -6); so did a rank reaching destroy while rank 0 still evaluated.
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


def train_and_evaluate(args: argparse.Namespace, distributed: bool) -> None:
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1
    torch.manual_seed(args.seed)

    train = PackedDataset.open(args.data, split="train")
    val = PackedDataset.open(args.data, split="val")
    train_loader = make_loader(
        train,
        batch_size=max(1, args.batch_size // world_size),
        shuffle=True,
        seed=args.seed,
        drop_last=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        pin_memory=False,
        with_indices=True,  # each sample's crop is drawn from its index: resumable, rank-free
    )
    # Evaluation runs on rank 0 alone, over the whole split: explicit rank/world override.
    val_loader = make_loader(val, batch_size=256, rank=0, world_size=1, pin_memory=False)

    # The shorter side samples were stored at (the largest among them, where samples keep
    # their aspect ratio: the `shorter` of `resize: {mode: keep_aspect}`).
    stored = int(train.sample_sizes.min(axis=1).max(initial=16))
    crop = max(16, round(stored * 7 / 8))  # 224 of 256, ImageNet's ratio
    train_augment = RandomResizedCrop(crop, scale=(0.35, 1.0), seed=args.seed)
    eval_augment = CenterCrop(crop, resize=stored)
    channels = train.sample_shape[-1] if train.layout == "HWC" else train.sample_shape[0]
    net = small_cnn(channels, len(train.classes))
    model = nn.parallel.DistributedDataParallel(net) if distributed else net
    steps = args.epochs * len(train_loader)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, args.lr * 10, total_steps=steps)
    loss_fn = nn.CrossEntropyLoss()

    start_epoch = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint, weights_only=True)  # plain tensors and ints: no pickle
        net.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        train_loader.load_state_dict(saved["loader"])  # refuses another dataset, order or seed
        start_epoch = saved["loader"]["epoch"]
        if rank == 0:
            position = saved["loader"]["position"]
            print(f"resumed epoch {start_epoch + 1} after {position} samples", flush=True)

    def save(state: dict[str, object]) -> None:
        if args.checkpoint and rank == 0:
            torch.save(state, args.checkpoint + ".tmp")
            os.replace(args.checkpoint + ".tmp", args.checkpoint)

    started = time.perf_counter()
    steps_run = 0
    accuracy = 0.0
    for epoch in range(start_epoch, args.epochs):
        train_loader.set_epoch(epoch)  # after load_state_dict: keeps the resume point
        seen, loss_sum = 0, 0.0
        batches = on_device(train_loader, train_augment)
        for images, labels, _ in batches:  # with_indices: (images, labels, indices)
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            seen += len(labels)
            loss_sum += loss.item() * len(labels)
            steps_run += 1
            if args.checkpoint_every and steps_run % args.checkpoint_every == 0:
                save(checkpoint(net, optimizer, schedule, batches.state_dict()))
            if steps_run == args.stop_after:
                break
        if steps_run == args.stop_after:
            print(f"stopped after {steps_run} steps", flush=True)
            break
        save(checkpoint(net, optimizer, schedule, batches.state_dict()))
        if rank == 0:
            accuracy = evaluate(
                net, on_device(val_loader, eval_augment)
            )  # the module itself: no DDP sync
            print(
                f"epoch {epoch + 1}/{args.epochs}  train loss {loss_sum / max(seen, 1):.3f}  "
                f"val accuracy {accuracy:.3f}  ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    if rank == 0 and steps_run != args.stop_after:
        print(f"final validation accuracy: {accuracy:.3f} on {len(val)} samples", flush=True)


def checkpoint(
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    loader_state: dict[str, object],
) -> dict[str, object]:
    """What a resumed run needs; the loader's state says which batches were trained on."""
    return {
        "model": net.state_dict(),
        "optimizer": optimizer.state_dict(),
        "schedule": schedule.state_dict(),
        "loader": loader_state,
    }


if __name__ == "__main__":
    main()
