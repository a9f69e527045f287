from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import blake3
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from etl.errors import ManifestError
from etl.format import coherence
from etl.format import manifest as manifest_module
from etl.format.commit import commit
from etl.format.manifest import list_versions, read_manifest, table_from_rows, version_dir
from etl.format.schema import (
    FORMAT_VERSION,
    REJECTS_SCHEMA,
    SAMPLES_SCHEMA,
    SHARDS_SCHEMA,
    ManifestMeta,
)
from tests.format.test_mapped import resident_file_kib
from tests.helpers.packed import rewrite_sealed


def meta(version: int = 1) -> ManifestMeta:
    return ManifestMeta(
        version=version,
        sample_shape=(2, 2, 3),
        layout="HWC",
        classes=("a", "b"),
        checksum="xxh3_64",
        config_digest="abc",
        config={"k": 1},
        tool_version="test",
    )


def sample_row(i: int, shard: str = "shards/v000001-00000.npy") -> dict[str, object]:
    return {
        "sample_id": f"id{i}",
        "source": f"a/{i}.png",
        "source_size": 10,
        "source_mtime_ns": 5,
        "source_hash": f"h{i}",
        "source_height": 4,
        "source_width": 4,
        "label": i % 2,
        "class_name": "ab"[i % 2],
        "split": "train",
        "shard": shard,
        "row": i,
        "checksum": f"{i:016x}",
    }


def tables(n: int = 3, shard: str = "shards/v000001-00000.npy", rows: int = 3):
    samples = table_from_rows([sample_row(i, shard) for i in range(n)], SAMPLES_SCHEMA)
    shards = table_from_rows(
        [{"shard": shard, "rows": rows, "bytes": 1, "checksum": "0" * 16, "blake3": "0" * 64}],
        SHARDS_SCHEMA,
    )
    rejects = table_from_rows(
        [
            {
                "source": "b/bad.jpg",
                "reason": "truncated",
                "message": "m",
                "source_size": 3,
                "source_mtime_ns": None,
                "source_hash": None,
            }
        ],
        REJECTS_SCHEMA,
    )
    return samples, shards, rejects


def test_commit_and_read_round_trip(tmp_path: Path) -> None:
    commit(tmp_path, meta(1), *tables())
    commit(tmp_path, meta(2), *tables(2))
    assert list_versions(tmp_path) == [1, 2]
    latest = read_manifest(tmp_path)
    assert latest.version == 2 and latest.samples.num_rows == 2
    pinned = read_manifest(tmp_path, 1)
    assert pinned.samples.num_rows == 3
    assert pinned.meta.classes == ("a", "b") and pinned.meta.sample_shape == (2, 2, 3)
    via_file = read_manifest(version_dir(tmp_path, 1) / "manifest.arrow")
    assert via_file.samples.equals(pinned.samples)
    assert pinned.rejects.column("reason").to_pylist() == ["truncated"]


def test_readable_without_our_code(tmp_path: Path) -> None:
    commit(tmp_path, meta(1), *tables())
    path = version_dir(tmp_path, 1) / "manifest.arrow"
    table = ipc.open_file(path).read_all()
    assert table.num_rows == 3
    assert table.schema.metadata[b"etl.format_version"] == str(FORMAT_VERSION).encode()
    import duckdb
    import pandas as pd

    frame = pd.read_feather(path)
    assert list(frame["row"]) == [0, 1, 2]
    manifest = table  # noqa: F841 (duckdb scans the pyarrow table by its variable name)
    rows = duckdb.sql("select count(*) from manifest where label = 1").fetchall()
    assert rows == [(1,)]


def test_version_exists_is_refused(tmp_path: Path) -> None:
    commit(tmp_path, meta(1), *tables())
    with pytest.raises(ManifestError, match="exists already"):
        commit(tmp_path, meta(1), *tables())


def test_temp_folders_are_not_versions(tmp_path: Path) -> None:
    commit(tmp_path, meta(1), *tables())
    (tmp_path / "versions" / ".tmp-v000002-1").mkdir()
    (tmp_path / "versions" / "v000003").mkdir()  # no manifest inside: never committed
    assert list_versions(tmp_path) == [1]


def test_unknown_format_version_is_refused(tmp_path: Path) -> None:
    commit(tmp_path, meta(1), *tables())
    path = version_dir(tmp_path, 1) / "manifest.arrow"
    table = ipc.open_file(path).read_all()
    metadata = dict(table.schema.metadata)
    metadata[b"etl.format_version"] = b"99"
    rewrite_sealed(path, table.replace_schema_metadata(metadata))
    with pytest.raises(ManifestError, match="format version 99"):
        read_manifest(tmp_path)


@pytest.mark.parametrize(
    ("shard", "rows", "n", "expected"),
    [
        ("/etc/passwd.npy", 3, 3, "not of the form"),
        ("shards/../../x.npy", 3, 3, "not of the form"),
        ("shards/v000001-00000.npy", 2, 3, "outside shard"),
    ],
)
def test_tampered_manifests_are_refused(
    tmp_path: Path, shard: str, rows: int, n: int, expected: str
) -> None:
    commit(tmp_path, meta(1), *tables(n, shard, rows))
    with pytest.raises(ManifestError, match=expected):
        read_manifest(tmp_path)


def test_label_out_of_range_is_refused(tmp_path: Path) -> None:
    samples, shards, rejects = tables()
    labels = pa.array(np.array([0, 1, 7], np.int32))
    samples = samples.set_column(samples.schema.get_field_index("label"), "label", labels)
    commit(tmp_path, meta(1), samples, shards, rejects)
    with pytest.raises(ManifestError, match="outside the 2 classes"):
        read_manifest(tmp_path)


@pytest.mark.parametrize("bad", ["label", "row"])
def test_a_check_made_a_slice_at_a_time_names_the_versions_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setattr(coherence, "CHECK_ROWS", 3)
    samples, shards, rejects = tables(10, rows=10)
    column = samples.column(bad).to_numpy().copy()
    column[7] = 99
    at = samples.schema.get_field_index(bad)
    samples = samples.set_column(at, bad, pa.array(column, samples.schema.field(bad).type))
    commit(tmp_path, meta(1), samples, shards, rejects)
    with pytest.raises(ManifestError, match=r"at row 7 \(source 'a/7.png'\)"):
        read_manifest(tmp_path)


def test_the_shard_index_made_a_slice_at_a_time_is_each_samples_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manifest_module, "CHECK_ROWS", 3)
    names = [f"shards/v000001-{i:05d}.npy" for i in range(3)]
    picks = [2, 0, 1, 1, 2, 0, 0, 2, 1, 2]
    rows = [sample_row(i, names[k]) | {"row": 0} for i, k in enumerate(picks)]
    samples = table_from_rows(rows, SAMPLES_SCHEMA)
    shard_rows = [
        {"shard": name, "rows": 1, "bytes": 1, "checksum": "0" * 16, "blake3": "0" * 64}
        for name in reversed(names)
    ]
    shards = table_from_rows(shard_rows, SHARDS_SCHEMA)
    commit(tmp_path, meta(1), samples, shards, tables()[2])
    opened = read_manifest(tmp_path)
    listed = opened.shards.column("shard").to_pylist()
    assert opened.shard_index.tolist() == [listed.index(names[k]) for k in picks]


def test_missing_dataset(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no manifest version"):
        read_manifest(tmp_path)
    with pytest.raises(ManifestError, match="no such dataset"):
        read_manifest(tmp_path / "nope")
    commit(tmp_path, meta(1), *tables())
    with pytest.raises(ManifestError, match="no version 5"):
        read_manifest(tmp_path, 5)


def _with_tool_version(tmp_path: Path, tool_version: str) -> None:
    """Version 1 as a tool of `tool_version` would have left it: no commit record if older."""
    commit(tmp_path, dataclasses.replace(meta(1), tool_version=tool_version), *tables())
    (version_dir(tmp_path, 1) / "commit.json").unlink()


def test_a_version_from_before_commit_records_still_opens(tmp_path: Path) -> None:
    _with_tool_version(tmp_path, "0.1.0")
    assert read_manifest(tmp_path).samples.num_rows == 3


@pytest.mark.parametrize("tool_version", ["0.2.0", "1.0", "test"])
def test_a_missing_commit_record_is_refused(tmp_path: Path, tool_version: str) -> None:
    _with_tool_version(tmp_path, tool_version)
    with pytest.raises(ManifestError, match=r"v000001/commit.json: missing"):
        read_manifest(tmp_path)
    assert read_manifest(tmp_path, verify=False).samples.num_rows == 3


def test_the_record_names_sizes_and_digests_any_tool_can_check(tmp_path: Path) -> None:
    """commit.json is plain JSON; its digests are BLAKE3 of the files, computed here without
    our code; its own seal is BLAKE3 of its other keys as compact sorted JSON."""
    commit(tmp_path, meta(1), *tables())
    folder = version_dir(tmp_path, 1)
    record = json.loads((folder / "commit.json").read_text())
    assert set(record["files"]) == {"manifest.arrow", "shards.arrow", "rejects.arrow"}
    for name, entry in record["files"].items():
        data = (folder / name).read_bytes()
        assert entry == {"bytes": len(data), "blake3": blake3.blake3(data).hexdigest()}
    seal = record.pop("record")
    assert (
        seal
        == blake3.blake3(
            json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
    )


def test_a_manifest_without_the_later_stat_columns_reads_them_as_nulls(tmp_path: Path) -> None:
    commit(tmp_path, meta(1), *tables())
    path = version_dir(tmp_path, 1) / "manifest.arrow"
    table = ipc.open_file(path).read_all()
    rewrite_sealed(path, table.drop_columns(["source_ctime_ns", "source_inode"]))
    samples = read_manifest(tmp_path).samples
    assert samples.column("source_inode").null_count == samples.num_rows == 3
    assert samples.schema == SAMPLES_SCHEMA.with_metadata(samples.schema.metadata)


@pytest.mark.slow
def test_opening_a_version_leaves_its_pages_to_the_page_cache(tmp_path: Path) -> None:
    """Opening (and checking) a version touches a page of every batch and of the columns it
    checks; none of them stays in the process's resident set (`etl.format.mapped`)."""
    n, shard = 1 << 19, "shards/v000001-00000.npy"
    keys = [f"{k:016x}" for k in range(n)]
    numbers = pa.array(np.arange(n, dtype=np.int64))
    columns = {
        "sample_id": keys,
        "source": [f"a/{k}.png" for k in keys],
        "source_size": numbers,
        "source_mtime_ns": numbers,
        "source_ctime_ns": numbers,
        "source_inode": pa.array(np.arange(n, dtype=np.uint64)),
        "source_hash": [k * 4 for k in keys],
        "source_height": pa.array(np.full(n, 4, np.int32)),
        "source_width": pa.array(np.full(n, 4, np.int32)),
        "label": pa.array(np.arange(n, dtype=np.int32) % 2),
        "class_name": ["ab"[k % 2] for k in range(n)],
        "split": ["train"] * n,
        "shard": [shard] * n,
        "row": numbers,
        "checksum": keys,
        "sample_offset": pa.nulls(n, pa.int64()),  # format version 2's; null in 1
        "sample_height": pa.nulls(n, pa.int32()),
        "sample_width": pa.nulls(n, pa.int32()),
        "sample_codec": pa.nulls(n, pa.string()),  # format version 3's
        "sample_bytes": pa.nulls(n, pa.int64()),
    }
    samples = pa.table(columns, schema=SAMPLES_SCHEMA)
    _, shards, rejects = tables(shard=shard, rows=n)
    commit(tmp_path, meta(1), samples.to_batches(max_chunksize=1 << 12), shards, rejects)
    size_kib = (version_dir(tmp_path, 1) / "manifest.arrow").stat().st_size >> 10
    before = resident_file_kib()
    opened = read_manifest(tmp_path)
    assert resident_file_kib() - before < size_kib // 10
    assert opened.samples.column("source")[-1].as_py() == columns["source"][-1]
