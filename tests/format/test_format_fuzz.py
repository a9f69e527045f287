"""Every stored byte is hostile too: the files a packed dataset keeps, damaged the way a bad
disk, a partial copy or a careless edit damages them, read by every reader.

A real dataset (two versions, packed by `etl run` from real images) is copied per case and one of
its files mutated: a byte set to another value, the file cut short, garbage appended, or the file
swapped with another of its kind. Each reader then runs in a long-lived subprocess
(tests/format/fuzz_driver.py) under a time limit: `etl audit`, `inspect`, `versions`, `diff`,
`show`, `compact`, the next `etl run`, and the loaders at open and at read (plain, with
`verify="shards"` and with `verify="rows"`), in the main process and in workers, and with the
samples decoded where the batch goes (`decode="device"`, by nvImageCodec's native decoder,
checked and unchecked). Each must end
with an exit code and, for an error, one line: never a traceback, a signal or a hang. What can
know of the damage must say so: the audit always, the loaders for a shard (each row checked
the first time it is read, by default; `verify="shards"` and "rows" too), the loaders for a version
file (its commit record).

Hypothesis draws the mutations (a few dozen per kind; `--fuzz-long` for thousands); every byte
of a shard's `.npy` header and of `commit.json` is also swept exhaustively. The mirror a
training node keeps of a dataset in object storage (moto's server on 127.0.0.1) is fuzzed the
same way, read by URL.
"""

from __future__ import annotations

import csv
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).parent / "fuzz_driver.py"
CASE_SECONDS = 120
EVERY_READER = (
    "audit",
    "inspect",
    "versions",
    "diff",
    "show",
    "compact",
    "run",
    "loaders",
    "loaders-verify",
    "loaders-rows",
    "loaders-lenient",
    "loaders-unchecked",
    "loaders-workers",
    "loaders-device",
    "loaders-device-unchecked",
    "loaders-columns",
    "stream",
    "stream-workers",
)
EXIT_CODES = {"audit": {0, 1, 2}}
"""What each reader may exit with: 0 or 2 (one line) unless said; the audit's 1 is a finding."""


FIXED = "{size: [12, 16], mode: center_crop}"
ASPECT = "{mode: keep_aspect, shorter: 12, longer: 20}"
"""Samples that keep their aspect ratio (format version 2): flat shards placed by the manifest."""
JPEG = ", codec: jpeg"
"""Samples stored as JPEG (format version 3): flat shards of encoded bytes, decoded on read."""


@dataclass(frozen=True)
class Base:
    work: Path
    root: Path
    sources: Path
    files: dict[str, list[str]]
    """Paths relative to `root` of each kind of file the dataset keeps."""
    resize: str = FIXED
    codec: str = ""


def etl(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "etl", *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr


def write_config(
    path: Path, sources: Path, output: Path, resize: str = FIXED, codec: str = ""
) -> None:
    """Packs the listing sources/list.csv with per-sample columns of every kind (text, a
    number, ragged lists, a struct), so the manifest's own columns are fuzzed too."""
    path.write_text(
        f"""
source: {{kind: listing, path: {json.dumps(str(sources / "list.csv"))}}}
stages:
  - decode: {{mode: RGB}}
  - resize: {resize}
output: {{dir: {json.dumps(str(output))}, samples_per_shard: 5{codec}}}
run: {{n_jobs: 1, backend: sequential}}
columns:
  caption: string
  score: float32
  boxes: list<list<float32>>
  meta: "struct<camera: string, year: int16>"
"""
    )


def write_listing(sources: Path, left_out: Iterable[Path] = ()) -> None:
    """sources/list.csv: every picture under `sources` but `left_out`, with its columns."""
    skipped = set(left_out)
    pictures = sorted(p for p in sources.rglob("*") if p.is_file() and p.suffix != ".csv")
    rows = [
        {
            "path": str(p.relative_to(sources)),
            "label": p.parent.name,
            "caption": f"picture {i} of a {p.parent.name}",
            "score": str(i / 4),
            "boxes": json.dumps([[i, i, i + 2.5, i + 3.5]] * (i % 3)),
            "meta": json.dumps({"camera": f"cam{i % 2}", "year": 2000 + i}),
        }
        for i, p in enumerate(pictures)
        if p not in skipped
    ]
    with open(sources / "list.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    return make_base(tmp_path_factory, FIXED)


@pytest.fixture(scope="module")
def aspect_base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    return make_base(tmp_path_factory, ASPECT)


@pytest.fixture(scope="module")
def jpeg_base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    return make_base(tmp_path_factory, FIXED, JPEG)


def make_base(tmp_path_factory: pytest.TempPathFactory, resize: str, codec: str = "") -> Base:
    work = tmp_path_factory.mktemp("fuzz")
    sources = work / "sources"
    etl("sample-data", str(sources), "--per-class", "3", "--quiet")
    write_listing(sources, sorted(sources.rglob("*.jpg"))[:4])  # version 1 without them
    root = work / "ds"
    write_config(work / "pipeline.yaml", sources, root, resize, codec)
    etl("run", str(work / "pipeline.yaml"), "--quiet")
    write_listing(sources)  # version 2 with them
    etl("run", str(work / "pipeline.yaml"), "--quiet")
    latest = sorted((root / "versions").iterdir())[-1].relative_to(root)
    files = {
        "shard": sorted(str(p.relative_to(root)) for p in (root / "shards").glob("*.npy")),
        "manifest": [str(latest / "manifest.arrow")],
        "shards-table": [str(latest / "shards.arrow")],
        "rejects": [str(latest / "rejects.arrow")],
        "record": [str(latest / "commit.json")],
        "lock": [".lock"],
    }
    assert len(files["shard"]) >= 3 and (root / ".lock").exists()
    return Base(work, root, sources, files, resize, codec)


class Driver:
    """The readers' process; started again after a case kills it."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.process: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.cases = 0
        self.env = env or {}
        """Set in the readers' environment (a store's endpoint and credentials)."""

    def start(self) -> None:
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, str(DRIVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.lines = queue.Queue()
        stdout = self.process.stdout
        assert stdout is not None

        def pump() -> None:
            for line in stdout:
                self.lines.put(line)
            self.lines.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def run(self, root: Path, config: Path, readers: tuple[str, ...]) -> dict[str, Any]:
        return self.run_case({"root": str(root), "config": str(config)}, readers)

    def run_case(self, case: dict[str, Any], readers: tuple[str, ...]) -> dict[str, Any]:
        """`readers` on one case (see tests/format/fuzz_driver.py): their results by name."""
        if self.process is None or self.process.poll() is not None:
            self.start()
        assert self.process is not None and self.process.stdin is not None
        self.cases += 1
        case = {**case, "case": self.cases}
        self.process.stdin.write(json.dumps({**case, "readers": list(readers)}) + "\n")
        self.process.stdin.flush()
        try:
            line = self.lines.get(timeout=CASE_SECONDS)
        except queue.Empty:
            self.stop()
            raise AssertionError(f"the readers hung for {CASE_SECONDS} s") from None
        if line is None:
            code = self.process.wait()
            self.process = None
            raise AssertionError(f"the readers' process died (exit {code}, a signal if < 0)")
        result: dict[str, Any] = json.loads(line)["results"]
        return result

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@pytest.fixture(scope="module")
def driver() -> Any:
    readers = Driver()
    yield readers
    readers.stop()


@dataclass(frozen=True)
class Mutation:
    kind: str
    file: str
    how: str
    """set, truncate, extend or swap."""
    at: int = 0
    value: int = 0
    other: str = ""

    def apply(self, root: Path) -> bool:
        """Damage `root/file`; False when the bytes did not change (nothing to read)."""
        path = root / self.file
        data = bytearray(path.read_bytes())
        if self.how == "set":
            if not data:  # an empty file (the lock): any byte is damage
                data.append(self.value)
            elif data[self.at % len(data)] == self.value:
                return False
            else:
                data[self.at % len(data)] = self.value
        elif self.how == "truncate":
            if not data:
                return False
            del data[self.at % len(data) :]
        elif self.how == "extend":
            data += bytes([self.value]) * (1 + self.at % 4096)
        else:
            other = root / self.other
            swapped = other.read_bytes()
            if swapped == bytes(data):
                return False
            other.write_bytes(bytes(data))
            data = bytearray(swapped)
        if path.suffix == ".json" and _same_json(path.read_bytes(), bytes(data)):
            return False  # white space where white space was: the same record, no damage
        path.write_bytes(bytes(data))
        return True


def _same_json(before: bytes, after: bytes) -> bool:
    try:
        return bool(json.loads(before) == json.loads(after))
    except ValueError:
        return False


def case_root(base: Base, tmp: Path) -> tuple[Path, Path]:
    """A fresh copy of the dataset and a config whose output is that copy."""
    root = tmp / "ds"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(base.root, root)
    config = tmp / "pipeline.yaml"
    write_config(config, base.sources, root, base.resize, base.codec)
    return root, config


def check(mutation: Mutation, results: dict[str, Any]) -> None:
    for reader, result in results.items():
        assert "bug" not in result, f"{reader} on {mutation}:\n{result['bug']}"
        allowed = EXIT_CODES.get(reader, {0, 2})
        assert result["code"] in allowed, f"{reader} exit {result['code']} on {mutation}"
        if result["code"] == 2:
            message = result["error"]
            assert message and "\n" not in message.strip(), f"{reader}: {message!r}"
    changed = (mutation.file, mutation.other if mutation.how == "swap" else None)
    if (
        mutation.kind == "cached-version"
        and f"{mutation.file.rsplit('/', 1)[0]}/commit.json" in changed
    ):
        # the mirror's record is compared with the store's at every open: a changed one is
        # fetched again with its version's files, so every reader reads the store's samples
        assert {r["code"] for r in results.values()} == {0}, f"not fetched again: {mutation}"
        return
    covered = mutation.kind not in ("lock", "leftovers", "cache-locks")  # a committed file?
    if "audit" in results and covered:
        assert results["audit"]["code"] in (1, 2), f"the audit missed {mutation}"
    if "loaders-verify" in results and covered:
        assert results["loaders-verify"]["code"] == 2, f"verify=shards read {mutation}"
    shard = mutation.kind in ("shard", "cached-shard")
    if "loaders" in results and covered and not shard:
        assert results["loaders"]["code"] == 2, f"the commit record missed {mutation}"
    if "loaders-rows" in results and covered and (not shard or mutation.how != "set"):
        # a set byte may be white space in a shard's header padding: no sample changed
        assert results["loaders-rows"]["code"] == 2, f"verify='rows' read {mutation}"
    if shard and results.get("loaders-rows", {}).get("code") == 2:
        # what every row checked finds, each row checked once (the default) finds: no reader
        # of every sample hands out a changed one
        for reader in ("loaders", "loaders-workers", "loaders-device", "stream", "stream-workers"):
            if reader in results:
                assert results[reader]["code"] == 2, f"{reader} read a changed row: {mutation}"
    if shard and mutation.how == "swap":
        for reader in ("loaders", "stream"):
            if reader in results:
                assert results[reader]["code"] == 2, f"{reader}'s probe row missed {mutation}"


def fuzz_settings(request: pytest.FixtureRequest, count: int) -> Any:
    """Hypothesis's settings for `count` drawn cases: the same cases every run, unless
    --fuzz-long asks for new ones."""
    return settings(
        max_examples=count,
        deadline=None,
        derandomize=not request.config.getoption("--fuzz-long"),
        suppress_health_check=list(HealthCheck),
    )


def examples(request: pytest.FixtureRequest) -> int:
    return 2000 if request.config.getoption("--fuzz-long") else 120


@st.composite
def mutations(draw: st.DrawFn, files: dict[str, list[str]], kind: str) -> Mutation:
    file = draw(st.sampled_from(files[kind]))
    how = draw(st.sampled_from(["set", "set", "set", "truncate", "extend", "swap"]))
    if how == "swap":
        others = [f for f in files[kind] if f != file]
        if not others:
            how = "set"
        else:
            return Mutation(kind, file, how, other=draw(st.sampled_from(others)))
    at = draw(st.one_of(st.integers(0, 255), st.integers(0, 1 << 20)))
    return Mutation(kind, file, how, at, draw(st.integers(0, 255)))


@pytest.mark.parametrize("kind", ["shard", "manifest", "shards-table", "rejects", "record", "lock"])
def test_any_damage_to_a_stored_file_is_named_never_a_crash(
    base: Base, driver: Driver, tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    fuzz(base, driver, tmp_path, request, kind, EVERY_READER, examples(request))


@pytest.mark.parametrize("kind", ["shard", "manifest", "shards-table"])
def test_any_damage_to_an_aspect_kept_dataset_is_named_never_a_crash(
    aspect_base: Base, driver: Driver, tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    """The same for format version 2, whose shards are flat and placed by the manifest's
    `sample_offset` and sizes."""
    fuzz(aspect_base, driver, tmp_path, request, kind, EVERY_READER, examples(request) // 2)


@pytest.mark.parametrize("kind", ["shard", "manifest", "shards-table"])
def test_any_damage_to_a_jpeg_dataset_is_named_never_a_crash(
    jpeg_base: Base, driver: Driver, tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    """The same for format version 3 (samples stored as JPEG): a damaged byte of an encoded
    sample is a checksum mismatch before any decode, and what the loaders read unchecked goes
    through libjpeg-turbo, and through nvImageCodec's decoder on the device path, without a
    crash."""
    fuzz(jpeg_base, driver, tmp_path, request, kind, EVERY_READER, examples(request) // 2)


def fuzz(
    base: Base,
    driver: Driver,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    kind: str,
    readers: tuple[str, ...],
    count: int,
) -> None:
    """`count` drawn mutations of `kind` files of `base`, each read by `readers`: `check`."""
    seen = []

    @fuzz_settings(request, count)
    @given(mutation=mutations(base.files, kind))
    def one(mutation: Mutation) -> None:
        root, config = case_root(base, tmp_path / "case")
        if not mutation.apply(root):
            return
        seen.append(mutation)
        check(mutation, driver.run(root, config, readers))

    one()
    assert len(seen) >= count // 2, "most drawn mutations changed a byte"


def sweep(base: Base, driver: Driver, tmp: Path, kind: str, mutations: list[Mutation]) -> None:
    readers = ("audit", "loaders", "loaders-verify")
    changed = 0
    for mutation in mutations:
        root, config = case_root(base, tmp / "case")
        if mutation.apply(root):
            changed += 1
            check(mutation, driver.run(root, config, readers))
    assert changed >= len(mutations) // 2


def test_every_byte_of_a_shard_header(base: Base, driver: Driver, tmp_path: Path) -> None:
    """Each of the 128 header bytes of one shard set to 0x00, 0xff, '9' and '}' in turn: the
    values that end, overflow, lengthen and close numpy's header literal."""
    shard = base.files["shard"][1]
    values = (0x00, 0xFF, ord("9"), ord("}"))
    sweep(
        base,
        driver,
        tmp_path,
        "shard",
        [Mutation("shard", shard, "set", at, v) for at in range(128) for v in values],
    )


def test_every_byte_of_the_commit_record(base: Base, driver: Driver, tmp_path: Path) -> None:
    record = base.files["record"][0]
    size = (base.root / record).stat().st_size
    sweep(
        base,
        driver,
        tmp_path,
        "record",
        [Mutation("record", record, "set", at, ord("0")) for at in range(size)],
    )


def test_leftovers_of_an_interrupted_run_are_never_trusted(
    base: Base, driver: Driver, tmp_path: Path
) -> None:
    """Garbage where a run killed mid-write leaves its scratch: a `.tmp-` folder of spill and
    plan files, a temp shard, a shard of the version it never committed. Every reader goes
    on as if they were not there, and the next run removes them."""
    root, config = case_root(base, tmp_path / "case")
    scratch = root / "versions" / ".tmp-run-1234"
    scratch.mkdir()
    (scratch / "runs-00000.arrow").write_bytes(b"ARROW1\x00\x00" + os.urandom(512))
    (scratch / "plan.arrow").write_bytes(b"")
    (root / "shards" / ".tmp-v000003-00000.npy").write_bytes(os.urandom(300))
    uncommitted = root / "shards" / "v000003-00000.npy"
    uncommitted.write_bytes(b"\x93NUMPY\x01\x00" + os.urandom(200))
    results = driver.run(root, config, EVERY_READER)
    check(Mutation("leftovers", "versions/.tmp-run-1234", "plant"), results)
    assert {name: r["code"] for name, r in results.items()} == {name: 0 for name in EVERY_READER}, (
        "leftovers are no damage: every reader reads the committed version"
    )
    assert not scratch.exists() and not uncommitted.exists(), "the next run removed them"


REMOTE_READERS = (
    "inspect",
    "versions",
    "diff",
    "show",
    "loaders",
    "loaders-verify",
    "loaders-workers",
    "loaders-limited",
    "stream",
)
"""The readers of a dataset in object storage that trust its mirror in the cache."""


@dataclass(frozen=True)
class Mirror:
    url: str
    cache: Path
    """A cache folder holding the dataset's mirror: both versions and every shard."""
    mirror: Path
    """The mirror's folder in `cache`."""
    files: dict[str, list[str]]
    """Paths relative to `mirror` of each kind of file the mirror keeps."""


@pytest.fixture(scope="module")
def mirrored(base: Base, endpoint: str) -> Iterator[tuple[Mirror, Driver]]:
    """The packed dataset in a bucket of moto's server on 127.0.0.1, a cache folder that holds
    its mirror (as a training node's does after one epoch), and readers pointed at the store."""
    s3fs = pytest.importorskip("s3fs")
    from etl.storage.location import StoreOptions
    from etl.storage.store import StoreDataset
    from loaders import PackedDataset
    from tests.helpers.stores import new_bucket

    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }
    new_bucket(endpoint, "fuzzed")
    s3fs.S3FileSystem(**options).put(str(base.root), "fuzzed/ds", recursive=True)
    url, cache = "s3://fuzzed/ds", base.work / "cache"
    PackedDataset.open(url, store=StoreOptions(cache_dir=cache, storage_options=options))
    remote = StoreDataset(url, cache, options)
    remote.fetch_version(1)
    mirror = remote.root
    (mirror / "shards" / "v000001-00000.npy.use").touch()  # as a bounded cache leaves them
    version = sorted(p for p in (mirror / "versions").iterdir() if p.name.startswith("v"))[-1]

    def relative(paths: Iterable[Path]) -> list[str]:
        return sorted(str(p.relative_to(mirror)) for p in paths)

    files = {
        "cached-shard": relative((mirror / "shards").glob("*.npy")),
        "cached-version": relative(version.iterdir()),
        "cache-locks": relative(
            p for p in (mirror / "shards").iterdir() if p.name.endswith((".lock", ".use"))
        ),
    }
    assert all(files.values()), files
    readers = Driver(env)
    yield Mirror(url, cache, mirror, files), readers
    readers.stop()


def mirror_case(mirrored: Mirror, tmp: Path) -> tuple[Path, Path]:
    """A fresh copy of the cache folder, and the mirror in it."""
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(mirrored.cache, tmp)
    return tmp, tmp / mirrored.mirror.relative_to(mirrored.cache)


@pytest.mark.parametrize("kind", ["cached-shard", "cached-version", "cache-locks"])
def test_any_damage_to_a_remote_datasets_mirror_is_named_never_a_crash(
    mirrored: tuple[Mirror, Driver], tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    """What a training node's cache holds of a dataset in object storage (its shards, its
    versions' files, the lock and hold files of its processes), damaged as a bad disk damages
    it: each reader of the URL ends with one named error or reads the store's samples; a
    changed commit record is fetched again with its version (it is compared with the store's
    at every open), any other damaged version file is named (by the record), a swapped shard
    by its probe row, any damage to a shard with `verify="shards"`."""
    mirror, driver = mirrored
    seen = []

    @fuzz_settings(request, examples(request) // 2)
    @given(mutation=mutations(mirror.files, kind))
    def one(mutation: Mutation) -> None:
        cache, root = mirror_case(mirror, tmp_path / "case")
        if not mutation.apply(root):
            return
        seen.append(mutation)
        results = driver.run_case({"url": mirror.url, "cache": str(cache)}, REMOTE_READERS)
        check(mutation, results)
        if kind == "cache-locks":
            assert {r["code"] for r in results.values()} == {0}, "a lock file holds nothing"

    one()
    assert len(seen) >= examples(request) // 4, "most drawn mutations changed a byte"


def test_any_damage_to_a_retirement_record_is_ignored_or_obeyed_never_a_crash(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A retirement record (NOTE [ a grace period ]) damaged as a bad disk damages it: listing,
    a compaction and opening the latest version end without a crash; a record that no longer
    parses is ignored (its version listed again, nothing removed); the latest version always
    reads as packed, byte for byte."""
    from etl.format.manifest import list_versions
    from etl.format.retirement import record_name
    from etl.maintenance.housekeeping import compact
    from loaders import PackedDataset
    from tests.helpers.packed import make_packed

    template = tmp_path / "template"
    packed = make_packed(template, shard_sizes=(4, 3))
    # the last shard's orphan row makes it sparse: its rewrite is version 2, and 1 retires
    report = compact(template, keep_last=1, min_dead_fraction=0.2, grace=3600)
    assert report.new_version == 2 and report.retired_versions == [1]
    record = record_name(1)
    seen = []

    @fuzz_settings(request, examples(request) // 2)
    @given(
        how=st.sampled_from(["set", "set", "truncate", "extend"]),
        at=st.integers(0, 200),
        value=st.integers(0, 255),
    )
    def one(how: str, at: int, value: int) -> None:
        root = tmp_path / "case"
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(template, root)
        mutation = Mutation("retirement", f"versions/{record}", how, at, value)
        if not mutation.apply(root):
            return
        seen.append(mutation)
        listed = list_versions(root)
        assert listed in ([2], [1, 2]), (mutation, listed)
        if listed == [1, 2]:  # ignored: nothing may go on its word
            assert (root / "versions" / "v000001").is_dir()
        compact(root, keep_last=2, grace=3600)
        ds = PackedDataset.open(root)
        assert len(ds) == len(packed.images)
        for i in range(len(ds)):
            position = ds.selection.positions[i]
            np.testing.assert_array_equal(ds[i][0].numpy(), packed.images[position])

    one()
    assert len(seen) >= examples(request) // 8


HOSTILE_NAMES = [
    "/etc/passwd.npy",
    "shards/../../victim.npy",
    "shards/a\x00.npy",
    "shards/\x1b[2J.npy",
]


def _resealed(root: Path, change: Any) -> None:
    """The latest version's tables changed by `change(manifest, shards) -> (manifest,
    shards)` and its commit record sealed again over them: what a hostile writer, or a
    store, can serve (the record detects damage, not an adversary: docs/FORMAT.md)."""
    import pyarrow.ipc as ipc

    from etl.format.record import RECORD_FILE, write_record

    folder = sorted((root / "versions").glob("v*"))[-1]
    tables = [ipc.open_file(str(folder / n)).read_all() for n in ("manifest.arrow", "shards.arrow")]
    for name, table in zip(("manifest.arrow", "shards.arrow"), change(*tables), strict=True):
        with ipc.new_file(str(folder / name), table.schema) as writer:
            writer.write_table(table)
    files = tuple(json.loads((folder / RECORD_FILE).read_text())["files"])
    write_record(folder, int(folder.name[1:]), files)


def _renamed(name: str) -> Any:
    import pyarrow as pa

    def change(manifest: Any, shards: Any) -> tuple[Any, Any]:
        first = shards.column("shard")[0].as_py()
        names = [name if n == first else n for n in shards.column("shard").to_pylist()]
        used = [name if n == first else n for n in manifest.column("shard").to_pylist()]
        at, to = shards.schema.get_field_index("shard"), manifest.schema.get_field_index("shard")
        return (
            manifest.set_column(to, manifest.schema.field(to), pa.array(used)),
            shards.set_column(at, shards.schema.field(at), pa.array(names)),
        )

    return change


def _declared(height: int, width: int) -> Any:
    import pyarrow as pa

    def change(manifest: Any, shards: Any) -> tuple[Any, Any]:
        for column, value in (("sample_height", height), ("sample_width", width)):
            at = manifest.schema.get_field_index(column)
            values = manifest.column(column).to_pylist()
            values[0] = value
            field = manifest.schema.field(at)
            manifest = manifest.set_column(at, field, pa.array(values, field.type))
        return manifest, shards

    return change


@pytest.mark.parametrize("hostile", [*HOSTILE_NAMES, "16384x21845"])
def test_hostile_values_sealed_by_their_own_record_are_named_never_trusted(
    jpeg_base: Base, driver: Driver, tmp_path: Path, hostile: str
) -> None:
    """A version whose shards table (and manifest) name a shard outside the dataset or with a
    NUL or an escape in its name, or whose manifest declares a JPEG sample of 16384x21845
    (a gigabyte to allocate), its record sealed again: every reader ends with an exit code
    and one line, the loaders refuse to open it, and no file outside the dataset is read or
    touched (NOTE [ names from a store ], NOTE [ bounded decodes ])."""
    root, config = case_root(jpeg_base, tmp_path / "case")
    victim = tmp_path / "victim.npy"
    victim.write_bytes(b"someone's file")
    if hostile == "16384x21845":
        _resealed(root, _declared(16384, 21845))
    else:
        _resealed(
            root, _renamed(hostile.replace("victim.npy", os.path.relpath(victim, root / "shards")))
        )
    results = driver.run(root, config, EVERY_READER)
    for reader, result in results.items():
        assert "bug" not in result, f"{reader} on {hostile!r}:\n{result['bug']}"
        assert result["code"] in EXIT_CODES.get(reader, {0, 2}), f"{reader} on {hostile!r}"
        if result["code"] == 2:
            assert "\n" not in result["error"].strip(), f"{reader}: {result['error']!r}"
    for reader in ("loaders", "loaders-workers", "loaders-unchecked"):
        if reader in results:
            assert results[reader]["code"] == 2, f"{reader} opened {hostile!r}"
    assert victim.read_bytes() == b"someone's file"
