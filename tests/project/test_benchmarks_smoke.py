"""The benchmarks still run end to end: `python -m benchmarks.pack.throughput --tiny`,
`python -m benchmarks.pack.sources --tiny`, `python -m benchmarks.formats.scale --tiny`,
`python -m benchmarks.pack.tree --tiny`, `python -m benchmarks.load.cold --tiny`, and small
runs of `load.from_store`, `pack.from_store`, `pack.grid`, `pack.rejects`,
`load.verify_rows`, `formats.columns`, `load.mixture`, `formats.aspect`, `formats.codecs`,
`formats.encoded`, `pack.draft`, `load.trace`, `maintain.report`, `pack.worker_start`,
`pack.original` and `gpu.device_decode`.

Numbers from 16 photos mean nothing; the test checks that every part runs (photo generation,
bare loops, the pipeline on every backend, the memory runs) and that the pipeline's pixels equal
the bare Pillow loop's, which the benchmark itself verifies and reports.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end to end: see docs/architecture.md, "Test tiers"

pytest.importorskip("skimage", reason="benchmark-only dependency: pip install -e '.[bench]'")
pytest.importorskip("psutil")

REPO = Path(__file__).resolve().parents[2]


def run_benchmark(name: str, *args: str, timeout: int) -> subprocess.CompletedProcess[str]:
    """`python -m benchmarks.<name> args...` from the checkout (not installed)."""
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_tiny(name: str, work: Path, timeout: int) -> subprocess.CompletedProcess[str]:
    """`python -m benchmarks.<name> --tiny --work WORK`."""
    return run_benchmark(name, "--tiny", "--work", str(work), timeout=timeout)


def test_bench_pack_tiny(tmp_path: Path) -> None:
    result = run_tiny("pack.throughput", tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    table = result.stdout
    assert "| goal | measured | target | met |" in table
    for label in ("bare Pillow loop, 1 process", "pipeline, loky, n_jobs 2", "+ draft", "naive"):
        assert label in table
    # every pipeline output and the naive writer's matched the bare loop's pixels, image for image
    assert table.count("| 16/16 |") == 5, table
    # the memory run (--tiny makes only the one on N photos)
    assert "| 16 | 64 samples |" in table


def test_bench_sources_tiny(tmp_path: Path) -> None:
    result = run_tiny("pack.sources", tmp_path, timeout=180)
    # the benchmark stops before its table unless all three outputs hold the same pixels
    assert result.returncode == 0, result.stderr
    for kind in ("folder", "webdataset", "parquet"):
        assert f"| {kind} | " in result.stdout, result.stdout


def test_bench_scale_tiny(tmp_path: Path) -> None:
    result = run_tiny("formats.scale", tmp_path, timeout=180)
    # each operation ran in its own process and opened the manifest the commit path wrote
    assert result.returncode == 0, result.stderr
    for rows in ("| 20,000 |", "| 40,000 |"):
        assert rows in result.stdout, result.stdout
    assert list(tmp_path.iterdir()) == []  # the manifests are removed


def test_bench_tree_tiny(tmp_path: Path) -> None:
    result = run_tiny("pack.tree", tmp_path, timeout=300)
    # the benchmark stops unless the first run packed every file, the rerun nothing and the
    # +1% run exactly the new files
    assert result.returncode == 0, result.stderr
    for rows in ("| 2,000 |", "| 4,000 |", "| per file |"):
        assert rows in result.stdout, result.stdout
    assert list(tmp_path.iterdir()) == []  # the trees are removed


def test_bench_cold_tiny(tmp_path: Path) -> None:
    result = run_tiny("load.cold", tmp_path, timeout=180)
    # every loader epoch delivered every sample once, or the benchmark stops before its table
    assert result.returncode == 0, result.stderr
    for name in ("device: pread, 16 threads", "per-row copy", "loaders blocks, 2 workers"):
        assert f"| {name}" in result.stdout, result.stdout
    assert list(tmp_path.iterdir()) == []  # the dataset is removed


def test_bench_workers_measures_two_trees_side_by_side() -> None:
    """The A/B form: this checkout as its own baseline, every contender in both."""
    options = ["--samples=1000", "--size=16", "--rounds=1", f"--baseline={REPO}"]
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.load.workers", *options],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    for tree in ("this", "baseline"):
        for contender in ("0 workers", "2 workers", "2 workers, persistent", "per-row copy"):
            assert f"| {tree} | {contender}" in result.stdout, result.stdout


def test_bench_workers_jpeg_small() -> None:
    """`--jpeg`: photos stored as JPEG, decoded and cropped in the workers, beside the bare
    decode + crop loop (no per-row copy: the rows are encoded)."""
    done = run_benchmark("load.workers", "--jpeg", "--samples", "40", "--rounds", "1", timeout=300)
    assert done.returncode == 0, done.stderr
    for contender in ("0 workers", "2 workers", "2 workers, persistent", "bare loop: decode"):
        assert f"| this | {contender}" in done.stdout, done.stdout
    assert "per-row copy" not in done.stdout and "photos stored as JPEG" in done.stdout


def test_bench_remote_small(tmp_path: Path) -> None:
    pytest.importorskip("moto")
    small = ["--samples", "300", "--size", "16", "--rounds", "1"]
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.load.from_store", *small],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # the run stops before its table unless every cached shard equals the packed one
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("endpoint: 8 concurrent", "cache cold", "cache warm", "local disk", "epoch 2"):
        assert name in result.stdout, result.stdout


def run_module(name: str, *args: str, timeout: int = 240) -> str:
    """`run_benchmark`'s stdout, once it passed."""
    result = run_benchmark(name, *args, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_bench_pack_grid_small(tmp_path: Path) -> None:
    """Cold `etl run` and the naive writer at two shard sizes and two job counts."""
    table = run_module(
        "pack.grid",
        *("--sizes", "12", "--shards", "16,256", "--jobs", "1,2", "--rounds", "1"),
        *("--work", str(tmp_path)),
    )
    grid, ceiling = table.split("Decode ceiling:")
    assert grid.count("| 12 | 1 |") == 4 and grid.count("| 12 | 2 |") == 4, table
    assert "auto x loky" in grid
    assert "| photos | list | hash | plan | pack | commit | outside run | whole command |" in grid
    rows = [line.split("|")[1:-1] for line in ceiling.splitlines() if line.startswith("| 12 |")]
    assert [row[1].strip() for row in rows] == ["1", "2"], table
    for row in rows:  # the writers' rates as shares of the decode-only rate, > 0
        assert float(row[2]) > 0 and all(cell.strip().endswith("%") for cell in row[3:])


def test_bench_rejects_small(tmp_path: Path) -> None:
    out = run_module("pack.rejects", "--rows", "500,2000", "--work", str(tmp_path))
    assert "| 2,000 |" in out and "bytes per extra entry" in out


def test_bench_remote_pack_small(tmp_path: Path) -> None:
    """Packing from a bucket, from disk and into a bucket: the run stops before its table
    unless the datasets hold the same samples."""
    pytest.importorskip("moto")
    args = ("--photos", "12", "--rounds", "1", "--work", str(tmp_path))
    table = run_module("pack.from_store", *args)
    for name in ("on local disk", "in the bucket", "into a bucket", "endpoint: 8 concurrent"):
        assert name in table, table


def test_bench_verify_rows_small() -> None:
    done = run_benchmark(
        "load.verify_rows", "--samples", "64", "--size", "16", "--rounds", "1", timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "rows:" in done.stdout and "unchecked:" in done.stdout


def test_bench_columns_small() -> None:
    done = run_benchmark(
        "formats.columns", "--samples", "1000", "--size", "8", "--rounds", "1", timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "workers=2    all:" in done.stdout and "workers=0  dense:" in done.stdout


def test_bench_mixture_small() -> None:
    done = run_benchmark(
        "load.mixture", "--samples", "600", "--size", "8", "--rounds", "1", "--steps", "20",
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "workers=2  mixture:" in done.stdout and "view 2:" in done.stdout


def test_bench_aspect_small(tmp_path: Path) -> None:
    done = run_benchmark(
        "formats.aspect", "--photos", "24", "--rounds", "1", "--work", str(tmp_path), timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "| aspect | " in done.stdout and "aspect / fixed: bytes" in done.stdout


def test_bench_codecs_small() -> None:
    done = run_benchmark("formats.codecs", "--photos", "12", timeout=300)
    assert done.returncode == 0, done.stderr
    table = done.stdout
    assert "| raw | 100.0% | 1.0 |" in table
    for lossless in ("png level 1 (Pillow)", "zlib level 1 over raw rows"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {lossless} |"))
        assert row.endswith("| 0 | exact |"), row  # decoded back byte for byte


def test_bench_encoded_small() -> None:
    done = run_benchmark("formats.encoded", "--photos", "24", "--rounds", "1", timeout=600)
    assert done.returncode == 0, done.stderr
    assert "| 224 fixed | raw |" in done.stdout and "| aspect 256/512 | jpeg |" in done.stdout
    assert (
        "| jpeg, 2 workers |" in done.stdout
        and "| bare simplejpeg loop, 1 process |" in done.stdout
    )


def test_bench_draft_small() -> None:
    done = run_benchmark(
        "pack.draft", "--photos", "8", "--camera", "2", "--rounds", "1", "--size", "64",
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 2 camera photos")]
    assert rows and "| 100% |" in rows[0]  # 12 MP to 64 px: every sample took the reduced decode


def test_bench_trace_small() -> None:
    done = run_benchmark(
        "load.trace", "--samples", "5000", "--batch", "32", "--step", "20000", timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "samples_at(step 20,000)" in done.stdout and "read 20 times" in done.stdout


def test_bench_report_tiny(tmp_path: Path) -> None:
    result = run_tiny("maintain.report", tmp_path, timeout=300)
    # the report of 20,000 synthetic rows was written and named its sample count
    assert result.returncode == 0, result.stderr
    assert "| 20,000 |" in result.stdout, result.stdout
    assert list(tmp_path.iterdir()) == []


def test_bench_worker_start_small() -> None:
    done = run_benchmark("pack.worker_start", "--rounds", "1", timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {line.split("|")[1].strip(): line for line in done.stdout.splitlines() if "|" in line}
    # every phase's first task was captured, and unpickling it imported none of the heavy ones
    assert {"floor", "hash_chunk", "pack_batch", "warm"} <= set(rows), done.stdout
    assert all(rows[name].rstrip().endswith("| none |") for name in ("hash_chunk", "pack_batch"))


def test_bench_original_small() -> None:
    done = run_benchmark("pack.original", "--photos", "6", "--rounds", "1", timeout=300)
    assert done.returncode == 0, done.stderr
    # sources already 224x224: every one stored as its own scan, the pixels identical
    assert "| original |" in done.stdout and "| 100% | identical | 0 |" in done.stdout


def test_bench_device_decode_small() -> None:
    done = run_benchmark("gpu.device_decode", "--photos", "12", "--epochs", "2", timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {line.split("|")[1].strip(): line for line in done.stdout.splitlines() if "|" in line}
    assert rows["simplejpeg, this process"].startswith("| simplejpeg, this process | ")
    # nvImageCodec's CPU backend ran here, and decoded as Pillow does (libjpeg-turbo both)
    cells = [cell.strip() for cell in rows["nvimgcodec"].split("|")]
    assert cells[4] == "0" and "nvImageCodec" in cells[7] and "CPU backend" in cells[7], cells
    assert "torchvision" in rows  # measured where installed, else a row saying why not
