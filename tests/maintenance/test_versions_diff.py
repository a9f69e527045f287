"""`etl diff` between two versions, against a plain Python comparison of the two manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from etl.format.commit import commit
from etl.format.manifest import read_manifest
from etl.format.schema import ManifestMeta
from etl.maintenance import versions
from etl.maintenance.versions import diff
from tests.helpers.packed import Packed, make_packed

COMPARED = ("checksum", "class_name", "split")


@pytest.fixture
def packed(tmp_path: Path) -> Packed:
    return make_packed(tmp_path / "ds")


def commit_edited(
    packed: Packed, version: int, edit: Any, classes: tuple[str, ...], ordered: bool = True
) -> None:
    """Commit `version`: version 1's rows as dicts, edited by `edit(rows)`, relabelled by
    class name for `classes` and sorted by source (as this tool writes every manifest), or
    reversed (as another writer might)."""
    first = read_manifest(packed.root, 1)
    rows = edit(first.samples.to_pylist())
    for row in rows:
        row["label"] = classes.index(row["class_name"])
    rows.sort(key=lambda r: r["source"], reverse=not ordered)
    meta = ManifestMeta(**{**first.meta.__dict__, "version": version, "classes": classes})
    table = pa.Table.from_pylist(rows, schema=first.samples.schema)
    commit(packed.root, meta, table, first.shards, first.rejects)


def expected_diff(root: Path, a: int, b: int) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    before, after = read_manifest(root, a), read_manifest(root, b)
    old = {r["source"]: r for r in before.samples.to_pylist()}
    new = {r["source"]: r for r in after.samples.to_pylist()}
    declared = [c for c in after.meta.columns if c in before.meta.columns]
    changed = [
        {
            "sample_id": new[s]["sample_id"],
            "source": s,
            **{f"{c}_old": old[s][c] for c in COMPARED},
            **{f"{c}_new": new[s][c] for c in COMPARED},
            "columns": [name for name, _ in declared if old[s][name] != new[s][name]],
        }
        for s in sorted(old.keys() & new.keys())
        if any(old[s][c] != new[s][c] for c in COMPARED)
        or any(old[s][name] != new[s][name] for name, _ in declared)
    ]
    return sorted(new.keys() - old.keys()), sorted(old.keys() - new.keys()), changed


def edit(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows[5]["checksum"] = "f" * len(rows[5]["checksum"])  # same width: compared as bytes
    rows[6]["class_name"] = "cat" if rows[6]["class_name"] != "cat" else "ant"
    rows[7]["split"] = "test"  # a split version 1 does not have
    added = [{**rows[8], "source": "zzz/new.png", "sample_id": "n1"}]
    added.append({**rows[9], "source": "aaa/new.png", "sample_id": "n2"})
    return [r for i, r in enumerate(rows) if i not in (0, 3)] + added


@pytest.mark.parametrize("classes", [("ant", "bee", "cat"), ("cat", "ant", "bee", "dog")])
@pytest.mark.parametrize(("rows", "ordered"), [(1 << 16, True), (2, True), (3, False)])
def test_diff_matches_a_plain_comparison(
    packed: Packed,
    classes: tuple[str, ...],
    monkeypatch: pytest.MonkeyPatch,
    rows: int,
    ordered: bool,
) -> None:
    """Reordered classes change every label but no class name: only real edits show. The two
    versions are walked side by side `rows` at a time (2: every step ends inside a run of
    added or removed sources); a version written out of source order is sorted first."""
    monkeypatch.setattr(versions, "DIFF_ROWS", rows)
    commit_edited(packed, 2, edit, classes, ordered)
    added, removed, changed = expected_diff(packed.root, 1, 2)
    assert len(added) == 2 and len(removed) == 2 and len(changed) == 3
    d = diff(packed.root, 1, 2)
    assert d.added.column("source").to_pylist() == added
    assert d.removed.column("source").to_pylist() == removed
    assert d.changed.to_pylist() == changed


def test_checksums_of_another_width_compare_as_strings(packed: Packed) -> None:
    """A version whose digests are longer (another algorithm) differs in every checksum."""

    def longer(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for row in rows[::2]:
            row["checksum"] += "0" * 16
        return rows

    commit_edited(packed, 2, longer, packed.classes)
    added, removed, changed = expected_diff(packed.root, 1, 2)
    d = diff(packed.root, 1, 2)
    assert not added and not removed and len(changed) == (len(packed.images) + 1) // 2
    assert d.changed.to_pylist() == changed
    assert diff(packed.root, 2, 2).changed.num_rows == 0
