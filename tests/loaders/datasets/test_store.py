"""Training from object storage: a packed dataset in a bucket of a real S3-compatible server
(moto's server mode, started here on 127.0.0.1), opened through a local cache. What comes out
is compared with the arrays the dataset was packed from, not with another read of ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from etl.errors import ManifestError, ShardError
from etl.storage.location import StoreOptions
from etl.storage.store import RECORD_BYTES, StoreDataset
from loaders import PackedDataset, PackedStream, View, make_loader, stream_loader
from tests.helpers.packed import Packed, make_packed
from tests.helpers.stores import new_bucket, silent_endpoint

s3fs = pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")


def options(endpoint: str) -> dict[str, Any]:
    """Credentials and endpoint as a user passes them: nothing is read from the environment,
    and no request leaves 127.0.0.1."""
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }


@pytest.fixture
def bucket(endpoint: str, request: pytest.FixtureRequest) -> str:
    """A new, empty bucket for one test."""
    name = f"b{abs(hash(request.node.nodeid)) % 10**10}"
    new_bucket(endpoint, name)
    return name


def upload(packed: Packed, endpoint: str, url: str) -> Any:
    fs = s3fs.S3FileSystem(**options(endpoint))
    fs.put(str(packed.root), url.removeprefix("s3://"), recursive=True)
    return fs


def assert_same_samples(ds: PackedDataset, packed: Packed) -> None:
    positions = ds.selection.positions
    assert len(ds) == len(positions) > 0
    for i in range(len(ds)):
        image, label = ds[i]
        np.testing.assert_array_equal(image.numpy(), packed.images[positions[i]])
        assert label == packed.labels[positions[i]]


def test_a_dataset_in_a_bucket_reads_as_packed(endpoint: str, bucket: str, tmp_path: Path) -> None:
    packed = make_packed(tmp_path / "ds", shard_sizes=(13, 8, 21))
    url = f"s3://{bucket}/datasets/ds"
    upload(packed, endpoint, url)
    cache = tmp_path / "cache"
    ds = PackedDataset.open(
        url, store=StoreOptions(cache_dir=cache, storage_options=options(endpoint))
    )
    assert_same_samples(ds, packed)
    seen = sorted(
        int(i)
        for _, _, indices in make_loader(
            ds, batch_size=5, num_workers=2, workers_as="processes", with_indices=True
        )
        for i in indices
    )
    assert seen == list(range(len(ds)))
    mirror = StoreDataset(url, cache, options(endpoint)).root
    assert sorted(p.name for p in (mirror / "shards").glob("*.npy")) == sorted(
        Path(name).name for name in ds.selection.shards.names
    )
    assert not list(mirror.rglob(".tmp-*")), "no partial download is left behind"


def test_only_the_shards_a_selection_reads_are_fetched(
    endpoint: str, bucket: str, tmp_path: Path
) -> None:
    packed = make_packed(
        tmp_path / "ds", shard_sizes=(10, 10, 10), split_of=lambda i: "val" if i < 10 else "train"
    )
    url = f"s3://{bucket}/ds"
    upload(packed, endpoint, url)
    cache = tmp_path / "cache"
    ds = PackedDataset.open(
        url, split="val", store=StoreOptions(cache_dir=cache, storage_options=options(endpoint))
    )
    assert_same_samples(ds, packed)
    fetched = list((StoreDataset(url, cache, options(endpoint)).root / "shards").glob("*.npy"))
    assert len(fetched) == len(set(ds.selection.shards.names)) == 1
    # a view of it, by its URL: the same shard, none other
    view = View(url, split="val").narrowed(where="row % 2 = 0")
    ds = PackedDataset.open(
        view, store=StoreOptions(cache_dir=cache, storage_options=options(endpoint))
    )
    assert list(ds.selection.positions) == [i for i in range(10) if i % 2 == 0]
    assert_same_samples(ds, packed)
    assert (
        list((StoreDataset(url, cache, options(endpoint)).root / "shards").glob("*.npy")) == fetched
    )


def test_a_second_open_reads_nothing_from_the_store(
    endpoint: str, bucket: str, tmp_path: Path
) -> None:
    packed = make_packed(tmp_path / "ds")
    url = f"s3://{bucket}/ds"
    fs = upload(packed, endpoint, url)
    cache = tmp_path / "cache"
    PackedDataset.open(
        url, version=1, store=StoreOptions(cache_dir=cache, storage_options=options(endpoint))
    )
    fs.rm(url.removeprefix("s3://"), recursive=True)  # the store no longer has a byte of it
    again = PackedDataset.open(
        url, version=1, store=StoreOptions(cache_dir=cache, storage_options=options(endpoint))
    )
    assert_same_samples(again, packed)


def test_a_shard_changed_in_the_store_is_a_named_error_and_is_not_cached(
    endpoint: str, bucket: str, tmp_path: Path
) -> None:
    packed = make_packed(tmp_path / "ds", shard_sizes=(6, 7))
    url = f"s3://{bucket}/ds"
    fs = upload(packed, endpoint, url)
    shard = PackedDataset.open(packed.root).selection.shards.names[1]
    data = bytearray(fs.cat(f"{bucket}/ds/{shard}"))
    data[-1] ^= 0xFF  # one pixel byte, after the commit
    fs.pipe(f"{bucket}/ds/{shard}", bytes(data))
    cache = tmp_path / "cache"
    with pytest.raises(ShardError, match=rf"{shard}.*changed after the commit"):
        PackedDataset.open(
            url, store=StoreOptions(cache_dir=cache, storage_options=options(endpoint))
        )
    mirror = StoreDataset(url, cache, options(endpoint)).root
    assert not (mirror / shard).exists() and not list(mirror.rglob(".tmp-*"))


def test_what_a_killed_download_left_is_never_trusted(
    endpoint: str, bucket: str, tmp_path: Path
) -> None:
    """A process killed mid-download leaves `.tmp-` files; the next open ignores them and
    fetches the real bytes."""
    packed = make_packed(tmp_path / "ds", shard_sizes=(6, 7))
    url = f"s3://{bucket}/ds"
    upload(packed, endpoint, url)
    cache = tmp_path / "cache"
    mirror = StoreDataset(url, cache, options(endpoint)).root
    names = PackedDataset.open(packed.root).selection.shards.names
    (mirror / "shards").mkdir(parents=True)
    for name in names:  # half-written downloads of every shard, by a process now gone
        (mirror / f"shards/.tmp-{Path(name).name}-99999").write_bytes(b"\x93NUMPY garbage")
    staging = mirror / "versions" / ".tmp-v000001-99999"
    staging.mkdir(parents=True)
    (staging / "manifest.arrow").write_bytes(b"half")
    ds = PackedDataset.open(
        url, store=StoreOptions(cache_dir=cache, storage_options=options(endpoint))
    )
    assert_same_samples(ds, packed)


def test_bad_locations_are_one_clear_error(endpoint: str, bucket: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(ManifestError, match="no manifest version found"):
        PackedDataset.open(
            f"s3://{bucket}/nothing-here",
            store=StoreOptions(cache_dir=cache, storage_options=options(endpoint)),
        )
    packed = make_packed(tmp_path / "ds")
    url = f"s3://{bucket}/ds"
    upload(packed, endpoint, url)
    with pytest.raises(ManifestError, match=r"v000007/commit\.json: not in the store"):
        PackedDataset.open(
            url, version=7, store=StoreOptions(cache_dir=cache, storage_options=options(endpoint))
        )


@pytest.mark.slow
def test_processes_of_one_node_share_the_cache(endpoint: str, bucket: str, tmp_path: Path) -> None:
    """Four processes open the same URL with one cache at the same time: each reads every
    sample right, and the cache holds one verified copy of each shard, nothing partial."""
    packed = make_packed(tmp_path / "ds", shard_sizes=(9, 12, 7, 10))
    url = f"s3://{bucket}/ds"
    upload(packed, endpoint, url)
    cache = tmp_path / "cache"
    script = (
        "import json, sys, numpy as np\n"
        "from etl.storage.location import StoreOptions\n"
        "from loaders import PackedDataset\n"
        "url, cache, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])\n"
        "ds = PackedDataset.open(url, store=StoreOptions(cache_dir=cache, storage_options=opts))\n"
        "print(json.dumps([ds[i][0].numpy().tobytes().hex() for i in range(len(ds))]))\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", script, url, str(cache), json.dumps(options(endpoint))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(4)
    ]
    positions = PackedDataset.open(packed.root).selection.positions
    expected = [packed.images[p].tobytes().hex() for p in positions]
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err[-2000:]
        assert json.loads(out) == expected
    mirror = StoreDataset(url, cache, options(endpoint)).root
    assert len(list((mirror / "shards").glob("*.npy"))) == 4
    assert not list(mirror.rglob(".tmp-*"))


@pytest.fixture
def silent_store() -> Iterator[str]:
    with silent_endpoint() as url:
        yield url


@pytest.mark.parametrize("version", [None, 1])
def test_a_store_that_never_answers_is_an_error_in_bounded_time(
    silent_store: str, tmp_path: Path, version: int | None
) -> None:
    """Listing the versions (latest) or fetching the commit record (pinned): each call to the
    store waits at most `store_timeout`, then one error names what was asked for."""
    started = time.monotonic()
    with pytest.raises(ManifestError, match=r"no answer from the store in 1 s"):
        PackedDataset.open(
            "s3://bucket/ds",
            version=version,
            store=StoreOptions(
                cache_dir=tmp_path / "cache", storage_options=options(silent_store), timeout=1
            ),
        )
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (b'{"files": {"../../escape": {}}}', "not a plain file name"),
        (b'{"files": {}}', "lists no files"),
        (b"[" * 100_000, "unreadable commit record"),
        (b"\xff\xfe not json", "unreadable commit record"),
    ],
)
def test_a_hostile_commit_record_in_the_store_is_refused_before_any_download(
    endpoint: str, bucket: str, tmp_path: Path, record: bytes, message: str
) -> None:
    """The record names the files to fetch: one that names a path, names nothing or is no
    JSON is one error, and nothing of the version reaches the cache."""
    packed = make_packed(tmp_path / "ds")
    url = f"s3://{bucket}/ds"
    fs = upload(packed, endpoint, url)
    fs.pipe(f"{bucket}/ds/versions/v000001/commit.json", record)
    cache = tmp_path / "cache"
    with pytest.raises(ManifestError, match=message):
        PackedDataset.open(
            url, version=1, store=StoreOptions(cache_dir=cache, storage_options=options(endpoint))
        )
    mirror = StoreDataset(url, cache, options(endpoint)).root
    assert not (mirror / "versions" / "v000001").exists() and not list(mirror.rglob(".tmp-*"))


def by_index(loader: Any) -> dict[int, np.ndarray]:
    """Every image a loader with indices yields, by dataset index."""
    return {
        int(i): image.numpy() for b in loader for image, i in zip(b.images, b.indices, strict=True)
    }


@pytest.mark.parametrize("workers", [0, 2])
def test_ranged_reads_fetch_no_shard_and_verify_every_row(
    endpoint: str, bucket: str, tmp_path: Path, workers: int
) -> None:
    """`ranged=True`: a quarter of each shard's rows (the val split) read with ranged GETs,
    the packed pixels, and no shard file in the cache. A byte changed in a row the selection
    does not read changes nothing; one in a row it reads is an error naming the shard."""
    packed = make_packed(tmp_path / "ds", shard_sizes=(9, 11, 8, 10))
    url = f"s3://{bucket}/ds"
    fs = upload(packed, endpoint, url)
    cache = tmp_path / "cache"

    def opened() -> PackedDataset:
        return PackedDataset.open(
            url,
            split="val",
            store=StoreOptions(cache_dir=cache, storage_options=options(endpoint), ranged=True),
        )

    ds = opened()
    assert_same_samples(ds, packed)
    loader = make_loader(
        ds,
        batch_size=3,
        shuffle=True,
        num_workers=workers,
        workers_as="processes",
        with_indices=True,
    )
    seen = by_index(loader)
    assert sorted(seen) == list(range(len(ds)))
    for i, image in seen.items():
        np.testing.assert_array_equal(image, packed.images[ds.selection.positions[i]])
    stream = stream_loader(
        PackedStream(ds.selection, batch_size=3, window=2), num_workers=workers, with_indices=True
    )
    streamed = by_index(stream)
    assert sorted(streamed) == list(range(len(ds)))
    for i, image in streamed.items():
        np.testing.assert_array_equal(image, seen[i])
    assert not list(StoreDataset(url, cache, options(endpoint)).root.rglob("*.npy")), (
        "no shard is downloaded"
    )

    key = f"{bucket}/ds/shards/v000001-00000.npy"
    data = bytearray(fs.cat(key))
    row_bytes = packed.images[0].nbytes
    first_row = len(data) - 9 * row_bytes
    data[first_row + 5] ^= 0xFF  # sample 0, a train sample: not read
    fs.pipe(key, bytes(data))
    assert_same_samples(opened(), packed)
    data[first_row + row_bytes + 5] ^= 0xFF  # sample 1, a val sample
    fs.pipe(key, bytes(data))
    with pytest.raises(ShardError, match=r"v000001-00000\.npy: row 1 does not match"):
        list(make_loader(opened(), batch_size=3, num_workers=workers, workers_as="processes"))


def test_ranged_is_for_a_store_and_without_a_cache_limit(
    endpoint: str, bucket: str, tmp_path: Path
) -> None:
    packed = make_packed(tmp_path / "ds")
    with pytest.raises(ValueError, match="ranged is for a dataset in object storage"):
        PackedDataset.open(packed.root, store=StoreOptions(ranged=True))
    with pytest.raises(ValueError, match="give it or cache_limit, not both"):
        PackedDataset.open(f"s3://{bucket}/ds", store=StoreOptions(ranged=True, cache_limit="1GiB"))


@pytest.mark.parametrize("name", ["cache_dir", "storage_options", "store_timeout"])
def test_the_former_store_keywords_still_open_a_bucket_and_warn_once(
    endpoint: str, bucket: str, tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`PackedDataset.open(url, cache_dir=, storage_options=, store_timeout=)`, as before
    `StoreOptions`: the same samples, into the same cache, and one DeprecationWarning naming
    the keyword and its new place, the first time only."""
    import etl.deprecations

    monkeypatch.setattr(etl.deprecations, "_WARNED", set())
    packed = make_packed(tmp_path / "ds", shard_sizes=(5, 7))
    url = f"s3://{bucket}/ds"
    upload(packed, endpoint, url)
    given: dict[str, Any] = {
        "cache_dir": tmp_path / "cache",
        "storage_options": options(endpoint),
        "store_timeout": 30.0,
    }
    expected = f"store=StoreOptions({'timeout' if name == 'store_timeout' else name}=)"
    for attempt in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ds = PackedDataset.open(url, **given)
        said = [str(w.message) for w in caught if f"({name}=)" in str(w.message)]
        assert all(w.category is DeprecationWarning for w in caught)
        if attempt == 0:
            assert said == [f"PackedDataset.open({name}=) is deprecated: use {expected}"]
        else:
            assert said == []  # once per process
        assert_same_samples(ds, packed)
    assert list(
        (StoreDataset(url, tmp_path / "cache", options(endpoint)).root / "shards").glob("*.npy")
    )
    with pytest.raises(TypeError, match="not both"):
        PackedDataset.open(url, store=StoreOptions(), **{name: given[name]})


@pytest.mark.parametrize(("name", "value"), [("cache_limit", "1MiB"), ("ranged", True)])
def test_the_former_cache_keywords_still_decide_and_warn_once(
    packed: Packed, name: str, value: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cache_limit=` and `ranged=` as keywords of their own: a warning naming the new place,
    then the same refusal as `StoreOptions` gives for a local folder."""
    import etl.deprecations

    monkeypatch.setattr(etl.deprecations, "_WARNED", set())
    with (
        pytest.warns(DeprecationWarning, match=rf"open\({name}=\).*StoreOptions\({name}=\)"),
        pytest.raises(ValueError, match=f"{name} is for a dataset in object storage"),
    ):
        PackedDataset.open(packed.root, **{name: value})
    with pytest.raises(TypeError, match="unexpected keyword argument 'cache_size'"):
        PackedDataset.open(packed.root, cache_size=1)


CAPPED = """
import json, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize}))
from etl.errors import EtlError
from etl.storage.location import StoreOptions
from loaders import PackedDataset, make_loader
try:
    options = StoreOptions(cache_dir={cache!r}, storage_options=json.loads({options!r}), **{extra})
    for _ in make_loader(PackedDataset.open({url!r}, store=options), batch_size=4):
        pass
except EtlError as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.parametrize("extra", [{}, {"cache_limit": "64MiB"}])
def test_a_store_that_sends_more_than_recorded_fills_nothing(
    endpoint: str, bucket: str, tmp_path: Path, extra: dict[str, Any]
) -> None:
    """A store that serves 10x the bytes the manifest records for a shard: the download stops
    at the first byte over its recorded size, before it is written (NOTE [ capped downloads ]),
    with or without a cache limit. Independent of our own accounting, the reading process runs
    under a file-size limit a little over the shard's size: had more been written, the write
    would have failed with EFBIG, a different error."""
    packed = make_packed(tmp_path / "ds", shard_sizes=(6, 7))
    url = f"s3://{bucket}/ds"
    fs = upload(packed, endpoint, url)
    shards = PackedDataset.open(packed.root).selection.shards
    shard, size = shards.names[1], shards.sizes[1]
    intact = fs.cat(f"{bucket}/ds/{shard}")
    fs.pipe(f"{bucket}/ds/{shard}", intact * 10)  # the right bytes first, then 9x more
    cache = tmp_path / "cache"
    script = CAPPED.format(
        fsize=max(size, 1 << 20) + (256 << 10), cache=str(cache), url=url,
        options=json.dumps(options(endpoint)), extra=extra,
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == (
        f"ShardError {bucket}/ds/{shard}: the store sends more than the {size} bytes recorded "
        "for it: refused at the first byte over, nothing of it kept"
    ), proc.stdout + proc.stderr[-2000:]
    mirror = StoreDataset(url, cache, options(endpoint)).root
    assert not (mirror / shard).exists() and not list(mirror.rglob(".tmp-*"))


def test_a_version_file_longer_than_its_record_is_refused(
    endpoint: str, bucket: str, tmp_path: Path
) -> None:
    """The version's files are capped at the sizes their commit record states, and the record
    itself at `RECORD_BYTES`: a store serving more is a ManifestError naming the file, and the
    version is not cached."""
    packed = make_packed(tmp_path / "ds", shard_sizes=(6,))
    url = f"s3://{bucket}/ds"
    fs = upload(packed, endpoint, url)
    manifest = f"{bucket}/ds/versions/v000001/manifest.arrow"
    fs.pipe(manifest, fs.cat(manifest) * 10)
    store = StoreOptions(cache_dir=tmp_path / "cache", storage_options=options(endpoint))
    with pytest.raises(ManifestError, match=r"manifest\.arrow: the store sends more than the"):
        PackedDataset.open(url, store=store)
    record = f"{bucket}/ds/versions/v000001/commit.json"
    fs.pipe(record, b" " * (RECORD_BYTES + 1))
    with pytest.raises(ManifestError, match=rf"commit\.json: .* more than the {RECORD_BYTES} "):
        PackedDataset.open(url, store=store)
    mirror = StoreDataset(url, tmp_path / "cache", options(endpoint)).root
    assert not (mirror / "versions" / "v000001").exists() and not list(mirror.rglob(".tmp-*"))
