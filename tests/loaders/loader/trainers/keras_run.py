"""Fit a tiny Keras 3 model (torch backend) on a packed dataset with `model.fit(loader,
validation_data=loader)`, the loaders as make_loader returns them; record what each step saw.
Run by tests/loaders/loader/test_trainers.py.

    python keras_run.py DATA OUT [--epochs N] [--workers W] [--with-indices]

Writes OUT/seen.json: per stage ("train", "val") and epoch, the sha1 of every image a step
received (in order), so the test identifies samples by content, and each train step's loss.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ["KERAS_BACKEND"] = "torch"

import keras
from run_args import run_parser  # beside this script

from loaders import PackedDataset, make_loader


def digests(images: Any) -> list[str]:
    return [hashlib.sha1(image.contiguous().numpy().tobytes()).hexdigest() for image in images]


SEEN: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
"""Per stage and epoch, what the steps got (outside the model: Keras tracks its attributes)."""
LOSSES: list[float] = []
EPOCH = [0]


class Recorded(keras.Model):
    """A model that records each batch its train and test steps get, then steps as Keras does."""

    def train_step(self, data: Any) -> Any:
        SEEN["train"][EPOCH[0]].extend(digests(data[0]))
        logs = super().train_step(data)
        LOSSES.append(float(logs["loss"]))
        return logs

    def test_step(self, data: Any) -> Any:
        SEEN["val"][EPOCH[0]].extend(digests(data[0]))
        return super().test_step(data)


class Epochs(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        EPOCH[0] = epoch


def main() -> None:
    parser = run_parser()
    parser.add_argument("--with-indices", action="store_true")
    args = parser.parse_args()

    train = PackedDataset.open(args.data, split="train")
    val = PackedDataset.open(args.data, split="val")
    options = {"num_workers": args.workers, "with_indices": args.with_indices}
    train_loader = make_loader(train, batch_size=4, shuffle=True, seed=3, **options)
    val_loader = make_loader(val, batch_size=4, **options)

    inputs = keras.Input(shape=train.sample_shape, dtype="uint8")
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(len(train.classes))(x)
    model = Recorded(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(
        train_loader,
        validation_data=val_loader,
        epochs=args.epochs,
        callbacks=[Epochs()],
        verbose=0,
    )
    record = {"train": SEEN["train"], "val": SEEN["val"], "loss": LOSSES}
    (Path(args.out) / "seen.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
