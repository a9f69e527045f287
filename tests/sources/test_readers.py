"""Reads that stall (a hung network mount) are cut off after source.io_timeout.

No file system here can hang a read of a regular file on demand (that needs a FUSE server or a
dead NFS server), so the stall is a real blocking read of a FIFO inside the timed section, and
in the run below a reader that blocks on one named file until the test ends.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from etl.config import FolderSource, load_config
from etl.format.manifest import read_manifest
from etl.run import pipeline
from etl.sources import in_store, readers, timed
from etl.sources.registry import spec_of


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "stalled"
    os.mkfifo(path)
    yield path
    # release the reader left blocked in open(): a writer that opens and closes at once
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    os.close(fd)


def test_a_stalled_read_is_cut_off_and_the_next_read_works(fifo: Path) -> None:
    started = time.monotonic()
    with pytest.raises(readers.Refused) as info:
        timed.with_time_limit(fifo.read_bytes, 0.3, str(fifo))
    assert 0.3 <= time.monotonic() - started < 5
    assert info.value.reason == "io_timeout"
    assert str(info.value) == (
        f"{fifo}: no answer in 0.3 s (source.io_timeout): a hung or very slow mount?"
    )
    assert timed.with_time_limit(lambda: b"next", 0.3, "x") == b"next"


def test_errors_of_the_read_itself_come_back_unchanged(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        timed.with_time_limit((tmp_path / "absent").read_bytes, 5, "absent")


CONFIG = """\
source: {{kind: folder, path: {source}, io_timeout: 0.5, split: {{}}}}
stages: [{{decode: {{}}}}, {{resize: {{size: [8, 8]}}}}]
output: {{dir: {out}, samples_per_shard: 4}}
run: {{n_jobs: 2, backend: threading}}
"""


def test_a_run_rejects_the_stalled_file_and_packs_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "src"
    for i in range(6):
        (source / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        Image.fromarray(np.full((10, 10, 3), i * 20, np.uint8)).save(buffer, "PNG")
        (source / f"c{i % 2}" / f"{i}.png").write_bytes(buffer.getvalue())
    stalled = str(source / "c1" / "3.png")
    release = threading.Event()
    real = in_store.file_digest

    def hanging_digest(path: str, algorithm: str, max_bytes: int) -> str:
        if path == stalled:
            release.wait(60)  # as a read on a dead mount: no answer
        return real(path, algorithm, max_bytes)

    monkeypatch.setattr(in_store, "file_digest", hanging_digest)
    config = tmp_path / "pipeline.yaml"
    config.write_text(CONFIG.format(source=source, out=tmp_path / "out"))
    try:
        report = pipeline.run(load_config(config))
    finally:
        release.set()
    manifest = read_manifest(tmp_path / "out")
    assert sorted(manifest.samples.column("source").to_pylist()) == [
        "c0/0.png",
        "c0/2.png",
        "c0/4.png",
        "c1/1.png",
        "c1/5.png",
    ]
    rejects = manifest.rejects.to_pylist()
    assert [(r["source"], r["reason"]) for r in rejects] == [("c1/3.png", "io_timeout")]
    assert report.committed


# --- many files: read ahead of the caller ---------------------------------------------------


def test_many_reads_keep_their_order_and_each_files_own_outcome(tmp_path: Path) -> None:
    small = tmp_path / "small.bin"
    small.write_bytes(b"a" * 10)
    large = tmp_path / "large.bin"
    large.write_bytes(b"b" * 100)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    locators = [str(p) for p in (small, tmp_path / "absent", fifo, large, folder, empty, small)]
    config = FolderSource(path=tmp_path, max_file_bytes=50, io_timeout=5)

    outcomes = list(readers.read_many(spec_of(config), locators))
    digests = list(readers.digest_many(spec_of(config), locators, "sha256"))

    assert outcomes[0] == outcomes[6] == b"a" * 10
    assert outcomes[5] == b""
    assert isinstance(outcomes[1], FileNotFoundError)
    reasons = [getattr(o, "reason", None) for o in outcomes]
    assert reasons[2:5] == ["not_a_file", "file_too_large", "not_a_file"]
    for outcome, digest in zip(outcomes, digests, strict=True):
        if isinstance(outcome, bytes):
            assert digest == hashlib.sha256(outcome).hexdigest()
        else:
            assert type(digest) is type(outcome) and str(digest) == str(outcome)


def test_a_stalled_file_among_many_is_cut_off_and_the_others_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = [tmp_path / f"{i}.bin" for i in range(6)]
    for i, path in enumerate(paths):
        path.write_bytes(bytes([i]) * 4)
    release = threading.Event()
    real = in_store.read_regular_file

    def hanging_read(path: str, max_bytes: int) -> bytes:
        if path == str(paths[2]):
            release.wait(60)  # as a read on a dead mount: no answer
        return real(path, max_bytes)

    monkeypatch.setattr(in_store, "read_regular_file", hanging_read)
    config = FolderSource(path=tmp_path, io_timeout=0.3)
    started = time.monotonic()
    try:
        outcomes = list(readers.read_many(spec_of(config), [str(p) for p in paths]))
    finally:
        release.set()
    assert time.monotonic() - started < 10
    assert [o for i, o in enumerate(outcomes) if i != 2] == [
        bytes([i]) * 4 for i in (0, 1, 3, 4, 5)
    ]
    assert isinstance(outcomes[2], readers.Refused) and outcomes[2].reason == "io_timeout"


def test_reading_ahead_holds_at_most_a_few_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader thread runs ahead of a slow caller by READ_AHEAD files, not the whole list:
    what it holds stays a few files whatever the length of a shard."""
    started: list[str] = []
    real = in_store.read_regular_file

    def counted_read(path: str, max_bytes: int) -> bytes:
        started.append(path)
        return real(path, max_bytes)

    monkeypatch.setattr(in_store, "read_regular_file", counted_read)
    paths = []
    for i in range(40):
        paths.append(tmp_path / f"{i}.bin")
        paths[-1].write_bytes(b"x")
    outcomes = readers.read_many(spec_of(FolderSource(path=tmp_path)), [str(p) for p in paths])
    for taken in range(1, 4):
        assert next(outcomes) == b"x"
        time.sleep(0.2)  # the caller decodes slowly; the thread has all the time it wants
        assert len(started) == taken + timed.READ_AHEAD
    assert len(list(outcomes)) == 40 - 3
