"""How a map-style loader's batches are made: the collate (ours, which hands on the batch as
gathered; `ModelInputs` of it; or yours, given the samples) and the memory the batches are
gathered into, chosen for where they go next (`loaders.memory.batch_memory`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from loaders.datasets.packed import CollateInputs, collate_batch, passes_batches
from loaders.memory.batch_memory import BatchMemory, batch_memory


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
