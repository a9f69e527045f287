"""transformers' `Trainer` over packed datasets, exact through its own checkpoints.

NOTE [ transformers' Trainer ]: plain `Trainer` cannot read a `PackedDataset` as it is: it calls
`model(**batch)` and asks `batch.get(...)` (a batch must be a dict of what the model takes,
floats in the model's layout), and its checkpoints hold no loader state, so a resumed run's
loader knows neither the steps before it nor, with workers, how many batches the Trainer took.
`PackedTrainer` is a `Trainer` that
- builds its loaders with `make_loader` from its arguments (`per_device_*_batch_size`, `seed`,
  `dataloader_num_workers`, `_drop_last`, `_pin_memory`, `_persistent_workers`,
  `_prefetch_factor`), each batch `ModelInputs` (`pixel_values` uint8, `labels`);
- makes `pixel_values` the model's floats on the device, after the copy (a quarter of the
  bytes cross): x / 255, then (x - image_mean) / image_std per channel when given (your image
  processor's `image_mean` and `image_std`);
- keeps the loader's state in every checkpoint (`LoaderCheckpoints`, in trainer_state.json:
  `etl trace CHECKPOINT_FOLDER` reads it) and, on `train(resume_from_checkpoint=...)`, loads it
  for the Trainer's own skip of the batches already trained on (NOTE [ skipping trainers ] in
  `loaders.order.run_batches`): the resumed run trains on exactly what an uninterrupted one
  would, and its states name every step since the run began;
- adds the train loader's stats to every log (`LoaderStatsLogger`: `loader/waited`, the share
  of the loop's time spent waiting for data this epoch, `loader/wait_s`, the stages' seconds).

Exact resume needs the loader's order, so the train loader is `shuffle=True` (a pure function
of `seed` and the epoch) and `train_sampling="random"`; evaluation reads in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import ExportableState

from loaders.loader.factories import make_loader
from loaders.loader.packed import PackedLoader
from loaders.loader.stats import log_values


class LoaderStatsLogger(TrainerCallback):
    """Adds the train loader's `stats()` (`loaders.loader.stats`: how long the loop waited for
    data this epoch, where making the batches spent its time) to every log the Trainer makes,
    so its integrations (TensorBoard, W&B, trainer_state.json) carry them. `PackedTrainer`
    puts it first among its callbacks, before the integrations read the log."""

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        stats = getattr(kw.get("train_dataloader"), "stats", None)
        if logs is None or not callable(stats):
            return
        values = log_values(stats())
        logs.update(values)
        if state.log_history and state.log_history[-1] is not logs:
            state.log_history[-1].update(values)  # the Trainer kept a copy of this log


class LoaderCheckpoints(TrainerCallback, ExportableState):
    """The train loader's state in each checkpoint the Trainer saves, loaded again when it
    resumes from one (NOTE [ transformers' Trainer ]). `PackedTrainer` adds it."""

    def __init__(self) -> None:
        self.loader: PackedLoader | None = None
        self.taken = 0
        """Batches of the epoch in progress the Trainer has trained on."""
        self.skipped = 0
        """Batches the Trainer skips at the start of the epoch it resumes."""

    def state(self) -> dict[str, Any]:
        loader = self.loader
        if loader is None:
            return {"args": {}, "attributes": {}}
        run = loader.run
        if run is not None and run.current is not None and run.current.started:
            run.delivered(self.taken)  # what the Trainer took, whichever loader delivered it
        return {"args": {}, "attributes": {"loader_state": loader.state_dict()}}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loader = kwargs.get("train_dataloader")
        self.loader = loader if isinstance(loader, PackedLoader) else None
        saved = (state.stateful_callbacks or {}).get(type(self).__name__) or {}
        if isinstance(saved, list):
            saved = saved[-1] if saved else {}
        loader_state = saved.get("attributes", {}).get("loader_state")
        if self.loader is not None and loader_state:
            self.loader.load_state_dict(loader_state, for_skipping=True)
            self.skipped = self.loader.to_skip

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.taken, self.skipped = self.skipped, 0

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.taken += 1

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.taken += 1


class PackedTrainer(Trainer):
    """A `Trainer` whose datasets are `PackedDataset`s (NOTE [ transformers' Trainer ]).

    `image_mean` and `image_std` (per channel, on the 0-1 scale: an image processor's) make
    `pixel_values` (x / 255 - mean) / std; without them, x / 255.
    """

    def __init__(
        self,
        *args: Any,
        image_mean: Sequence[float] | None = None,
        image_std: Sequence[float] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.image_mean, self.image_std = image_mean, image_std
        self.add_callback(LoaderCheckpoints())
        self.callback_handler.callbacks.insert(0, LoaderStatsLogger())  # before integrations

    def get_train_dataloader(self) -> PackedLoader:
        if self.train_dataset is None:
            raise ValueError("PackedTrainer needs a train_dataset (a PackedDataset)")
        return self._loader(self.train_dataset, self._train_batch_size, True)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> PackedLoader:
        dataset: Any = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(dataset, str) and isinstance(self.eval_dataset, dict):
            dataset = self.eval_dataset[dataset]  # a name of a dict of eval datasets
        if dataset is None:
            raise ValueError("PackedTrainer evaluates an eval_dataset (a PackedDataset)")
        return self._loader(dataset, self.args.eval_batch_size, False)

    def get_test_dataloader(self, test_dataset: Any) -> PackedLoader:
        return self._loader(test_dataset, self.args.eval_batch_size, False)

    def _loader(self, dataset: Any, batch_size: int, train: bool) -> PackedLoader:
        args = self.args
        workers = args.dataloader_num_workers
        return make_loader(
            dataset,
            batch_size=batch_size,
            shuffle=train,
            seed=args.data_seed if args.data_seed is not None else args.seed,
            drop_last=args.dataloader_drop_last if train else False,
            num_workers=workers,
            pin_memory=None if args.dataloader_pin_memory else False,
            persistent_workers=bool(args.dataloader_persistent_workers and workers),
            prefetch_factor=args.dataloader_prefetch_factor if workers else None,
            as_inputs=True,
        )

    def _prepare_inputs(self, inputs: Any) -> Any:
        """The Trainer's copy to the device, then `pixel_values` as the model's floats."""
        inputs = super()._prepare_inputs(inputs)
        pixels = inputs.get("pixel_values") if isinstance(inputs, dict) else None
        if isinstance(pixels, torch.Tensor) and pixels.dtype == torch.uint8:
            inputs["pixel_values"] = self._model_floats(pixels)
        return inputs

    def _model_floats(self, pixels: torch.Tensor) -> torch.Tensor:
        dtype = getattr(self.model, "dtype", torch.float32)
        if not dtype.is_floating_point:
            dtype = torch.float32
        x = pixels.to(dtype).div_(255)
        mean, std = self._normalisation(dtype, x.device)
        if mean is not None:
            x.sub_(mean)
        if std is not None:
            x.div_(std)
        return x.contiguous()

    def _normalisation(
        self, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """image_mean and image_std as [1, C, 1, 1] tensors on the device, made once (not a
        host-to-device copy each batch)."""
        key = (dtype, device)
        cache: dict[Any, Any] = self.__dict__.setdefault("_normalised", {})
        if key not in cache:
            cache[key] = tuple(
                None if v is None else torch.tensor(v, dtype=dtype, device=device).view(1, -1, 1, 1)
                for v in (self.image_mean, self.image_std)
            )
        return cache[key]
