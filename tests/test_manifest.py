from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import blake3
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from packed import rewrite_sealed

from etl.errors import ManifestError
from etl.format.commit import commit
from etl.format.manifest import (
    FORMAT_VERSION,
    REJECTS_SCHEMA,
    SAMPLES_SCHEMA,
    SHARDS_SCHEMA,
    ManifestMeta,
    list_versions,
    read_manifest,
    table_from_rows,
    version_dir,
)


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
