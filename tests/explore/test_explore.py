"""etl.explore.dataset on datasets packed by real pipeline runs, checked against independent reads:
pyarrow.ipc for the manifest, np.load(mmap_mode="r") for the shards, Pillow for the sources."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

import etl
from etl.config import DecodeStage, FolderSource, load_config
from etl.errors import EtlError
from etl.explore import dataset as explore
from etl.explore import drawing, reject_sheet
from etl.run import pipeline
from etl.start.sample_data import make_sample_data

CONFIG = """\
source:
  kind: folder
  path: data
  split: {{val: 0.25, test: 0.25}}
stages:
  - decode: {{mode: {mode}}}
  - validate: {{min_size: [16, 16], duplicates: keep_first}}
  - resize: {{size: [64, 64]}}
output:
  dir: {out}
  samples_per_shard: 7
  layout: {layout}
run:
  backend: sequential
"""


def pack(workdir: Path, out: str, mode: str = "RGB", layout: str = "HWC") -> Path:
    path = workdir / f"{out}.yaml"
    path.write_text(CONFIG.format(mode=mode, layout=layout, out=out))
    report = pipeline.run(load_config(path))
    assert report.committed
    return workdir / out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("explore")
    make_sample_data(root / "data", per_class=4, seed=1)
    return root


@pytest.fixture(scope="module")
def rgb(workdir: Path) -> Path:
    return pack(workdir, "rgb")


@pytest.fixture(scope="module")
def grey_chw(workdir: Path) -> Path:
    return pack(workdir, "grey", mode="L", layout="CHW")


def manifest_rows(root: Path, version: int = 1) -> list[dict]:
    """The manifest read with pyarrow alone."""
    with ipc.open_file(root / "versions" / f"v{version:06d}" / "manifest.arrow") as f:
        return f.read_all().to_pylist()


def stored(root: Path, row: dict) -> np.ndarray:
    """One sample read with numpy alone."""
    return np.load(root / row["shard"], mmap_mode="r")[row["row"]]


def nearest(array_hwc: np.ndarray, factor: int) -> np.ndarray:
    return array_hwc.repeat(factor, axis=0).repeat(factor, axis=1)


# --- the dataset ------------------------------------------------------------------------------


def test_tables_match_an_independent_read(rgb: Path) -> None:
    ds = explore.open_dataset(rgb)
    rows = manifest_rows(rgb)
    assert ds.table.to_pylist() == rows
    assert ds.to_pandas().to_dict("records") == rows
    with ipc.open_file(rgb / "versions" / "v000001" / "rejects.arrow") as f:
        rejects = f.read_all().to_pylist()
    assert ds.rejects.to_pylist() == rejects
    assert ds.to_pandas(rejects=True)["reason"].tolist() == [r["reason"] for r in rejects]
    assert len(ds) == len(rows) and ds.version == 1 and ds.versions == [1]
    assert "version 1" in repr(ds) and f"{len(rows)} samples" in repr(ds)


def test_package_level_open_dataset_is_lazy(rgb: Path) -> None:
    assert etl.open_dataset is explore.open_dataset
    code = (
        "import sys, etl\n"
        "heavy = [m for m in ('numpy', 'pyarrow', 'PIL', 'pydantic') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        f"print(len(etl.open_dataset({str(rgb)!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(manifest_rows(rgb))


def test_arrays_and_images_are_the_stored_pixels(rgb: Path) -> None:
    ds = explore.open_dataset(rgb)
    for i, row in enumerate(manifest_rows(rgb)):
        expected = stored(rgb, row)
        by_position, by_id = ds.array(i), ds.array(row["sample_id"])
        assert by_position.shape == (64, 64, 3) and not by_position.flags.writeable
        np.testing.assert_array_equal(by_position, expected)
        np.testing.assert_array_equal(by_id, expected)
        image = ds.image(row["sample_id"])
        assert image.mode == "RGB" and image.size == (64, 64)
        np.testing.assert_array_equal(np.asarray(image), expected)
        assert ds.row(i) == row


def test_grey_chw_shows_as_l(grey_chw: Path) -> None:
    ds = explore.open_dataset(grey_chw)
    assert ds.layout == "CHW" and ds.sample_shape == (1, 64, 64)
    for i, row in enumerate(manifest_rows(grey_chw)):
        expected = stored(grey_chw, row)
        assert expected.shape == (1, 64, 64)
        image = ds.image(i)
        assert image.mode == "L"
        np.testing.assert_array_equal(np.asarray(image), expected[0])


def test_to_image_transposes_chw() -> None:
    hwc = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    chw = np.ascontiguousarray(hwc.transpose(2, 0, 1))
    shown = explore.to_image(chw, "CHW")
    assert shown.size == (7, 5) and shown.mode == "RGB"
    np.testing.assert_array_equal(np.asarray(shown), hwc)
    np.testing.assert_array_equal(np.asarray(explore.to_image(hwc, "HWC")), hwc)
    with pytest.raises(ValueError, match="channels"):
        explore.to_image(np.zeros((4, 4, 2), np.uint8), "HWC")


def test_positions(rgb: Path) -> None:
    ds = explore.open_dataset(rgb)
    n = len(ds)
    assert ds.position(-1) == n - 1 and ds.position(np.int64(2)) == 2
    with pytest.raises(IndexError, match=str(n)):
        ds.position(n)
    with pytest.raises(EtlError, match="no sample with sample_id 'nope'"):
        ds.image("nope")
    with pytest.raises(TypeError):
        ds.position(True)


def test_counts_and_summary(rgb: Path) -> None:
    ds = explore.open_dataset(rgb)
    rows = manifest_rows(rgb)
    found = Counter((r["split"], r["class_name"]) for r in rows)
    counts = ds.counts()
    assert list(counts) == [
        s for s in ("train", "val", "test") if any(r["split"] == s for r in rows)
    ]
    for split, per_class in counts.items():
        assert list(per_class) == list(ds.classes)  # every class, zeros included
        for name, n in per_class.items():
            assert n == found[(split, name)]
    summary = ds.summary()
    shard_files = sorted({r["shard"] for r in rows})
    assert summary.shards == len(shard_files) > 1
    assert summary.shard_bytes == sum(os.path.getsize(rgb / s) for s in shard_files)
    rejects = Counter(r["reason"] for r in ds.rejects.to_pylist())
    assert summary.rejects_by_reason == dict(rejects) and summary.rejects == sum(rejects.values())
    assert summary.checksum == "xxh3_64" and summary.sample_shape == [64, 64, 3]
    assert [s["kind"] for s in summary.config["stages"]] == ["decode", "validate", "resize"]
    assert summary.to_dict()["counts"] == counts


# --- choosing ---------------------------------------------------------------------------------


def test_pick_is_seeded_and_filtered(rgb: Path) -> None:
    ds = explore.open_dataset(rgb)
    rows = manifest_rows(rgb)
    first = ds.pick(8, seed=3)
    np.random.seed(12345)  # a pick that drew from numpy's global state would now differ
    np.random.random(7)
    again = explore.open_dataset(rgb).pick(8, seed=3)
    assert first == again and len(set(first)) == 8
    assert len({tuple(ds.pick(8, seed=s)) for s in range(5)}) > 1
    assert ds.pick(10_000) == list(range(len(rows)))  # more than there are: all, in order
    chosen = ds.pick(5, seed=1, split=["train", "val"], classes=["circle", "square"])
    assert chosen == sorted(chosen)
    for p in chosen:
        assert rows[p]["split"] in ("train", "val") and rows[p]["class_name"] in (
            "circle",
            "square",
        )
    ids = [rows[4]["sample_id"], rows[1]["sample_id"]]
    assert ds.pick(ids=ids) == [4, 1]
    with pytest.raises(EtlError, match=r"no class \['dog'\]; classes: \['checker'"):
        ds.pick(classes=["dog"])
    with pytest.raises(EtlError, match="no split"):
        ds.pick(split="holdout")
    with pytest.raises(ValueError, match="not both"):
        ds.pick(ids=ids, split="train")


# --- contact sheets ---------------------------------------------------------------------------


def test_contact_sheet_cells_are_the_chosen_samples(rgb: Path) -> None:
    ds = explore.open_dataset(rgb)
    rows = manifest_rows(rgb)
    sheet = ds.contact_sheet(n=6, seed=2, columns=4, cell=128)
    assert len(sheet.boxes) == 6
    width = drawing.PAD + 4 * (128 + drawing.PAD)
    assert sheet.image.size[0] == width and sheet.image.mode == "RGB"
    tops = sorted({box[1] for box in sheet.boxes})
    assert len(tops) == 2  # 6 cells in rows of 4
    by_id = {r["sample_id"]: r for r in rows}
    for info, box in zip(sheet.info, sheet.boxes, strict=True):
        assert (box[2] - box[0], box[3] - box[1]) == (128, 128)
        crop = np.asarray(sheet.image.crop(box))
        np.testing.assert_array_equal(crop, nearest(stored(rgb, by_id[info["sample_id"]]), 2))
        assert info["class_name"] == by_id[info["sample_id"]]["class_name"]
    png = sheet._repr_png_()
    assert Image.open(io.BytesIO(png)).size == sheet.image.size


def test_grey_contact_sheet(grey_chw: Path) -> None:
    ds = explore.open_dataset(grey_chw)
    sheet = ds.contact_sheet(n=3, seed=0, cell=64)  # factor 1: the sample itself
    for info, box in zip(sheet.info, sheet.boxes, strict=True):
        crop = np.asarray(sheet.image.crop(box))
        grey = stored(grey_chw, ds.row(info["sample_id"]))[0]
        np.testing.assert_array_equal(crop, np.stack([grey] * 3, axis=-1))


@given(width=st.integers(1, 300), height=st.integers(1, 300), cell=st.sampled_from([16, 64, 128]))
def test_thumbnail_fits_and_keeps_small_pixels(width: int, height: int, cell: int) -> None:
    image = Image.new("RGB", (width, height))
    thumb = drawing.thumbnail(image, cell)
    assert thumb.width <= max(cell, 1) and thumb.height <= cell
    if width <= cell and height <= cell:
        factor = thumb.width // width
        assert factor >= 1 and thumb.size == (width * factor, height * factor)
        assert (width * (factor + 1) > cell) or (height * (factor + 1) > cell)
    else:
        assert max(thumb.size) == cell and min(thumb.size) >= 1


def test_draw_sheet_placeholders_and_titles() -> None:
    cells = [
        drawing.Cell(None, ("truncated", "a.jpg"), placeholder="truncated: ends early"),
        drawing.Cell(Image.new("L", (10, 20), 7), ("x" * 200,)),
    ]
    sheet = drawing.draw_sheet(cells, cell=40, title="t" * 500)
    assert sheet.boxes[0] == (
        drawing.PAD,
        sheet.boxes[0][1],
        drawing.PAD + 40,
        sheet.boxes[0][1] + 40,
    )
    tile = np.asarray(sheet.image.crop(sheet.boxes[1]))
    assert tile.shape == (40, 20, 3) and (tile == 7).all()  # grown x2, NEAREST
    with pytest.raises(ValueError):
        drawing.draw_sheet([])


# --- rejects ----------------------------------------------------------------------------------


def test_reject_sheet_decodes_what_it_can(rgb: Path, workdir: Path) -> None:
    ds = explore.open_dataset(rgb)
    sheet = ds.reject_sheet(workdir / "data", n=100)
    assert [i["source"] for i in sheet.info] == ds.rejects.column("source").to_pylist()
    shown = {i["reason"] for i in sheet.info if i["decoded"]}
    assert shown >= {"too_small", "duplicate"}
    assert not any(i["decoded"] for i in sheet.info if i["reason"] in ("truncated", "unreadable"))
    for info, box in zip(sheet.info, sheet.boxes, strict=True):
        crop = np.asarray(sheet.image.crop(box))
        if not info["decoded"]:
            assert info["note"] and crop.shape[:2] == (128, 128)
            continue
        source = Image.open(workdir / "data" / info["source"])
        source = source.convert("RGBA").convert("RGB") if source.mode != "RGB" else source
        if max(source.size) <= 128:  # e.g. the 12x10 too_small file: x10, NEAREST
            factor = min(128 // source.width, 128 // source.height)
            np.testing.assert_array_equal(crop, nearest(np.asarray(source), factor))
        else:
            assert max(crop.shape[:2]) == 128
    only = ds.reject_sheet(workdir / "data", reasons=["truncated"])
    assert {i["reason"] for i in only.info} == {"truncated"}
    with pytest.raises(EtlError, match="no reject with reason"):
        ds.reject_sheet(workdir / "data", reasons=["bogus"])


def test_reject_cell_stays_inside_the_source_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    secret = tmp_path / "secret.png"
    Image.new("RGB", (8, 8), (255, 0, 0)).save(secret)
    os.symlink(secret, root / "a" / "link.png")
    os.mkfifo(root / "a" / "fifo.png")
    decode = DecodeStage()
    cases = [
        ("../secret.png", "outside"),
        ("a/link.png", "outside"),
        ("a/fifo.png", "regular file"),
        ("a/missing.png", "No such file"),
    ]
    rows = [{"source": source, "reason": "outside_root", "message": "m"} for source, _ in cases]
    cells = reject_sheet.reject_cells(FolderSource(path=root), rows, decode, "xxh3_64")
    for (source, why), cell in zip(cases, cells, strict=True):
        assert cell.image is None and why in cell.info["note"], (source, cell.info)


# --- the class-balance chart ------------------------------------------------------------------


def test_class_balance_bars_follow_the_counts(rgb: Path) -> None:
    ds = explore.open_dataset(rgb)
    chart = ds.class_balance()
    rows = manifest_rows(rgb)
    found = Counter((r["class_name"], r["split"]) for r in rows)
    top = max(found.values())
    pixels = chart.image.load()
    assert pixels is not None
    assert set(chart.bars) == {(c, s) for c in ds.classes for s in ds.splits}
    for (name, split), (x0, y0, x1, y1) in chart.bars.items():
        assert y1 - y0 == round(drawing.PLOT_HEIGHT * found[(name, split)] / top)
        if y1 > y0:
            assert pixels[(x0 + x1) // 2, (y0 + y1) // 2] == chart.colors[split]
    lefts = [chart.bars[(c, s)][0] for c in ds.classes for s in ds.splits]
    assert lefts == sorted(lefts)  # grouped by class, splits side by side, no overlap


def test_many_long_class_names_are_drawn_vertically() -> None:
    classes = [f"n{i:08d} a rather long class name" for i in range(30)]
    counts = {"train": {c: i * 37 for i, c in enumerate(classes)}, "val": {}}
    chart = drawing.draw_class_balance(counts, classes)
    slot = chart.bars[(classes[1], "train")][0] - chart.bars[(classes[0], "train")][0]
    assert slot < 100  # the names did not widen the groups
    assert chart.image.height > drawing.PLOT_HEIGHT + 100


@given(st.integers(0, 10**7))
def test_ticks_are_round_and_cover_the_axis(top: int) -> None:
    ticks = drawing._ticks(top)
    assert ticks[0] == 0 and ticks[-1] <= max(top, 0) and len(ticks) <= 11
    if top > 0:
        step = ticks[1] - ticks[0] if len(ticks) > 1 else top
        assert ticks[-1] + step > top
        mantissa = step / 10 ** int(np.floor(np.log10(step)))
        assert mantissa in (1, 2, 5)
