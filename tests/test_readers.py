"""Reads that stall (a hung network mount) are cut off after source.io_timeout.

No file system here can hang a read of a regular file on demand (that needs a FUSE server or a
dead NFS server), so the stall is a real blocking read of a FIFO inside the timed section, and
in the run below a reader that blocks on one named file until the test ends.
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from etl import pipeline, readers
from etl.config import load_config
from etl.manifest import read_manifest


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
        readers.with_time_limit(fifo.read_bytes, 0.3, str(fifo))
    assert 0.3 <= time.monotonic() - started < 5
    assert info.value.reason == "io_timeout"
    assert str(info.value) == (
        f"{fifo}: no answer in 0.3 s (source.io_timeout): a hung or very slow mount?"
    )
    assert readers.with_time_limit(lambda: b"next", 0.3, "x") == b"next"


def test_errors_of_the_read_itself_come_back_unchanged(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        readers.with_time_limit((tmp_path / "absent").read_bytes, 5, "absent")


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
    real = readers.file_digest

    def hanging_digest(path: str, algorithm: str, max_bytes: int) -> str:
        if path == stalled:
            release.wait(60)  # as a read on a dead mount: no answer
        return real(path, algorithm, max_bytes)

    monkeypatch.setattr(readers, "file_digest", hanging_digest)
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
