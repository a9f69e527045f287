"""The batch sampler of a run: the batches of an order sampler, and the run's state (the epoch,
how far the pass got, the run's history), where every loader rebuilt from it still finds them.

NOTE [ the run lives in the sampler ]: trainers rebuild a DataLoader from its parts
(`DataLoader(loader.dataset, batch_sampler=loader.batch_sampler, ...)`: accelerate's
`skip_first_batches`, which transformers' Trainer calls on resume, Ray Train's
`prepare_data_loader`), wrap its batch sampler once more (accelerate's `SkipBatchSampler`), or
iterate the loader without ever telling it the epoch (Keras). So the epoch (in the order
sampler), how far the pass in progress got, and the run's history live in this object, which
all of them keep; `PackedLoader` asks it for its state. `set_epoch` on the loader, on its
`sampler` or on this means one thing: the order sampler's epoch.

A pass is one iteration of this sampler. It counts the batches it hands out (drawn). A loader
that knows how many of them reached the training loop says so (`delivered`): `PackedLoader` at
every batch it yields, less those a wrapper such as `DeviceLoader` holds (`hold_back`), and a
trainer's integration at every step. A pass nobody reports on counts what it drew: exact where
batches are drawn only as the loop asks for them (a DataLoader with no workers, which gathers
each in this process as it draws it), not where a DataLoader's workers draw `prefetch_factor`
batches each ahead of the loop. So the dataset's memory counts the batches gathered in this
process (`BatchMemory.gathered`), and a state is refused, in one line, for a pass whose
batches were all gathered elsewhere, and where batches were gathered that no pass drew (a
DataLoader that reads the dataset through a sampler of its own): never a wrong position.

NOTE [ epochs advance by themselves ]: a pass whose batches all reached the loop makes the next
pass read the next epoch, unless an epoch was chosen since it began (`set_epoch`, a loaded
state), as StreamingDataset does: Keras' `fit` never calls `set_epoch`, and a plain loop that
forgets it still sees a new order each epoch. A pass left before its end (Lightning's sanity
check, `limit_train_batches`, a `break`) does not advance; an explicit `set_epoch` always wins.

NOTE [ skipping trainers ]: transformers' Trainer resumes a checkpoint in epoch e after k
batches by skipping the first k batches of a fresh pass of epoch e (accelerate's
`SkipBatchSampler` over this: index lists drawn and dropped, no sample read). A state loaded
with `for_skipping` therefore restarts epoch e at its start with the step count of that start:
the k batches skipped are counted again as the steps they were, and the run's history stays
exact.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch.utils.data import BatchSampler

from loaders.memory.batch_memory import BatchMemory
from loaders.order.history import RunHistory
from loaders.order.orders import Order
from loaders.order.resume import State
from loaders.order.samplers import MixtureSampler, OrderSampler


@dataclass
class Pass:
    """One iteration of a `RunBatchSampler`: where it began and how far it got."""

    epoch: int
    start: int
    """Where the epoch's segment starts in the global order (see `loaders.order.resume`)."""
    skip: int
    """Samples of this rank's part that a loaded state skipped."""
    indices: Order = field(repr=False)
    """The samples it yields, in order."""
    calls: int
    """The order sampler's `epoch_calls` when it began."""
    batches: int
    """Batches it yields in all."""
    drawn: int = 0
    reported: int | None = None
    """Batches that reached the loop, where a loader said so (None: count those drawn)."""
    held: int = 0
    """Of those, batches a wrapper holds and has not handed to its user."""
    started: bool = False
    gathered: int = 0
    """The memory's count of batches gathered in this process when the pass began."""

    def delivered(self) -> int:
        got = self.drawn if self.reported is None else self.reported
        return max(got - self.held, 0)

    def complete(self) -> bool:
        return self.delivered() >= self.batches


class RunBatchSampler(BatchSampler):
    """Batches of `batch_size` from an `OrderSampler` (the last one short unless `drop_last`),
    carrying the run's state (NOTE [ the run lives in the sampler ]). A torch `BatchSampler`
    in what it promises (`sampler`, `batch_size`, `drop_last`, `len`)."""

    def __init__(
        self,
        order: OrderSampler,
        batch_size: int,
        drop_last: bool = False,
        memory: BatchMemory | None = None,
    ) -> None:
        super().__init__(order, batch_size, drop_last)
        self.order = order
        self.memory = memory
        """The memory of the dataset the batches are gathered from, which counts those gathered
        in this process (None: not known, nothing checked)."""
        self.history = RunHistory()
        """The steps of earlier passes and the segment each began at (`loaders.order.history`)."""
        self.current: Pass | None = None
        """The pass in progress, or the last one."""
        self.to_skip = 0
        """Batches a state loaded `for_skipping` expects the trainer to skip."""

    @property
    def epoch(self) -> int:
        return self.order.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the order of `epoch`: the order sampler's `set_epoch`."""
        self.order.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        run = self.begin()
        run.started = True
        order, size = run.indices.tolist(), self.batch_size
        for at in range(0, run.batches * size, size):
            run.drawn += 1
            yield order[at : at + size]

    def begin(self) -> Pass:
        """The pass the next iteration makes: begun now, unless one begun waits to be drawn.
        Counts the last pass into the run's steps, and advances the epoch after a whole pass
        (NOTE [ epochs advance by themselves ])."""
        if self.current is not None and not self.current.started:
            return self.current
        last, order = self.current, self.order
        if last is not None:
            self.history.ended(last.delivered())
            if last.complete() and last.calls == order.epoch_calls and last.epoch == order.epoch:
                order.advance()
        pending = order.state_dict()
        start, skip = int(pending["start"]), int(pending["position"])
        indices = order.remaining()
        n, size = len(indices), self.batch_size
        batches = n // size if self.drop_last else -(-n // size)
        run = Pass(order.epoch, start, skip, indices, order.epoch_calls, batches)
        run.gathered = self._gathered()
        self.current = run
        self.history.began(run.epoch, start, skip, order, size)  # NOTE [ a run's history ]
        return run

    def delivered(self, batches: int) -> None:
        """Say that `batches` of the pass in progress reached the training loop."""
        if self.current is not None:
            self.current.reported = int(batches)

    def hold_back(self, batches: int) -> None:
        """Say that `batches` of those delivered are held by a wrapper (such as `DeviceLoader`)
        and have not reached the training loop: the state leaves them out."""
        if self.current is not None:
            self.current.held = int(batches)

    def progress(self, loader: Any) -> State:
        """The order's state, with where this epoch stands (the batches that reached the loop)
        and the run's steps and history (`loader` is what the run's record describes)."""
        run = self.current
        self._check_counted(run)
        state = self.order.state_dict()
        delivered = 0 if run is None else run.delivered()
        state.update(self.history.fields(delivered, loader))
        if run is not None and run.epoch == self.order.epoch:
            done = min(delivered * self.batch_size, len(run.indices))
            state.update(start=run.start, position=run.skip + done)
        if isinstance(self.order, MixtureSampler):
            state.update(self.order.progress(state))
        return state

    def _gathered(self) -> int:
        return 0 if self.memory is None else self.memory.gathered

    def _check_counted(self, run: Pass | None) -> None:
        """Refuse a state this sampler cannot count right (see the module docstring)."""
        if self.memory is None:
            return
        since = self._gathered() - (0 if run is None else run.gathered)
        drawn = 0 if run is None or not run.started else run.drawn
        if since > drawn:
            raise ValueError(
                f"{since} batches were gathered from this loader's dataset that its batch "
                f"sampler did not draw ({drawn}): a DataLoader reads it through a sampler of its "
                "own, so this loader's state would not say what the run read; give that "
                "DataLoader this loader's batch_sampler"
            )
        if run is not None and run.reported is None and drawn and not since:
            raise ValueError(
                f"the {drawn} batches drawn so far this epoch were gathered by DataLoader workers "
                "of a loader rebuilt from this one's parts, which draw ahead of the training "
                "loop: how many reached it is not known here; iterate this loader, build the "
                "rebuilt one with num_workers=0, or report them (batch_sampler.delivered(n))"
            )

    def load_state_dict(self, state: Mapping[str, Any], for_skipping: bool = False) -> None:
        """Resume `state`'s epoch where it stopped (the order sampler checks the state), and
        carry its steps and history on; `for_skipping`: from the epoch's start, for a trainer
        that skips the batches already read itself (NOTE [ skipping trainers ])."""
        self.order.load_state_dict(state)
        self.history.load(state)
        order = self.order
        pending = order.state_dict()
        start, position = int(pending["start"]), int(pending["position"])
        left = order.left()
        self.current, self.to_skip = None, 0
        if for_skipping and left and (start or position):
            if start or int(state["world_size"]) != order.world_size:
                raise ValueError(
                    "a trainer that skips batches to resume counts them on the world size the "
                    "state was saved with, from the epoch's start: resume with "
                    f"{state['world_size']} rank(s), or load the state without skipping"
                )
            self.to_skip = -(-position // self.batch_size)
            self.history.before -= self.to_skip
            order.resume(order.epoch, 0)
        elif not left:
            # The saved epoch is whole: the next pass goes on to the next one unless told.
            self.current = Pass(
                order.epoch, start, position, np.empty(0, np.int64), order.epoch_calls, 0,
                started=True,
            )  # fmt: skip
