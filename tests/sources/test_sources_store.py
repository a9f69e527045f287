"""A folder source in object storage: `source.path: s3://bucket/prefix` on a real S3-compatible
server (moto's, started here on 127.0.0.1; endpoint and credentials from the environment, as a
user sets them). What a run packs from the bucket must be what it packs from the same files on
local disk, and a rerun must see objects added, changed and deleted by their metadata."""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageOps

from etl.cli import main
from etl.config import load_config
from etl.errors import ConfigError, SourceError
from etl.run import pipeline
from etl.sources import in_store
from tests.helpers.stores import (
    faulty_proxy,
    packed_contents,
    point_at,
    silent_endpoint,
)

s3fs = pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

CONFIG = """\
source: {{kind: folder, path: {source}, split: {{val: 0.25}}, max_file_bytes: 20000}}
stages:
  - decode: {{}}
  - resize: {{size: [16, 16]}}
output: {{dir: {out}, samples_per_shard: 5}}
run: {{n_jobs: 2, backend: threading}}
"""


@pytest.fixture
def store(endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Any:
    """A new bucket, with the environment pointing at the server (no other address is used)."""
    point_at(endpoint, monkeypatch)
    import boto3

    bucket = f"b{abs(hash(request.node.nodeid)) % 10**10}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.bucket = bucket
    return fs


def picture(seed: int, fmt: str = "PNG") -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (20 + seed % 7, 24, 3), dtype=np.uint8)).save(buffer, fmt)
    return buffer.getvalue()


def tree(seeds: dict[str, int]) -> dict[str, bytes]:
    return {
        name: picture(seed, "JPEG" if name.endswith(".jpg") else "PNG")
        for name, seed in seeds.items()
    }


FILES = {
    **{f"cat/{i}.png": i for i in range(5)},
    **{f"dog/{i}.jpg": 10 + i for i in range(4)},
    "loose.png": 30,  # outside any class folder: a reject
}


def put(fs: Any, prefix: str, files: dict[str, bytes], local: Path) -> None:
    for name, data in files.items():
        fs.pipe(f"{fs.bucket}/{prefix}/{name}", data)
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(data)


def run(tmp_path: Path, source: str | Path, out: Path) -> Any:
    config = tmp_path / f"{out.name}.yaml"
    config.write_text(CONFIG.format(source=source, out=out))
    return pipeline.run(load_config(config))


def test_a_folder_in_a_bucket_packs_as_the_same_folder_on_disk(
    store: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = tree(FILES)
    files["dog/big.png"] = Image.new("RGB", (300, 300)).tobytes()[:30000]  # over max_file_bytes
    files[".hidden/x.png"] = picture(40)
    put(store, "photos", files, tmp_path / "local")
    remote = run(tmp_path, f"s3://{store.bucket}/photos", tmp_path / "from-bucket")
    local = run(tmp_path, tmp_path / "local", tmp_path / "from-disk")
    assert remote.packed_new == local.packed_new == 9
    got, rejects = packed_contents(tmp_path / "from-bucket")
    assert (got, rejects) == packed_contents(tmp_path / "from-disk")
    assert rejects == {"loose.png": "no_class", "dog/big.png": "file_too_large"}
    assert {name.split("/")[0] for name in got} == {"cat", "dog"}
    # the audit re-reads every source from the bucket and finds them as packed, then a changed one
    config = str(tmp_path / "from-bucket.yaml")
    with pytest.raises(SystemExit) as clean:
        main(["audit", str(tmp_path / "from-bucket"), "--config", config, "--jobs", "1"])
    assert clean.value.code == 0
    store.pipe(f"{store.bucket}/photos/cat/3.png", picture(99))
    capsys.readouterr()
    with pytest.raises(SystemExit) as found:
        main(["audit", str(tmp_path / "from-bucket"), "--config", config, "--jobs", "1", "--json"])
    assert found.value.code == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [(f["kind"], f["source"]) for f in findings] == [("source_changed", "cat/3.png")]


def test_every_object_under_the_prefix_is_accounted_for_even_one_no_path_can_name(
    store: Any, tmp_path: Path
) -> None:
    """Keys with a '..', a '.' or an empty segment (a store takes any key): each a reject
    naming it, never packed, never left out silently; the rest packs as ever, and dot-named
    keys are skipped as dot-named files are."""
    import boto3

    files = tree({"cat/0.png": 1, "cat/1.png": 2, "dog/0.png": 3})
    odd = {
        "cat/../dog/evil.png": 4,
        "cat/./twice.png": 5,
        "cat//gap.png": 6,
        "/rooted.png": 7,
        "cat/..": 8,
    }
    client = boto3.client("s3")
    for name, data in {**files, **tree(odd), ".hidden/x.png": picture(9)}.items():
        client.put_object(Bucket=store.bucket, Key=f"photos/{name}", Body=data)
    report = run(tmp_path, f"s3://{store.bucket}/photos", tmp_path / "out")
    assert report.packed_new == 3
    got, rejects = packed_contents(tmp_path / "out")
    assert set(got) == set(files)
    assert rejects == dict.fromkeys(odd, "unnameable_key")


def test_a_rerun_sees_objects_added_changed_and_deleted(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Objects whose size, time and ETag are unchanged are not read again (no hash), as files
    whose stat is unchanged; the ones that changed are hashed and packed."""
    hashed: list[str] = []
    real = in_store.object_digest

    def counted(url: str, *args: Any) -> str:
        hashed.append(url.rsplit("/photos/", 1)[1])
        return real(url, *args)

    monkeypatch.setattr(in_store, "object_digest", counted)  # the run's threads call it here
    put(store, "photos", tree(FILES), tmp_path / "local")
    url = f"s3://{store.bucket}/photos"
    first = run(tmp_path, url, tmp_path / "out")
    assert first.packed_new == 9 and len(hashed) == 9
    hashed.clear()
    again = run(tmp_path, url, tmp_path / "out")
    assert again.packed_new == 0 and not again.committed and hashed == []
    store.pipe(f"{store.bucket}/photos/cat/new.png", picture(50))
    store.pipe(f"{store.bucket}/photos/dog/1.jpg", picture(51, "JPEG"))  # new bytes, same key
    store.rm(f"{store.bucket}/photos/cat/0.png")
    third = run(tmp_path, url, tmp_path / "out")
    assert sorted(hashed) == ["cat/new.png", "dog/1.jpg"]
    assert third.committed and third.packed_new == 2, third.plan_counts
    assert dict(third.plan_counts) == {
        "new": 1,
        "changed": 1,
        "deleted": 1,
        "unchanged": 7,
        "rejected": 1,  # loose.png, rejected again without being read
    }
    samples, _ = packed_contents(tmp_path / "out")
    assert "cat/0.png" not in samples and "cat/new.png" in samples and len(samples) == 9


def test_a_prefix_with_no_object_is_one_clear_error(store: Any, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=rf"s3://{store.bucket}/nothing holds no object"):
        run(tmp_path, f"s3://{store.bucket}/nothing", tmp_path / "out")
    assert not (tmp_path / "out").exists(), "a refused source leaves no output folder"


def test_a_store_that_never_answers_stops_the_run_in_bounded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An endpoint that accepts connections and never answers: the run's first call to it
    gives up after `io_timeout` with one error naming the source, and creates nothing."""
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        CONFIG.format(source="s3://bucket/photos", out=tmp_path / "out").replace(
            "max_file_bytes: 20000", "max_file_bytes: 20000, io_timeout: 1"
        )
    )
    with silent_endpoint() as silent:
        monkeypatch.setenv("AWS_ENDPOINT_URL", silent)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        s3fs.S3FileSystem.clear_instance_cache()  # the endpoint is read when one is made
        started = time.monotonic()
        try:
            with pytest.raises(SourceError, match=r"s3://bucket/photos.*no answer in 1 s"):
                pipeline.run(load_config(config))
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
        assert time.monotonic() - started < 30
    assert not (tmp_path / "out").exists()


SECRET = "s3cr3t-never-written-5b1f"


@pytest.mark.slow
def test_storage_options_in_the_config_reach_every_worker_and_are_never_written(
    endpoint: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No endpoint or credentials in the environment: `source.storage_options` alone reach the
    store, in the listing, in worker processes (backend loky) and in the audit; the secret is
    in no file the run writes and in nothing it prints."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    options = {
        "endpoint_url": endpoint,
        "key": "testing",
        "secret": SECRET,
        "client_kwargs": {"region_name": "us-east-1"},
    }
    import boto3

    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    ).create_bucket(Bucket="with-options")
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    fs.bucket = "with-options"
    put(fs, "photos", tree(FILES), tmp_path / "local")
    source = f"s3://{fs.bucket}/photos"
    config = tmp_path / "remote.yaml"
    config.write_text(
        CONFIG.format(source=source, out=tmp_path / "from-bucket")
        .replace("max_file_bytes: 20000}", f"storage_options: {json.dumps(options)}}}")
        .replace("backend: threading", "backend: loky")
    )
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["run", str(config), "--json"])
    printed = capsys.readouterr()
    assert done.value.code == 0, printed.err
    assert json.loads(printed.out)["packed_new"] == 9
    local = run(tmp_path, tmp_path / "local", tmp_path / "from-disk")
    assert local.packed_new == 9
    assert packed_contents(tmp_path / "from-bucket") == packed_contents(tmp_path / "from-disk")
    with pytest.raises(SystemExit) as audited:
        main(["audit", str(tmp_path / "from-bucket"), "--config", str(config), "--json"])
    printed_too = capsys.readouterr()
    assert audited.value.code == 0, printed_too.out
    assert json.loads(printed_too.out)["sources"]["checked"] == 9
    for path in (tmp_path / "from-bucket").rglob("*"):
        assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in printed.out + printed.err + printed_too.out + printed_too.err
    assert SECRET not in repr(load_config(config))
    # without them the store cannot be reached: one error naming the prefix
    config.write_text(config.read_text().replace(f"storage_options: {json.dumps(options)}", ""))
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(SourceError, match=re.escape(f"source.path: cannot reach {source}")):
        pipeline.run(load_config(config))


def test_storage_options_on_a_local_path_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "local.yaml"
    config.write_text(
        CONFIG.format(source=tmp_path, out=tmp_path / "out").replace(
            "max_file_bytes: 20000}", "storage_options: {anon: true}}"
        )
    )
    with pytest.raises(ConfigError, match=r"storage_options are for a source\.path in object"):
        load_config(config)


def tar_of(members: dict[str, bytes], mode: str = "w") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def samples_of(seeds: range, label: bytes) -> dict[str, bytes]:
    members = {}
    for seed in seeds:
        members[f"s{seed}.png"] = picture(seed)
        members[f"s{seed}.cls"] = label
    return members


CONTAINERS = """\
source: {{kind: {kind}, path: {source}, files: {files}, split: {{val: 0.25}}}}
stages:
  - decode: {{}}
  - resize: {{size: [16, 16]}}
output: {{dir: {out}, samples_per_shard: 5}}
run: {{n_jobs: 2, backend: loky}}
"""


def run_container(tmp_path: Path, kind: str, source: str | Path, files: str, out: str) -> Any:
    config = tmp_path / f"{out}.yaml"
    config.write_text(CONTAINERS.format(kind=kind, source=source, files=files, out=tmp_path / out))
    return pipeline.run(load_config(config))


def bucket_and_disk(
    store: Any, tmp_path: Path, kind: str, files: dict[str, bytes], globs: str
) -> tuple[str, int, Any]:
    """`files` put under a prefix and in a folder, each packed as `kind` with `globs`: the
    prefix's URL, how many samples both packed, and the bucket's contents (equal to the
    folder's)."""
    put(store, kind, files, tmp_path / f"local-{kind}")
    url = f"s3://{store.bucket}/{kind}"
    remote = run_container(tmp_path, kind, url, globs, f"{kind}-bucket")
    local = run_container(tmp_path, kind, tmp_path / f"local-{kind}", globs, f"{kind}-disk")
    assert remote.packed_new == local.packed_new
    found = packed_contents(tmp_path / f"{kind}-bucket")
    assert found == packed_contents(tmp_path / f"{kind}-disk")
    return url, remote.packed_new, found


def test_tar_shards_and_tables_in_a_bucket_pack_as_the_same_files_on_disk(
    store: Any, tmp_path: Path
) -> None:
    """WebDataset shards (plain, gzip, in a sub-prefix, cut short, not a tar) and Parquet and
    Arrow tables under a prefix: the same samples, pixels and rejects as from local disk, the
    files matched by the same globs; a rerun finds nothing new; a glob that matches nothing is
    one error naming the prefix."""
    whole = tar_of(samples_of(range(3), b"0"))
    shards = {
        "a.tar": tar_of(samples_of(range(10, 14), b"1")),
        "more/b.tar": tar_of(samples_of(range(20, 23), b"2")),
        "c.tar.gz": tar_of(samples_of(range(30, 33), b"0"), "w:gz"),
        "cut.tar": whole[: whole.index(b"s2.png") + 512 + 100],
        "foreign.tar": b"not a tar" * 100,
        ".hidden.tar": tar_of(samples_of(range(40, 41), b"1")),
    }
    globs = '["**/*.tar", "*.tar.gz"]'
    url, packed, (got, rejects) = bucket_and_disk(store, tmp_path, "webdataset", shards, globs)
    assert packed == 12
    assert rejects == {
        "cut.tar": "truncated",
        "cut.tar/s2": "truncated",
        "foreign.tar": "unreadable",
    }
    decoded = Image.open(io.BytesIO(picture(21))).convert("RGB")
    pixels = np.asarray(ImageOps.fit(decoded, (16, 16), Image.Resampling.BILINEAR))
    assert got["more/b.tar/s21"][2] == pixels.tobytes()
    again = run_container(tmp_path, "webdataset", url, globs, "webdataset-bucket")
    assert again.packed_new == 0 and not again.committed
    out, config = tmp_path / "webdataset-bucket", str(tmp_path / "webdataset-bucket.yaml")
    with pytest.raises(SystemExit) as audited:  # the audit lists the shards in the bucket again
        main(["audit", str(out), "--config", config, "--jobs", "1"])
    assert audited.value.code == 0
    store.pipe(f"{url}/more/b.tar", tar_of(samples_of(range(60, 63), b"2")))
    with pytest.raises(SystemExit) as changed:
        main(["audit", str(out), "--config", config, "--jobs", "1"])
    assert changed.value.code == 1

    table = pa.table(
        {
            "image": [picture(50 + i) for i in range(4)],
            "label": [i % 2 for i in range(4)],
        }
    )
    data = io.BytesIO()
    pq.write_table(table, data)
    arrow = io.BytesIO()
    with pa.ipc.new_file(arrow, table.schema) as writer:
        writer.write_table(table.slice(0, 2))
    tables = {"t/one.parquet": data.getvalue(), "t/two.arrow": arrow.getvalue()}
    globs = '["t/*.parquet", "t/*.arrow"]'
    url, packed, _ = bucket_and_disk(store, tmp_path, "parquet", tables, globs)
    assert packed == 6

    with pytest.raises(SourceError, match=re.escape(f"'*.zip' matches nothing in {url}")):
        run_container(tmp_path, "parquet", url, '["*.zip"]', "none")


LISTING = """\
source: {{kind: listing, path: {source}, split: {{val: 0.25}}, max_file_bytes: 20000}}
stages:
  - decode: {{}}
  - resize: {{size: [16, 16]}}
output: {{dir: {out}, samples_per_shard: 5}}
run: {{n_jobs: 2, backend: threading}}
"""


def run_listing(tmp_path: Path, source: str | Path, out: str) -> Any:
    config = tmp_path / f"{out}.yaml"
    config.write_text(LISTING.format(source=source, out=tmp_path / out))
    return pipeline.run(load_config(config))


def test_a_listing_in_a_bucket_packs_as_the_same_listing_on_disk(
    store: Any, tmp_path: Path
) -> None:
    """A CSV in a bucket naming objects under its prefix: missing objects, paths out of the
    prefix, rows without a label and an object over max_file_bytes are the same rejects as on
    disk; a rerun reads nothing again; a changed object is packed again."""
    files = tree({f"img/{i}.png": i for i in range(6)})
    files["img/big.png"] = Image.new("RGB", (300, 300)).tobytes()[:30000]
    rows = [f"img/{i}.png,{'cat' if i % 2 else 'dog'}" for i in range(6)]
    rows[5] = "img/5.png,"  # no label
    rows += ["img/gone.png,cat", "../outside.png,cat", "img/big.png,dog"]
    files["lists/train.csv"] = ("path,label\n" + "\n".join(rows) + "\n").encode()
    put(store, "data", files, tmp_path / "local")
    # the listing names paths relative to its own folder: lists/ holds a copy of img/
    for name, data in list(files.items()):
        if name.startswith("img/"):
            store.pipe(f"{store.bucket}/data/lists/{name}", data)
            (tmp_path / "local" / "lists" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "local" / "lists" / name).write_bytes(data)
    url = f"s3://{store.bucket}/data/lists/train.csv"
    remote = run_listing(tmp_path, url, "list-bucket")
    local = run_listing(tmp_path, tmp_path / "local" / "lists" / "train.csv", "list-disk")
    assert remote.packed_new == local.packed_new == 5
    got, rejects = packed_contents(tmp_path / "list-bucket")
    assert (got, rejects) == packed_contents(tmp_path / "list-disk")
    assert sorted(rejects.values()) == sorted(
        ["missing", "outside_root", "unknown_label", "file_too_large"]
    )
    hashed: list[str] = []
    real = in_store.object_digest

    def counted(url: str, *args: Any) -> str:
        hashed.append(url.rsplit("/lists/", 1)[1])
        return real(url, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(in_store, "object_digest", counted)
        again = run_listing(tmp_path, url, "list-bucket")
        assert again.packed_new == 0 and not again.committed and hashed == []
        store.pipe(f"{store.bucket}/data/lists/img/0.png", picture(77))
        changed = run_listing(tmp_path, url, "list-bucket")
    assert hashed == ["img/0.png"]
    assert changed.committed and changed.packed_new == 1
    config = str(tmp_path / "list-bucket.yaml")  # the audit re-hashes the objects it lists
    with pytest.raises(SystemExit) as audited:
        main(["audit", str(tmp_path / "list-bucket"), "--config", config, "--jobs", "1"])
    assert audited.value.code == 0
    with pytest.raises(SourceError, match="is not an object in the store"):
        run_listing(tmp_path, f"s3://{store.bucket}/data/lists/nope.csv", "none")


@pytest.mark.slow
def test_objects_the_store_refuses_or_cuts_short_are_rejects_naming_them(
    store: Any, endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a proxy that throttles one object forever, denies another, cuts a third's body
    short (its length header still whole) and serves half of a fourth as if whole: each is a
    reject naming it, never a stored sample and never a hang; the rest packs as from disk,
    a fifth object throttled twice included (the driver retries, with backoff)."""
    files = tree({f"cat/{i}.png": i for i in range(4)} | {f"dog/{i}.png": 10 + i for i in range(4)})
    put(store, "photos", files, tmp_path / "local")
    faults = {
        "/cat/1.png": "throttle",
        "/dog/2.png": "deny",
        "/dog/3.png": "short",
        "/dog/1.png": "shortened",
        "/cat/2.png": "throttle-2",
    }
    config = tmp_path / "faulty.yaml"
    config.write_text(
        CONFIG.format(source=f"s3://{store.bucket}/photos", out=tmp_path / "out").replace(
            "max_file_bytes: 20000", "max_file_bytes: 20000, io_timeout: 5"
        )
    )
    with faulty_proxy(endpoint, faults) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
        s3fs.S3FileSystem.clear_instance_cache()
        started = time.monotonic()
        try:
            report = pipeline.run(load_config(config))
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
        assert time.monotonic() - started < 120
    assert report.packed_new == 4
    got, rejects = packed_contents(tmp_path / "out")
    assert set(rejects) == {"cat/1.png", "dog/1.png", "dog/2.png", "dog/3.png"}
    assert set(rejects.values()) <= {"io_error", "io_timeout"}, rejects
    local = run(tmp_path, tmp_path / "local", tmp_path / "from-disk")
    assert local.packed_new == 8
    on_disk, _ = packed_contents(tmp_path / "from-disk")
    assert got == {source: on_disk[source] for source in got}
    assert "cat/2.png" in got, "a throttle that clears is retried through"


def test_each_object_is_read_once_and_a_full_disk_falls_back_to_reading_twice(
    store: Any, endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted at a proxy: a first run GETs each object once (hashed and kept on the scratch
    disk, then packed from there: `etl.sources.kept`), and packs what it packs from disk; a
    rerun with nothing changed GETs none. Where the scratch disk has no room to spare, nothing
    is kept and each packed object is read twice, with the same result."""
    files = tree({f"cat/{i}.png": i for i in range(5)} | {f"dog/{i}.jpg": 10 + i for i in range(4)})
    put(store, "photos", files, tmp_path / "local")
    run(tmp_path, tmp_path / "local", tmp_path / "from-disk")
    expected, _ = packed_contents(tmp_path / "from-disk")

    def counted(out: Path) -> Counter[str]:
        seen: list[str] = []
        with faulty_proxy(endpoint, {}, seen=seen) as proxy:
            monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
            s3fs.S3FileSystem.clear_instance_cache()
            try:
                run(tmp_path, f"s3://{store.bucket}/photos", out)
            finally:
                s3fs.S3FileSystem.clear_instance_cache()
        return Counter(request for request in seen if request.startswith("GET "))

    first = counted(tmp_path / "once")
    assert first == Counter({f"GET /{store.bucket}/photos/{name}": 1 for name in files})
    assert (
        packed_contents(tmp_path / "once")[0]
        == expected
        == {k: v for k, v in expected.items() if k in files}
    )
    assert counted(tmp_path / "once") == Counter()  # nothing changed: nothing read
    assert not list((tmp_path / "once" / "versions").glob(".tmp-*")), "the kept copies are gone"
    monkeypatch.setattr("etl.sources.kept.MIN_FREE_BYTES", 1 << 62)  # a disk with no room
    twice = counted(tmp_path / "twice")
    assert twice == Counter({f"GET /{store.bucket}/photos/{name}": 2 for name in files})
    assert packed_contents(tmp_path / "twice")[0] == expected


def test_a_container_the_store_serves_short_is_never_read_as_whole(
    store: Any, endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tar or table read from a bucket (`in_store.open_object`) ends in an error naming the
    object when the store serves fewer bytes than it lists: a tar cut at a member boundary
    would otherwise read as a shorter, valid shard."""
    data = tar_of(samples_of(range(4), b"0"))
    store.pipe(f"{store.bucket}/shards/a.tar", data)
    url = f"s3://{store.bucket}/shards/a.tar"
    with in_store.open_object(url) as whole:
        assert whole.read() == data
    with faulty_proxy(endpoint, {"/shards/a.tar": "shortened"}) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
        s3fs.S3FileSystem.clear_instance_cache()
        try:
            with (
                pytest.raises(OSError, match=re.escape(f"{url}: the store sent")),
                in_store.open_object(url) as short,
            ):
                short.read()
        finally:
            s3fs.S3FileSystem.clear_instance_cache()


def test_a_listing_streams_page_by_page_each_page_within_its_time(
    store: Any, endpoint: str
) -> None:
    """NOTE [ a listing in pages ]: 2,300 objects are three pages of the store's listing.
    The keys of the first page come before the second is asked for; a page the store never
    answers is named within that page's time limit, after the first page was delivered; a
    page throttled twice, then answered, loses nothing."""
    from tests.helpers.stores import client_options

    names = [f"photos/c{i % 7}/{i:05d}.png" for i in range(2300)]
    store.pipe({f"{store.bucket}/{name}": b"x" for name in names})
    url = f"s3://{store.bucket}/photos"
    with faulty_proxy(endpoint, {"?continuation-token": "stall"}) as proxy:
        got = []
        started = time.monotonic()
        with pytest.raises(SourceError, match=rf"cannot list {url} .*page of the listing took"):
            for key, size, _, _ in in_store.list_objects(url, client_options(proxy), 2.0):
                got.append(key)
                assert size == 1
        assert len(got) == 1000, "the first page is handed on before the next one is asked"
        assert time.monotonic() - started < 30
    with faulty_proxy(endpoint, {"?continuation-token": "throttle-2"}) as proxy:
        listed = [key for key, *_ in in_store.list_objects(url, client_options(proxy), 10.0)]
    assert sorted(listed) == sorted(name.removeprefix("photos/") for name in names)
