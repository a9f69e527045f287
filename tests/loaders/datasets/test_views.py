"""Views (`etl.format.views`): a selection kept as a predicate over one dataset version, in
Python or in a YAML file, composed into views of views; a loader opened on one yields exactly
its rows, and a resumed run refuses a view that changed. The oracle is a plain filter of the
manifest as pyarrow reads it, with the test's own values by source."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etl.config import load_config
from etl.errors import ConfigError, ManifestError, SelectionError
from etl.run import pipeline
from loaders import PackedDataset, View, make_loader
from loaders.read.catalog import open_catalog
from tests.helpers.columns import write_captioned, write_listing_config


@pytest.fixture(scope="module")
def captioned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    tmp_path = tmp_path_factory.mktemp("views")
    expected = write_captioned(tmp_path / "photos", count=30)
    assert pipeline.run(load_config(write_listing_config(tmp_path))).packed_new == 30
    return tmp_path / "out", expected


def manifest(out: Path) -> list[dict[str, Any]]:
    version = sorted((out / "versions").iterdir())[-1]
    with pa.ipc.open_file(version / "manifest.arrow") as reader:
        rows: list[dict[str, Any]] = reader.read_all().to_pylist()
    return rows


def sources_read(ds: PackedDataset) -> set[str]:
    seen = []
    for batch in make_loader(ds, batch_size=4, shuffle=True, with_indices=True):
        seen += ds.manifest_rows(batch.indices).column("source").to_pylist()
    assert len(seen) == len(set(seen)) == len(ds)
    return set(seen)


def test_a_view_yields_exactly_its_rows(
    captioned: tuple[Path, dict[str, dict[str, Any]]], tmp_path: Path
) -> None:
    out, expected = captioned
    rows = manifest(out)
    assert {r["source"] for r in rows} == set(expected)
    train = View(str(out), split="train")
    scored = train.narrowed(where="score >= 2.5 AND len(boxes) > 0")
    narrow = scored.narrowed(sources=["img1*", "img2?.png"], classes=["even"])
    for view, keep in (
        (train, lambda r: r["split"] == "train"),
        (
            scored,
            lambda r: r["split"] == "train" and r["score"] >= 2.5 and len(r["boxes"]) > 0,
        ),
        (
            narrow,
            lambda r: (
                r["split"] == "train"
                and r["score"] >= 2.5
                and len(r["boxes"]) > 0
                and r["class_name"] == "even"
                and any(fnmatch.fnmatchcase(r["source"], p) for p in ("img1*", "img2?.png"))
            ),
        ),
    ):
        want = {r["source"] for r in rows if keep(r)}
        assert want, view
        assert sources_read(PackedDataset.open(view)) == want
    arrow = train.narrowed(
        where=(pc.field("score") >= 2.5) & (pc.list_value_length(pc.field("boxes")) > 0)
    )
    assert sources_read(PackedDataset.open(arrow)) == sources_read(PackedDataset.open(scored))
    assert arrow.fingerprint(1) != scored.fingerprint(1)  # another predicate, the same rows
    ids = [rows[3]["sample_id"], rows[7]["sample_id"]]
    picked = PackedDataset.open(View(str(out), ids=ids))
    assert sources_read(picked) == {rows[3]["source"], rows[7]["source"]}

    # the same view from files, a view of a view by `base`
    (tmp_path / "train.yaml").write_text(f"dataset: {json.dumps(str(out))}\nsplit: train\n")
    (tmp_path / "scored.yaml").write_text(
        "base: train.yaml\nwhere: score >= 2.5 AND len(boxes) > 0\n"
    )
    from_file = View.load(tmp_path / "scored.yaml")
    assert from_file.chain() == scored.chain()
    assert sources_read(PackedDataset.open(from_file)) == sources_read(PackedDataset.open(scored))
    assert from_file.fingerprint(1) == scored.fingerprint(1) != train.fingerprint(1)
    assert scored.fingerprint(1) != scored.fingerprint(2)  # the version is part of it


def test_a_resumed_run_refuses_a_changed_view(
    captioned: tuple[Path, dict[str, dict[str, Any]]],
) -> None:
    out, _ = captioned
    view = View(str(out), where="score >= 2")
    loader = make_loader(PackedDataset.open(view), batch_size=3, shuffle=True, seed=5)
    whole = [
        b.labels.tolist()
        for b in make_loader(PackedDataset.open(view), batch_size=3, shuffle=True, seed=5)
    ]
    batches = iter(loader)
    first = [next(batches).labels.tolist() for _ in range(2)]
    state = loader.state_dict()
    assert state["view"] == view.fingerprint(1)
    resumed = make_loader(PackedDataset.open(view), batch_size=3, shuffle=True, seed=5)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert first + [b.labels.tolist() for b in resumed] == whole

    same_rows = View(str(out), where="score >= 1.9")  # other predicate, maybe the same rows
    other = make_loader(PackedDataset.open(same_rows), batch_size=3, shuffle=True, seed=5)
    with pytest.raises(ValueError, match="loader state is for view"):
        other.load_state_dict(state)
    plain = make_loader(
        PackedDataset.open(out, where="score >= 2"), batch_size=3, shuffle=True, seed=5
    )
    with pytest.raises(ValueError, match="loader state is for view"):
        plain.load_state_dict(state)


def test_bad_views_are_one_clear_error(
    captioned: tuple[Path, dict[str, dict[str, Any]]], tmp_path: Path
) -> None:
    out, _ = captioned
    with pytest.raises(SelectionError, match="no split"):
        PackedDataset.open(View(str(out), split="holdout"))
    with pytest.raises(SelectionError, match="no sample with sample_id"):
        PackedDataset.open(View(str(out), ids=["0000"]))
    with pytest.raises(ManifestError, match="no version 7; versions are"):
        PackedDataset.open(View(str(out), version=7).narrowed(split="train"))
    with pytest.raises(SelectionError, match="the view pins 7"):
        open_catalog(out).select_view(View(str(out), version=7))
    with pytest.raises(ValueError, match="narrow it"):
        PackedDataset.open(View(str(out)), split="train")
    with pytest.raises(ConfigError, match="needs a dataset"):
        View(split="train")
    with pytest.raises(TypeError, match="narrows by"):
        View(str(out)).narrowed(shuffle=True)
    cases = {
        "dataset: out\nsplits: train\n": "unknown key 'splits'",
        "dataset: out\nsplit: {a: 1}\n": "split is a name or a list of names",
        "dataset: out\nversion: two\n": "version must be a number",
        "base: me.yaml\n": "bases come back to it",
        "base: other.yaml\n": "bases come back to it (me.yaml -> other.yaml -> me.yaml)",
        "dataset: out\nwhere: 3\n": "where must be a SQL condition",
        "dataset: out\nsplit: a\nsplit: b\n": "appears twice",
        "- dataset\n": "expected a mapping",
    }
    (tmp_path / "other.yaml").write_text("base: me.yaml\n")
    for text, said in cases.items():
        (tmp_path / "me.yaml").write_text(text)
        with pytest.raises(ConfigError, match=re.escape(said)):
            View.load(tmp_path / "me.yaml")


def test_etl_view_shows_what_a_view_selects(
    captioned: tuple[Path, dict[str, dict[str, Any]]], tmp_path: Path
) -> None:
    out, _ = captioned
    rows = manifest(out)
    view = tmp_path / "v.yaml"
    view.write_text(f"dataset: {json.dumps(str(out))}\nwhere: score >= 3\nclasses: [odd]\n")
    sheet = tmp_path / "sheet.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "etl",
            "view",
            str(view),
            "--json",
            "--sheet",
            str(sheet),
            "-n",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    want = [r for r in rows if r["score"] >= 3 and r["class_name"] == "odd"]
    assert report["samples"] == len(want) and report["of"] == len(rows)
    by_split: dict[str, int] = {}
    for r in want:
        by_split[r["split"]] = by_split.get(r["split"], 0) + 1
    assert {s: c["odd"] for s, c in report["counts"].items()} == by_split
    assert report["fingerprint"] == View.load(view).fingerprint(1)
    assert sheet.stat().st_size > 0
    view.write_text(f"dataset: {json.dumps(str(out))}\nwhere: nope > 1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "etl", "view", str(view)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "nope" in proc.stderr and "Traceback" not in proc.stderr
