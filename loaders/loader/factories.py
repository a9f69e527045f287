"""`make_loader` and `stream_loader`: a `PackedLoader` with this project's defaults (batches of
256, an order by name, pinning where CUDA is)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict, Unpack

import torch
from torch.utils.data import Sampler

from loaders.datasets.mixture import Mixture
from loaders.datasets.packed import PackedDataset
from loaders.datasets.stream import PackedStream
from loaders.loader.packed import PackedLoader
from loaders.order.aspect_buckets import AspectBuckets


class LoaderOptions(TypedDict, total=False):
    """`PackedLoader`'s keywords beside the dataset and the batch size, declared once for
    `make_loader` to take as they are (`Unpack`), with PackedLoader's defaults; a test holds
    the two to the same names. DataLoader's meaning where DataLoader has the keyword."""

    shuffle: bool | str | AspectBuckets | None
    sampler: Sampler[int] | None
    num_workers: int
    collate_fn: Callable[[Any], Any] | None
    pin_memory: bool | None
    drop_last: bool
    prefetch_factor: int | None
    persistent_workers: bool | None
    worker_init_fn: Callable[[int], None] | None
    timeout: float
    generator: torch.Generator | None
    seed: int | None
    rank: int | None
    world_size: int | None
    multiprocessing_context: Any
    with_indices: bool
    as_inputs: bool
    workers_as: str | None
    log_stats: bool


def make_loader(
    dataset: PackedDataset | Mixture, batch_size: int = 256, **options: Unpack[LoaderOptions]
) -> PackedLoader:
    """A `PackedLoader` (a DataLoader) over `dataset` in batches of 256 unless told otherwise.

    `shuffle` is a `SHUFFLES` name or a bool (default: in order), or aspect-ratio buckets
    ("buckets" or an `AspectBuckets`: every batch one bucket's, `loaders.order.aspect_buckets`);
    `sampler` (any torch sampler of indices) replaces it. A `Mixture`'s order is its own
    (`loaders.datasets.mixture`): no shuffle.
    `drop_last` drops the short last batch and, across ranks, the tail that does not split
    evenly (otherwise ranks are padded by repetition, like DistributedSampler). Rank and world
    size come from torch.distributed when it is initialised, unless given.

    The order is a pure function of `seed` (default 0: every run sees the same orders) and the
    epoch; `torch.manual_seed` does not change it. `generator`, as with DataLoader, makes it
    random instead: the seed is drawn from it once, here (pass one or the other). `collate_fn`
    has DataLoader's meaning: it gets the batch's samples, `(image, label)` tuples (with the
    index when `with_indices`), and its result is what the loader yields; without it batches
    are `Batch(images, labels)` made with no copy beyond the gather (an `IndexedBatch` with
    `with_indices`, whose indices `dataset.manifest_rows` maps to sample ids and sources).
    `as_inputs` makes each batch the `ModelInputs` dict a Hugging Face model takes
    (`pixel_values` uint8 [B, C, H, W], `labels`), what `loaders.trainers.hf.PackedTrainer`
    reads.

    `num_workers=N` makes batches on the loader's threads unless they need processes (a
    per-sample `transform`, your `collate_fn`, a `worker_init_fn` or a context: NOTE
    [ num_workers out of habit ] in `loaders.loader.workers`); `workers_as` ("threads",
    "processes") decides it. Worker processes are persistent unless `persistent_workers=False`.
    On threads the next `prefetch_factor` batches (2) are read ahead while the loop works.

    Every keyword but `batch_size` is `LoaderOptions`', passed to `PackedLoader` as given.
    """
    unknown = sorted(options.keys() - LoaderOptions.__annotations__.keys())
    if unknown:
        raise TypeError(f"make_loader() got an unexpected keyword argument {unknown[0]!r}")
    return PackedLoader(dataset, batch_size=batch_size, **options)


def stream_loader(
    stream: PackedStream,
    num_workers: int = 0,
    pin_memory: bool | None = None,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    worker_init_fn: Callable[[int], None] | None = None,
    timeout: float = 0.0,
    multiprocessing_context: Any = None,
    with_indices: bool = False,
    generator: torch.Generator | None = None,
) -> PackedLoader:
    """A `PackedLoader` (a DataLoader) over a `PackedStream`; batch size, order, seed and
    drop_last are the stream's. `len()` is the batches this rank yields (equal on every rank);
    the state resumes with the same number of workers and ranks."""
    if generator is not None:
        raise ValueError(
            "a stream's order comes from PackedStream(seed=...); generator= would not change it"
        )
    return PackedLoader(
        stream,
        batch_size=None,
        num_workers=num_workers,
        pin_memory=pin_memory,
        timeout=timeout,
        worker_init_fn=worker_init_fn,
        multiprocessing_context=multiprocessing_context,
        prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers,
        with_indices=with_indices,
    )
