"""The cache folder is safe to share and safe not to (NOTE [ a cache nobody can poison ]), on a
real S3-compatible server (moto's, on 127.0.0.1): a folder others can write is refused unless
shared on purpose, a symlink is never written through nor trusted, a download is alive while
its lock is held (whatever its name says), the same URL on two endpoints is two mirrors, and a
re-published version is noticed while a pinned one still opens offline. The shared cache is
tried as two Unix users, made here for the test."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from etl.errors import EtlError, ShardError
from etl.storage.location import StoreOptions
from etl.storage.store import StoreDataset
from loaders import PackedDataset, make_loader
from tests.helpers.packed import Packed, make_packed
from tests.helpers.stores import client_options, uploaded

s3fs = pytest.importorskip("s3fs")
pytest.importorskip("moto.server")


options = client_options


@pytest.fixture
def dataset(endpoint: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Packed, str]:
    """A packed dataset uploaded to a new bucket, and its URL."""
    packed = make_packed(tmp_path / "ds", shard_sizes=(6, 5, 7), sample_shape=(8, 8, 3))
    return packed, uploaded(packed.root, endpoint, f"s{abs(hash(request.node.nodeid)) % 10**10}")


def opened(url: str, endpoint: str, cache: Path, **more: Any) -> PackedDataset:
    store = StoreOptions(cache_dir=cache, storage_options=options(endpoint), **more)
    return PackedDataset.open(url, store=store)


def same_samples(ds: PackedDataset, packed: Packed) -> bool:
    positions = ds.selection.positions
    return len(ds) > 0 and all(
        np.array_equal(ds[i][0].numpy(), packed.images[positions[i]]) for i in range(len(ds))
    )


@pytest.mark.parametrize(
    ("mode", "owner", "shared", "refused"),
    [
        (0o777, "me", False, "writable by every user"),
        (0o777, "me", True, "writable by every user"),
        (0o775, "me", False, "writable by its group"),
        (0o755, "other", False, "belongs to another user"),
        (0o775, "me", True, None),
        (0o2770, "other", True, None),
        (0o755, "me", False, None),
    ],
)
def test_a_cache_folder_others_can_write_is_refused_unless_shared_on_purpose(
    dataset: tuple[Packed, str],
    endpoint: str,
    tmp_path: Path,
    mode: int,
    owner: str,
    shared: bool,
    refused: str | None,
) -> None:
    packed, url = dataset
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, mode)
    if owner == "other":
        os.chown(cache, 65534, -1)  # nobody's
        if os.geteuid() != 0:
            pytest.skip("only root gives a folder to another user")
    if refused is None:
        assert same_samples(opened(url, endpoint, cache, shared_cache=shared), packed)
        return
    with pytest.raises(ShardError, match=refused) as raised:
        opened(url, endpoint, cache, shared_cache=shared)
    message = str(raised.value)
    assert str(cache) in message and "\n" not in message
    assert not any(cache.iterdir()), "nothing is written to a refused folder"


def test_a_new_cache_is_private_and_so_is_everything_in_it(
    dataset: tuple[Packed, str], endpoint: str, tmp_path: Path
) -> None:
    packed, url = dataset
    cache = tmp_path / "fresh" / "cache"
    old = os.umask(0)  # the loosest umask a user can have
    try:
        ds = opened(url, endpoint, cache)
    finally:
        os.umask(old)
    assert same_samples(ds, packed)
    for path in [cache, *cache.rglob("*")]:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        assert not mode & 0o077, f"{path}: mode {mode:o}"


def test_a_symlink_in_the_cache_is_never_written_through_nor_trusted(
    dataset: tuple[Packed, str], endpoint: str, tmp_path: Path
) -> None:
    """Links planted where the cache keeps a shard and a lock, pointing at a file of the
    user's: the shard's link is replaced by the verified download, the lock's is refused by
    name, and the file they point at keeps its bytes."""
    packed, url = dataset
    cache = tmp_path / "cache"
    victim = tmp_path / "checkpoint.pt"
    victim.write_bytes(b"weights")
    mirror = StoreDataset(url, cache, options(endpoint)).root
    first, second = PackedDataset.open(packed.root).selection.shards.names[:2]
    (mirror / "shards").mkdir(parents=True)
    os.chmod(cache, 0o700)
    os.chmod(mirror, 0o700)
    os.chmod(mirror / "shards", 0o700)
    (mirror / first).symlink_to(victim)
    (mirror / f"{second}.lock").symlink_to(victim)
    with pytest.raises(ShardError, match=rf"{second}\.lock: a symlink where the cache keeps"):
        opened(url, endpoint, cache)
    assert victim.read_bytes() == b"weights"
    (mirror / f"{second}.lock").unlink()
    assert same_samples(opened(url, endpoint, cache), packed)
    assert not (mirror / first).is_symlink()
    assert (mirror / first).read_bytes() == (packed.root / first).read_bytes()
    assert victim.read_bytes() == b"weights"


@pytest.mark.timeout(120)
def test_a_download_is_alive_while_its_lock_is_held_whatever_its_name_says(
    dataset: tuple[Packed, str], endpoint: str, tmp_path: Path
) -> None:
    """In a bounded cache, a `.tmp-` download held (flock) by a process of another container
    (its name, a pid this node has never seen) is counted and kept; one nobody holds, though
    its name is this very process's pid, is a dead download and removed; one nobody holds yet
    but made a moment ago (between its creation and its writer's lock) is kept."""
    packed, url = dataset
    cache = tmp_path / "cache"
    sizes = [p.stat().st_size for p in sorted((packed.root / "shards").glob("*.npy"))]
    mirror = StoreDataset(url, cache, options(endpoint)).root
    folder = mirror / "shards"
    folder.mkdir(parents=True)
    for path in (cache, mirror, folder):
        os.chmod(path, 0o700)
    names = PackedDataset.open(packed.root).selection.shards.names
    held = folder / f".tmp-{Path(names[0]).name}-999999999"
    dead = folder / f".tmp-{Path(names[1]).name}-{os.getpid()}"
    fresh = folder / f".tmp-{Path(names[2]).name}-{os.getpid()}x"
    for path in (held, dead, fresh):
        path.write_bytes(b"")
    an_hour_ago = time.time() - 3600
    for path in (held, dead):  # a killed download's file is older than a moment
        os.utime(path, (an_hour_ago, an_hour_ago))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
            str(held),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        ds = opened(url, endpoint, cache, cache_limit=2 * sum(sizes))
        loader = make_loader(ds, batch_size=3, shuffle="shards", seed=1, with_indices=True)
        assert sum(len(batch.indices) for batch in loader) == len(ds)
        assert held.exists(), "a download someone holds is never removed"
        assert not dead.exists(), "a download nobody holds never finishes"
        assert fresh.exists(), "one made a moment ago may not be locked yet by its writer"
    finally:
        holder.kill()
        holder.wait()


def test_the_same_url_on_two_endpoints_is_two_mirrors(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "s3://bucket/ds"
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    keys = {
        StoreDataset(url, "/c", options("http://127.0.0.1:9000")).key,
        StoreDataset(url, "/c", options("http://127.0.0.1:9001")).key,
        StoreDataset(url, "/c", {"endpoint_url": "http://127.0.0.1:9002"}).key,
        StoreDataset(url, "/c").key,
    }
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9003")
    keys.add(StoreDataset(url, "/c").key)
    assert len(keys) == 5
    # the keys say where, never how one signs in: the same endpoint, other keys, one mirror
    a = StoreDataset(url, "/c", {**options("http://127.0.0.1:9000"), "secret": "other"})
    assert a.key == StoreDataset(url, "/c", options("http://127.0.0.1:9000")).key
    # and one endpoint however it is given: the environment, endpoint_url, client_kwargs
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/")
    assert StoreDataset(url, "/c").key == a.key
    assert StoreDataset(url, "/c", {"endpoint_url": "http://127.0.0.1:9000"}).key == a.key


def test_a_republished_version_is_noticed_and_a_pinned_one_opens_offline(
    dataset: tuple[Packed, str], endpoint: str, tmp_path: Path
) -> None:
    packed, url = dataset
    cache = tmp_path / "cache"
    assert same_samples(opened(url, endpoint, cache, shared_cache=False), packed)
    other = make_packed(tmp_path / "other", shard_sizes=(4, 9), sample_shape=(8, 8, 3), seed=5)
    fs = s3fs.S3FileSystem(**options(endpoint))
    fs.rm(url.removeprefix("s3://"), recursive=True)
    fs.put(str(other.root), url.removeprefix("s3://"), recursive=True)
    fs.invalidate_cache()
    assert same_samples(opened(url, endpoint, cache), other), "the new record is noticed"

    closed = "http://127.0.0.1:9"  # nothing listens: the store cannot be asked
    mirror = StoreDataset(url, cache, options(endpoint)).root
    offline = StoreDataset(url, cache, options(closed), timeout=5, root=mirror)
    assert offline.fetch_version(1) == 1
    with pytest.raises(EtlError):
        offline.fetch_version(None)  # the latest needs the store


# -- two Unix users ------------------------------------------------------------------------

USERS = ("etlalice", "etlbob")
GROUP = "etlshare"


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, pwd.struct_passwd]]:
    """Two users in one group, made for the test (root only) and removed after."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("making Unix users needs root and useradd")
    subprocess.run(["groupadd", "-f", GROUP], check=True)
    for name in USERS:
        subprocess.run(["userdel", "-r", name], capture_output=True)
        subprocess.run(["useradd", "-m", "-G", GROUP, name], check=True)
    try:
        yield {name: pwd.getpwnam(name) for name in USERS}
    finally:
        for name in USERS:
            subprocess.run(["userdel", "-r", name], capture_output=True)
        subprocess.run(["groupdel", GROUP], capture_output=True)


def read_sum(url: str, endpoint: str, cache: str, shared: bool) -> str:
    """'read <sum of every pixel>' of the dataset read through `cache`, or 'error <type>
    <message>'."""
    try:
        ds = opened(url, endpoint, Path(cache), shared_cache=shared)
        return f"read {sum(int(ds[i][0].sum()) for i in range(len(ds)))}"
    except Exception as exc:
        return f"error {type(exc).__name__} {exc}"


def as_user(user: pwd.struct_passwd, url: str, endpoint: str, cache: Path, shared: bool) -> str:
    """`read_sum` in a child of this process that became `user` (in GROUP): a fork, since
    this interpreter lies under /root where another user cannot run it; the modules it needs
    are imported already (see `warm`)."""
    group = grp.getgrnam(GROUP).gr_gid
    out, into = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        said = "error child"
        try:
            os.close(out)
            os.setgroups([group])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            os.environ["HOME"] = user.pw_dir
            said = read_sum(url, endpoint, str(cache), shared)
        finally:
            os.write(into, said.encode())
            os._exit(0)
    os.close(into)
    with os.fdopen(out, "rb") as answer:
        said = answer.read().decode()
    os.waitpid(pid, 0)
    return said


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_users_share_a_cache_on_purpose_and_never_each_other_s_private_one(
    dataset: tuple[Packed, str], endpoint: str, users: dict[str, pwd.struct_passwd]
) -> None:
    packed, url = dataset
    alice, bob = users["etlalice"], users["etlbob"]
    base = Path(tempfile.mkdtemp(prefix="etl-users-"))
    expected = f"read {int(packed.images.astype(np.int64).sum())}"
    assert read_sum(url, endpoint, str(base / "warm"), False) == expected  # imports all it needs
    shutil.rmtree(base / "warm")
    try:
        os.chmod(base, 0o1777)  # as /tmp: each user makes their own folder in it
        private = base / "alice-cache"
        assert as_user(alice, url, endpoint, private, False) == expected
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        said = as_user(bob, url, endpoint, private, False)
        assert said.startswith("error ShardError") and "belongs to another user" in said, said

        shared = base / "team-cache"
        shared.mkdir()
        os.chown(shared, alice.pw_uid, grp.getgrnam(GROUP).gr_gid)
        os.chmod(shared, 0o2770)
        assert as_user(alice, url, endpoint, shared, True) == expected
        assert as_user(bob, url, endpoint, shared, True) == expected, "bob reads alice's"
        said = as_user(bob, url, endpoint, shared, False)
        assert "belongs to another user" in said, said
        for path in shared.rglob("*"):
            assert not stat.S_IMODE(os.lstat(path).st_mode) & 0o007, path  # nothing for others
    finally:
        shutil.rmtree(base, ignore_errors=True)
