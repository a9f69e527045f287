"""DataLoader workers as the loaders run them: an error a worker raised comes back as it was
raised there, and an iteration an error ended stops its workers at once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from etl.errors import EtlError


def from_worker(exc: EtlError) -> EtlError:
    """An error raised in a DataLoader worker, as it was raised there: DataLoader re-raises it
    in this process as the same type, its message replaced by "Caught ... Original Traceback"
    and the worker's whole traceback. Our messages are one line: the traceback's last."""
    text = str(exc)
    if not text.startswith("Caught "):
        return exc
    last = text.rstrip().splitlines()[-1]
    return type(exc)(last.partition(f"{type(exc).__name__}: ")[2] or last)


def stop_workers(batches: Iterator[Any] | None, persistent: bool) -> None:
    """Stop the workers of an iteration that an error ended, now.

    NOTE: otherwise they stop when the iterator is garbage collected, at some later moment of
    the training process. Measured in tests/format/test_format_fuzz.py: in a process that had used a
    joblib (loky) pool before, that collection waited 10 s (two workers' 5 s join timeouts)
    inside whatever ran next. Persistent workers stay: the next epoch reuses them.
    """
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is not None and not persistent:
        shutdown()
