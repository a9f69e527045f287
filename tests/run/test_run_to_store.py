"""`etl run` with `output.dir: s3://bucket/prefix`, on a real S3-compatible server (moto's, on
127.0.0.1): the bucket holds what a run to local disk holds, read back here with s3fs, pyarrow
and numpy alone; reruns converge; two writers racing for a version publish one whole version;
a writer killed mid-upload leaves nothing the next run does not remove."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from etl.config import load_config
from etl.errors import ConfigError
from etl.run import pipeline, to_store
from etl.start.sample_data import make_sample_data
from etl.storage import publish as publishing
from etl.storage.location import StoreOptions
from tests.helpers.cli import cli
from tests.helpers.stores import (
    all_objects,
    faulty_proxy,
    named_by_versions,
    packed_contents,
    point_at,
    stored_in_bucket,
)

s3fs = pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

URL = "s3://published/out"
CONFIG = (
    "source: {{kind: folder, path: data, split: {{val: 0.25}}}}\n"
    "stages: [{{decode: {{mode: RGB}}}}, {{resize: {{size: [16, 16]}}}}]\n"
    "output: {{dir: '{out}', samples_per_shard: 5}}\n"
    "run: {{n_jobs: 1, backend: threading}}\n"
)
TAGGED_SHARD = re.compile(r"^shards/v\d{6}-[0-9a-f]{8}-\d{5}\.npy$")


@pytest.fixture
def bucket(endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """An empty bucket 'published', the environment pointing at the server, a cache here."""
    point_at(endpoint, monkeypatch, tmp_path / "cache")
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    if fs.exists("published"):
        fs.rm("published", recursive=True)
    fs.mkdir("published")
    return fs


def write_config(tmp_path: Path, out: str, name: str = "pipeline.yaml") -> Path:
    config = tmp_path / name
    config.write_text(CONFIG.format(out=out))
    return config


def two_writers(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Writer A's config (sample data here) and writer B's folder and config (other sample
    data, its own folder), both publishing to URL."""
    make_sample_data(tmp_path / "data", per_class=3, seed=7)
    other = tmp_path / "other"
    other.mkdir()
    make_sample_data(other / "data", per_class=2, seed=8)
    return write_config(tmp_path, URL), other, write_config(other, URL)


def change_sources(data: Path) -> None:
    """One image added, one changed (new pixels), one deleted."""
    rng = np.random.default_rng(3)
    for name in ("added.png", sorted(p.name for p in (data / "circle").glob("circle_*"))[0]):
        pixels = rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(data / "circle" / name, format="PNG")
    sorted((data / "square").glob("square_*"))[0].unlink()


def test_a_bucket_holds_what_a_disk_holds_and_reruns_converge(
    bucket: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_sample_data(tmp_path / "data", per_class=3, seed=7)
    to_disk = write_config(tmp_path, "disk", "disk.yaml")
    to_bucket = write_config(tmp_path, URL)

    assert pipeline.run(load_config(to_disk)).committed
    code, out, err = cli(["run", str(to_bucket)], capsys)
    assert code == 0, err
    assert URL in out
    assert stored_in_bucket(bucket) == packed_contents(tmp_path / "disk")
    assert all_objects(bucket) == named_by_versions(bucket)
    shards = {p.removeprefix("published/out/") for p in all_objects(bucket) if p.endswith(".npy")}
    assert shards and all(TAGGED_SHARD.match(name) for name in shards)

    change_sources(tmp_path / "data")
    assert pipeline.run(load_config(to_disk)).committed
    report = pipeline.run(load_config(to_bucket))
    assert (report.version, report.packed_new, report.plan_counts["deleted"]) == (2, 2, 1)
    assert report.output == URL
    assert stored_in_bucket(bucket) == packed_contents(tmp_path / "disk")
    assert all_objects(bucket) == named_by_versions(bucket)
    again = pipeline.run(load_config(to_bucket))
    assert (again.version, again.committed) == (2, False)

    code, out, err = cli(["audit", URL], capsys)
    assert code == 0, out + err
    code, out, err = cli(["versions", URL, "--json"], capsys)
    assert code == 0, err
    assert [v["version"] for v in json.loads(out)] == [1, 2]
    work = to_store.work_folder(to_store.StoreDataset(URL)) / "dataset"
    assert not list(work.rglob("*.npy"))  # the work folder keeps no shard between runs


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before A uploads", "before A puts its record"])
def test_a_writer_that_loses_the_race_publishes_nothing_and_says_so(
    bucket: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    when: str,
) -> None:
    """Writer A packs version 1; before it uploads, or after it uploaded everything and just
    before it puts its record, writer B (another node: its own cache) packs and publishes
    version 1 from other sources. A stops in one line, having removed what it uploaded; the
    store holds B's version 1, whole."""
    config, other, other_config = two_writers(tmp_path)
    early = when == "before A uploads"
    module, name = (to_store, "publish") if early else (publishing, "relocated")
    step = getattr(module, name)
    b_done: list[bool] = []

    def b_publishes_first(*args: Any) -> Any:
        if not b_done:  # A's step: B's run first (B's own step is the real one)
            b_done.append(True)
            with monkeypatch.context() as m:
                m.setenv("ETL_CACHE", str(other / "cache"))
                assert pipeline.run(load_config(other_config)).version == 1
        return step(*args)

    monkeypatch.setattr(module, name, b_publishes_first)
    code, out, err = cli(["run", str(config)], capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "another writer published version 1" in lines[0], err
    assert "Traceback" not in err
    monkeypatch.setattr(module, name, step)

    assert all_objects(bucket) == named_by_versions(bucket)  # nothing of A's is left
    on_b = tmp_path / "b-disk.yaml"
    on_b.write_text(CONFIG.format(out="b-disk").replace("path: data", f"path: {other / 'data'}"))
    pipeline.run(load_config(on_b))
    assert stored_in_bucket(bucket) == packed_contents(tmp_path / "b-disk")
    report = pipeline.run(load_config(config))  # A again: builds on B's version
    assert (report.version, report.committed) == (2, True)
    assert all_objects(bucket) == named_by_versions(bucket)
    code, out, err = cli(["audit", URL], capsys)
    assert code == 0, out + err


def test_a_writer_whose_upload_the_winner_swept_says_it_lost(
    bucket: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Writer B publishes version 1 and sweeps what losing attempts left, between A's upload
    of a file and A's read-back of it (seen once in CI with two real writers): A's check then
    finds the file gone, and says that another writer published the version, not that the
    store lost a file."""
    config, other, other_config = two_writers(tmp_path)
    real = to_store.StoreDataset.stored_digest
    b_done: list[bool] = []

    def b_publishes_and_sweeps(self: Any, *args: Any) -> Any:
        if not b_done:
            b_done.append(True)
            with monkeypatch.context() as m:
                m.setenv("ETL_CACHE", str(other / "cache"))
                assert pipeline.run(load_config(other_config)).version == 1
        return real(self, *args)

    monkeypatch.setattr(to_store.StoreDataset, "stored_digest", b_publishes_and_sweeps)
    code, _, err = cli(["run", str(config)], capsys)
    assert code == 2 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "another writer published version 1" in lines[0], err
    monkeypatch.setattr(to_store.StoreDataset, "stored_digest", real)
    assert all_objects(bucket) == named_by_versions(bucket)


def run_etl(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "etl", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_writers_at_once_leave_whole_versions(bucket: Any, tmp_path: Path) -> None:
    """Two `etl run` processes of two nodes (two caches), started together: each ends with
    exit 0 or a one-line exit 2, and the store holds exactly the versions that succeeded."""
    make_sample_data(tmp_path / "data", per_class=3, seed=7)
    config = write_config(tmp_path, URL)
    runs = []
    for node in ("a", "b"):
        env = {**os.environ, "ETL_CACHE": str(tmp_path / f"cache-{node}")}
        runs.append(run_etl(["run", str(config), "--json"], env, tmp_path))
    ended = [(p.wait(timeout=120), *p.communicate()) for p in runs]
    for code, _, err in ended:
        assert code in (0, 2) and "Traceback" not in err, err
        if code == 2:
            errors = [line for line in err.splitlines() if line.startswith("error:")]
            assert len(errors) == 1 and "another writer published version" in errors[0], err
    published = sorted(json.loads(p)["version"] for p in _records(bucket))
    # NOTE: a writer that lists the store after the other published finds nothing changed:
    # it succeeds and commits nothing (seen once in CI), so count the commits, not the exits
    commits = [json.loads(out)["committed"] for code, out, _ in ended if code == 0]
    assert commits and len(published) == sum(commits) >= 1
    assert all_objects(bucket) == named_by_versions(bucket)


def _records(fs: Any) -> list[bytes]:
    fs.invalidate_cache()
    return [fs.cat(p) for p in fs.glob("published/out/versions/v*/commit.json")]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("held", "node"),
    [
        (".npy", "this node"),
        ("manifest.arrow", "this node"),
        ("commit.json", "this node"),
        ("commit.json", "another node"),
    ],
)
def test_a_writer_killed_mid_upload_leaves_nothing_a_rerun_does_not_remove(
    bucket: Any,
    tmp_path: Path,
    endpoint: str,
    held: str,
    node: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """kill -9 while a shard, a version file or the record is being put: no version is
    published, and the next run publishes version 1, the same as a run never interrupted,
    with nothing of the killed attempt left: from the same node, whose work folder names the
    attempt, or from another, which removes an attempt at a version published since."""
    make_sample_data(tmp_path / "data", per_class=3, seed=7)
    config = write_config(tmp_path, URL)
    arrived = threading.Event()
    with faulty_proxy(endpoint, {held: "hold"}, arrived) as proxy:
        env = {**os.environ, "AWS_ENDPOINT_URL": proxy}
        if node == "another node":
            env["ETL_CACHE"] = str(tmp_path / "other-cache")
        writer = run_etl(["run", str(config)], env, tmp_path)
        try:
            assert arrived.wait(90), writer.communicate(timeout=5)
        finally:
            writer.kill()
            writer.wait(30)
    assert _records(bucket) == []
    leftovers = all_objects(bucket)
    if held != ".npy":
        assert leftovers  # the shards were uploaded before it was killed

    code, _, err = cli(["run", str(config)], capsys)
    assert code == 0, err
    assert all_objects(bucket) == named_by_versions(bucket)
    assert [json.loads(r)["version"] for r in _records(bucket)] == [1]
    disk = write_config(tmp_path, "disk", "disk.yaml")
    pipeline.run(load_config(disk))
    assert stored_in_bucket(bucket) == packed_contents(tmp_path / "disk")


def test_storage_options_of_a_local_output_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        "source: {kind: folder, path: data}\n"
        "stages: [{decode: {}}, {resize: {size: [8, 8]}}]\n"
        "output: {dir: out, storage_options: {anon: true}}\n"
    )
    with pytest.raises(ConfigError, match=r"are for an output\.dir in object storage"):
        load_config(config)


def test_a_damaged_attempt_file_never_widens_what_a_run_removes(
    bucket: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The attempt file names what a killed run uploaded, and the next run removes it. One
    that is damaged, or names a tag that is a pattern or a path, is ignored: the published
    version keeps every object."""
    make_sample_data(tmp_path / "data", per_class=3, seed=7)
    config = write_config(tmp_path, URL)
    assert pipeline.run(load_config(config)).version == 1
    published = all_objects(bucket)
    work = to_store.work_folder(to_store.StoreDataset(URL))
    record = json.loads(_records(bucket)[0])
    writer = record["files_at"].rsplit("-", 1)[1]
    bodies = [
        b'{"version": 1, "writer": "*"}',
        b'{"version": 1, "writer": "*-*"}',
        b'{"version": 1, "writer": "../../x"}',
        b'{"version": "1", "writer": "%s"}' % writer[:7].encode(),
        b'{"version": 1.0, "writer": "%s*"}' % writer[:7].encode(),
        b'[1, "*"]',
        b"\xff\xfe{",
        b'{"version": 1, "writer": "' + b"[" * 10000 + b'"}',
    ]
    for body in bodies:
        (work / publishing.ATTEMPT_FILE).write_bytes(body)
        code, out, err = cli(["run", str(config)], capsys)
        assert code == 0 and "Traceback" not in err, (body, err)
        assert all_objects(bucket) == published, body
        assert not (work / publishing.ATTEMPT_FILE).exists()
    code, out, err = cli(["audit", URL], capsys)
    assert code == 0, out + err


def test_compact_on_a_bucket_keeps_what_a_local_compaction_keeps(
    bucket: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`etl compact s3://...` decides as a local compaction of the same history decides;
    the kept version holds the same samples with the same pixels, read back with s3fs,
    pyarrow and numpy alone; no object is left that no version names; the shards of a writer
    packing the next version now, and the whole retired versions of a killed compaction,
    are told apart."""
    make_sample_data(tmp_path / "data", per_class=5, seed=11)
    to_disk = write_config(tmp_path, str(tmp_path / "disk"), "disk.yaml")
    to_bucket = write_config(tmp_path, URL)
    for config in (to_disk, to_bucket):
        assert pipeline.run(load_config(config)).committed
    for picture in sorted((tmp_path / "data").rglob("*.png"))[::2]:
        picture.unlink()  # half the samples: shards mostly dead
    for config in (to_disk, to_bucket):
        assert pipeline.run(load_config(config)).version == 2
    before = stored_in_bucket(bucket)
    assert before == packed_contents(tmp_path / "disk")
    objects = all_objects(bucket)
    code, out, err = cli(
        ["compact", URL, "--min-dead", "0.3", "--dry-run", "--json", "--grace", "0"], capsys
    )
    assert code == 0, err
    planned = json.loads(out)
    assert all_objects(bucket) == objects, "a dry run changes nothing in the store"

    reports = []
    for where in (str(tmp_path / "disk"), URL):
        code, out, err = cli(
            ["compact", where, "--min-dead", "0.3", "--json", "--grace", "0"], capsys
        )
        assert code == 0, err
        reports.append(json.loads(out))
    local, remote = reports
    assert remote["rewritten_shards"], "the history left shards to rewrite"
    for key in ("kept_versions", "deleted_versions", "new_version"):
        assert remote[key] == local[key], key
    assert len(remote["rewritten_shards"]) == len(local["rewritten_shards"])
    assert len(remote["deleted_shards"]) == len(local["deleted_shards"])
    for key in ("kept_versions", "deleted_versions", "new_version", "rewritten_shards"):
        assert planned[key] == remote[key], key
    assert planned["deleted_shards"] == remote["deleted_shards"]
    assert stored_in_bucket(bucket) == before
    assert all_objects(bucket) == named_by_versions(bucket)
    code, out, err = cli(["versions", URL, "--json"], capsys)
    assert [v["version"] for v in json.loads(out)] == [3]
    code, out, err = cli(["audit", URL], capsys)
    assert code == 0, out + err

    # a writer uploading version 4 now, and what a compaction killed after removing
    # version 2's record left
    bucket.pipe("published/out/shards/v000004-0badcafe-00000.npy", b"in flight")
    bucket.pipe("published/out/versions/v000002/manifest.arrow", b"left behind")
    code, out, err = cli(["compact", URL, "--json", "--grace", "0"], capsys)
    assert code == 0, err
    assert json.loads(out)["deleted_shards"] == []
    leftovers = all_objects(bucket) - named_by_versions(bucket)
    assert leftovers == {"published/out/shards/v000004-0badcafe-00000.npy"}
    code, _, err = cli(["inspect", URL, "--version", "1"], capsys)
    assert code != 0 and len(err.strip().splitlines()) == 1, err


def test_a_version_compacted_away_is_never_published_again(
    bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Writer A packs version 1. Before it puts its record, writer B publishes versions 1
    and 2, and a compaction retires version 1 (its record removed). A's put would now
    succeed: A must see the later version and stop, publishing nothing."""
    config, other, other_config = two_writers(tmp_path)
    step = publishing.relocated
    b_done: list[bool] = []

    def b_publishes_and_compacts_first(*args: Any) -> Any:
        if not b_done:
            b_done.append(True)
            with monkeypatch.context() as m:
                m.setenv("ETL_CACHE", str(other / "cache"))
                m.setattr(publishing, "relocated", step)
                assert pipeline.run(load_config(other_config)).version == 1
                change_sources(other / "data")
                assert pipeline.run(load_config(other_config)).version == 2
                assert cli(["compact", URL, "--grace", "0"], capsys)[0] == 0
        return step(*args)

    monkeypatch.setattr(publishing, "relocated", b_publishes_and_compacts_first)
    code, out, err = cli(["run", str(config)], capsys)
    assert code == 2, out + err
    assert "another writer published version 1" in err
    monkeypatch.setattr(publishing, "relocated", step)
    code, out, err = cli(["versions", URL, "--json"], capsys)
    assert [v["version"] for v in json.loads(out)] == [2]
    assert all_objects(bucket) == named_by_versions(bucket)


def test_audit_repair_of_a_bucket_publishes_the_repaired_version(
    bucket: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pixel byte flipped in a shard in the bucket: `etl audit s3://... --repair` publishes
    a version whose samples are the ones packed (read back with s3fs, pyarrow and numpy
    alone), and the audit after it is clean; nothing is left that no version names."""
    make_sample_data(tmp_path / "data", per_class=3, seed=7)
    config = write_config(tmp_path, URL)
    assert pipeline.run(load_config(config)).committed
    packed = stored_in_bucket(bucket)
    shard = sorted(p for p in all_objects(bucket) if p.endswith(".npy"))[0]
    data = bytearray(bucket.cat(shard))
    data[-2] ^= 0x5A  # a pixel of the shard's last row
    bucket.pipe(shard, bytes(data))
    assert stored_in_bucket(bucket) != packed

    code, out, err = cli(["audit", URL, "--json"], capsys)
    assert code != 0, "the damage is found"
    code, out, err = cli(["audit", URL, "--repair", "--config", str(config), "--json"], capsys)
    assert code == 0, out + err
    result = json.loads(out)
    assert result["repair"]["version"] == 2 and result["repair"]["after"]["version"] == 2
    assert stored_in_bucket(bucket) == packed
    assert all_objects(bucket) == named_by_versions(bucket)
    shards = {p.removeprefix("published/out/") for p in all_objects(bucket) if p.endswith(".npy")}
    assert all(TAGGED_SHARD.match(name) for name in shards)
    code, out, err = cli(["audit", URL], capsys)
    assert code == 0, out + err


@pytest.mark.slow
def test_any_damage_to_the_attempt_file_is_ignored_never_trusted(
    bucket: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The attempt file as a fuzzer meets it (#38): a real one, a byte set, cut short or
    extended at drawn places; the next run exits 0 without a traceback, removes it, and the
    published version keeps every object."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    make_sample_data(tmp_path / "data", per_class=3, seed=7)
    config = write_config(tmp_path, URL)
    assert pipeline.run(load_config(config)).version == 1
    published = all_objects(bucket)
    work = to_store.work_folder(to_store.StoreDataset(URL))
    writer = json.loads(_records(bucket)[0])["files_at"].rsplit("-", 1)[1]
    real = json.dumps({"version": 2, "writer": writer}).encode()

    @settings(
        max_examples=40,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        how=st.sampled_from(["set", "truncate", "extend"]),
        at=st.integers(0, len(real) - 1),
        value=st.integers(0, 255),
    )
    def one(how: str, at: int, value: int) -> None:
        body = bytearray(real)
        if how == "set":
            body[at] = value
        elif how == "truncate":
            del body[at:]
        else:
            body += bytes([value]) * (1 + at)
        (work / publishing.ATTEMPT_FILE).write_bytes(bytes(body))
        code, _, err = cli(["run", str(config)], capsys)
        assert code == 0 and "Traceback" not in err, (bytes(body), err)
        assert all_objects(bucket) == published, bytes(body)
        assert not (work / publishing.ATTEMPT_FILE).exists()

    one()


@pytest.mark.slow
def test_a_folder_in_a_bucket_packed_into_a_bucket_converges_as_on_disk(
    bucket: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's end-to-end case: images in a bucket packed into a bucket; a rerun after one
    object is added, one changed and one deleted in the store packs those two and drops the
    third; the audit is clean; each time the bucket holds what packing the same files from
    local disk holds."""
    make_sample_data(tmp_path / "data", per_class=3, seed=7)
    bucket.put(str(tmp_path / "data"), "published/photos", recursive=True)
    to_disk = write_config(tmp_path, "disk", "disk.yaml")
    to_bucket = tmp_path / "bucket.yaml"
    to_bucket.write_text(
        CONFIG.format(out=URL).replace("path: data", "path: s3://published/photos")
    )

    def same_as_disk() -> None:
        assert pipeline.run(load_config(to_disk)).committed
        assert stored_in_bucket(bucket) == packed_contents(tmp_path / "disk")
        assert all_objects(bucket) - named_by_versions(bucket) == {
            p for p in all_objects(bucket) if p.startswith("published/photos/")
        }

    code, out, err = cli(["run", str(to_bucket)], capsys)
    assert code == 0, err
    same_as_disk()
    change_sources(tmp_path / "data")  # on disk, then the same in the store
    bucket.rm("published/photos", recursive=True)
    bucket.put(str(tmp_path / "data"), "published/photos", recursive=True)
    report = pipeline.run(load_config(to_bucket))
    assert (report.version, report.packed_new, report.plan_counts["deleted"]) == (2, 2, 1)
    same_as_disk()
    code, out, err = cli(["audit", URL], capsys)
    assert code == 0, out + err


@pytest.mark.slow
def test_a_store_reached_only_through_the_config_is_run_repaired_and_compacted_through_it(
    bucket: Any,
    endpoint: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The endpoint and keys are in `output.storage_options` alone, the environment points at
    a closed port: a run, `etl audit --repair --config`, `etl compact --config` all reach the
    store through the config (one source, `OutputConfig.store`), and no key is printed."""
    make_sample_data(tmp_path / "data", per_class=3, seed=7)
    secret = "not-the-default-secret-4d1f"
    options = {"endpoint_url": endpoint, "key": "testing", "secret": secret}
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        CONFIG.format(out=URL).replace(
            "samples_per_shard: 5}",
            f"samples_per_shard: 5, storage_options: {json.dumps(options)}, store_timeout: 20}}",
        )
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    s3fs.S3FileSystem.clear_instance_cache()
    code, out, err = cli(["run", str(config)], capsys)
    assert code == 0, out + err
    packed = stored_in_bucket(bucket)
    shard = sorted(p for p in all_objects(bucket) if p.endswith(".npy"))[0]
    data = bytearray(bucket.cat(shard))
    data[-2] ^= 0x5A
    bucket.pipe(shard, bytes(data))

    code, out, err = cli(["audit", URL], capsys)
    assert code == 2 and "127.0.0.1:9" in err, "without the config: the environment's store"
    code, out, err = cli(["audit", URL, "--repair", "--config", str(config), "--json"], capsys)
    assert code == 0, out + err
    assert json.loads(out)["repair"]["after"]["version"] == 2
    assert stored_in_bucket(bucket) == packed
    code, out2, err2 = cli(
        ["compact", URL, "--config", str(config), "--json", "--grace", "0"], capsys
    )
    assert code == 0, err2
    assert json.loads(out2)["new_version"] is None and json.loads(out2)["deleted_versions"] == [1]
    assert all_objects(bucket) == named_by_versions(bucket)
    assert secret not in out + err + out2 + err2


LATE = 4.0
"""Seconds the fault proxy holds a PUT before it forwards it: past the run's store_timeout."""


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("key", "fault"),
    [
        ("commit.json", "late-once"),
        ("commit.json", "late"),
        (".npy", "late-once"),
        ("manifest.arrow", "late"),
    ],
)
def test_a_put_the_store_answers_late_but_lands_never_publishes_a_version_without_its_files(
    bucket: Any,
    endpoint: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    key: str,
    fault: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A store that holds a PUT past store_timeout and then acts on it (the fault proxy
    forwards it late): the run ends published or with one named error; once every late put
    has landed, each version the store holds names only objects it has; and one rerun
    converges on the version a run never disturbed packs."""
    make_sample_data(tmp_path / "data", per_class=3, seed=7)
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        CONFIG.format(out=URL).replace(
            "samples_per_shard: 5}", "samples_per_shard: 5, store_timeout: 1.5}"
        )
    )
    with faulty_proxy(endpoint, {key: fault}, delay=LATE) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
        s3fs.S3FileSystem.clear_instance_cache()
        code, out, err = cli(["run", str(config)], capsys)
        assert code in (0, 2), out + err
        if code:
            errors = [line for line in err.splitlines() if line.startswith("error:")]
            # the call that ran out of time names its object, or the dataset itself: on two
            # busy cores a listing can pass the 1.5 s too ("s3://published/out: cannot list")
            assert len(errors) == 1 and "published/out" in errors[0], err
        time.sleep(LATE + 1)  # every put the proxy held has been forwarded and acted on
    bucket.invalidate_cache()
    if _records(bucket):
        assert named_by_versions(bucket) <= all_objects(bucket), "a version names a lost file"
    if code == 0 or (key, fault) == ("commit.json", "late"):
        assert [json.loads(r)["version"] for r in _records(bucket)] == [1]

    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    s3fs.S3FileSystem.clear_instance_cache()
    config.write_text(CONFIG.format(out=URL))  # the rerun meets a healthy store: no 1.5 s limit
    code, out, err = cli(["run", str(config)], capsys)
    assert code == 0, out + err
    assert [json.loads(r)["version"] for r in _records(bucket)] == [1]
    assert all_objects(bucket) == named_by_versions(bucket)
    disk = write_config(tmp_path, "disk", "disk.yaml")
    pipeline.run(load_config(disk))
    assert stored_in_bucket(bucket) == packed_contents(tmp_path / "disk")
    code, out, err = cli(["audit", URL], capsys)
    assert code == 0, out + err


@pytest.mark.parametrize("after", ["compact", "run"])
def test_a_retired_version_in_a_bucket_stays_whole_for_its_grace_then_goes(
    bucket: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    after: str,
) -> None:
    """NOTE [ a grace period ] in a store: `etl compact --grace 1h` retires the old versions
    (a record each beside them, nothing removed): no longer listed, still whole, a pinned open
    warns and reads them as packed; the first compaction, or run, after the grace removes
    their objects and records, leaving only what the kept version names."""
    from etl.format import retirement
    from loaders import PackedDataset

    make_sample_data(tmp_path / "data", per_class=5, seed=11)
    config = write_config(tmp_path, URL)
    assert pipeline.run(load_config(config)).version == 1
    first = stored_in_bucket(bucket)
    change_sources(tmp_path / "data")
    assert pipeline.run(load_config(config)).version == 2
    code, out, err = cli(["compact", URL, "--grace", "1h", "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["deleted_versions"] == [] and report["deleted_shards"] == []
    retired = report["retired_versions"]
    assert 1 in retired and set(retired) | set(report["kept_versions"]) >= {1, 2}
    code, out, err = cli(["versions", URL, "--json"], capsys)
    assert [v["version"] for v in json.loads(out)] == report["kept_versions"]
    records = {f"published/out/versions/retired/v{v:06d}.json" for v in retired}
    assert all_objects(bucket) - named_by_versions(bucket) == records
    with pytest.warns(RuntimeWarning, match="version 1 was retired"):
        old = PackedDataset.open(URL, version=1, store=StoreOptions(cache_dir=tmp_path / "c2"))
    assert len(old) == len(first[0])

    code, out, err = cli(["run", str(config)], capsys)  # within the grace: nothing goes
    assert code == 0, err
    assert all_objects(bucket) - named_by_versions(bucket) == records

    later = time.time() + 3601
    monkeypatch.setattr(retirement.time, "time", lambda: later)
    if after == "compact":
        code, out, err = cli(["compact", URL, "--grace", "1h", "--json"], capsys)
        assert code == 0, err
        assert json.loads(out)["deleted_versions"] == retired
    else:
        code, out, err = cli(["run", str(config), "--json"], capsys)
        assert code == 0, err
        assert json.loads(out)["committed"] is False
    assert all_objects(bucket) == named_by_versions(bucket)
    code, out, err = cli(["audit", URL], capsys)
    assert code == 0, out + err
    assert [json.loads(r)["version"] for r in _records(bucket)] == report["kept_versions"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_bucket_run_killed_at_twenty_random_points_converges_on_rerun(
    bucket: Any, endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """kill -9 of `etl run` to a bucket at 20 drawn moments (listing, packing, uploading,
    putting the record, sweeping), one new picture each time: after one rerun the latest
    version passes `etl audit`, the store holds no object that no version names, and no
    picture is packed twice (an unchanged one keeps its shard and row)."""
    rng = np.random.default_rng(20261128)
    make_sample_data(tmp_path / "data", per_class=3, seed=7)
    config = write_config(tmp_path, URL)
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint}
    started = time.monotonic()
    writer = run_etl(["run", str(config)], env, tmp_path)
    assert writer.wait(120) == 0, writer.communicate()
    whole = time.monotonic() - started  # what an undisturbed run takes, start-up included
    placed = _placed(bucket)
    for attempt in range(20):
        picture = rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)
        Image.fromarray(picture).save(tmp_path / "data" / "circle" / f"new_{attempt}.png")
        writer = run_etl(["run", str(config)], env, tmp_path)
        time.sleep(float(rng.uniform(0.2, whole)))
        writer.kill()
        writer.wait(30)
        code, out, err = cli(["run", str(config)], capsys)
        assert code == 0, (attempt, out + err)
        code, out, err = cli(["audit", URL], capsys)
        assert code == 0, (attempt, out + err)
        assert all_objects(bucket) == named_by_versions(bucket), attempt
        now = _placed(bucket)
        assert f"circle/new_{attempt}.png" in now
        moved = {s for s, where in placed.items() if now.get(s) != where}
        assert not moved, f"attempt {attempt}: packed again: {sorted(moved)[:3]}"
        placed = now


def _placed(fs: Any, prefix: str = "published/out") -> dict[str, tuple[str, int]]:
    """Each source of the latest version in the bucket: its shard and row."""
    fs.invalidate_cache()
    versions = sorted(
        p.rsplit("/", 1)[1] for p in fs.ls(f"{prefix}/versions") if re.search(r"/v\d{6}$", p)
    )
    record = json.loads(fs.cat(f"{prefix}/versions/{versions[-1]}/commit.json"))
    body = fs.cat(f"{prefix}/versions/{record['files_at']}/manifest.arrow")
    rows = pa.ipc.open_file(pa.BufferReader(body)).read_all().to_pylist()
    return {r["source"]: (r["shard"], r["row"]) for r in rows}


STORE_FAULTS = [
    (".npy", "reset-once"),
    (".npy", "short-once"),
    (".npy", "throttle-2"),
    (".npy", "deny"),
    (".arrow", "oversend"),
    ("commit.json", "late-once"),
    ("commit.json", "deny"),
]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("operation", ["compact", "repair"])
@pytest.mark.parametrize(("key", "fault"), STORE_FAULTS)
def test_compaction_and_repair_under_store_faults_end_whole_or_named(
    bucket: Any,
    endpoint: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    operation: str,
    key: str,
    fault: str,
) -> None:
    """`etl compact` (retiring version 1, grace 0) and `etl audit --repair` (a damaged shard
    of version 2) through the fault proxy, the store reached through the config alone: each
    ends in success or one named error, never a published version missing a file; once the
    store behaves, the same command converges: audit clean, nothing no version names."""
    make_sample_data(tmp_path / "data", per_class=3, seed=7)
    direct = write_config(tmp_path, URL)
    assert pipeline.run(load_config(direct)).version == 1
    change_sources(tmp_path / "data")
    assert pipeline.run(load_config(direct)).version == 2
    if operation == "repair":
        shard = sorted(p for p in all_objects(bucket) if p.endswith(".npy"))[-1]
        damaged = bytearray(bucket.cat(shard))
        damaged[-2] ^= 0x5A
        bucket.pipe(shard, bytes(damaged))
    command = {
        "compact": ["compact", URL, "--grace", "0", "--json"],
        "repair": ["audit", URL, "--repair", "--json"],
    }[operation]
    with faulty_proxy(endpoint, {key: fault}, delay=LATE) as proxy:
        options = {"endpoint_url": proxy, "key": "testing", "secret": "testing"}
        faulty = tmp_path / "faulty.yaml"
        faulty.write_text(
            CONFIG.format(out=URL).replace(
                "samples_per_shard: 5}",
                f"samples_per_shard: 5, storage_options: {json.dumps(options)}, store_timeout: 3}}",
            )
        )
        code, out, err = cli([*command, "--config", str(faulty)], capsys)
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 0 or (code == 2 and len(errors) == 1), (code, out, err)
    time.sleep(LATE)  # a put the proxy held has landed by now
    missing = named_by_versions(bucket) - all_objects(bucket)
    assert not missing, f"a published version lacks {sorted(missing)}"

    code, out, err = cli([*command, "--config", str(direct)], capsys)
    assert code == 0, out + err
    code, out, err = cli(["audit", URL], capsys)
    assert code == 0, out + err
    assert all_objects(bucket) == named_by_versions(bucket)
