"""End to end: real runs on generated data, checked against an independent Pillow decode."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc
import pytest
import xxhash
from PIL import Image, ImageOps

from etl.config import PipelineConfig, load_config
from etl.engine import parallel
from etl.errors import ConfigError, LockError
from etl.format.lock import DatasetLock
from etl.format.manifest import list_versions, read_manifest
from etl.run import phases, pipeline
from etl.start.sample_data import make_sample_data

CONFIG = """\
source:
  kind: folder
  path: data
  split: {{val: 0.2}}
stages:
  - decode: {{mode: {mode}}}
  - validate: {{min_size: [16, 16], max_aspect: 8.0, duplicates: keep_first}}
  - resize: {{size: [24, 32], mode: {resize}, draft: {draft}}}
output:
  dir: out
  samples_per_shard: {per_shard}
  layout: {layout}
run:
  n_jobs: 2
"""


def make_config(
    tmp_path: Path,
    *,
    mode: str = "RGB",
    resize: str = "center_crop",
    draft: bool = False,
    per_shard: int = 16,
    layout: str = "HWC",
) -> PipelineConfig:
    path = tmp_path / "pipeline.yaml"
    path.write_text(
        CONFIG.format(
            mode=mode, resize=resize, draft=str(draft).lower(), per_shard=per_shard, layout=layout
        )
    )
    return load_config(path)


@pytest.fixture(scope="module")
def sample_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sample") / "data"
    make_sample_data(root, per_class=8, seed=3)
    return root


@pytest.fixture
def workdir(tmp_path: Path, sample_root: Path) -> Path:
    os.symlink(sample_root, tmp_path / "data")
    return tmp_path


def reference(path: Path, size_hw: tuple[int, int], mode: str) -> np.ndarray:
    """A plain Pillow decode + centre-crop resize, written independently of etl.images.stages."""
    image = Image.open(io.BytesIO(path.read_bytes()))
    image.seek(0)
    image = ImageOps.exif_transpose(image)
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        values = np.asarray(image, dtype=np.float64)
        image = Image.fromarray(np.round(values / 257.0).astype(np.uint8), "L")
    if image.mode in ("RGBA", "LA", "PA", "La", "RGBa") or (
        image.mode == "P" and "transparency" in image.info
    ):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, rgba)
    image = image.convert(mode)
    h, w = size_hw
    fitted = ImageOps.fit(image, (w, h), Image.Resampling.BILINEAR)
    array = np.asarray(fitted)
    return array[:, :, None] if array.ndim == 2 else array


def stored(root: Path, shard: str, row: int) -> np.ndarray:
    return np.load(root / shard, mmap_mode="r")[row]


@pytest.mark.parametrize(("mode", "layout"), [("RGB", "HWC"), ("L", "CHW")])
def test_every_sample_matches_an_independent_decode(workdir: Path, mode: str, layout: str) -> None:
    config = make_config(workdir, mode=mode, layout=layout)
    report = pipeline.run(config)
    assert report.committed and report.version == 1
    manifest = read_manifest(config.output.dir)
    samples = manifest.samples.to_pylist()
    assert samples, "nothing was packed"
    for s in samples:
        expected = reference(config.source.path / s["source"], (24, 32), mode)
        if layout == "CHW":
            expected = expected.transpose(2, 0, 1)
        got = stored(config.output.dir, s["shard"], s["row"])
        np.testing.assert_array_equal(got, expected, err_msg=s["source"])
        assert s["checksum"] == xxhash.xxh3_64_hexdigest(np.ascontiguousarray(got).tobytes())
        assert s["source_hash"] == xxhash.xxh3_64_hexdigest(
            (config.source.path / s["source"]).read_bytes()
        )
        assert manifest.meta.classes[s["label"]] == s["class_name"] == s["source"].split("/")[0]
    assert manifest.meta.sample_shape == config.sample_shape


def test_every_source_is_accounted_for_with_its_reason(workdir: Path) -> None:
    config = make_config(workdir)
    report = pipeline.run(config)
    manifest = read_manifest(config.output.dir)
    listed = sorted(
        p.relative_to(config.source.path).as_posix()
        for p in config.source.path.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    )
    packed = manifest.samples.column("source").to_pylist()
    rejected = manifest.rejects.column("source").to_pylist()
    assert sorted(packed + rejected) == listed
    assert not set(packed) & set(rejected)
    assert report.listed == len(listed)
    reasons = dict(zip(rejected, manifest.rejects.column("reason").to_pylist(), strict=True))
    by_name = {name.split("/")[-1]: reason for name, reason in reasons.items()}
    assert by_name["broken_truncated_half.jpg"] == "truncated"
    assert by_name["broken_truncated_half.png"] == "truncated"
    assert by_name["broken_zero_bytes.jpg"] == "unreadable"
    assert by_name["broken_text_not_image.jpg"] == "unreadable"
    assert by_name["broken_bad_crc.png"] in ("unreadable", "corrupt")
    assert by_name["edge_too_small_12x10.png"] == "too_small"
    assert by_name["edge_extreme_aspect_400x20.jpg"] == "aspect"
    assert "duplicate" in reasons.values()
    assert sum(report.rejects_by_reason.values()) == report.rejected == len(rejected)


def test_shards_are_plain_npy_and_match_the_shards_table(workdir: Path) -> None:
    config = make_config(workdir, per_shard=10)
    pipeline.run(config)
    manifest = read_manifest(config.output.dir)
    names = manifest.shards.column("shard").to_pylist()
    assert len(names) > 2
    for row in manifest.shards.to_pylist():
        path = config.output.dir / row["shard"]
        array = np.load(path, mmap_mode="r")
        assert array.shape == (row["rows"], *config.sample_shape)
        assert path.stat().st_size == row["bytes"]
        assert row["checksum"] == xxhash.xxh3_64_hexdigest(path.read_bytes())
    counts = manifest.samples.group_by("shard").aggregate([("row", "count")])
    assert dict(zip(counts["shard"].to_pylist(), counts["row_count"].to_pylist(), strict=True)) == {
        r["shard"]: r["rows"] for r in manifest.shards.to_pylist()
    }


def test_draft_decoding_stays_close_to_full_decode(workdir: Path, tmp_path: Path) -> None:
    full = pipeline.run(make_config(workdir, draft=False))
    draft_dir = tmp_path / "draft"
    draft_dir.mkdir()
    os.symlink(workdir / "data", draft_dir / "data")
    config = make_config(draft_dir, draft=True)
    pipeline.run(config)
    a = read_manifest(full.output)
    b = read_manifest(config.output.dir)
    assert a.samples.column("source").to_pylist() == b.samples.column("source").to_pylist()
    diffs = [
        np.abs(
            stored(full.output, x["shard"], x["row"]).astype(np.int16)
            - stored(config.output.dir, y["shard"], y["row"]).astype(np.int16)
        ).mean()
        for x, y in zip(a.samples.to_pylist(), b.samples.to_pylist(), strict=True)
    ]
    assert max(diffs) < 6.0 and float(np.mean(diffs)) < 2.0


def test_the_report_says_where_the_time_went(workdir: Path) -> None:
    started = time.perf_counter()
    report = pipeline.run(make_config(workdir))
    wall = time.perf_counter() - started
    assert list(report.phases) == ["list", "hash", "plan", "pack", "commit"]
    assert all(seconds >= 0 for seconds in report.phases.values())
    assert sum(report.phases.values()) <= report.seconds <= wall
    assert report.to_dict()["phases"].keys() == report.phases.keys()
    again = pipeline.run(make_config(workdir))  # nothing to pack or commit
    assert list(again.phases) == ["list", "hash", "plan", "pack"]


def test_rerun_without_changes_commits_nothing(workdir: Path) -> None:
    config = make_config(workdir)
    first = pipeline.run(config)
    again = pipeline.run(config)
    assert not again.committed and again.version == first.version == 1
    assert again.packed_new == 0 and list_versions(config.output.dir) == [1]


def test_output_setting_change_is_refused_unless_rebuild(workdir: Path) -> None:
    pipeline.run(make_config(workdir))
    changed = make_config(workdir, resize="pad")
    with pytest.raises(ConfigError, match=r"changed: stages"):
        pipeline.run(changed)
    report = pipeline.run(changed, rebuild=True)
    assert report.committed and report.version == 2 and report.reused == 0
    assert (
        read_manifest(changed.output.dir, 1).meta.config
        != read_manifest(changed.output.dir, 2).meta.config
    )


def test_output_inside_source_is_refused(workdir: Path, tmp_path: Path) -> None:
    (tmp_path / "src" / "a").mkdir(parents=True)
    path = tmp_path / "bad.yaml"
    path.write_text(
        "source: {kind: folder, path: src}\nstages: [{decode: {}}, {resize: {size: [4, 4]}}]\n"
        "output: {dir: src/out}\n"
    )
    with pytest.raises(ConfigError, match=r"inside source\.path"):
        pipeline.run(load_config(path))


def test_second_writer_is_refused(workdir: Path) -> None:
    config = make_config(workdir)
    config.output.dir.mkdir()
    with DatasetLock(config.output.dir), pytest.raises(LockError, match="another etl process"):
        pipeline.run(config)
    assert pipeline.run(config).committed, "the lock is released with its holder"


def _comparable(root: Path) -> list[tuple[object, ...]]:
    """Samples with their stored bytes, independent of shard names."""
    manifest = read_manifest(root)
    return [
        (
            s["source"],
            s["label"],
            s["split"],
            s["checksum"],
            stored(root, s["shard"], s["row"]).tobytes(),
        )
        for s in manifest.samples.to_pylist()
    ]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_run_leaves_previous_version_and_rerun_converges(
    tmp_path: Path, sig: signal.Signals
) -> None:
    data = tmp_path / "data"
    make_sample_data(data, per_class=60, seed=5, broken=False)
    config = make_config(tmp_path, per_shard=8)
    # version 1 from a subset, then the full folder is packed by a run we kill
    subset = tmp_path / "subset"
    (tmp_path / "subset.yaml").write_text(
        (tmp_path / "pipeline.yaml").read_text().replace("path: data", "path: subset")
    )
    subset.mkdir()
    first_class = sorted(p for p in data.iterdir() if p.is_dir())[0]
    shutil.copytree(first_class, subset / first_class.name, copy_function=shutil.copy2)
    pipeline.run(load_config(tmp_path / "subset.yaml"))
    v1 = _comparable(config.output.dir)

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "etl",
            "run",
            str(tmp_path / "pipeline.yaml"),
            "--jobs",
            "1",
            "--quiet",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # NOTE: a background shell (like CI's) starts us with SIGINT ignored, and children
        # inherit that; restore the default so Python installs its KeyboardInterrupt handler.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    shards = config.output.dir / "shards"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
        p.name.startswith("v000002") for p in shards.iterdir()
    ):
        time.sleep(0.02)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0, "the run finished before it could be interrupted"
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and b"Traceback" not in stderr, stderr.decode()
    assert list_versions(config.output.dir) == [1]
    assert _comparable(config.output.dir) == v1, "the previous version changed"

    report = pipeline.run(config)
    assert report.committed and report.version == 2
    assert not [p for p in shards.iterdir() if p.name.startswith(".tmp-")]
    clean = tmp_path / "clean"
    clean.mkdir()
    os.symlink(data, clean / "data")
    pipeline.run(make_config(clean, per_shard=8))
    assert _comparable(config.output.dir) == _comparable(clean / "out")
    referenced = set(read_manifest(config.output.dir).shards.column("shard").to_pylist()) | set(
        read_manifest(config.output.dir, 1).shards.column("shard").to_pylist()
    )
    on_disk = {f"shards/{p.name}" for p in shards.iterdir()}
    assert on_disk == referenced, "leftovers of the killed run remain"


def test_manifest_is_readable_by_pandas_and_duckdb(workdir: Path) -> None:
    config = make_config(workdir)
    pipeline.run(config)
    path = config.output.dir / "versions" / "v000001" / "manifest.arrow"
    import duckdb
    import pandas as pd

    frame = pd.read_feather(path)
    manifest = ipc.open_file(path).read_all()
    per_class = duckdb.sql(
        "select class_name, count(*) n from manifest group by class_name order by class_name"
    ).fetchall()
    assert sum(n for _, n in per_class) == len(frame) == manifest.num_rows


def test_every_new_shard_is_fsynced_before_the_commit(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers leave the fsync to the parent, which seals each shard from its tasks' rows
    (etl.run.execute.pack); the manifest must still come only after every shard it references,
    and the rename of each, is on disk."""
    from etl.run import execute

    events: list[tuple[str, str]] = []
    real_fsync, real_fsync_dir, real_commit = os.fsync, execute.fsync_dir, phases.commit_version

    def fsync(fd: int) -> None:
        real_fsync(fd)
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))

    def fsync_dir(path: Path) -> None:
        real_fsync_dir(path)
        events.append(("fsync", str(path)))

    def commit(*args: object, **kwargs: object) -> None:
        events.append(("commit", ""))
        real_commit(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(execute, "fsync_dir", fsync_dir)
    monkeypatch.setattr(phases, "commit_version", commit)
    report = pipeline.run(make_config(workdir, per_shard=5))  # loky workers
    assert report.committed and report.shards_written > 3
    root = workdir / "out"
    shards = read_manifest(root).shards.column("shard").to_pylist()
    before = events[: events.index(("commit", ""))]
    synced = [Path(path).name for _, path in before]
    for shard in shards:  # fsynced under its temp name, before the rename
        assert any(name.startswith(f".tmp-{Path(shard).name}-") for name in synced), shard
    assert before[-1] == ("fsync", str(root / "shards")), "the folder after the last shard"


def test_threads_here_workers_or_both_give_the_same_dataset(
    tmp_path: Path, sample_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small first run hashes and packs on threads here; a large one starts its loky
    workers and hands them what the threads have not taken (NOTE [ head start ]); a `call`
    stage packs in the workers only. The same version, byte for byte, every way."""
    from tests.run.test_cluster import same_dataset

    outputs = []
    for worthy, user_code in ((10**9, False), (0, False), (0, True)):
        monkeypatch.setattr(parallel, "PROCESS_WORTHY_ITEMS", worthy)
        work = tmp_path / f"worthy-{worthy}-{user_code}"
        work.mkdir()
        os.symlink(sample_root, work / "data")
        config = make_config(work)
        assert config.run.backend == "auto"
        if user_code:
            text = (work / "pipeline.yaml").read_text()
            call = '  - call: {function: "numpy:ascontiguousarray"}\noutput:'
            (work / "pipeline.yaml").write_text(text.replace("output:", call))
            config = load_config(work / "pipeline.yaml")
            assert config.runs_user_code
        report = pipeline.run(config)
        assert report.committed and report.packed_new > 0
        outputs.append(work / "out")
    same_dataset(outputs[0], outputs[1])
    same_dataset(outputs[0], outputs[2])
