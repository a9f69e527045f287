"""DataLoader workers as the loaders run them: an error a worker raised comes back as it was
raised there, and an iteration an error ended stops its workers at once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from etl.errors import EtlError
from etl.format.codecs import RAW


def from_worker(exc: EtlError) -> EtlError:
    """An error raised in a DataLoader worker, as it was raised there: DataLoader re-raises it
    in this process as the same type, its message replaced by "Caught ... Original Traceback"
    and the worker's whole traceback. Our messages are one line: the traceback's last."""
    text = str(exc)
    if not text.startswith("Caught "):
        return exc
    last = text.rstrip().splitlines()[-1]
    return type(exc)(last.partition(f"{type(exc).__name__}: ")[2] or last)


def stop_workers(loader: Any, batches: Iterator[Any] | None) -> None:
    """Stop the workers of an iteration that an error ended, now, persistent ones too (an error
    may have left their state anything; the next epoch starts fresh ones).

    NOTE: otherwise they stop when the iterator is garbage collected, at some later moment of
    the training process. Measured in tests/format/test_format_fuzz.py: in a process that had used a
    joblib (loky) pool before, that collection waited 10 s (two workers' 5 s join timeouts)
    inside whatever ran next.
    """
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is None:
        return
    shutdown()
    if getattr(loader, "_iterator", None) is batches:
        loader._iterator = None  # DataLoader would reset this stopped one for the next epoch


WORKERS_AS = ("threads", "processes")
AHEAD = 2
"""Batches read ahead on the loader's thread when `prefetch_factor` does not say."""


def in_threads(
    dataset: Any,
    num_workers: int,
    collate_fn: Any,
    as_inputs: bool,
    worker_init_fn: Any,
    multiprocessing_context: Any,
    workers_as: str | None,
) -> bool:
    """Whether a map-style loader makes its batches on its threads rather than in
    `num_workers` processes (`workers_as`: "threads", "processes", or None to choose).

    NOTE [ num_workers out of habit ]: most loops pass `num_workers=8` (or os.cpu_count()) by
    habit. Measured with benchmarks/load/workers.py (2-core VM, each contender in its own
    process, batches of 256): random 224x224x3 raw samples, 2 threads 45,785-57,485 samples/s,
    2 workers 26,470 fresh each epoch and 50,156 persistent (with a 4 ms step after each
    batch: 50,229-52,163 against 27,453 and 46,604); JPEG photos (aspect kept, 256/512) with
    `RandomResizedCrop(224)`, 2 threads 1,626-1,929, 2 workers 2,388 fresh and 2,730
    persistent (the Python left per crop holds the GIL: docs/architecture.md). So
    `num_workers=N` runs on the threads where samples are stored raw, and in persistent
    processes where they are decoded here (stored encoded) or the batches need processes: a
    per-sample `transform` of the user's (Python that may hold the GIL), a `collate_fn` of the
    user's (given the samples), a `worker_init_fn` or a `multiprocessing_context` (which only
    mean something in a process)."""
    if num_workers == 0 or workers_as == "threads":
        return True
    if workers_as == "processes":
        return False
    ours = collate_fn is None or as_inputs
    plain = getattr(dataset, "transform", None) is None and not decodes(dataset)
    return ours and plain and worker_init_fn is None and multiprocessing_context is None


def decodes(dataset: Any) -> bool:
    """Whether some of `dataset`'s samples (a mixture's members' too) are stored encoded, so
    making a batch decodes them: NOTE [ num_workers out of habit ]."""
    for member in getattr(dataset, "members", (dataset,)):
        stored = getattr(getattr(member, "selection", None), "stored", None)
        if stored is not None and bool((stored[:, 1] != RAW).any()):
            return True
    return False


def worker_options(
    dataset: Any,
    options: dict[str, Any],
    collate_fn: Any,
    as_inputs: bool,
    persistent_workers: bool | None,
    workers_as: str | None,
) -> int:
    """Settle a map-style loader's DataLoader `options` (num_workers, prefetch_factor,
    persistent_workers, ...) for threads or processes (`in_threads`), in place; the batches
    its thread reads ahead (0 with processes)."""
    threads = in_threads(
        dataset, options["num_workers"], collate_fn, as_inputs, options["worker_init_fn"],
        options["multiprocessing_context"], workers_as,
    )  # fmt: skip
    if not threads:
        if persistent_workers is None:  # a fresh process an epoch re-faults every page
            options["persistent_workers"] = True
        return 0
    ahead = options["prefetch_factor"]
    options.update(num_workers=0, prefetch_factor=None, persistent_workers=False)
    return AHEAD if ahead is None else int(ahead)


def check_options(options: dict[str, Any], workers_as: str | None, stream_workers: bool) -> None:
    """Refuse DataLoader options that would make the order random (`in_order=False`), a
    `workers_as` that is neither, and threads for a stream's workers (its order is dealt to
    them: `loaders.datasets.stream`)."""
    if options.get("in_order", True) is not True:
        raise ValueError("in_order=False would make the batch order, and so resume, random")
    if workers_as not in (None, *WORKERS_AS):
        raise ValueError(f"workers_as must be 'threads' or 'processes', got {workers_as!r}")
    if stream_workers and workers_as == "threads":
        raise ValueError("a stream's order is dealt to its workers: workers_as='threads'")
