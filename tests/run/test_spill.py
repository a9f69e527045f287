"""What a run's parent keeps by position and on disk instead of as objects (#13): new samples
leave memory as sorted runs and come back merged at the commit (`etl.format.spill`), and hashes
are placed by their chunk's position, whatever order workers finish in. Runs are made tiny
here so that a run of a few dozen images writes several and reads them back in many pieces;
the manifests are checked with plain pyarrow and numpy against a Pillow decode of each
source."""

from __future__ import annotations

import hashlib
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from etl.config import load_config
from etl.engine import fill
from etl.errors import WorkerError
from etl.format import spill, table_ops
from etl.format.manifest import list_versions
from etl.format.schema import SAMPLES_SCHEMA
from etl.run import execute, hash_buckets, pipeline, staged
from tests.helpers.encoded import SIZE, picture, reasons, reference, stored

CLASSES = ("ant", "bee", "cat")


@pytest.fixture
def tiny_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spill runs of 5 rows in batches of 2, merged 6 rows at a time, 3 runs of a size merged
    into one; the plan in windows of 4 files and buckets of about 3."""
    monkeypatch.setattr(spill, "RUN_ROWS", 5)
    monkeypatch.setattr(spill, "FAN_IN", 3)
    monkeypatch.setattr(spill, "BATCH_ROWS", 2)
    monkeypatch.setattr(spill, "MERGE_ROWS", 6)
    monkeypatch.setattr(staged, "WINDOW_ROWS", 4)
    monkeypatch.setattr(hash_buckets, "BUCKET_ROWS", 3)


def rows(keys: list[str]) -> pa.Table:
    return pa.table(
        {"source": keys, "n": [len(k) for k in keys]},
        schema=pa.schema([("source", pa.string()), ("n", pa.int64())]),
    )


def test_spilled_runs_merge_back_in_order(tmp_path: Path, tiny_runs: None) -> None:
    keys = [f"k{i:03d}" for i in range(60)]
    random.Random(3).shuffle(keys)
    kept_sorted = sorted(keys[:17])
    added = keys[17:]
    schema = rows([]).schema
    with spill.SortedSpill(tmp_path, schema, "source") as runs:
        for start in range(0, len(added), 4):
            runs.add(rows(added[start : start + 4]))
        on_disk = sorted(tmp_path.iterdir())
        # every 5+ rows (two adds) make a run: 5 runs, the first 3 of them merged into one
        assert len(added) // 8 == 5
        assert len(on_disk) == 3
        pieces = list(runs.merged(rows(kept_sorted)))
        assert runs.rows == len(added)
    assert not list(tmp_path.iterdir()), "the runs outlived the spill"
    merged = [r["source"] for piece in pieces for r in piece.to_pylist()]
    assert merged == sorted(keys)
    # a piece of each run (and of the table, and of the rows not yet written) at a time
    streams = len(on_disk) + 2
    piece = max(spill.BATCH_ROWS, spill.MERGE_ROWS // streams)
    assert max(piece.num_rows for piece in pieces) <= streams * piece


@pytest.mark.parametrize(("runs", "on_disk"), [(3, 3), (40, 2 + 8)])
def test_sorted_runs_merge_a_bounded_number_of_rows_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runs: int, on_disk: int
) -> None:
    monkeypatch.setattr(spill, "BATCH_ROWS", 4)
    monkeypatch.setattr(spill, "MERGE_ROWS", 64)
    assert spill.FAN_IN == 16
    keys = [f"k{i:04d}" for i in range(runs * 50)]
    random.Random(runs).shuffle(keys)
    with spill.SortedSpill(tmp_path, rows([]).schema, "source") as spilled:
        for start in range(0, len(keys), 50):
            spilled.add_sorted(rows(sorted(keys[start : start + 50])))
        # each sorted table is a run at once; each 16 of them became one (40: 16 + 16 + 8)
        assert len(list(tmp_path.iterdir())) == on_disk
        pieces = list(spilled.merged())
    assert not list(tmp_path.iterdir()), "the runs outlived the spill"
    assert [r["source"] for piece in pieces for r in piece.to_pylist()] == sorted(keys)
    # a piece of each run is MERGE_ROWS / runs rows, never less than a batch
    assert max(piece.num_rows for piece in pieces) <= max(64, on_disk * 4)


def test_runs_cascade_into_few_whatever_the_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs of one size merge into one of the next as soon as there are FAN_IN of them, so the
    files the final merge reads stay few: 200 runs in 3s leave 2 + 1 + 1 + 0 + 2 (200 in base
    3 is 21102)."""
    monkeypatch.setattr(spill, "FAN_IN", 3)
    monkeypatch.setattr(spill, "BATCH_ROWS", 2)
    monkeypatch.setattr(spill, "MERGE_ROWS", 6)
    keys = [f"k{i:05d}" for i in range(200 * 3)]
    random.Random(7).shuffle(keys)
    most = 0
    with spill.SortedSpill(tmp_path, rows([]).schema, "source") as spilled:
        for start in range(0, len(keys), 3):
            spilled.add_sorted(rows(sorted(keys[start : start + 3])))
            most = max(most, len(list(tmp_path.iterdir())))
        assert len(list(tmp_path.iterdir())) == 2 + 1 + 1 + 0 + 2
        merged = spilled.written(tmp_path / "all.arrow")
        assert [p.name for p in tmp_path.iterdir()] == ["all.arrow"]
    assert most <= 2 * 5, "at most FAN_IN - 1 runs of each of the 5 sizes"
    assert merged.table.column("source").to_pylist() == sorted(keys)


def batch_rows(path: Path) -> list[int]:
    """Rows of each record batch of the Arrow file at `path`, read with plain pyarrow."""
    with pa.OSFile(str(path)) as file:
        reader = ipc.open_file(file)
        return [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]


def test_files_mapped_back_hold_few_large_batches(tmp_path: Path) -> None:
    """The merge yields small pieces (MERGE_ROWS over the runs it reads), but the file it
    writes holds batches of FILE_BATCH_ROWS: each batch costs ~470 B of heap a column once
    mapped, 34 MiB for a 10M-row manifest written in 2,000-row batches (session 18)."""
    keys = [f"k{i:06d}" for i in range(50_000)]
    random.Random(5).shuffle(keys)
    with spill.SortedSpill(tmp_path, rows([]).schema, "source") as spilled:
        for start in range(0, len(keys), 1_000):
            spilled.add(rows(keys[start : start + 1_000]))
        mapped = spilled.written(tmp_path / "all.arrow")
    full = table_ops.FILE_BATCH_ROWS
    whole, rest = divmod(len(keys), full)
    assert whole >= 2 and rest
    assert batch_rows(tmp_path / "all.arrow") == [full] * whole + [rest]
    assert mapped.table.column("source").to_pylist() == sorted(keys)


def write_tree(root: Path, seeds: range) -> dict[str, bytes]:
    """Pictures spread over CLASSES, and one file in each class that is not an image."""
    files: dict[str, bytes] = {}
    for seed in seeds:
        files[f"{CLASSES[seed % 3]}/p{seed:03d}.{'png' if seed % 2 else 'jpg'}"] = picture(seed)
    for name in CLASSES:
        files.setdefault(f"{name}/broken.png", b"\x89PNG\r\n\x1a\nnot an image")
    for source, data in files.items():
        (root / source).parent.mkdir(parents=True, exist_ok=True)
        (root / source).write_bytes(data)
    return files


CONFIG = """\
source: {{kind: folder, path: {source}}}
stages:
  - decode: {{}}
  - resize: {{size: [{height}, {width}]}}
output: {{dir: {out}, samples_per_shard: 4}}
run: {{n_jobs: 2, backend: threading}}
"""


def check_output(out: Path, files: dict[str, bytes]) -> dict[str, Any]:
    """Every picture stored as Pillow decodes it, once, in source order; the rest rejected."""
    samples = stored(out)
    sources = list(samples)
    assert sources == sorted(sources, key=lambda s: s.encode()), "manifest not in source order"
    pictures = {s for s in files if not s.endswith("broken.png")}
    assert set(samples) == pictures
    assert reasons(out) == {s: "unreadable" for s in set(files) - pictures}
    for source, (pixels, row) in samples.items():
        np.testing.assert_array_equal(pixels, reference(files[source]), err_msg=source)
        assert row["class_name"] == source.split("/")[0]
    locations = [(row["shard"], row["row"]) for _, row in samples.values()]
    assert len(set(locations)) == len(locations)
    # tiny runs merge a few rows at a time; the version's files still hold one batch each
    manifest = sorted((out / "versions").glob("v*/manifest.arrow"))[-1]
    assert batch_rows(manifest) == [len(samples)]
    leftovers = [p.name for p in (out / "versions").iterdir() if p.name.startswith(".tmp-")]
    assert not leftovers
    return {source: row for source, (_, row) in samples.items()}


def test_a_run_and_a_rerun_through_tiny_runs(tmp_path: Path, tiny_runs: None) -> None:
    source, out = tmp_path / "src", tmp_path / "out"
    files = write_tree(source, range(23))
    path = tmp_path / "p.yaml"
    height, width = SIZE
    path.write_text(CONFIG.format(source=source, out=out, height=height, width=width))
    config = load_config(path)

    first = pipeline.run(config)
    assert first.packed_new == 23 and first.rejected == 3
    before = check_output(out, files)

    files.update(write_tree(source, range(23, 35)))
    second = pipeline.run(config)
    assert (second.reused, second.packed_new, second.version) == (23, 12, 2)
    after = check_output(out, files)
    assert all(after[s]["shard"] == before[s]["shard"] for s in before), "reused rows moved"
    assert list_versions(out) == [1, 2]


def test_a_failed_pack_leaves_no_runs_behind(
    tmp_path: Path, tiny_runs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, out = tmp_path / "src", tmp_path / "out"
    write_tree(source, range(30))
    path = tmp_path / "p.yaml"
    path.write_text(
        CONFIG.format(source=source, out=out, height=12, width=16).replace(
            "threading", "sequential"
        )
    )
    real, calls = fill.process_image, [0]
    written: list[int] = []
    real_cascade = spill.SortedSpill._cascade

    def cascade(self: spill.SortedSpill) -> None:  # runs after each run is written
        real_cascade(self)
        if self.name == "samples":  # the new samples, not the plan's spills
            written.append(len(list(self.folder.glob("samples-*"))))

    monkeypatch.setattr(spill.SortedSpill, "_cascade", cascade)

    def failing(*args: Any) -> Any:
        calls[0] += 1
        if calls[0] == 25:  # in the 7th shard: 6 were packed, 3 runs written, merged into 1
            raise RuntimeError("a bug in a stage")
        return real(*args)

    monkeypatch.setattr(fill, "process_image", failing)
    with pytest.raises(WorkerError, match="a bug in a stage"):
        pipeline.run(load_config(path))
    assert written == [1, 2, 1]
    assert list_versions(out) == []
    assert not (out / "versions").exists(), "a first run that failed leaves no versions/"


def test_empty_tables_spill_and_merge_to_nothing(tmp_path: Path) -> None:
    with spill.SortedSpill(tmp_path, SAMPLES_SCHEMA, "source") as runs:
        runs.add(SAMPLES_SCHEMA.empty_table())
        assert list(runs.merged(SAMPLES_SCHEMA.empty_table())) == []


def test_hashes_land_on_their_files_whatever_order_chunks_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of 3 files hashed by 2 threads finish out of order; each hash must still be its
    own file's (sha256 by hashlib, not etl's code), unreadable files null and rejected."""
    from etl.config import FolderSource, RunConfig
    from etl.sources.kinds.folder import list_folder

    source = tmp_path / "src"
    files = write_tree(source, range(40))
    listing = list_folder(FolderSource(kind="folder", path=source))
    gone = sorted(files)[5::9]
    for name in gone:
        (source / name).unlink()
    monkeypatch.setattr(execute, "HASH_CHUNK", 3)
    from etl.run import worker

    real = worker.readers.digest_many

    def shuffled_delay(config: Any, paths: Any, algorithm: str, *rest: Any) -> Any:
        paths = list(paths)
        time.sleep(random.Random(paths[0]).random() / 50)  # finish out of order
        return real(config, paths, algorithm, *rest)

    monkeypatch.setattr(worker.readers, "digest_many", shuffled_delay)
    hashes, rejects = execute.hash_sources(
        listing.files,
        "sha256",
        RunConfig(n_jobs=2, backend="threading"),
        source_config=FolderSource(kind="folder", path=source),
    )
    sources = listing.files.table.column("source").to_pylist()
    want = [None if s in gone else hashlib.sha256(files[s]).hexdigest() for s in sources]
    assert hashes.to_pylist() == want
    assert sorted(r.source for r in rejects) == gone
