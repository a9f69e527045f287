"""Dask: the only module that imports dask.distributed. It connects to a cluster (or starts a
LocalCluster of worker processes), checks that every worker sees the same storage, and turns a
lost cluster into one clear error. joblib's Dask backend does the scheduling; see execute.py.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from etl.config import RunConfig
from etl.engine import interrupt
from etl.errors import ExecutionError

CONNECT_TIMEOUT_S = 20


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise ExecutionError(
            "run.backend 'dask' needs dask.distributed: pip install 'etl-memmap[dask]'"
        ) from None
    return distributed


@contextmanager
def dask_client(run: RunConfig) -> Iterator[Any]:
    """A Client for the length of a run: to `run.address`, or to a LocalCluster of `n_jobs`
    single-threaded worker processes on 127.0.0.1 when no address is given."""
    distributed = _import_distributed()
    if run.address:
        try:
            client = distributed.Client(run.address, timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            raise ExecutionError(
                f"run.address: cannot reach the Dask scheduler at {run.address} ({exc})"
            ) from None
        with client:
            yield client
        return
    n = run.n_jobs if run.n_jobs > 0 else max(1, (os.cpu_count() or 1) + 1 + run.n_jobs)
    with interrupt.starting_workers():  # a Ctrl-C is the run's to handle: it closes the cluster
        cluster = distributed.LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        )
    with cluster, distributed.Client(cluster) as client:
        yield client


def _probe(token_path: str, folders: list[str]) -> str:
    """Runs on each worker: '' when it sees the token and can write every folder, else why not."""
    if not os.path.exists(token_path):
        return f"does not see {token_path}"
    for folder in folders:
        probe = os.path.join(folder, f".tmp-probe-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            with open(probe, "wb"):
                pass
            os.unlink(probe)
        except OSError as exc:
            return f"cannot write to {folder} ({exc.strerror})"
    return ""


def check_shared_storage(client: Any, writable_root: Path | None, readable: list[Path]) -> None:
    """Every worker must see the same storage as this client: a worker writing its shards to a
    disk nobody else reads would leave holes in the dataset. A token file written here proves
    that a worker's `writable_root` is this one; `readable` paths must merely exist there."""
    missing: dict[str, str] = {}
    answers: dict[str, str] = {}
    token: Path | None = None
    try:
        if writable_root is not None:
            token = writable_root / f".tmp-probe-{secrets.token_hex(8)}"
            token.write_bytes(b"")
            (writable_root / "shards").mkdir(exist_ok=True)
            answers = client.run(_probe, str(token), [str(writable_root / "shards")])
            missing.update({w: why for w, why in answers.items() if why})
        for path in readable:
            seen = client.run(os.path.exists, str(path))
            answers = answers or {w: "" for w in seen}
            missing.update({w: f"does not see {path}" for w, ok in seen.items() if not ok})
    finally:
        if token is not None:
            token.unlink(missing_ok=True)
    if missing:
        worker, why = sorted(missing.items())[0]
        raise ExecutionError(
            f"Dask worker {worker} {why}: the output and source folders must be on storage "
            f"every worker mounts at the same path ({len(missing)} worker(s) affected)"
        )
    if not answers and (writable_root is not None or readable):
        raise ExecutionError("the Dask cluster has no workers")


def is_cluster_failure(exc: BaseException) -> bool:
    """A lost scheduler or a task that killed every worker it ran on."""
    distributed = _import_distributed()
    lost = (
        distributed.comm.core.CommClosedError,
        distributed.KilledWorker,
        TimeoutError,
    )
    return isinstance(exc, lost) or type(exc).__name__ in ("CancelledError", "FutureCancelledError")
