"""The same pipeline on a real dask.distributed cluster on 127.0.0.1: a scheduler and worker
processes started here, killed here, and compared with loky's output byte for byte."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from etl.config import PipelineConfig, RunConfig, load_config
from etl.errors import ExecutionError
from etl.format.manifest import list_versions, read_manifest
from etl.run import pipeline
from etl.start.sample_data import make_sample_data
from tests.helpers.columns import write_captioned, write_listing_config
from tests.helpers.stores import new_bucket, packed_contents, point_at, stored_in_bucket

pytestmark = pytest.mark.slow
distributed = pytest.importorskip("distributed")

CONFIG = """\
source: {{kind: folder, path: {source}}}
stages:
  - decode: {{}}
  - validate: {{min_size: [16, 16]}}
  - resize: {{size: [24, 24]}}
output: {{dir: {out}, samples_per_shard: {per_shard}}}
run: {{n_jobs: 2, backend: {backend}{address}}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    address: str
    scheduler: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def stop(self) -> None:
        for proc in [*self.workers, self.scheduler]:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


def start_cluster(tmp: Path, n_workers: int = 2, worker_prefix: list[str] | None = None) -> Cluster:
    """A scheduler and `n_workers` single-threaded worker processes (no nanny, so a killed
    worker stays dead), all on 127.0.0.1."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    bin_dir = Path(sys.executable).parent
    log = open(tmp / "dask.log", "ab")  # noqa: SIM115 (closed when the processes end)
    scheduler = subprocess.Popen(
        [
            str(bin_dir / "dask"),
            "scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dashboard-address",
            ":0",
            "--no-show",
        ],
        stdout=log,
        stderr=log,
    )
    cluster = Cluster(address, scheduler)
    for i in range(n_workers):
        command = [
            str(bin_dir / "dask"),
            "worker",
            address,
            "--nthreads",
            "1",
            "--no-nanny",
            "--host",
            "127.0.0.1",
            "--dashboard-address",
            ":0",
            "--name",
            f"w{i}",
        ]
        cluster.workers.append(
            subprocess.Popen([*(worker_prefix or []), *command], stdout=log, stderr=log)
        )
    # generous: on a loaded 2-core machine the scheduler took over 30 s to answer once
    with distributed.Client(address, timeout=120) as client:
        client.wait_for_workers(n_workers, timeout=120)
    return cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = start_cluster(tmp_path)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("src") / "data"
    make_sample_data(root, per_class=12, seed=4)
    return root


def config(
    tmp: Path, source: Path, out: str, backend: str, address: str | None = None, per_shard: int = 6
) -> PipelineConfig:
    path = tmp / f"{out}.yaml"
    path.write_text(
        CONFIG.format(
            source=source,
            out=tmp / out,
            per_shard=per_shard,
            backend=backend,
            address=f", address: '{address}'" if address else "",
        )
    )
    return load_config(path)


def same_dataset(a: Path, b: Path) -> None:
    """Same samples, shards, checksums and bytes (the creation time may differ)."""
    ma, mb = read_manifest(a), read_manifest(b)
    assert ma.samples.equals(mb.samples)
    assert ma.shards.equals(mb.shards)
    assert ma.rejects.equals(mb.rejects)
    for name in ma.shards.column("shard").to_pylist():
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_dask_output_equals_loky(tmp_path: Path, source: Path, cluster: Cluster) -> None:
    """Shards of 24 in tasks of 8 (`etl.run.tasks.batch_size`): the tasks of one shard run on
    both workers and the parent seals it."""
    loky = pipeline.run(config(tmp_path, source, "loky", "loky", per_shard=24))
    dask = pipeline.run(config(tmp_path, source, "dask", "dask", cluster.address, per_shard=24))
    assert dask.committed and dask.packed_new == loky.packed_new > 0
    same_dataset(tmp_path / "loky", tmp_path / "dask")
    # an incremental run on the cluster
    extra = source.parent / "extra"
    shutil.copytree(source, extra)
    try:
        (extra / "circle" / "circle_00000.jpg").unlink(missing_ok=True)
        moved = next((extra / "square").glob("square_0000[1-5].*"))
        moved.rename(extra / "circle" / moved.name)
        inc = config(tmp_path, extra, "dask", "dask", cluster.address, per_shard=24)
        report = pipeline.run(inc)
        assert report.committed and report.version == 2 and report.packed_new == 0
        rebuilt = pipeline.run(config(tmp_path, extra, "rebuilt", "loky", per_shard=24))
        assert rebuilt.samples_total == report.samples_total
    finally:
        shutil.rmtree(extra)


def test_local_cluster_without_address(tmp_path: Path, source: Path) -> None:
    pipeline.run(config(tmp_path, source, "loky", "loky"))
    pipeline.run(config(tmp_path, source, "local", "dask"))
    same_dataset(tmp_path / "loky", tmp_path / "local")


def _run_in_thread(cfg: PipelineConfig) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(pipeline.run(cfg))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def _wait_for_shards(out: Path, prefix: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    shards = out / "shards"
    while time.monotonic() < deadline:
        if shards.is_dir() and any(p.name.startswith(prefix) for p in shards.iterdir()):
            return
        time.sleep(0.01)
    raise AssertionError("no shard appeared")


def test_killed_worker_is_retried(tmp_path: Path, source: Path, cluster: Cluster) -> None:
    pipeline.run(config(tmp_path, source, "loky", "loky", per_shard=2))
    cfg = config(tmp_path, source, "dask", "dask", cluster.address, per_shard=2)
    thread, outcome = _run_in_thread(cfg)
    _wait_for_shards(tmp_path / "dask", "v000001")
    cluster.workers[0].send_signal(signal.SIGKILL)
    thread.join(timeout=300)
    assert cluster.workers[0].poll() is not None, "the worker was not killed"
    assert isinstance(outcome[0], pipeline.RunReport), outcome
    same_dataset(tmp_path / "loky", tmp_path / "dask")


def test_lost_cluster_fails_clearly_and_rerun_converges(
    tmp_path: Path, source: Path, cluster: Cluster
) -> None:
    first = config(tmp_path, source, "dask", "loky")
    sub = tmp_path / "sub"
    shutil.copytree(source / "circle", sub / "circle")
    pipeline.run(config(tmp_path, sub, "dask", "loky"))
    v1 = read_manifest(tmp_path / "dask").samples
    cfg = config(tmp_path, source, "dask", "dask", cluster.address, per_shard=2)
    thread, outcome = _run_in_thread(cfg)
    _wait_for_shards(tmp_path / "dask", "v000002")
    cluster.scheduler.send_signal(signal.SIGKILL)
    thread.join(timeout=300)
    assert isinstance(outcome[0], ExecutionError), outcome
    assert "previous version is intact" in str(outcome[0])
    assert list_versions(tmp_path / "dask") == [1]
    assert read_manifest(tmp_path / "dask").samples.equals(v1)
    report = pipeline.run(first)
    assert report.committed and report.version == 2
    pipeline.run(config(tmp_path, source, "loky", "loky"))
    assert (
        read_manifest(tmp_path / "dask")
        .samples.column("checksum")
        .equals(read_manifest(tmp_path / "loky").samples.column("checksum"))
    )


def test_worker_that_cannot_see_the_output_is_refused(tmp_path: Path, source: Path) -> None:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs none {hidden} && true"],
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot make a private mount namespace here: {probe.stderr.decode()}")
    # One worker sees a private, empty tmpfs where the output folder lives.
    prefix = ["unshare", "-m", "sh", "-c", f'mount -t tmpfs none {hidden} && exec "$0" "$@"']
    c = start_cluster(tmp_path, n_workers=1, worker_prefix=prefix)
    try:
        cfg = config(hidden, source, "out", "dask", c.address)
        with pytest.raises(ExecutionError, match=r"Dask worker .* does not see"):
            pipeline.run(cfg)
        assert not list_versions(hidden / "out")
    finally:
        c.stop()


def test_backend_dask_reaches_no_scheduler(tmp_path: Path, source: Path) -> None:
    cfg = config(tmp_path, source, "dask", "dask", f"tcp://127.0.0.1:{free_port()}")
    with pytest.raises(ExecutionError, match="cannot reach the Dask scheduler"):
        pipeline.run(cfg)


def test_pixels_survive_a_cluster_round_trip(tmp_path: Path, source: Path) -> None:
    """Sanity on what the cluster wrote: rows open as plain npy and checksums hold."""
    pipeline.run(config(tmp_path, source, "local", "dask"))
    m = read_manifest(tmp_path / "local")
    import xxhash

    for s in m.samples.to_pylist()[:20]:
        row = np.load(tmp_path / "local" / s["shard"], mmap_mode="r")[s["row"]]
        assert xxhash.xxh3_64_hexdigest(np.ascontiguousarray(row).tobytes()) == s["checksum"]
    assert os.listdir(tmp_path / "local" / "shards")


def test_audit_on_the_cluster_names_the_bad_sample(
    tmp_path: Path, source: Path, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from etl.cli import main

    pipeline.run(config(tmp_path, source, "dask", "dask", cluster.address))
    victim = read_manifest(tmp_path / "dask").samples.to_pylist()[7]
    shard = np.load(tmp_path / "dask" / victim["shard"], mmap_mode="r+")
    shard[victim["row"], 0, 0, 0] ^= 0xFF
    shard.flush()
    del shard
    with pytest.raises(SystemExit) as info:
        main(
            ["audit", str(tmp_path / "dask"), "--address", cluster.address, "--jobs", "2", "--json"]
        )
    assert info.value.code == 1
    report = json.loads(capsys.readouterr().out)
    bad = [f for f in report["findings"] if f.get("sample_id")]
    assert [f["sample_id"] for f in bad] == [victim["sample_id"]]


def test_a_cluster_packs_into_a_bucket(
    tmp_path: Path,
    source: Path,
    cluster: Cluster,
    endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`output.dir: s3://...` with the Dask backend: the workers pack into the packing node's
    work folder, which they share here (one machine); the bucket then holds what loky packs
    to local disk, read back with s3fs, pyarrow and numpy alone. A cluster whose workers
    cannot see that folder is refused as for a local output
    (test_worker_that_cannot_see_the_output_is_refused)."""
    s3fs = pytest.importorskip("s3fs")
    point_at(endpoint, monkeypatch, tmp_path / "cache")
    new_bucket(endpoint, "clustered")
    pipeline.run(config(tmp_path, source, "loky", "loky"))
    path = tmp_path / "to-bucket.yaml"
    path.write_text(
        CONFIG.format(
            source=source,
            out="s3://clustered/ds",
            per_shard=6,
            backend="dask",
            address=f", address: '{cluster.address}'",
        )
    )
    report = pipeline.run(load_config(path))
    assert report.committed and report.output == "s3://clustered/ds"
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    assert stored_in_bucket(fs, "clustered/ds") == packed_contents(tmp_path / "loky")


def test_columns_on_the_cluster_equal_columns_here(tmp_path: Path, cluster: Cluster) -> None:
    """Per-sample columns (`columns:`) ride with the plan, not the workers: a cluster run's
    manifest, values included, is the local run's."""
    write_captioned(tmp_path / "photos")
    here = load_config(write_listing_config(tmp_path))
    there = on_the_cluster(here, cluster, tmp_path / "dask")
    assert pipeline.run(here).packed_new == pipeline.run(there).packed_new == 12
    same_dataset(tmp_path / "out", tmp_path / "dask")
    assert (
        read_manifest(tmp_path / "dask").meta.columns
        == read_manifest(tmp_path / "out").meta.columns
    )


def test_samples_of_their_own_size_on_the_cluster_equal_here(
    tmp_path: Path, cluster: Cluster
) -> None:
    """Samples that keep their aspect ratio (format version 2): the tasks of one shard write
    their slots on both workers and the parent moves them together; same bytes as here."""
    from tests.helpers.aspect import write_config, write_sources

    write_sources(tmp_path / "images", count=24)
    here = load_config(write_config(tmp_path, jobs=2, backend="loky"))
    there = on_the_cluster(here, cluster, tmp_path / "dask")
    assert pipeline.run(here).packed_new == pipeline.run(there).packed_new == 24
    same_dataset(tmp_path / "out", tmp_path / "dask")
    assert read_manifest(tmp_path / "dask").meta.ragged


def on_the_cluster(here: PipelineConfig, cluster: Cluster, out: Path) -> PipelineConfig:
    """`here` packed on `cluster` into `out`."""
    return here.model_copy(
        update={
            "output": here.output.model_copy(update={"dir": out}),
            "run": RunConfig(backend="dask", address=cluster.address),
        }
    )
