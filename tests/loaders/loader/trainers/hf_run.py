"""Train a tiny ViT (built from its config, no weights downloaded) with transformers'
`Trainer` through `loaders.trainers.hf.PackedTrainer`, set up as docs/training.md shows; record
what each forward pass got. Run by tests/loaders/loader/test_trainers.py.

    python hf_run.py DATA OUT [--epochs N] [--workers W] [--accum A] [--save-steps S]
        [--kill-after-step K] [--resume CKPT]

Appends to OUT/seen.jsonl one line per forward pass: {"train": bool, "images": the sha1 of
each image as stored (the model's floats turned back into the stored uint8 HWC bytes)},
flushed at once, so a run killed mid-epoch leaves what it trained on. With
--kill-after-step the process kills itself (SIGKILL) right after that optimizer step.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import torch
from run_args import run_parser  # beside this script
from transformers import TrainerCallback, TrainingArguments, ViTConfig, ViTForImageClassification

from loaders import PackedDataset
from loaders.trainers.hf import PackedTrainer

MEAN, STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


class RecordedViTForImageClassification(ViTForImageClassification):
    """ViT, recording each batch it is called with (what the Trainer trained or evaluated on)."""

    record: Path

    def forward(self, pixel_values: torch.Tensor, labels: Any = None, **kwargs: Any) -> Any:
        mean = torch.tensor(MEAN).view(1, -1, 1, 1)
        std = torch.tensor(STD).view(1, -1, 1, 1)
        stored = ((pixel_values.detach().cpu() * std + mean) * 255).round().to(torch.uint8)
        hwc = stored.permute(0, 2, 3, 1).contiguous()
        images = [hashlib.sha1(image.numpy().tobytes()).hexdigest() for image in hwc]
        line = {"train": self.training, "images": images}
        with self.record.open("a") as out:
            out.write(json.dumps(line) + "\n")
        return super().forward(pixel_values=pixel_values, labels=labels, **kwargs)


class KillAfter(TrainerCallback):  # type: ignore[misc]
    """Dies as a preempted node does, right after optimizer step `step`, before anything the
    Trainer does after a step (a checkpoint due at that step is not written)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.step and state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = run_parser()
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--save-steps", type=int, default=2)
    parser.add_argument("--kill-after-step", type=int, default=0)
    parser.add_argument("--resume")
    a = parser.parse_args()
    RecordedViTForImageClassification.record = Path(a.out) / "seen.jsonl"

    train = PackedDataset.open(a.data, split="train")
    val = PackedDataset.open(a.data, split="val")
    height, width, channels = train.sample_shape
    config = ViTConfig(
        image_size=(height, width), patch_size=1, num_channels=channels, hidden_size=16,
        num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        num_labels=len(train.classes),
    )  # fmt: skip
    torch.manual_seed(0)
    model = RecordedViTForImageClassification(config)

    # As docs/training.md, "transformers' Trainer":
    args = TrainingArguments(
        a.out,
        num_train_epochs=a.epochs,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=a.accum,
        eval_strategy="epoch",
        save_steps=a.save_steps,
        dataloader_num_workers=a.workers,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = PackedTrainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=val,
        image_mean=MEAN,
        image_std=STD,
        callbacks=[KillAfter(a.kill_after_step)],
    )
    trainer.train(resume_from_checkpoint=a.resume)


if __name__ == "__main__":
    main()
