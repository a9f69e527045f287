"""Tasks smaller than shards (NOTE [ tasks smaller than shards ] in etl.format.parts): many
tasks fill one shard, rejects leave gaps that the seal closes, and the output is the same bytes
whatever the batch size or the engine. Checked against plain numpy reads and a Pillow decode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from etl.config import PipelineConfig, load_config
from etl.format.manifest import read_manifest
from etl.run import pipeline, tasks
from tests.run.test_cluster import same_dataset
from tests.run.test_pipeline import reference

SIZE = (12, 10)


def make_source(root: Path, good: int, broken: int, seed: int = 7) -> set[str]:
    """`good` noise PNGs and `broken` truncated ones in two classes; returns the broken."""
    rng = np.random.default_rng(seed)
    broken_names: set[str] = set()
    for i in range(good + broken):
        folder = root / ("a" if i % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"img_{i:04d}.png"
        side = int(rng.integers(14, 30))
        Image.fromarray(rng.integers(0, 256, (side, side + 3, 3), dtype=np.uint8)).save(path)
        if i >= good:
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 2])
            broken_names.add(path.relative_to(root).as_posix())
    return broken_names


def make_config(tmp: Path, source: Path, out: str, per_shard: int, backend: str) -> PipelineConfig:
    path = tmp / f"{out}.yaml"
    n_jobs = 1 if backend == "sequential" else 2
    path.write_text(
        f"source: {{kind: folder, path: '{source}'}}\n"
        "stages:\n"
        "  - decode: {mode: RGB}\n"
        f"  - resize: {{size: [{SIZE[0]}, {SIZE[1]}], mode: center_crop}}\n"
        f"output: {{dir: '{tmp / out}', samples_per_shard: {per_shard}}}\n"
        f"run: {{n_jobs: {n_jobs}, backend: {backend}}}\n"
    )
    return load_config(path)


def batches_of(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    """Make every pack task `size` sources (the planner reads these when it plans)."""
    monkeypatch.setattr(tasks, "MIN_BATCH", size)
    monkeypatch.setattr(tasks, "MAX_BATCH", size)


def check_shards(out: Path, source: Path) -> None:
    """Each shard holds exactly the rows the manifest names, 0..n-1, each an independent decode
    of its source; no temp file is left."""
    manifest = read_manifest(out)
    samples = manifest.samples.to_pylist()
    by_shard: dict[str, list[dict[str, object]]] = {}
    for s in samples:
        by_shard.setdefault(str(s["shard"]), []).append(s)
    records = {r["shard"]: r for r in manifest.shards.to_pylist()}
    assert set(records) == set(by_shard)
    for shard, rows in by_shard.items():
        array = np.load(out / shard)
        assert sorted(int(str(r["row"])) for r in rows) == list(range(len(array)))
        assert records[shard]["rows"] == len(array) == len(rows)
        for r in rows:
            expected = reference(source / str(r["source"]), SIZE, "RGB")
            np.testing.assert_array_equal(array[int(str(r["row"]))], expected, str(r["source"]))
    assert not [p.name for p in (out / "shards").iterdir() if p.name.startswith(".tmp-")]


def test_rejects_inside_many_task_shards_leave_no_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "src"
    broken = make_source(source, good=30, broken=25)
    batches_of(monkeypatch, 3)
    config = make_config(tmp_path, source, "out", per_shard=7, backend="loky")
    report = pipeline.run(config)
    assert report.committed and report.packed_new == 30
    manifest = read_manifest(config.output.dir)
    assert set(manifest.rejects.column("source").to_pylist()) == broken
    assert set(manifest.rejects.column("reason").to_pylist()) == {"truncated"}
    check_shards(config.output.dir, source)
    # 55 sources in shards of 7: 8 planned; with 25 rejects some hold fewer rows, some none
    planned = -(-55 // 7)
    written = manifest.shards.num_rows
    assert written <= planned and report.shards_written == written
    assert any(r["rows"] < 7 for r in manifest.shards.to_pylist())


def test_same_bytes_whatever_the_batch_and_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "src"
    make_source(source, good=26, broken=9, seed=3)
    runs = [("whole", 50, "loky"), ("seq1", 1, "sequential"), ("thr2", 2, "threading")]
    runs += [("loky4", 4, "loky")]
    for name, batch, backend in runs:
        batches_of(monkeypatch, batch)
        report = pipeline.run(make_config(tmp_path, source, name, 10, backend))
        assert report.committed and report.packed_new == 26
    check_shards(tmp_path / "whole", source)
    for name, _, _ in runs[1:]:
        same_dataset(tmp_path / "whole", tmp_path / name)


@pytest.mark.parametrize(
    ("items", "per_shard", "batch"), [(0, 5, 2), (1, 5, 2), (23, 5, 2), (23, 5, 7), (40, 8, 3)]
)
def test_shard_batches_cover_every_source_once_within_one_shard(
    items: int, per_shard: int, batch: int
) -> None:
    made = list(tasks.ShardBatches(items, per_shard, batch, lambda *args: args))
    seen: list[int] = []
    for shard, start, stop, shard_start, capacity in made:
        assert shard_start == shard * per_shard and 0 < stop - start <= batch
        assert shard_start <= start < stop <= shard_start + capacity
        assert capacity == min(per_shard, items - shard_start)
        seen += range(start, stop)
    assert seen == list(range(items))


def test_batch_size_follows_pixels_and_workers() -> None:
    photo = 224 * 224 * 3
    assert tasks.batch_size(100_000, 1700, photo, 2) == tasks.TASK_BYTES // photo
    assert tasks.batch_size(1000, 1700, photo, 16) == 16  # 4 tasks a worker
    assert tasks.batch_size(10, 1700, photo, 16) == tasks.MIN_BATCH
    assert tasks.batch_size(10**6, 87_000, 32 * 32 * 3, 2) == tasks.MAX_BATCH
    assert tasks.batch_size(10**6, 5, 32 * 32 * 3, 2) == 5  # never past one shard
