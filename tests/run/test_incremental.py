"""Incremental re-packing: every cycle ends where a full rebuild of the final source ends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from PIL import Image

from etl.cli import main
from etl.config import PipelineConfig, load_config
from etl.engine import fill
from etl.format.manifest import list_versions, read_manifest
from etl.maintenance.housekeeping import compact
from etl.maintenance.versions import diff, summaries
from etl.run import pipeline
from etl.start.sample_data import make_sample_data
from tests.helpers.cli import cli

CONFIG = """\
source: {{kind: folder, path: {source}, split: {{val: 0.25}}}}
stages:
  - decode: {{}}
  - validate: {{min_size: [16, 16], duplicates: keep_first}}
  - resize: {{size: [16, 16]}}
output: {{dir: {out}, samples_per_shard: 8}}
run: {{n_jobs: 2, backend: threading}}
"""


def config_for(tmp: Path, source: Path, out: Path) -> PipelineConfig:
    path = tmp / f"{out.name}.yaml"
    path.write_text(CONFIG.format(source=source, out=out))
    return load_config(path)


State = tuple[dict[str, tuple[Any, ...]], dict[str, str]]


def state(root: Path, version: int | None = None) -> State:
    """Samples (class, split, checksum, stored bytes) and rejects by source; no shard names or
    label numbers, which legitimately differ between an incremental run and a rebuild."""
    m = read_manifest(root, version)
    samples = {
        s["source"]: (
            s["class_name"],
            m.meta.classes[s["label"]],
            s["split"],
            s["checksum"],
            np.load(root / s["shard"], mmap_mode="r")[s["row"]].tobytes(),
        )
        for s in m.samples.to_pylist()
    }
    rejects = dict(
        zip(
            m.rejects.column("source").to_pylist(),
            m.rejects.column("reason").to_pylist(),
            strict=True,
        )
    )
    return samples, rejects


def rebuild_state(tmp: Path, source: Path) -> State:
    out = tmp / f"rebuild-{len(list(tmp.glob('rebuild-*')))}"
    pipeline.run(config_for(tmp, source, out))
    return state(out)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    make_sample_data(root, per_class=5, seed=11)
    return root


def count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = fill.process_image

    def counting(data: bytes, *args: Any) -> Any:
        calls.append(str(len(data)))
        return real(data, *args)

    monkeypatch.setattr(fill, "process_image", counting)
    return calls


def new_image(path: Path, seed: int, size: tuple[int, int] = (40, 30)) -> None:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(path)


def test_cycles_match_a_full_rebuild(
    tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    config = config_for(tmp_path, source, out)
    decodes = count_decodes(monkeypatch)
    first = pipeline.run(config)
    assert first.version == 1 and len(decodes) == first.packed_new + first.rejected - (
        first.rejects_by_reason.get("duplicate", 0)
    )
    snapshots = {1: state(out)}
    classes_v1 = read_manifest(out).meta.classes

    def cycle(change: Callable[[], None], expect_decodes: int) -> pipeline.RunReport:
        change()
        decodes.clear()
        report = pipeline.run(config)
        assert len(decodes) == expect_decodes, (report.plan_counts, decodes)
        assert report.committed
        snapshots[report.version or 0] = state(out)
        assert state(out) == rebuild_state(tmp_path, source)
        return report

    circle = sorted((source / "circle").glob("circle_*"))
    square = sorted((source / "square").glob("square_*"))
    # add two files
    r = cycle(
        lambda: (
            new_image(source / "circle" / "new1.png", 1),
            new_image(source / "circle" / "new2.png", 2),
        ),
        2,
    )
    assert r.plan_counts["new"] == 2 and r.reused == first.samples_total
    # modify one file's bytes
    r = cycle(lambda: new_image(circle[0], 3), 1)
    assert r.plan_counts["changed"] == 1
    # touch a file: same bytes, new mtime -> hashed, not decoded, not re-stored
    r = cycle(lambda: os.utime(circle[1], ns=(1, 1)), 0)
    assert r.packed_new == 0 and r.shards_written == 0
    # delete one, rename one within its class, move one to another class
    r = cycle(
        lambda: (
            circle[2].unlink(),
            circle[3].rename(circle[3].with_name("renamed" + circle[3].suffix)),
            square[1].rename(source / "triangle" / ("moved" + square[1].suffix)),
        ),
        0,
    )
    assert r.plan_counts["deleted"] == 3 and r.plan_counts["moved"] == 2, r.plan_counts
    # a new class that sorts first keeps every existing label
    r = cycle(lambda: ((source / "aaa").mkdir(), new_image(source / "aaa" / "x.png", 4)), 1)
    classes = read_manifest(out).meta.classes
    assert classes[: len(classes_v1)] == classes_v1 and classes[-1] == "aaa"
    # fix a broken file; the other broken files are not decoded again
    broken = next(source.rglob("broken_truncated_half.png"))
    r = cycle(lambda: new_image(broken, 5), 1)
    assert broken.relative_to(source).as_posix() in state(out)[0]
    # nothing changed: nothing read, nothing committed
    decodes.clear()
    again = pipeline.run(config)
    assert not again.committed and not decodes and again.version == r.version

    # pinned versions are still exactly what they were
    for version, snapshot in snapshots.items():
        assert state(out, version) == snapshot, f"version {version} changed"
    d = diff(out, 1, r.version or 0)
    assert {"circle/new1.png", "circle/new2.png"} <= set(d.added.column("source").to_pylist())
    assert circle[2].relative_to(source).as_posix() in d.removed.column("source").to_pylist()
    assert circle[0].relative_to(source).as_posix() in d.changed.column("source").to_pylist()
    assert [s.version for s in summaries(out)] == list_versions(out)


def test_compaction_keeps_kept_versions_byte_identical(tmp_path: Path, source: Path) -> None:
    out = tmp_path / "out"
    config = config_for(tmp_path, source, out)
    pipeline.run(config)
    v1 = state(out, 1)
    for path in sorted(source.rglob("*_0000[0-3].*")):
        path.unlink()  # kill most rows of the early shards
    pipeline.run(config)
    v2 = state(out, 2)
    before = {p.name for p in (out / "shards").iterdir()}
    report = compact(out, keep_last=1, keep=[1], min_dead_fraction=0.3, grace=0)
    assert report.new_version == 3 and report.rewritten_shards
    assert state(out, 1) == v1 and state(out, 3) == v2
    assert report.deleted_versions == [2]
    assert list_versions(out) == [1, 3]
    # with version 1 kept, no shard it names may go
    assert not set(read_manifest(out, 1).shards.column("shard").to_pylist()) & set(
        report.deleted_shards
    )
    report = compact(out, keep_last=1, grace=0)
    assert list_versions(out) == [3] and state(out, 3) == v2
    after = {p.name for p in (out / "shards").iterdir()}
    assert after == {n.split("/")[1] for n in read_manifest(out).shards.column("shard").to_pylist()}
    assert len(after) < len(before | after)


def test_a_retired_version_stays_whole_for_its_grace_then_goes(
    tmp_path: Path,
    source: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """NOTE [ a grace period ]: a compaction retires versions 1 and 2 (records, nothing gone):
    it is no longer listed, opens pinned with a warning and reads as packed, a loader that
    opened it before finishes its epoch; a compaction within the grace keeps it; the first
    after removes its files, its record and the shards only it named. A damaged record is
    ignored: the version is listed again and nothing goes."""
    import warnings

    from etl.format import retirement
    from loaders import PackedDataset, make_loader

    out = tmp_path / "out"
    config = config_for(tmp_path, source, out)
    pipeline.run(config)
    v1 = state(out, 1)
    for path in sorted(source.rglob("*_0000[0-3].*")):
        path.unlink()
    pipeline.run(config)
    reading = PackedDataset.open(out, version=1)
    epoch = iter(make_loader(reading, batch_size=2, shuffle=True, seed=1, with_indices=True))
    seen = len(next(epoch).indices)

    report = compact(out, keep_last=1, min_dead_fraction=0.3, grace=3600)
    assert report.new_version == 3, "sparse shards rewritten as version 3"
    assert report.deleted_versions == [] and report.retired_versions == [1, 2]
    assert report.deleted_shards == [] and list_versions(out) == [3]
    seen += sum(len(batch.indices) for batch in epoch)  # the epoch begun before ends whole
    assert seen == len(reading)
    assert state(out, 1) == v1
    with pytest.warns(RuntimeWarning, match="version 1 was retired by a compaction"):
        pinned = PackedDataset.open(out, version=1)
    assert len(pinned) == len(v1[0])
    code, listed, err = cli(["versions", str(out), "--json"], capsys)
    assert code == 0 and [v["version"] for v in json.loads(listed)] == [3], err
    assert compact(out, keep_last=1, grace=3600).retired_versions == [1, 2]  # in the grace
    assert state(out, 1) == v1

    record = out / "versions" / retirement.record_name(1)
    whole = record.read_bytes()
    record.write_bytes(whole[:-3])  # damaged: never trusted
    assert list_versions(out) == [1, 3]
    record.write_bytes(whole)
    later = time.time() + 3601
    monkeypatch.setattr(retirement.time, "time", lambda: later)
    report = compact(out, keep_last=1, grace=3600)
    assert report.deleted_versions == [1, 2] and report.retired_versions == []
    assert not (out / "versions" / "v000001").exists() and not record.exists()
    named = set(read_manifest(out, 3).shards.column("shard").to_pylist())
    assert {f"shards/{p.name}" for p in (out / "shards").glob("*.npy")} == named
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(PackedDataset.open(out)) == len(state(out, 3)[0])


def test_the_first_run_after_the_grace_removes_a_retired_version(
    tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE [ a grace period ]: the retired versions go at the first run after their grace,
    as at a compaction: their folders, their records and the shards only they named; the
    latest version reads as before, byte for byte; a run within the grace removes nothing."""
    from etl.format import retirement

    out = tmp_path / "out"
    config = two_versions(tmp_path, source, out)
    report = compact(out, keep_last=1, min_dead_fraction=0.3, grace=3600)
    assert report.retired_versions == [1, 2] and report.new_version == 3
    latest = state(out, 3)
    shards = {p.name for p in (out / "shards").glob("*.npy")}
    assert not pipeline.run(config).committed  # nothing new, and within the grace
    assert (out / "versions" / "v000001").is_dir()
    assert {p.name for p in (out / "shards").glob("*.npy")} == shards

    later = time.time() + 3601
    monkeypatch.setattr(retirement.time, "time", lambda: later)
    assert not pipeline.run(config).committed
    assert sorted(p.name for p in (out / "versions").iterdir()) == ["retired", "v000003"]
    assert not list((out / "versions" / "retired").iterdir())
    named = set(read_manifest(out, 3).shards.column("shard").to_pylist())
    assert {f"shards/{p.name}" for p in (out / "shards").glob("*.npy")} == named
    assert state(out, 3) == latest


def two_versions(tmp_path: Path, source: Path, out: Path) -> PipelineConfig:
    """Version 1 packed from `source`, then version 2 after most rows of the early shards
    were deleted (shards mostly dead): the config that packed them."""
    config = config_for(tmp_path, source, out)
    pipeline.run(config)
    for path in sorted(source.rglob("*_0000[0-3].*")):
        path.unlink()
    pipeline.run(config)
    return config


def test_compact_dry_run_changes_nothing(tmp_path: Path, source: Path) -> None:
    out = tmp_path / "out"
    two_versions(tmp_path, source, out)
    listing = sorted(p.relative_to(out) for p in out.rglob("*"))
    report = compact(out, keep_last=1, min_dead_fraction=0.3, dry_run=True, grace=0)
    assert report.deleted_versions == [1, 2] and report.deleted_shards
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == listing
    real = compact(out, keep_last=1, min_dead_fraction=0.3, grace=0)
    assert real.deleted_shards == report.deleted_shards


class Crash(Exception):
    pass


def crash_after(monkeypatch: pytest.MonkeyPatch, target: Any, name: str, calls: int) -> None:
    """Make target.name raise Crash on call number `calls` (a kill at that exact point)."""
    real = getattr(target, name)
    seen = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        seen[0] += 1
        if seen[0] == calls:
            raise Crash(f"{name} #{calls}")
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, wrapper)


@pytest.mark.slow
@pytest.mark.parametrize(("target", "name"), [(os, "replace"), (os, "rename"), (shutil, "rmtree")])
def test_kill_at_every_step_then_rerun_converges(
    tmp_path: Path, source: Path, target: Any, name: str
) -> None:
    """Crash the incremental run and then the compaction at each call of a durable step."""
    out = tmp_path / "out"
    config = config_for(tmp_path, source, out)
    pipeline.run(config)
    for path in sorted(source.rglob("*_0000[0-2].*")):
        path.unlink()
    new_image(source / "circle" / "fresh.png", 9)
    expected = rebuild_state(tmp_path, source)
    pristine = tmp_path / "pristine"
    shutil.copytree(out, pristine, symlinks=True)
    for step in range(1, 40):
        shutil.rmtree(out)
        shutil.copytree(pristine, out, symlinks=True)
        with pytest.MonkeyPatch.context() as mp:
            crash_after(mp, target, name, step)
            try:
                pipeline.run(config)
                compact(out, keep_last=1, min_dead_fraction=0.3, grace=0)
                crashed = False
            except Crash:
                crashed = True
        assert list_versions(out), "no complete version left"
        pipeline.run(config)
        compact(out, keep_last=1, min_dead_fraction=0.3, grace=0)
        assert state(out) == expected, f"diverged after a crash at {name} #{step}"
        on_disk = {f"shards/{p.name}" for p in (out / "shards").iterdir()}
        assert on_disk == set(read_manifest(out).shards.column("shard").to_pylist())
        assert not [p for p in (out / "versions").iterdir() if p.name.startswith(".tmp-")]
        if not crashed:
            assert step > 3, f"{name} was called only {step - 1} times: the test crashed nothing"
            break
    else:
        pytest.fail("never ran to completion")


def test_config_change_names_keys_and_cli_exit_code(
    tmp_path: Path, source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    pipeline.run(config_for(tmp_path, source, out))
    path = tmp_path / "out.yaml"
    path.write_text(
        path.read_text()
        .replace("size: [16, 16]", "size: [16, 20]")
        .replace("n_jobs: 2", "n_jobs: 1")
    )
    with pytest.raises(SystemExit) as info:
        main(["run", str(path), "--quiet"])
    assert info.value.code == 2
    assert "changed: stages" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["run", str(path), "--quiet", "--rebuild"])
    assert info.value.code == 0
    with pytest.raises(SystemExit) as info:
        main(["versions", str(out)])
    text = capsys.readouterr().out
    assert info.value.code == 0 and " 1 " in text and " 2 " in text
    with pytest.raises(SystemExit) as info:
        main(["diff", str(out), "1", "2"])
    assert info.value.code == 0 and "changed" in capsys.readouterr().out


@pytest.mark.slow
def test_an_in_place_rewrite_with_its_old_mtime_is_packed_again(tmp_path: Path) -> None:
    """`cp -p`, rsync and some editors put the old mtime back: size and mtime then match the
    manifest although the bytes changed. ctime and inode tell; a chmod costs only a re-hash."""
    source = tmp_path / "src"
    rng = np.random.default_rng(3)
    for name in ("a/x.bmp", "a/y.bmp", "b/z.bmp"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(source / name)
    out = tmp_path / "out"
    config = tmp_path / "out.yaml"
    config.write_text(CONFIG.format(source=source, out=out).replace("val: 0.25", "val: 0.0"))

    def etl_run() -> dict[str, dict[str, Any]]:
        done = subprocess.run(
            [sys.executable, "-m", "etl", "run", str(config)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        return {s["source"]: s for s in read_manifest(out).samples.to_pylist()}

    def stored(sample: dict[str, Any]) -> NDArray[np.uint8]:
        return np.array(np.load(out / sample["shard"], mmap_mode="r")[sample["row"]])

    before = etl_run()
    victim = source / "a/x.bmp"
    old = victim.stat()
    Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(victim)
    os.utime(victim, ns=(old.st_atime_ns, old.st_mtime_ns))
    now = victim.stat()
    assert (now.st_size, now.st_mtime_ns) == (old.st_size, old.st_mtime_ns)
    after = etl_run()
    expected = np.asarray(Image.open(victim).convert("RGB"))  # 16x16: the resize keeps it
    assert np.array_equal(stored(after["a/x.bmp"]), expected)
    assert after["a/x.bmp"]["checksum"] != before["a/x.bmp"]["checksum"]
    assert list_versions(out) == [1, 2]

    os.chmod(source / "a/y.bmp", 0o600)  # a new ctime, the same bytes
    shards = sorted(p.name for p in (out / "shards").iterdir())
    again = etl_run()
    assert sorted(p.name for p in (out / "shards").iterdir()) == shards  # nothing re-packed
    assert (again["a/y.bmp"]["shard"], again["a/y.bmp"]["row"]) == (
        after["a/y.bmp"]["shard"],
        after["a/y.bmp"]["row"],
    )
    assert again["a/y.bmp"]["source_ctime_ns"] == (source / "a/y.bmp").stat().st_ctime_ns


@pytest.mark.parametrize("policy", ["allow", "keep_first"])
def test_a_rerun_with_files_of_one_content_changes_nothing(tmp_path: Path, policy: str) -> None:
    """Files of one content, each a sample (duplicates: allow) or one kept and the others
    rejected (keep_first): on a rerun every kept file keeps its own row. Before, a rerun gave a
    kept duplicate the first such file's row, and committed a version that changed nothing but
    row numbers."""
    rng = np.random.default_rng(1)
    for name in ("a/1.png", "a/2.png", "b/3.png", "b/4.png"):
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(
            tmp_path / "src" / name
        )
    same = (tmp_path / "src" / "a" / "1.png").read_bytes()
    (tmp_path / "src" / "b" / "0-copy.png").write_bytes(same)  # sorts before, packs apart
    (tmp_path / "src" / "b" / "9-copy.png").write_bytes(same)
    path = tmp_path / "p.yaml"
    path.write_text(
        CONFIG.format(source=tmp_path / "src", out=tmp_path / "out").replace(
            "duplicates: keep_first", f"duplicates: {policy}"
        )
    )
    first = pipeline.run(load_config(path))
    again = pipeline.run(load_config(path))
    assert (again.version, again.committed) == (first.version, False), again.notes
    rows = read_manifest(tmp_path / "out").samples.select(["shard", "row"]).to_pylist()
    assert len({(r["shard"], r["row"]) for r in rows}) == len(rows) == first.samples_total
