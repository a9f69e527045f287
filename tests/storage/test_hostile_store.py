"""A store that lies about names (NOTE [ names from a store ] in etl.storage.store), on a real
S3-compatible server (moto's, on 127.0.0.1): it re-publishes a version whose shards table names
a file outside the cache (an absolute path, '..', a NUL, a link planted in the mirror), sealed
by a commit record it makes itself, then re-publishes it again with another checksum for that
name (which once made the second open delete the file). Every open ends in one line naming
the store or its mirror, the mirror keeps a copy whose names are plain, and nothing outside
the cache is touched: not by an open, not by `etl audit` of the URL, not by a ranged read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from etl.errors import EtlError, ManifestError
from etl.format.coherence import check_shard_name
from etl.format.record import RECORD_FILE, write_record
from etl.storage.location import StoreOptions
from etl.storage.records import changed_shards, remove_shard_files
from etl.storage.store import StoreDataset
from loaders import PackedDataset
from tests.helpers.cli import cli
from tests.helpers.packed import Packed, make_packed
from tests.helpers.stores import client_options, point_at, uploaded

s3fs = pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

HOSTILE = ["absolute", "dotdot", "nul", "link"]


def _opened(url: str, endpoint: str, cache: Path, **more: Any) -> PackedDataset:
    store = StoreOptions(cache_dir=cache, storage_options=client_options(endpoint), **more)
    return PackedDataset.open(url, store=store)


def _hostile_name(kind: str, mirror: Path, victim: Path) -> str:
    """A shard name that, taken as a path under the mirror, is `victim` (which exists)."""
    if kind == "absolute":
        return str(victim)
    if kind == "dotdot":
        rel = os.path.relpath(victim, mirror / "shards")
        return f"shards/{rel}"
    if kind == "nul":
        return "shards/v000001-00000.npy\x00/../../victim"
    link = mirror / "shards" / "planted.npy"  # a plain name, whose mirror file is a link out
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(victim)
    return "shards/planted.npy"


def _republish(packed: Packed, fs: Any, url: str, name: str, checksum: str) -> None:
    """Version 1 re-published in the store with its first shard renamed `name` (with
    `checksum`), its commit record sealed again over the changed table."""
    folder = packed.root / "versions" / "v000001"
    table = ipc.open_file(str(folder / "shards.arrow")).read_all()
    names = table.column("shard").to_pylist()
    sums = table.column("checksum").to_pylist()
    names[0], sums[0] = name, checksum
    table = table.set_column(table.schema.get_field_index("shard"), "shard", pa.array(names))
    table = table.set_column(table.schema.get_field_index("checksum"), "checksum", pa.array(sums))
    with ipc.new_file(str(folder / "shards.arrow"), table.schema) as writer:
        writer.write_table(table)
    files = tuple(json.loads((folder / RECORD_FILE).read_text())["files"])
    write_record(folder, 1, files)
    remote = url.removeprefix("s3://") + "/versions/v000001"
    for file in (*files, RECORD_FILE):
        fs.put(str(folder / file), f"{remote}/{file}")
    fs.invalidate_cache()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", HOSTILE)
def test_a_store_naming_a_file_outside_the_cache_never_touches_it(
    endpoint: str, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    packed = make_packed(tmp_path / "ds", shard_sizes=(6, 5), sample_shape=(8, 8, 3))
    url = uploaded(packed.root, endpoint, f"h{abs(hash(request.node.nodeid)) % 10**10}")
    cache = tmp_path / "cache"
    assert len(_opened(url, endpoint, cache)) == 11
    mirror = StoreDataset(url, cache, client_options(endpoint)).root
    victim = tmp_path / "home" / "thesis.tex"
    victim.parent.mkdir()
    victim.write_bytes(b"four years of work")
    name = _hostile_name(kind, mirror, victim)
    fs = s3fs.S3FileSystem(**client_options(endpoint))
    for checksum in ("0" * 32, "f" * 32):  # published, then re-published with another sum
        _republish(packed, fs, url, name, checksum)
        with pytest.raises(EtlError) as raised:
            ds = _opened(url, endpoint, cache)
            ds.gather(np.arange(len(ds)))
        message = str(raised.value)
        assert (url in message or str(mirror) in message) and "\n" not in message, message
        assert victim.read_bytes() == b"four years of work"
        for table in mirror.rglob("shards.arrow"):  # the mirror's copies name plain files
            for shard in ipc.open_file(str(table)).read_all().column("shard").to_pylist():
                if shard != "shards/planted.npy":
                    check_shard_name(shard, table)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["absolute", "dotdot"])
def test_an_audit_or_a_ranged_read_of_a_hostile_store_writes_and_asks_nothing_outside(
    endpoint: str,
    tmp_path: Path,
    kind: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """`etl audit URL` downloads the shards as the store holds them into a scratch mirror:
    a hostile name is refused in one line with exit code 2 and nothing is written outside;
    a ranged read (`ranged=True`) refuses it before any request."""
    packed = make_packed(tmp_path / "ds", shard_sizes=(6, 5), sample_shape=(8, 8, 3))
    url = uploaded(packed.root, endpoint, f"a{abs(hash(request.node.nodeid)) % 10**10}")
    cache = tmp_path / "cache"
    point_at(endpoint, monkeypatch, cache)
    mirror = StoreDataset(url, cache, client_options(endpoint)).root
    victim = tmp_path / "home" / "thesis.tex"
    victim.parent.mkdir()
    victim.write_bytes(b"four years of work")
    fs = s3fs.S3FileSystem(**client_options(endpoint))
    table = ipc.open_file(str(packed.root / "versions/v000001/shards.arrow")).read_all()
    _republish(packed, fs, url, _hostile_name(kind, mirror, victim), table["checksum"][0].as_py())
    code, out, err = cli(["audit", url], capsys)
    assert code != 0 and "Traceback" not in out + err
    assert victim.read_bytes() == b"four years of work"
    with pytest.raises(EtlError, match="is not of the form"):
        ds = _opened(url, endpoint, tmp_path / "cache2", ranged=True)
        ds.gather(np.arange(len(ds)))
    assert victim.read_bytes() == b"four years of work"


def test_changed_shards_of_a_hostile_cached_table_remove_only_plain_files(tmp_path: Path) -> None:
    """A cached shards table written by a hostile store before names were checked (an old
    cache): its names that are not plain are never removal candidates, and removal goes
    through the mirror's `shards/` by file name, so a link there goes and its target stays."""
    root = tmp_path / "mirror"
    cached, fetched = root / "versions" / "v000001", tmp_path / "staging"
    victim = tmp_path / "thesis.tex"
    victim.write_bytes(b"work")
    (root / "shards").mkdir(parents=True)
    (root / "shards" / "plain.npy").write_bytes(b"x")
    (root / "shards" / "link.npy").symlink_to(victim)
    names = [str(victim), "shards/../../thesis.tex", "shards/plain.npy", "shards/link.npy"]
    for folder, checksum in ((cached, "a"), (fetched, "b")):
        folder.mkdir(parents=True)
        table = pa.table({"shard": names, "checksum": [checksum] * len(names)})
        with ipc.new_file(str(folder / "shards.arrow"), table.schema) as writer:
            writer.write_table(table)
    files = changed_shards(cached, fetched, root)
    assert sorted(files) == ["link.npy", "plain.npy"]
    remove_shard_files(root, [*files, "../thesis.tex", str(victim)])
    assert victim.read_bytes() == b"work"
    assert not any((root / "shards").iterdir())
    with pytest.raises(ManifestError, match="not of the form"):
        StoreDataset("s3://b/ds", tmp_path / "c").shard_file("shards/../../thesis.tex")


@pytest.mark.timeout(120)
def test_etl_trace_opens_a_store_a_state_names_only_when_allowed(
    endpoint: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """A state saved by a loader over a dataset in a bucket: `etl trace` refuses to open the
    URL its record names (one line, exit code 2) until --allow-store, then says it opens it
    and answers as the loader read."""
    from loaders import make_loader

    packed = make_packed(tmp_path / "ds", shard_sizes=(6, 5), sample_shape=(8, 8, 3))
    url = uploaded(packed.root, endpoint, f"t{abs(hash(request.node.nodeid)) % 10**10}")
    point_at(endpoint, monkeypatch, tmp_path / "cache")
    loader = make_loader(PackedDataset.open(url), batch_size=4, shuffle=True, pin_memory=False)
    first = next(iter(loader))
    state = tmp_path / "state.json"
    state.write_text(json.dumps(loader.state_dict()))
    code, _, err = cli(["trace", str(state), "--step", "0", "--json"], capsys)
    assert code == 2 and "--allow-store" in err and url in err and "Traceback" not in err, err
    code, out, err = cli(["trace", str(state), "--step", "0", "--json", "--allow-store"], capsys)
    assert code == 0 and f"opening {url}" in err, err
    assert len(json.loads(out)["samples"]) == len(first[0])
