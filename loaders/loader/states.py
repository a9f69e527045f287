"""A loader's state: what it belongs to (its identity: the dataset version, the selection, the
order, the batch size) and where its run stands. A map-style loader's progress is its batch
sampler's (NOTE [ the run lives in the sampler ] in `loaders.order.run_batches`), a stream's is
the stream's and the loader's count of the batches it delivered (`StreamPosition`).

The functions take the `PackedLoader` (typed `Any`: this module is below it) and read only what
every PackedLoader has: `dataset`, `run`, `order`, `stream`, `_position`, `_batch_size()`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loaders.datasets.mixture import Mixture
from loaders.datasets.stream import PackedStream
from loaders.order.resume import State, check_global_batch, check_state


@dataclass
class StreamPosition:
    """How far a stream's iteration in progress (or the last one) got: what its state is made
    of."""

    epoch: int
    """The epoch the iteration reads; a position of another epoch than the current is stale."""
    skip: int
    """Batches of this rank a loaded state skipped."""
    batches: int = 0
    """Batches handed out by this iteration."""
    held: int = 0
    """Of those, batches a wrapper (`DeviceLoader`) holds and has not handed to its user."""
    calls: int = 0
    """The stream's `epoch_calls` when the iteration began."""

    def whole(self, length: int) -> bool:
        """Whether every batch of the epoch (`length` a rank) reached the loop."""
        return self.skip + self.batches - self.held >= length


def state_of(loader: Any) -> State:
    """`PackedLoader.state_dict`: the identity and the progress."""
    identity = identity_of(loader)
    run = loader.run
    if run is not None:
        return {**identity, **run.progress(loader)}
    stream, position = loader.stream, loader._position
    assert stream is not None, "identity_of refuses loaders that cannot resume"
    if position is not None and position.epoch == stream.epoch:
        batches = position.skip + position.batches - position.held
    else:
        batches = stream.pending_batches() or 0
    return {**identity, "epoch": stream.epoch, "batches": batches, "rank": stream.rank}


def load_state(loader: Any, state: Mapping[str, Any], for_skipping: bool = False) -> None:
    """`PackedLoader.load_state_dict`: check the identity, then resume the progress."""
    identity = identity_of(loader)
    if isinstance(state, Mapping) and "view" in state and "view" not in identity:
        identity["view"] = ""  # a state saved on a view is not one of no view
    run = loader.run
    if run is not None:
        size = identity.pop("batch_size")
        check_state(state, identity, ("batch_size", "world_size"))
        check_global_batch(state, int(size), run.order.world_size)
        run.load_state_dict(state, for_skipping)
        loader.to_skip = run.to_skip
        return
    stream = loader.stream
    assert stream is not None, "identity_of refuses loaders that cannot resume"
    check_state(state, identity, ("epoch", "batches", "rank"))
    batches = state["batches"]
    if for_skipping and batches < len(stream):  # NOTE [ skipping trainers ] (read to skip)
        stream.resume(state["epoch"], 0)
        loader.to_skip = batches
        return
    stream.resume(state["epoch"], batches)


def identity_of(loader: Any) -> dict[str, int | str]:
    """The fields a state must match to be loaded into `loader`; TypeError for a loader that
    cannot resume (a torch sampler of your own keeps no position)."""
    dataset, order, stream = loader.dataset, loader.order, loader.stream
    if isinstance(dataset, Mixture) and order is not None:
        return {"batch_size": loader._batch_size()}  # the members: MixtureSampler's state
    selection = getattr(dataset, "selection", None)
    if selection is None or (order is None and stream is None):
        raise TypeError(
            "resuming needs one of the loaders samplers (shuffle=, or an OrderSampler "
            "passed as sampler=) or a PackedStream; torch samplers keep no position"
        )
    identity: dict[str, int | str] = {
        "dataset_version": selection.version,
        "selection": selection.fingerprint,
    }
    if selection.view:  # only then: a state saved before views existed still loads
        identity["view"] = selection.view
    if stream is not None:
        return {**identity, **stream.identity()}
    return {**identity, "batch_size": loader._batch_size()}


def begin_stream(stream: PackedStream | None, last: StreamPosition | None) -> StreamPosition | None:
    """Where a stream's iteration begins (None: not a stream): the next epoch after a whole
    one with no `set_epoch` since (NOTE [ epochs advance by themselves ] in
    `loaders.order.run_batches`), `last` being the last iteration's position."""
    if stream is None:
        return None
    if (
        last is not None and last.calls == stream.epoch_calls
        and last.epoch == stream.epoch and last.whole(len(stream))
    ):  # fmt: skip
        stream.advance()
    skip = stream.pending_batches() or 0
    return StreamPosition(stream.epoch, skip, calls=stream.epoch_calls)
