"""Publishing is conditional on every store we claim: S3 (moto), GCS (fake-gcs-server) and
Azure (Azurite), each started on 127.0.0.1 by these tests. A put only if absent succeeds once
whoever races for it (the precondition each driver sends, `CONDITIONAL_PUTS`); `etl run` to
each store holds what a run to disk holds; two writers racing leave whole versions. Where an
emulator does not enforce a precondition, an expected failure names the gap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from etl.start.sample_data import make_sample_data
from tests.helpers.cli import cli
from tests.helpers.emulators import Emulated, emulator
from tests.helpers.stores import all_objects, named_by_versions, packed_contents, stored_in_bucket

CONFIG = (
    "source: {{kind: folder, path: data, split: {{val: 0.25}}}}\n"
    "stages: [{{decode: {{mode: RGB}}}}, {{resize: {{size: [16, 16]}}}}]\n"
    "output: {{dir: '{out}', samples_per_shard: 5, storage_options: {options}}}\n"
    "run: {{n_jobs: 1, backend: threading}}\n"
)


@pytest.fixture(scope="module", params=["s3", "gcs", "azure"])
def store(request: pytest.FixtureRequest) -> Iterator[Emulated]:
    with emulator(request.param) as emulated:
        yield emulated


@pytest.fixture
def bucket(store: Emulated, request: pytest.FixtureRequest) -> str:
    """A new, empty bucket for this test."""
    name = "b" + format(abs(hash(request.node.nodeid)) % 10**10, "010d")
    store.new_bucket(name)
    return name


MOTO_RACE = (
    "moto checks If-None-Match, then stores the body, with no lock between: writers racing "
    "can all succeed (seen: 3 of 6 with 9 MiB bodies); AWS S3 decides atomically"
)


@pytest.mark.parametrize("size", [1 << 10, 9 << 20], ids=["1 KiB", "9 MiB"])
def test_a_second_put_only_if_absent_is_refused_and_changes_nothing(
    store: Emulated, bucket: str, size: int
) -> None:
    key = f"{bucket}/versions/v000001/commit.json"
    store.fs().pipe_file(key, b"a" * size, mode="create")
    with pytest.raises(FileExistsError):
        store.fs().pipe_file(key, b"b" * size, mode="create")
    assert store.fs().cat_file(key) == b"a" * size


@pytest.mark.parametrize("size", [1 << 10, 9 << 20], ids=["1 KiB", "9 MiB"])
def test_a_put_only_if_absent_succeeds_once_whoever_races_for_it(
    store: Emulated, bucket: str, size: int, request: pytest.FixtureRequest
) -> None:
    """Six writers, each its own client, put one key at once, only if absent (a small body
    in one request, a large one in parts): one succeeds, the others are told the key
    exists, and the store holds the winner's bytes."""
    if store.protocol == "s3":
        request.applymarker(pytest.mark.xfail(strict=False, reason=MOTO_RACE))
    key = f"{bucket}/versions/v000001/commit.json"
    start = threading.Barrier(6)
    outcomes: dict[int, str] = {}

    def write(writer: int) -> None:
        fs = store.fs()
        body = bytes([writer]) * size
        start.wait()
        try:
            fs.pipe_file(key, body, mode="create")
            outcomes[writer] = "put"
        except FileExistsError:
            outcomes[writer] = "exists"
        except Exception as exc:
            outcomes[writer] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=write, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    winners = [w for w, outcome in outcomes.items() if outcome == "put"]
    assert len(outcomes) == 6 and len(winners) == 1, outcomes
    assert sorted(set(outcomes.values())) == ["exists", "put"], outcomes
    assert store.fs().cat_file(key) == bytes([winners[0]]) * size


@pytest.mark.xfail(
    strict=True,
    reason="fake-gcs-server ignores ifGenerationMatch=0 on media uploads (uploadType=media); "
    "gcsfs puts with multipart and resumable uploads, where it is enforced (the test above)",
)
def test_fake_gcs_server_enforces_the_precondition_on_media_uploads() -> None:
    with emulator("gcs") as gcs:
        gcs.new_bucket("media")
        endpoint = gcs.options["endpoint_url"]
        query = "uploadType=media&name=k&ifGenerationMatch=0"
        url = f"{endpoint}/upload/storage/v1/b/media/o?{query}"
        statuses = []
        for body in (b"one", b"two"):
            request = urllib.request.Request(url, data=body, method="POST")
            try:
                with urllib.request.urlopen(request) as answer:
                    statuses.append(answer.status)
            except urllib.error.HTTPError as exc:
                statuses.append(exc.code)
    assert statuses == [200, 412]


def write_config(tmp_path: Path, store: Emulated, out: str, name: str = "pipeline.yaml") -> Path:
    config = tmp_path / name
    config.write_text(CONFIG.format(out=out, options=json.dumps(store.options)))
    return config


def test_a_run_to_the_store_holds_what_a_run_to_disk_holds(
    store: Emulated, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Endpoint and credentials only in the config: run, rerun (nothing changed), audit."""
    make_sample_data(tmp_path / "data", per_class=3, seed=7)
    url = store.url(f"{bucket}/out")
    config = write_config(tmp_path, store, url)
    for expected in (True, False):
        code, out, err = cli(["run", str(config), "--json"], capsys)
        assert code == 0, err
        assert json.loads(out)["committed"] is expected
        assert "AccountKey" not in out + err and "Eby8vdM02" not in out + err
    disk = write_config(tmp_path, store, "disk", "disk.yaml")
    disk.write_text(disk.read_text().replace(f", storage_options: {json.dumps(store.options)}", ""))
    code, _, err = cli(["run", str(disk)], capsys)
    assert code == 0, err
    fs = store.fs()
    assert stored_in_bucket(fs, f"{bucket}/out") == packed_contents(tmp_path / "disk")
    code, out, err = cli(["audit", url, "--config", str(config)], capsys)
    assert code == 0, out + err
    for secret in ("AccountKey", "Eby8vdM02"):
        assert secret not in out + err


def test_two_writers_at_once_leave_whole_versions(
    store: Emulated, bucket: str, tmp_path: Path
) -> None:
    """Two `etl run` processes of two nodes (two caches), started together: each ends with
    exit 0 or a one-line exit 2, and the store holds exactly the versions that succeeded,
    nothing else."""
    make_sample_data(tmp_path / "data", per_class=3, seed=7)
    config = write_config(tmp_path, store, store.url(f"{bucket}/out"))
    runs = []
    for node in ("a", "b"):
        env = {**os.environ, "ETL_CACHE": str(tmp_path / f"cache-{node}")}
        runs.append(
            subprocess.Popen(
                [sys.executable, "-m", "etl", "run", str(config), "--json"],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    ended = [(p.wait(timeout=180), *p.communicate()) for p in runs]
    for code, _, err in ended:
        assert code in (0, 2) and "Traceback" not in err, err
        if code == 2:
            errors = [line for line in err.splitlines() if line.startswith("error:")]
            assert len(errors) == 1 and "another writer published version" in errors[0], err
    fs = store.fs()
    fs.invalidate_cache()
    published = fs.glob(f"{bucket}/out/versions/v*/commit.json")
    commits = [json.loads(out)["committed"] for code, out, _ in ended if code == 0]
    assert commits and len(published) == sum(commits) >= 1
    assert all_objects(fs, f"{bucket}/out") == named_by_versions(fs, f"{bucket}/out")


def test_a_store_without_a_put_only_if_absent_is_refused_as_an_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """fsspec's fallback for a driver without a create mode is check-then-write, which two
    writers can both pass: such a store is refused in one line, before anything is packed."""
    make_sample_data(tmp_path / "data", per_class=1, seed=1)
    config = tmp_path / "pipeline.yaml"
    config.write_text(CONFIG.format(out="memory://bucket/out", options="{}"))
    code, _, err = cli(["run", str(config)], capsys)
    assert code != 0 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "put that succeeds only if the object is absent" in lines[0], err
    assert "memory://" in lines[0]
