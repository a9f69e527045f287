"""A dataset written by the code of format version 1, kept as it was written
(tests/format/fixtures/format_v1): every later version must open it, train on it, audit it and
repack it incrementally, untouched. The oracle is plain numpy, pyarrow and Pillow, never the
code under test."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc
import pytest
import torch
from PIL import Image, ImageOps

from loaders import PackedDataset, make_loader
from tests.helpers.cli import cli

FIXTURE = Path(__file__).parent / "fixtures" / "format_v1"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def packed(tmp_path: Path) -> Path:
    """A copy of the fixture (a run writes into its folder): the pipeline file's folder."""
    copy = tmp_path / "format_v1"
    shutil.copytree(FIXTURE, copy)
    return copy


def _manifest(out: Path, version: int = 1) -> list[dict[str, object]]:
    table = ipc.open_file(out / "versions" / f"v{version:06d}" / "manifest.arrow").read_all()
    return table.to_pylist()


def _expected(images: Path, source: str) -> np.ndarray:
    """The source as the fixture's config stores it: Pillow's centre-crop resize to 8x8."""
    with Image.open(images / source) as image:
        return np.asarray(ImageOps.fit(image.convert("RGB"), (8, 8), Image.Resampling.BILINEAR))


def test_version_1_reads_as_written(packed: Path) -> None:
    rows = _manifest(packed / "out")
    assert len(rows) == 6
    meta = ipc.open_file(packed / "out/versions/v000001/manifest.arrow").schema.metadata
    assert meta[b"etl.format_version"] == b"1"
    dataset = PackedDataset.open(packed / "out")
    by_source = {row["source"]: row for row in rows}
    for i in range(len(dataset)):
        image, label = dataset[i]
        row = dataset.manifest_rows([i]).to_pylist()[0]
        shard = np.load(packed / "out" / str(row["shard"]), mmap_mode="r")
        assert np.array_equal(image.numpy(), shard[int(row["row"])])  # type: ignore[call-overload]
        assert np.array_equal(image.numpy(), _expected(packed / "images", str(row["source"])))
        assert label == row["label"]
    assert sorted(by_source) == [
        "cat/0.png",
        "cat/2.png",
        "cat/4.png",
        "dog/1.png",
        "dog/3.png",
        "dog/5.png",
    ]


def test_version_1_trains_audits_and_repacks(
    packed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loader = make_loader(
        PackedDataset.open(packed / "out"), batch_size=4, shuffle=True, pin_memory=False
    )
    seen = [labels for _, labels in loader]
    assert sum(len(labels) for labels in seen) == 6
    assert all(labels.dtype == torch.int64 for labels in seen)

    code, out, _ = cli(["audit", str(packed / "out"), "--jobs", "1"], capsys)
    assert code == 0, out

    before = {p.name: p.read_bytes() for p in (packed / "out" / "shards").iterdir()}
    Image.new("RGB", (11, 13), (200, 10, 30)).save(packed / "images" / "cat" / "new.png")
    code, out, err = cli(["run", str(packed / "pipeline.yaml")], capsys)
    assert code == 0, err
    rows = _manifest(packed / "out", 2)
    assert len(rows) == 7
    new = next(r for r in rows if r["source"] == "cat/new.png")
    assert str(new["shard"]).startswith("shards/v000002-")
    for name, data in before.items():  # the version 1 shards, untouched and still referenced
        assert (packed / "out" / "shards" / name).read_bytes() == data
    assert {str(r["shard"]) for r in rows} >= {f"shards/{name}" for name in before}
    shard = np.load(packed / "out" / str(new["shard"]), mmap_mode="r")
    assert np.array_equal(shard[int(new["row"])], _expected(packed / "images", "cat/new.png"))  # type: ignore[call-overload]
    code, out, _ = cli(["audit", str(packed / "out"), "--jobs", "1"], capsys)
    assert code == 0, out
