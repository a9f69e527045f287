"""Lightning's side of the loader's stats (`loaders.loader.stats`): a callback that logs, at
the end of each training epoch, how long the loop waited for data and where the making of
batches spent its time, through whatever loggers the Trainer has.

    trainer = L.Trainer(callbacks=[LoaderStats()], ...)   # loader/waited, loader/wait_s, ...
"""

from __future__ import annotations

from typing import Any

import lightning as L

from loaders.loader.stats import log_values


class LoaderStats(L.Callback):
    """Log the train loader's `stats()` once per epoch (`pl_module.log_dict`, on every rank:
    each rank's own wait). Loaders without `stats` (not ours) are left alone."""

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loader: Any = trainer.train_dataloader
        stats = getattr(loader, "stats", None)
        if callable(stats):
            pl_module.log_dict(log_values(stats()), on_epoch=True, sync_dist=False)
