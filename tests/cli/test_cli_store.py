"""The read-only commands on a dataset in object storage (`etl inspect`, `show`, `versions`,
`diff` given `s3://bucket/ds`), on a real S3-compatible server (moto's, on 127.0.0.1): the
same answers as on the same dataset on local disk, shards fetched into the cache and verified,
and a shard changed in the store one clear error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from etl.config import load_config
from etl.format.manifest import read_manifest
from etl.run import pipeline
from etl.start.sample_data import make_sample_data
from tests.helpers.cli import cli
from tests.helpers.stores import point_at

s3fs = pytest.importorskip("s3fs")
pytest.importorskip("moto.server")


@pytest.fixture
def bucket(endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    point_at(endpoint, monkeypatch, tmp_path / "cache")
    import boto3

    boto3.client("s3").create_bucket(Bucket="datasets")
    return s3fs.S3FileSystem(skip_instance_cache=True)


def two_versions(tmp_path: Path) -> Path:
    """A dataset with two versions: the sample data, then one more class folder."""
    make_sample_data(tmp_path / "data", per_class=4, seed=5)
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        "source: {kind: folder, path: data, split: {val: 0.25}}\n"
        "stages: [{decode: {mode: RGB}}, {resize: {size: [16, 16]}}]\n"
        "output: {dir: out, samples_per_shard: 5}\n"
        "run: {n_jobs: 1}\n"
    )
    assert pipeline.run(load_config(config)).committed
    extra = tmp_path / "data" / "extra"
    extra.mkdir()
    for picture in sorted((tmp_path / "data").glob("circle/*.png"))[:2]:
        (extra / picture.name).write_bytes(picture.read_bytes()[:-1] + b"\0")  # new bytes
    assert pipeline.run(load_config(config)).version == 2
    return tmp_path / "out"


def test_read_only_commands_on_a_bucket_answer_as_on_disk(
    bucket: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local = two_versions(tmp_path)
    bucket.put(str(local), "datasets/out", recursive=True)  # the same name: the same titles
    url = "s3://datasets/out"
    commands = (["versions", "{}"], ["diff", "{}", "1", "2"], ["inspect", "{}", "--version", "1"])
    for command in commands:
        answers = []
        for where in (str(local), url):
            code, out, err = cli([a.format(where) for a in command] + ["--json"], capsys)
            assert code == 0, err
            answers.append(json.loads(out))
        if command[0] == "inspect":
            assert answers[1].pop("root") == url and answers[0].pop("root") == str(local)
            assert answers[1]["versions"] == [1, 2]
        assert answers[0] == answers[1], command
    # a contact sheet: shards fetched into the cache, verified, drawn as from disk
    sheets = []
    for where, name in ((str(local), "local.png"), (url, "remote.png")):
        code, out, err = cli(
            ["show", where, "-n", "6", "--seed", "3", "--json", "--out", str(tmp_path / name)],
            capsys,
        )
        assert code == 0, err
        sheets.append(json.loads(out))
    assert (
        sheets[0] == {**sheets[1], "out": sheets[0]["out"]}
        or sheets[0]["cells"] == sheets[1]["cells"]
    )
    assert (tmp_path / "local.png").read_bytes() == (tmp_path / "remote.png").read_bytes()
    cached = list((tmp_path / "cache").rglob("shards/*.npy"))
    assert cached, "the shards the sheet drew are in the cache"


def test_the_report_of_a_bucket_is_the_report_of_the_same_folder(
    bucket: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`etl report s3://...`: both versions fetched, the shards its thumbnails draw from
    verified into the cache, the same page as from disk but for where the dataset is."""
    local = two_versions(tmp_path)
    # a key of its own: the bucket outlives a test, and fsspec's put onto an existing folder
    # nests the copy inside it
    bucket.put(str(local), "datasets/report/out", recursive=True)
    pages = []
    for where, name in ((str(local), "local.html"), ("s3://datasets/report/out", "remote.html")):
        code, _, err = cli(["report", where, "-o", str(tmp_path / name), "-q"], capsys)
        assert code == 0, err
        pages.append((tmp_path / name).read_text().replace(where, "DATASET"))
    assert pages[0] == pages[1]
    assert pages[0].count("data:image/jpeg;base64,") >= 12  # the grid and the changes
    assert "first version" in pages[0] and "(since v1)" in pages[0]


def test_a_shard_changed_in_the_store_is_one_clear_error(
    bucket: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local = two_versions(tmp_path)
    bucket.put(str(local), "datasets/damaged", recursive=True)
    shard = sorted(bucket.find("datasets/damaged/shards"))[0]
    data = bytearray(bucket.cat(shard))
    data[-1] ^= 0xFF
    bucket.pipe(shard, bytes(data))
    code, _, err = cli(["show", "s3://datasets/damaged", "-n", "40"], capsys)
    assert code != 0
    (line,) = err.strip().splitlines()
    assert line.startswith("error: s3://datasets/damaged/shards/"), line
    assert "its bytes in the store are not the ones the manifest recorded" in line
    cached = {p.name for p in (tmp_path / "cache").rglob("shards/*")}
    assert Path(shard).name not in cached, "the damaged shard is never cached"
    assert not [name for name in cached if name.startswith(".tmp-")]


def findings(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    return sorted((f["kind"], f["shard"], f["sample_id"]) for f in report["findings"])


@pytest.mark.slow
def test_audit_of_a_bucket_finds_what_a_local_audit_finds(
    bucket: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`etl audit s3://...` checks the bytes the store serves now, in a scratch copy removed
    afterwards: clean, then one flipped byte found as a local audit of the same damage finds
    it (the same shard, the same sample), and repaired with --repair."""
    local = two_versions(tmp_path)
    bucket.put(str(local), "datasets/audited", recursive=True)
    url = "s3://datasets/audited"
    code, out, err = cli(["audit", url, "--json"], capsys)
    assert code == 0, out + err
    clean = json.loads(out)
    manifest = read_manifest(local)
    code, out, err = cli(["audit", url, "--version", "1", "--json"], capsys)
    assert code == 0, out + err
    assert {k: json.loads(out)[k] for k in ("version", "latest")} == {"version": 1, "latest": 2}
    assert clean["dataset"] == url and clean["version"] == 2
    assert clean["shards"] == {
        "total": manifest.shards.num_rows,
        "hashed": manifest.shards.num_rows,
    }
    assert clean["samples"]["verified"] == manifest.samples.num_rows
    shard = manifest.shards.column("shard")[0].as_py()
    data = bytearray((local / shard).read_bytes())
    data[-3] ^= 0x5A  # a pixel of the last row
    (local / shard).write_bytes(bytes(data))
    bucket.pipe(f"datasets/audited/{shard}", bytes(data))
    reports = []
    for where in (str(local), url):
        code, out, _ = cli(["audit", where, "--json"], capsys)
        assert code == 1
        reports.append(json.loads(out))
    assert findings(reports[0]) == findings(reports[1])
    assert {kind for kind, _, _ in findings(reports[1])} >= {"shard_checksum", "sample_checksum"}
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".audit-")] == []
    # a dataset copied into the bucket (not published by `etl run`) is repaired all the same
    code, out, err = cli(
        ["audit", url, "--repair", "--config", str(tmp_path / "pipeline.yaml"), "--json"], capsys
    )
    assert code == 0, out + err
    assert json.loads(out)["repair"]["after"]["version"] == 3


def test_audit_of_a_store_that_sends_too_much_names_the_shard(
    bucket: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`etl audit s3://...` of a shard the store serves 10x of: its copy is cut one byte past
    the recorded size (never the whole object), and the audit names that shard's size."""
    local = two_versions(tmp_path)
    bucket.put(str(local), "datasets/long", recursive=True)
    manifest = read_manifest(local)
    shard, size = (manifest.shards.column(c)[0].as_py() for c in ("shard", "bytes"))
    bucket.pipe(f"datasets/long/{shard}", (local / shard).read_bytes() * 10)
    code, out, err = cli(["audit", "s3://datasets/long", "--json"], capsys)
    assert code == 1, out + err
    named = [f for f in json.loads(out)["findings"] if f["shard"] == shard and not f["sample_id"]]
    assert any(str(size) in f["message"] and str(size + 1) in f["message"] for f in named), named
