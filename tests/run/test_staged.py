"""The plan made a window and a bucket at a time (`etl.run.staged`, #13) is the plan made in
memory (`tests/helpers/plan_oracle.py`): windows of 3 files and buckets of about 2 make every
previous-version slice, bucket and spill boundary happen over a few dozen generated files,
with moved, touched, edited, duplicated, unreadable and remembered-reject files among them."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etl.format import spill
from etl.run import hash_buckets, staged
from etl.run.decide import PACKING_COLUMNS
from etl.run.plan import Plan, files_to_hash
from etl.sources.entries import SourceFile, SourceListing
from etl.sources.listed_rejects import SourceReject
from tests.helpers.plan_oracle import make_plan
from tests.run.test_plan import config, previous_manifest


def digest_of(content: int) -> str:
    return xxhash.xxh3_64_hexdigest(str(content).encode())


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, object]:
    """A previous version, the files listed now, their contents, and which cannot be read."""
    names = [f"{c}/{i:02d}.jpg" for c in "abc" for i in range(10)]
    previous = draw(st.lists(st.sampled_from(names), unique=True, max_size=20))
    rejected = draw(st.lists(st.sampled_from(names), unique=True, max_size=4))
    rejected = [s for s in rejected if s not in previous]
    contents = st.integers(0, 12)
    old = [(s, digest_of(draw(contents)), draw(st.integers(1, 2))) for s in sorted(previous)]
    reasons = st.sampled_from(["truncated", "corrupt", "duplicate", "io_error"])
    old_rejects = [(s, digest_of(draw(contents)), draw(reasons)) for s in sorted(rejected)]
    listed = draw(st.lists(st.sampled_from([*names, "d/00.jpg"]), unique=True, max_size=30))
    files = [
        SourceFile(s, f"/data/{s}", s[0], None, 10, draw(st.integers(1, 2)), None, 1, 7)
        for s in listed
    ]
    return {
        "old": old,
        "old_rejects": old_rejects,
        "files": files,
        "content": {s: digest_of(draw(contents)) for s in listed},
        "unreadable": set(draw(st.lists(st.sampled_from(listed), max_size=3))) if listed else set(),
        "duplicates": draw(st.sampled_from(["keep_first", "reject_all", "allow"])),
        "fixed": draw(st.booleans()),
        "first_run": draw(st.booleans()),
    }


def hashing(content: dict[str, str], unreadable: set[str], asked: list[str]) -> staged.HashFiles:
    """Hash the files asked for from `content`; the `unreadable` ones fail."""

    def hash_files(files: pa.Table) -> tuple[pa.Array, list[SourceReject]]:
        sources = files.column("source").to_pylist()
        asked.extend(sources)
        found = [None if s in unreadable else content[s] for s in sources]
        rows = {r["source"]: r for r in files.to_pylist()}
        rejects = [
            SourceReject(s, "io_error", "cannot read", rows[s]["size"], rows[s]["mtime_ns"])
            for s in sources
            if s in unreadable
        ]
        return pa.array(found, pa.string()), rejects

    return hash_files


@pytest.fixture
def tiny() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(staged, "WINDOW_ROWS", 3)
        patch.setattr(hash_buckets, "BUCKET_ROWS", 2)
        patch.setattr(spill, "RUN_ROWS", 4)
        patch.setattr(spill, "BATCH_ROWS", 2)
        patch.setattr(spill, "MERGE_ROWS", 3)
        patch.setattr(spill, "FAN_IN", 3)
        yield


def facts(plan: Plan) -> dict[str, object]:
    """What a plan decided, as plain values."""
    return {
        "classes": plan.classes,
        "counts": dict(plan.counts),
        "rejects": plan.rejects.to_pylist(),
        "reused": plan.reused.to_pylist(),
        "packing": plan.packing.select(list(PACKING_COLUMNS)).to_pylist(),
        "tasks": [(t.shard, t.start, list(t.sources), list(t.hashes)) for t in plan.tasks],
    }


# the fixture only sets module constants, the same for every example
@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(scenario=scenarios())
def test_staged_plan_is_the_plan_made_in_memory(tiny: None, scenario: dict) -> None:
    files: list[SourceFile] = scenario["files"]
    listing = SourceListing(tuple(files), ())
    previous = None
    if not scenario["first_run"]:
        previous = previous_manifest(scenario["old"], scenario["old_rejects"])
    settings_ = {"duplicates": scenario["duplicates"]}
    if scenario["fixed"]:
        settings_["classes"] = ["c", "a"]
    cfg = config(**settings_)
    prior = previous.meta.classes if previous is not None else ()

    asked: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        made = staged.staged_plan(
            cfg,
            listing,
            hashing(scenario["content"], scenario["unreadable"], asked),
            previous,
            2,
            prior,
            Path(folder),
        )
        got = facts(made)
        left = sorted(p.name for p in Path(folder).iterdir())

    wanted = [f.source for f in files_to_hash(listing, previous)]
    assert sorted(asked) == sorted(wanted), "hashed what the stat does not vouch for, once"
    hashes = {s: scenario["content"][s] for s in wanted if s not in scenario["unreadable"]}
    chosen = pa.array([f.source in set(wanted) for f in listing.files], pa.bool_())
    hash_wanted = hashing(scenario["content"], scenario["unreadable"], [])
    _, hash_rejects = hash_wanted(listing.files.table.filter(chosen))
    expected = make_plan(cfg, listing, hashes, hash_rejects, previous, 2, prior)
    assert got == facts(expected)
    assert left == ["packing.arrow", "rejects.arrow", "reused.arrow"], "runs are removed as read"


def test_previous_rows_out_of_source_order_still_match(tiny: None, tmp_path: Path) -> None:
    """A version whose rows are not sorted by source (not written by this tool) is re-sorted,
    not merge-joined as if sorted."""
    rows = [(f"a/{i:02d}.jpg", digest_of(i), 1) for i in range(8)]
    previous = previous_manifest(rows, [])
    shuffled = previous.samples.take(pa.array([5, 0, 7, 2, 1, 6, 3, 4]))
    previous = dataclasses.replace(previous, samples=shuffled)
    files = [SourceFile(s, f"/data/{s}", "a", None, 10, 1, None, 1, 7) for s, _, _ in rows]
    asked: list[str] = []
    plan = staged.staged_plan(
        config(),
        SourceListing(tuple(files), ()),
        hashing({}, set(), asked),
        previous,
        2,
        ("a",),
        tmp_path,
    )
    assert not asked, "every file is vouched for by its stat"
    assert plan.counts == {"unchanged": 8, "deleted": 0, "rejected": 0}
    assert plan.reused.column("source").to_pylist() == [s for s, _, _ in rows]


def test_buckets_are_the_same_worked_out_a_slice_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    digests = pa.chunked_array(
        [[digest_of(i) for i in range(5)], [None, "short", *(digest_of(i) for i in range(5, 40))]]
    )
    whole = hash_buckets.buckets_of(digests, 7)
    monkeypatch.setattr(hash_buckets, "SLICE_ROWS", 3)
    assert hash_buckets.buckets_of(digests, 7).tolist() == whole.tolist()
    assert set(whole.tolist()) == set(range(7)), "40 hex digests reach every one of 7 buckets"
