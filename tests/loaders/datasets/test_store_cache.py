"""Training from object storage through a cache smaller than the dataset (`cache_limit`), on a
real S3-compatible server (moto's, on 127.0.0.1): every sample once per epoch with the pixels
it was packed with, and the cache folder never over its limit, measured from outside by a
thread that sums the sizes of its files while the loaders run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

from etl.errors import ShardError
from etl.storage.location import StoreOptions
from etl.storage.store import StoreDataset
from loaders import PackedDataset, PackedStream, make_loader, stream_loader
from tests.helpers.packed import Packed, make_packed
from tests.helpers.stores import client_options, new_bucket, uploaded

s3fs = pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

SHAPE = (16, 16, 3)  # 768 bytes a sample
SHARDS = (10, 12, 9, 11, 10, 8, 12, 10)  # 82 samples, shards of 6-9 KiB


options = client_options


@pytest.fixture
def dataset(endpoint: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Packed, str]:
    """A packed dataset uploaded to a new bucket, and its URL."""
    packed = make_packed(tmp_path / "ds", shard_sizes=SHARDS, sample_shape=SHAPE)
    return packed, uploaded(packed.root, endpoint, f"c{abs(hash(request.node.nodeid)) % 10**10}")


def limited(url: str, endpoint: str, cache: Path, limit: int | str) -> PackedDataset:
    """The dataset at `url`, read through a cache folder `cache` of at most `limit` bytes."""
    return PackedDataset.open(
        url,
        store=StoreOptions(cache_dir=cache, storage_options=options(endpoint), cache_limit=limit),
    )


def shard_bytes(packed: Packed) -> list[int]:
    return [p.stat().st_size for p in sorted((packed.root / "shards").glob("*.npy"))]


@contextmanager
def watched(folder: Path) -> Iterator[list[int]]:
    """The largest number of bytes of shard files (whole or partial) seen in `folder`,
    polled every millisecond while the block runs."""
    peak = [0]
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            total = 0
            for entry in os.scandir(folder) if folder.is_dir() else []:
                if entry.name.endswith(".npy") or entry.name.startswith(".tmp-"):
                    with suppress(FileNotFoundError):  # removed since the listing
                        total += entry.stat().st_size
            peak[0] = max(peak[0], total)
            stop.wait(0.001)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()


def read_epoch(loader: Any) -> list[tuple[int, bytes]]:
    return [
        (int(i), image.numpy().tobytes())
        for batch in loader
        for image, i in zip(batch.images, batch.indices, strict=True)
    ]


def two_epochs_within(loader: Any, ds: Any, packed: Packed, folder: Path, limit: int) -> None:
    """Two epochs of `loader`: each sample once with its packed pixels, and the cache
    `folder` never over `limit` bytes."""
    with watched(folder) as peak:
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            seen = read_epoch(loader)
            assert sorted(i for i, _ in seen) == list(range(len(ds)))
            for i, pixels in seen:
                assert pixels == packed.images[ds.selection.positions[i]].tobytes()
    assert 0 < peak[0] <= limit, (peak[0], limit)


@pytest.mark.parametrize("workers", [0, 2])
def test_epochs_through_a_cache_smaller_than_the_dataset(
    dataset: tuple[Packed, str], endpoint: str, tmp_path: Path, workers: int
) -> None:
    packed, url = dataset
    sizes = shard_bytes(packed)
    limit = sum(sizes) * 6 // 10
    cache = tmp_path / "cache"
    ds = limited(url, endpoint, cache, limit)
    folder = StoreDataset(url, cache, options(endpoint)).root / "shards"
    assert not list(folder.glob("*.npy")) if folder.is_dir() else True  # nothing at open
    loader = make_loader(
        ds,
        batch_size=4,
        shuffle="shards",
        seed=3,
        num_workers=workers,
        workers_as="processes",
        with_indices=True,
    )
    two_epochs_within(loader, ds, packed, folder, limit)


def test_a_limit_smaller_than_one_shard_is_one_clear_error(
    dataset: tuple[Packed, str], endpoint: str, tmp_path: Path
) -> None:
    packed, url = dataset
    with pytest.raises(ShardError, match="cache_limit 100 bytes is smaller than one shard"):
        PackedDataset.open(
            url,
            store=StoreOptions(
                cache_dir=tmp_path / "c", storage_options=options(endpoint), cache_limit=100
            ),
        )
    with pytest.raises(ValueError, match="cache_limit is for a dataset in object storage"):
        PackedDataset.open(packed.root, store=StoreOptions(cache_limit="1MiB"))


def rank(rank: int, url: str, endpoint: str, cache: str, limit: int, port: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        ds = PackedDataset.open(
            url,
            store=StoreOptions(
                cache_dir=cache, storage_options=options(endpoint), cache_limit=limit
            ),
        )
        loader = make_loader(
            ds,
            batch_size=3,
            shuffle="shards",
            seed=5,
            num_workers=2,
            workers_as="processes",
            with_indices=True,
        )
        seen = {}
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            seen[epoch] = [(i, pixels.hex()) for i, pixels in read_epoch(loader)]
        gathered: list[object] = [None, None]
        dist.all_gather_object(gathered, seen)
        if rank == 0:
            Path(out).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_share_one_cache_smaller_than_the_dataset(
    dataset: tuple[Packed, str], endpoint: str, tmp_path: Path
) -> None:
    """Two gloo ranks with two workers each, one cache folder at 60% of the dataset: each
    sample once per epoch across the ranks (DistributedSampler's padding aside), the packed
    pixels, and the folder never over the limit."""
    from tests.loaders.order.test_distributed import free_port

    packed, url = dataset
    limit = sum(shard_bytes(packed)) * 6 // 10
    cache, out = tmp_path / "cache", tmp_path / "seen.json"
    folder = StoreDataset(url, cache, options(endpoint)).root / "shards"
    n = len(packed.images)
    args = (url, endpoint, str(cache), limit, free_port(), str(out))
    with watched(folder) as peak:
        mp.spawn(rank, args=args, nprocs=2)
    ranks = json.loads(out.read_text())
    positions = PackedDataset.open(packed.root).selection.positions
    for epoch in ("0", "1"):
        both = [(i, pixels) for seen in ranks for i, pixels in seen[epoch]]
        assert {i for i, _ in both} == set(range(n))
        assert len(both) == 2 * -(-n // 2)  # equal parts, padded
        for i, pixels in both:
            assert bytes.fromhex(pixels) == packed.images[positions[i]].tobytes()
    assert 0 < peak[0] <= limit, (peak[0], limit)


def test_shards_are_fetched_ahead_in_the_loaders_order(
    dataset: tuple[Packed, str], endpoint: str, tmp_path: Path
) -> None:
    """While the training loop works on its first batch, the shards of the next batches
    arrive in the cache without being asked for by a read."""
    packed, url = dataset
    limit = sum(shard_bytes(packed)) * 6 // 10
    cache = tmp_path / "cache"
    ds = limited(url, endpoint, cache, limit)
    loader = make_loader(ds, batch_size=2, shuffle="shards", seed=3)
    loader.set_epoch(0)
    order = loader.order.order()
    batches = [set(ds.selection.shard_idx[order[i : i + 2]].tolist()) for i in (2, 4)]
    folder = StoreDataset(url, cache, options(endpoint)).root / "shards"
    names = ds.selection.shards.names
    batches_ahead = [{Path(names[s]).name for s in batch} for batch in batches]
    iterator = iter(loader)
    next(iterator)  # the first batch: read; the second is not asked for yet
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        cached = {p.name for p in folder.glob("*.npy")}
        if batches_ahead[0] <= cached:
            break
        time.sleep(0.01)
    assert batches_ahead[0] <= cached, (batches_ahead, cached)
    rest = list(iterator)
    assert len(rest) == -(-len(ds) // 2) - 1


def test_what_a_killed_download_left_does_not_count_against_the_limit(
    dataset: tuple[Packed, str], endpoint: str, tmp_path: Path
) -> None:
    """A `.tmp-` file of a process that died (its pid free) is removed when room is made: it
    would otherwise count as a download under way for ever, and shrink the cache."""
    packed, url = dataset
    limit = sum(shard_bytes(packed)) * 6 // 10
    cache = tmp_path / "cache"
    ds = limited(url, endpoint, cache, limit)
    folder = StoreDataset(url, cache, options(endpoint)).root / "shards"
    folder.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = folder / f".tmp-{Path(ds.selection.shards.names[0]).name}-{dead.pid}"
    stale.write_bytes(b"\0" * limit)  # as large as the whole limit
    os.utime(stale, (time.time() - 3600, time.time() - 3600))  # killed an hour ago
    loader = make_loader(ds, batch_size=2, shuffle="shards", seed=3, with_indices=True)
    seen = read_epoch(loader)
    assert sorted(i for i, _ in seen) == list(range(len(ds)))
    assert not stale.exists()


def test_a_shard_changed_in_the_store_is_a_named_error_when_its_batch_comes(
    dataset: tuple[Packed, str], endpoint: str, tmp_path: Path
) -> None:
    packed, url = dataset
    fs = s3fs.S3FileSystem(**options(endpoint))
    shard = PackedDataset.open(packed.root).selection.shards.names[3]
    key = f"{url.removeprefix('s3://')}/{shard}"
    data = bytearray(fs.cat(key))
    data[-1] ^= 0xFF  # one pixel byte, after the commit
    fs.pipe(key, bytes(data))
    limit = sum(shard_bytes(packed)) * 6 // 10
    cache = tmp_path / "cache"
    ds = limited(url, endpoint, cache, limit)
    with pytest.raises(ShardError, match=rf"{shard}.*changed after the commit") as raised:
        read_epoch(make_loader(ds, batch_size=2, shuffle="shards", seed=3, with_indices=True))
    assert f"repair: etl audit {url} --repair" in str(raised.value)
    folder = StoreDataset(url, cache, options(endpoint)).root / "shards"
    assert not (folder / Path(shard).name).exists() and not list(folder.glob(".tmp-*"))


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_the_stream_reads_through_a_cache_smaller_than_the_dataset(
    dataset: tuple[Packed, str], endpoint: str, tmp_path: Path, workers: int
) -> None:
    """The stream form: every sample once per epoch with its packed pixels, the cache never
    over its limit, and the shards of later batches fetched ahead of the reads."""
    packed, url = dataset
    sizes = shard_bytes(packed)
    limit = sum(sizes) * 6 // 10
    cache = tmp_path / "cache"
    ds = limited(url, endpoint, cache, limit)
    stream = PackedStream(ds.selection, batch_size=4, seed=3, window=2)
    loader = stream_loader(stream, num_workers=workers, with_indices=True)
    folder = StoreDataset(url, cache, options(endpoint)).root / "shards"
    two_epochs_within(loader, ds, packed, folder, limit)
    # a cold cache with room for the next window (fetch-ahead leaves a batch's worth free)
    cache = tmp_path / "cold"
    folder = StoreDataset(url, cache, options(endpoint)).root / "shards"
    ds = limited(url, endpoint, cache, sum(sizes))
    loader = stream_loader(
        PackedStream(ds.selection, batch_size=4, seed=3, window=1),
        num_workers=workers,
        with_indices=True,
    )
    loader.set_epoch(2)
    upcoming = [
        {Path(ds.selection.shards.names[s]).name for s in ds.selection.shard_idx[chunk]}
        for chunk in loader.dataset.delivery()
    ]
    iterator = iter(loader)
    next(iterator)
    ahead = next(names for names in upcoming[1:] if names - upcoming[0])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not ahead <= {p.name for p in folder.glob("*.npy")}:
        time.sleep(0.01)
    assert ahead <= {p.name for p in folder.glob("*.npy")}, "fetched before it was read"
    del iterator


def test_a_resumed_epoch_through_a_cache_smaller_than_the_dataset(
    dataset: tuple[Packed, str], endpoint: str, tmp_path: Path
) -> None:
    """A state saved mid-epoch, loaded by a new process's loader on a cold cache (another
    cache folder): the rest of the epoch is what the first run had still to read, in order."""
    packed, url = dataset
    limit = sum(shard_bytes(packed)) * 6 // 10

    def loader_in(cache: Path) -> Any:
        ds = limited(url, endpoint, cache, limit)
        return make_loader(
            ds,
            batch_size=4,
            shuffle="shards",
            seed=7,
            num_workers=2,
            workers_as="processes",
            with_indices=True,
        )

    whole_run = loader_in(tmp_path / "whole")
    whole_run.set_epoch(1)
    whole = read_epoch(whole_run)
    first = loader_in(tmp_path / "first")
    first.set_epoch(1)
    iterator = iter(first)
    seen = [
        (int(i), image.numpy().tobytes())
        for batch in (next(iterator) for _ in range(6))
        for image, i in zip(batch.images, batch.indices, strict=True)
    ]
    state = json.loads(json.dumps(first.state_dict()))
    del iterator
    second = loader_in(tmp_path / "second")
    second.load_state_dict(state)
    second.set_epoch(1)
    assert seen + read_epoch(second) == whole


FULL_DISK = """
import json, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize}))
from etl.errors import EtlError
from etl.storage.location import StoreOptions
from loaders import PackedDataset, make_loader
try:
    options = StoreOptions(
        cache_dir={cache!r}, storage_options=json.loads({options!r}), cache_limit={limit!r}
    )
    ds = PackedDataset.open({url!r}, store=options)
    for _ in make_loader(ds, batch_size=4, shuffle="shards"):
        pass
except EtlError as exc:
    print(exc)
    sys.exit(3)
"""


@pytest.mark.slow
@pytest.mark.parametrize("limit", [None, "1MiB"])
def test_a_full_cache_disk_is_one_clear_error(
    endpoint: str, tmp_path: Path, limit: str | None
) -> None:
    """A cache disk that cannot take a shard (here a file-size limit, EFBIG, as a full disk's
    ENOSPC) stops the loader with one line naming the cache folder and the way out; no
    partial download is left to count against the cache."""
    new_bucket(endpoint, "fulldisk")
    packed = make_packed(tmp_path / "ds", shard_sizes=(4, 4), sample_shape=(64, 64, 3))
    s3fs.S3FileSystem(**options(endpoint)).put(str(packed.root), "fulldisk/ds", recursive=True)
    url, cache = "s3://fulldisk/ds", tmp_path / "cache"
    script = FULL_DISK.format(
        fsize=min(shard_bytes(packed)) // 2,  # above the manifest files, below a shard
        url=url,
        cache=str(cache),
        options=json.dumps(options(endpoint)),
        limit=limit,
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stdout + done.stderr
    (line,) = done.stdout.strip().splitlines()
    folder = StoreDataset(url, cache, options(endpoint)).root / "shards"
    assert "the cache disk is full" in line and str(folder) in line, line
    assert not list(folder.glob(".tmp-*")) and not list(folder.glob("*.npy"))


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "fault",
    ["reset", "reset-once", "short-once", "oversend", "swap", "throttle-2", "throttle", "deny"],
)
def test_a_store_that_breaks_a_shard_s_download_never_leaves_an_unverified_byte(
    dataset: tuple[Packed, str], endpoint: str, tmp_path: Path, fault: str
) -> None:
    """Training through a bounded cache while the store resets, cuts short, oversends,
    serves another shard's bytes, throttles or denies one shard's GET (the fault proxy): a
    fault that clears is retried and the epoch ends whole with the packed pixels; any other
    ends in one error naming that shard; either way every shard in the cache is byte for
    byte the packed one and no partial file is left."""
    from etl.errors import EtlError
    from tests.helpers.stores import faulty_proxy

    packed, url = dataset
    names = PackedDataset.open(packed.root).selection.shards.names
    broken, other = names[3], names[0]
    how = f"swap:{other}" if fault == "swap" else fault
    cache = tmp_path / "cache"
    limit = sum(shard_bytes(packed)) * 6 // 10
    with faulty_proxy(endpoint, {broken: how}) as proxy:
        ds = limited(url, proxy, cache, limit)
        loader = make_loader(ds, batch_size=4, shuffle="shards", seed=3, with_indices=True)
        try:
            seen = read_epoch(loader)
        except EtlError as exc:
            assert fault not in ("throttle-2", "reset-once", "short-once"), f"not retried: {exc}"
            assert broken in str(exc) and "\n" not in str(exc), exc
        else:
            assert fault in ("throttle-2", "reset-once", "short-once"), "a broken store believed"
            assert sorted(i for i, _ in seen) == list(range(len(ds)))
            for i, pixels in seen:
                assert pixels == packed.images[ds.selection.positions[i]].tobytes()
    folder = StoreDataset(url, cache, options(proxy)).root / "shards"
    assert not list(folder.glob(".tmp-*"))
    for cached in folder.glob("*.npy"):
        assert cached.read_bytes() == (packed.root / "shards" / cached.name).read_bytes()
