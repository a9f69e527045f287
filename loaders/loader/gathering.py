"""How a loader's batches are made: the collate (ours, which hands on the batch as gathered;
`ModelInputs` of it; or yours, given the samples), the memory the batches are gathered into,
chosen for where they go next (`loaders.memory.batch_memory`), and the form a wrapper asks of
batches of samples of several sizes (`loaders.batch.forms`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from loaders.batch.forms import EncodedBatch, SizedBatch
from loaders.datasets.packed import CollateInputs, collate_batch, passes_batches
from loaders.datasets.stream import PackedStream
from loaders.memory.batch_memory import BatchMemory, batch_memory
from loaders.memory.ring import SharedRing


def collate_of(
    dataset: Any, collate_fn: Callable[[Any], Any] | None, as_inputs: bool, with_indices: bool
) -> Callable[[Any], Any]:
    """The loader's collate: ours (the batch as gathered; `ModelInputs` of it `as_inputs`), or
    the one given."""
    if not as_inputs:
        return collate_batch if collate_fn is None else collate_fn
    if collate_fn is not None or with_indices:
        raise ValueError(
            "as_inputs=True makes each batch a model's inputs (pixel_values, labels): pass no "
            "collate_fn and no with_indices beside it"
        )
    return CollateInputs(getattr(dataset, "layout", "CHW"))


def memory_of(
    collate: Callable[[Any], Any],
    pin: bool,
    batch_size: int | None,
    sample_shape: tuple[int, ...],
    common: dict[str, Any],
) -> BatchMemory:
    """Where a map-style loader's batches are gathered: for our collate, pinned or in a ring
    for the workers (`batch_memory`); for another, which makes new tensors, plain (or fresh
    shared) memory, DataLoader pinning what the collate returns."""
    if not passes_batches(collate):
        return BatchMemory()
    batch_bytes = None if batch_size is None else batch_size * math.prod(sample_shape)
    return batch_memory(
        pin, common["num_workers"], common["prefetch_factor"], batch_bytes,
        common["multiprocessing_context"],
    )  # fmt: skip


def stream_parts(
    stream: PackedStream, pin: bool, with_indices: bool, common: dict[str, Any]
) -> tuple[PackedStream, dict[str, Any]]:
    """DataLoader's dataset and keywords for a loader of `stream`: its batches as the stream
    makes them, through a ring with workers (the stream brings its own batch size and order)."""
    workers = common["num_workers"]
    shape = stream.selection.sample_shape
    memory = memory_of(collate_batch, pin, stream.batch_size, shape, common)
    options = dict(batch_size=None, collate_fn=collate_batch, pin_memory=pin and workers > 0)
    return stream.with_memory(memory, workers, with_indices), options | common


def ask_form(dataset: Any, collate: Callable[[Any], Any], form: type[SizedBatch]) -> bool:
    """Have `dataset`'s batches of samples of several sizes made in `form`; whether they will
    be: not through another collate, which gets samples, and not still encoded where the
    dataset crops in its workers (`with_crop`), which needs the pixels there. Workers already
    running (persistent ones) keep the form they were forked with."""
    memory = getattr(dataset, "memory", None)
    if not passes_batches(collate) or not isinstance(memory, BatchMemory):
        return False
    if form is EncodedBatch and getattr(dataset, "crop", None) is not None:
        return False
    memory.form = form
    return True


def pinned_ring(dataset: Any, pin_memory: bool, num_workers: int) -> SharedRing | None:
    """The ring a loader's workers fill, page-locked for CUDA (once, before the first workers
    start) where batches are pinned: NOTE [ a ring pinned in place ] in
    `loaders.memory.pinning`. None: no ring, no workers, no pinning, or no room to pin it."""
    memory = getattr(dataset, "memory", None)
    ring = memory.ring if isinstance(memory, BatchMemory) else None
    if ring is None or not pin_memory or num_workers == 0:
        return None
    return ring if ring.pin() else None


def copies_on(dataset: Any, device: Any) -> None:
    """Tell the ring of `dataset`'s memory (if any) on which device's current stream the
    batches' copies are queued, so a pinned slot is freed after the copy there."""
    memory = getattr(dataset, "memory", None)
    if isinstance(memory, BatchMemory) and memory.ring is not None:
        memory.ring.copies_on = device
