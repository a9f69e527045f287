from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.config import PipelineConfig
from etl.format.manifest import Manifest, table_from_rows
from etl.format.names import sample_id
from etl.format.schema import REJECTS_SCHEMA, SAMPLES_SCHEMA, SHARDS_SCHEMA, ManifestMeta
from etl.run.plan import assign_split, files_to_hash, pack_order
from etl.sources.entries import SourceFile, SourceListing
from tests.helpers.plan_oracle import make_plan


def config(**source: object) -> PipelineConfig:
    validate = source.pop("duplicates", "keep_first")
    return PipelineConfig.model_validate(
        {
            "source": {"kind": "folder", "path": "/data", **source},
            "stages": [
                {"decode": {}},
                {"validate": {"duplicates": validate}},
                {"resize": {"size": [2, 2]}},
            ],
            "output": {"dir": "/out", "samples_per_shard": 2},
        }
    )


def file(source: str, size: int = 10, mtime: int = 1, ctime: int = 1, inode: int = 7) -> SourceFile:
    return SourceFile(
        source,
        f"/data/{source}",
        source.split("/")[0],
        None,
        size,
        mtime,
        ctime_ns=ctime,
        inode=inode,
    )


def listing(*files: SourceFile) -> SourceListing:
    return SourceListing(tuple(sorted(files, key=lambda f: f.source)), ())


def test_first_run_packs_everything_in_fixed_size_shards() -> None:
    src = listing(
        file("b/1.jpg"), file("a/1.jpg"), file("a/2.jpg"), file("c/9.png"), file("b/0.jpg")
    )
    hashes = {f.source: f"h-{f.source}" for f in src.files}
    plan = make_plan(config(), src, hashes, [], None, 1)
    assert plan.classes == ("a", "b", "c")
    assert [t.shard for t in plan.tasks] == [
        "shards/v000001-00000.npy",
        "shards/v000001-00001.npy",
        "shards/v000001-00002.npy",
    ]
    items = plan.packing.to_pylist()
    assert [s for t in plan.tasks for s in t.sources] == [i["source"] for i in items]
    assert [h for t in plan.tasks for h in t.hashes] == [hashes[i["source"]] for i in items]
    assert sorted(i["source"] for i in items) == sorted(hashes)
    assert [i["source"] for i in items] == sorted(hashes, key=pack_order), "shards mix classes"
    assert {i["source"]: i["label"] for i in items} == {
        "a/1.jpg": 0,
        "a/2.jpg": 0,
        "b/0.jpg": 1,
        "b/1.jpg": 1,
        "c/9.png": 2,
    }
    assert [t.start for t in plan.tasks] == [0, 2, 4]
    assert plan.counts["new"] == 5 and not plan.rejects.num_rows


@pytest.mark.parametrize(
    ("policy", "rejected"),
    [("keep_first", {"a/2.jpg"}), ("reject_all", {"a/1.jpg", "a/2.jpg"}), ("allow", set())],
)
def test_duplicates_policy(policy: str, rejected: set[str]) -> None:
    src = listing(file("a/1.jpg"), file("a/2.jpg"), file("a/3.jpg"))
    hashes = {"a/1.jpg": "same", "a/2.jpg": "same", "a/3.jpg": "other"}
    plan = make_plan(config(duplicates=policy), src, hashes, [], None, 1)
    assert set(plan.rejects.column("source").to_pylist()) == rejected
    assert set(plan.rejects.column("reason").to_pylist()) == ({"duplicate"} if rejected else set())
    assert plan.to_pack + plan.rejects.num_rows == 3


def test_fixed_classes_reject_unknown_labels() -> None:
    src = listing(file("a/1.jpg"), file("zzz/1.jpg"))
    plan = make_plan(
        config(classes=["b", "a"]), src, {"a/1.jpg": "1", "zzz/1.jpg": "2"}, [], None, 1
    )
    assert plan.classes == ("b", "a")
    rejects = plan.rejects.select(["source", "reason"]).to_pylist()
    assert rejects == [{"source": "zzz/1.jpg", "reason": "unknown_label"}]
    assert plan.packing.column("label").to_pylist() == [1]


def previous_manifest(
    rows: list[tuple[str, str, int]], rejects: list[tuple[str, str, str]]
) -> Manifest:
    """Version 1 holding (source, hash, mtime) rows and (source, hash, reason) rejects."""
    samples = [
        {
            "sample_id": sample_id(s),
            "source": s,
            "source_size": 10,
            "source_mtime_ns": m,
            "source_ctime_ns": 1,
            "source_inode": 7,
            "source_hash": h,
            "source_height": 8,
            "source_width": 8,
            "label": 0,
            "class_name": s.split("/")[0],
            "split": "train",
            "shard": "shards/v000001-00000.npy",
            "row": i,
            "checksum": f"c{i}",
        }
        for i, (s, h, m) in enumerate(rows)
    ]
    shard = [
        {
            "shard": "shards/v000001-00000.npy",
            "rows": len(rows),
            "bytes": 1,
            "checksum": "x",
            "blake3": "y",
        }
    ]
    reject_rows = [
        {
            "source": s,
            "reason": r,
            "message": "m",
            "source_size": 10,
            "source_mtime_ns": 1,
            "source_ctime_ns": 1,
            "source_inode": 7,
            "source_hash": h,
        }
        for s, h, r in rejects
    ]
    meta = ManifestMeta(
        version=1,
        sample_shape=(2, 2, 3),
        layout="HWC",
        classes=("a",),
        checksum="xxh3_64",
        config_digest="d",
        config={},
        tool_version="t",
    )
    return Manifest(
        Path("/out"),
        meta,
        table_from_rows(samples, SAMPLES_SCHEMA),
        table_from_rows(shard, SHARDS_SCHEMA),
        table_from_rows(reject_rows, REJECTS_SCHEMA),
    )


def test_incremental_plan_reads_only_what_changed() -> None:
    prev = previous_manifest(
        [
            ("a/same.jpg", "h1", 1),
            ("a/touched.jpg", "h2", 1),
            ("a/edited.jpg", "h3", 1),
            ("a/old-name.jpg", "h4", 1),
            ("a/gone.jpg", "h5", 1),
            ("a/rewritten.jpg", "h8", 1),
            ("a/replaced.jpg", "h9", 1),
        ],
        [("a/bad.jpg", "hb", "truncated")],
    )
    src = listing(
        file("a/same.jpg"),
        file("a/touched.jpg", mtime=2),
        file("a/edited.jpg", mtime=2),
        file("a/new-name.jpg"),
        file("a/bad.jpg"),
        file("a/fresh.jpg"),
        file("b/first.jpg"),
        file("a/rewritten.jpg", ctime=2),  # edited in place, old mtime put back
        file("a/replaced.jpg", inode=8),  # another file renamed over it, mtime kept
    )
    to_hash = {f.source for f in files_to_hash(src, prev)}
    assert to_hash == {
        "a/rewritten.jpg",
        "a/replaced.jpg",
        "a/touched.jpg",
        "a/edited.jpg",
        "a/new-name.jpg",
        "a/fresh.jpg",
        "b/first.jpg",
    }
    hashes = {
        "a/touched.jpg": "h2",
        "a/edited.jpg": "h3-new",
        "a/new-name.jpg": "h4",
        "a/fresh.jpg": "h6",
        "b/first.jpg": "h7",
        "a/rewritten.jpg": "h8-new",
        "a/replaced.jpg": "h9",
    }
    plan = make_plan(config(), src, hashes, [], prev, 2, prev.meta.classes)
    packed = sorted(s for t in plan.tasks for s in t.sources)
    assert packed == ["a/edited.jpg", "a/fresh.jpg", "a/rewritten.jpg", "b/first.jpg"]
    assert all(t.shard.startswith("shards/v000002-") for t in plan.tasks)
    reused = {r["source"]: (r["shard"], r["row"]) for r in plan.reused.to_pylist()}
    assert reused == {
        "a/same.jpg": ("shards/v000001-00000.npy", 0),
        "a/touched.jpg": ("shards/v000001-00000.npy", 1),
        "a/new-name.jpg": ("shards/v000001-00000.npy", 3),
        "a/replaced.jpg": ("shards/v000001-00000.npy", 6),
    }
    rows = {r["source"]: r for r in plan.reused.to_pylist()}
    assert rows["a/touched.jpg"]["source_mtime_ns"] == 2
    assert rows["a/replaced.jpg"]["source_inode"] == 8  # the stat key is brought up to date
    rejects = plan.rejects.select(["source", "reason"]).to_pylist()
    assert rejects == [{"source": "a/bad.jpg", "reason": "truncated"}]
    assert plan.classes == ("a", "b"), "a new class is appended, existing labels keep their number"
    assert plan.counts == {
        "unchanged": 3,
        "changed": 2,
        "moved": 1,
        "new": 2,
        "deleted": 2,
        "rejected": 1,
    }


@settings(max_examples=30, deadline=None)
@given(st.floats(0.0, 0.5), st.floats(0.0, 0.4))
def test_split_fractions_are_honoured(val: float, test: float) -> None:
    paths = [f"class/{i}.jpg" for i in range(4000)]
    counts = Counter(assign_split(p, {"val": val, "test": test}) for p in paths)
    assert abs(counts["val"] / 4000 - val) < 0.035
    assert abs(counts["test"] / 4000 - test) < 0.035
    assert assign_split("class/1.jpg", {"val": val, "test": test}) == assign_split(
        "class/1.jpg", {"test": test, "val": val}
    ), "split depends on the path and the fractions, not on their order in the YAML"
