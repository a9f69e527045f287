"""`etl audit`: datasets packed by the real pipeline, damaged on purpose, audited through the CLI.

Expected findings are computed here from the manifest and the bytes we changed, not by the code
under test; pixels after a repair are compared with the ones packed before any damage.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
import xxhash

from etl.cli import main
from etl.config import load_config
from etl.format.lock import DatasetLock
from etl.format.manifest import list_versions, read_manifest
from etl.format.shards import HEADER_BYTES
from etl.maintenance.audit import AuditOptions, audit
from etl.run import pipeline
from etl.start.sample_data import make_sample_data
from loaders import PackedDataset
from tests.helpers.packed import rewrite_sealed

CONFIG = """\
source:
  kind: folder
  path: {data}
stages:
  - decode: {{mode: RGB}}
  - validate: {{min_size: [16, 16], max_aspect: 8.0}}
  - resize: {{size: [{height}, 20]}}
output:
  dir: {out}
  samples_per_shard: 8
run:
  n_jobs: 1
"""
SAMPLE_BYTES = 16 * 20 * 3
V1 = "versions/v000001"


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(source folder, dataset) packed once by the real pipeline: 25 samples in 4 shards."""
    base = tmp_path_factory.mktemp("audit")
    make_sample_data(base / "data", per_class=4, seed=5)
    config = write_config(base, base / "data", base / "dataset")
    report = pipeline.run(load_config(config))
    assert report.committed and report.shards_written == 4
    return base / "data", base / "dataset"


@pytest.fixture(scope="module")
def originals(packed: tuple[Path, Path]) -> dict[str, np.ndarray]:
    """Pixels of every sample as first packed, by sample id."""
    _, dataset = packed
    return {s["sample_id"]: pixels(dataset, s) for s in samples(dataset)}


@pytest.fixture
def ds(tmp_path: Path, packed: tuple[Path, Path]) -> Path:
    """A private copy of the packed dataset."""
    shutil.copytree(packed[1], tmp_path / "ds")
    return tmp_path / "ds"


@pytest.fixture
def src(packed: tuple[Path, Path]) -> Path:
    return packed[0]


def write_config(folder: Path, data: Path, out: Path, height: int = 16) -> Path:
    path = folder / "pipeline.yaml"
    path.write_text(CONFIG.format(data=data, out=out, height=height))
    return path


def samples(dataset: Path, version: int | None = None) -> list[dict[str, Any]]:
    return read_manifest(dataset, version).samples.to_pylist()


def pixels(dataset: Path, sample: dict[str, Any]) -> np.ndarray:
    return np.array(np.load(dataset / sample["shard"], mmap_mode="r")[sample["row"]])


def flip_byte(dataset: Path, sample: dict[str, Any], at: int = 7) -> None:
    offset = HEADER_BYTES + sample["row"] * SAMPLE_BYTES + at
    with open(dataset / sample["shard"], "r+b") as f:
        f.seek(offset)
        value = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([value ^ 0xFF]))


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    captured = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), captured.out, captured.err


def audit_json(args: list[str], capsys: pytest.CaptureFixture[str], expect: int) -> dict[str, Any]:
    code, out, err = run_cli(["audit", *args, "--json", "--jobs", "1"], capsys)
    assert code == expect, (out, err)
    result: dict[str, Any] = json.loads(out)
    return result


def kinds(report: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = report["counts"]
    return counts


def bad_ids(report: dict[str, Any]) -> set[str]:
    return {f["sample_id"] for f in report["findings"] if f["kind"].startswith("sample_")}


def tree_state(root: Path) -> list[tuple[str, str, int]]:
    """Every entry under `root`: path, content hash and mtime. Equal before and after = no write."""
    state = []
    for path in sorted(root.rglob("*")):
        content = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        state.append((str(path.relative_to(root)), content, path.stat().st_mtime_ns))
    return state


# --- clean ---------------------------------------------------------------------------------------


def test_clean_dataset_exits_0(ds: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = audit_json([str(ds)], capsys, expect=0)
    assert report["clean"] and report["exit_code"] == 0 and report["findings"] == []
    assert report["samples"] == {"total": 25, "verified": 25, "bad": 0}
    assert report["shards"] == {"total": 4, "hashed": 4}
    assert report["bytes_hashed"] == sum(p.stat().st_size for p in (ds / "shards").iterdir())
    code, out, _ = run_cli(["audit", str(ds), "-j", "1"], capsys)
    assert code == 0 and "clean" in out


def test_help_shows_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["audit", "--help"], capsys)
    assert code == 0 and "Example:" in out and "--repair" in out


# --- damaged shards and samples ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["full", "fast", "deep"])
def test_one_flipped_byte_names_exactly_that_sample(
    ds: Path, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = samples(ds)
    victim = rows[np.random.default_rng(11).integers(len(rows))]
    flip_byte(ds, victim)
    report = audit_json([str(ds), *([f"--{mode}"] if mode != "full" else [])], capsys, expect=1)
    assert report["mode"] == mode
    bad = [f for f in report["findings"] if f["kind"] == "sample_checksum"]
    assert [(f["sample_id"], f["source"], f["shard"], f["row"]) for f in bad] == [
        (victim["sample_id"], victim["source"], victim["shard"], victim["row"])
    ]
    assert bad[0]["expected"] == victim["checksum"] != bad[0]["actual"]
    shard_kinds = {"shard_checksum": 1, **({"shard_blake3": 1} if mode == "deep" else {})}
    assert kinds(report) == {**shard_kinds, "sample_checksum": 1}
    assert {f["shard"] for f in report["findings"]} == {victim["shard"]}


@pytest.mark.parametrize(
    ("damage", "kind"),
    [("delete", "shard_missing"), ("truncate", "shard_size"), ("dtype", "shard_header")],
)
def test_unreadable_shard_makes_every_sample_in_it_bad(
    ds: Path, damage: str, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    shard = "shards/v000001-00001.npy"
    path = ds / shard
    if damage == "delete":
        path.unlink()
    elif damage == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) - 100])
    else:  # same size, another dtype in the header
        data = path.read_bytes()
        assert data.count(b"'descr': '|u1'") == 1
        path.write_bytes(data.replace(b"'descr': '|u1'", b"'descr': '<u2'"))
    report = audit_json([str(ds)], capsys, expect=1)
    in_shard = {s["sample_id"] for s in samples(ds) if s["shard"] == shard}
    assert len(in_shard) > 1
    assert kinds(report) == {kind: 1, "sample_unreadable": len(in_shard)}
    assert bad_ids(report) == in_shard


def test_stray_shard_is_an_orphan_and_temp_files_are_notes(
    ds: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (ds / "shards" / ".tmp-v000002-00000.npy-123").write_bytes(b"partial")
    report = audit_json([str(ds)], capsys, expect=0)  # leftovers alone are not damage
    assert kinds(report) == {"leftover": 1}
    # a shard of a version never committed: what a killed run leaves, a note too
    shutil.copy(ds / "shards/v000001-00000.npy", ds / "shards/v000007-00000.npy")
    report = audit_json([str(ds)], capsys, expect=0)
    assert kinds(report) == {"leftover": 2}
    # a shard of a committed version that no version lists: damage
    shutil.copy(ds / "shards/v000001-00000.npy", ds / "shards/v000001-00099.npy")
    report = audit_json([str(ds)], capsys, expect=1)
    assert kinds(report) == {"leftover": 2, "orphan_shard": 1}
    orphan = next(f for f in report["findings"] if f["kind"] == "orphan_shard")
    assert orphan["shard"] == "shards/v000001-00099.npy"


def rewrite_arrow(path: Path, column: str, values: dict[str, str], key: str) -> None:
    """Set `column` to values[row[key]] where given, keeping the schema and its metadata."""
    with ipc.open_file(path) as reader:
        table = reader.read_all()
    keys, old = table[key].to_pylist(), table[column].to_pylist()
    new = [values.get(k, v) for k, v in zip(keys, old, strict=True)]
    table = table.set_column(table.schema.get_field_index(column), column, pa.array(new))
    rewrite_sealed(path, table)


def test_only_deep_catches_changes_that_keep_the_xxh3_digests(
    ds: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """xxh3 is not cryptographic: model a forged collision by changing a sample's bytes and
    writing the new xxh3 digests into the manifest; only the shard's BLAKE3 digest still
    disagrees."""
    victim = samples(ds)[10]
    flip_byte(ds, victim)
    new_row = xxhash.xxh3_64_hexdigest(pixels(ds, victim).tobytes())
    new_file = xxhash.xxh3_64_hexdigest((ds / victim["shard"]).read_bytes())
    rewrite_arrow(
        ds / V1 / "manifest.arrow", "checksum", {victim["sample_id"]: new_row}, "sample_id"
    )
    rewrite_arrow(ds / V1 / "shards.arrow", "checksum", {victim["shard"]: new_file}, "shard")
    assert audit_json([str(ds)], capsys, expect=0)["clean"]
    report = audit_json([str(ds), "--deep"], capsys, expect=1)
    assert kinds(report) == {"shard_blake3": 1}
    assert report["findings"][0]["shard"] == victim["shard"]


# --- a damaged manifest --------------------------------------------------------------------------


def test_changed_checksum_string_in_manifest_bytes(
    ds: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = samples(ds)[3]
    path = ds / V1 / "manifest.arrow"
    data = path.read_bytes()
    old = victim["checksum"].encode()
    assert data.count(old) == 1
    new = ("0" if old[:1] != b"0" else "1").encode() + old[1:]
    path.write_bytes(data.replace(old, new))
    report = audit_json([str(ds)], capsys, expect=1)
    assert kinds(report) == {"manifest": 1, "sample_checksum": 1}
    record, finding = sorted(report["findings"], key=lambda f: f["kind"])
    assert record["message"] == f"{V1}/manifest.arrow: bytes changed after the commit (blake3)"
    assert finding["sample_id"] == victim["sample_id"] and finding["expected"] == new.decode()
    assert finding["actual"] == victim["checksum"]
    assert "manifest's checksum" in finding["message"]  # the shard itself verified


def test_values_no_loader_reads_are_the_audits_to_judge(
    ds: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resealed manifest with a per-sample checksum that is no digest and a source listed
    twice: a loader opens it (it reads neither value), the audit names both."""
    path = ds / V1 / "manifest.arrow"
    table = ipc.open_file(path).read_all()
    sources = table.column("source").to_pylist()
    checksums = table.column("checksum").to_pylist()
    checksums[2] = "not-a-digest"
    table = table.set_column(
        table.schema.get_field_index("checksum"), "checksum", pa.array(checksums)
    )
    table = pa.concat_tables([table, table.slice(4, 1)]).sort_by("source")
    rewrite_sealed(path, table)
    assert len(PackedDataset.open(ds)) == len(sources) + 1
    report = audit_json([str(ds)], capsys, expect=1)
    messages = [f["message"] for f in report["findings"] if f["kind"] == "manifest"]
    assert f"{V1}/manifest.arrow: checksum is not 16 lowercase hex digits: {sources[2]}" in messages
    assert (
        f"{V1}/manifest.arrow: rows not in strictly ascending source order (each source once): "
        f"{sources[4]}"
    ) in messages


def test_ids_classes_and_rejects_that_contradict_the_manifest_are_named(
    ds: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resealed manifest whose row 1 has another source's sample_id, whose row 3 names a
    class its label does not, and whose rejects list a packed source: the audit names each
    row (checked against xxhash itself, not etl's sample_id)."""
    path = ds / V1 / "manifest.arrow"
    table = ipc.open_file(path).read_all()
    sources = table.column("source").to_pylist()
    assert all(
        i == xxhash.xxh3_64_hexdigest(s.encode())
        for s, i in zip(sources, table.column("sample_id").to_pylist(), strict=True)
    )
    ids = table.column("sample_id").to_pylist()
    ids[1] = ids[0]
    names = table.column("class_name").to_pylist()
    names[3] = next(n for n in set(names) if n != names[3])
    for column, values in (("sample_id", ids), ("class_name", names)):
        index = table.schema.get_field_index(column)
        table = table.set_column(index, column, pa.array(values, pa.string()))
    rewrite_sealed(path, table)
    rejects_path = ds / V1 / "rejects.arrow"
    rejects = ipc.open_file(rejects_path).read_all()
    packed_too = rejects.slice(0, 1).set_column(0, "source", pa.array([sources[5]], pa.string()))
    packed_too = packed_too.cast(rejects.schema)
    rewrite_sealed(rejects_path, pa.concat_tables([rejects, packed_too]).sort_by("source"))
    report = audit_json([str(ds)], capsys, expect=1)
    messages = [f["message"] for f in report["findings"] if f["kind"] == "manifest"]
    assert f"{V1}/manifest.arrow: sample_id is not xxh3_64 of source: {sources[1]}" in messages
    assert f"{V1}/manifest.arrow: class_name is not classes[label]: {sources[3]}" in messages
    assert f"{V1}/rejects.arrow: also in manifest: {sources[5]}" in messages


@pytest.mark.parametrize("damage", ["truncate", "footer"])
def test_unreadable_manifest_is_a_finding(
    ds: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = ds / V1 / "manifest.arrow"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else data[:-6] + b"XXXXXX")
    report = audit_json([str(ds)], capsys, expect=1)
    assert kinds(report) == {"manifest": 2}
    record, unreadable = (f["message"] for f in report["findings"])
    assert record.startswith(f"{V1}/manifest.arrow: ")
    assert "manifest.arrow" in unreadable and "Arrow" in unreadable
    assert any("not checked" in note for note in report["notes"])


def test_unknown_format_version_and_no_dataset_exit_2(
    ds: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = ds / V1 / "manifest.arrow"
    with ipc.open_file(path) as reader:
        table = reader.read_all()
    metadata = {**table.schema.metadata, b"etl.format_version": b"9"}
    table = table.replace_schema_metadata(metadata)
    with ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)
    for args, message in [
        ([str(ds)], "format version 9"),
        ([str(tmp_path / "nowhere")], "no such dataset"),
        ([str(ds), "--version", "9"], "no version 9"),
    ]:
        code, _, err = run_cli(["audit", *args], capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_shards_records_of_two_versions_must_agree(
    ds: Path, src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flip_byte(ds, samples(ds)[0])  # repair -> version 2, which still lists shards of version 1
    config = write_config(tmp_path, src, ds)
    audit_json([str(ds), "--repair", "--config", str(config)], capsys, expect=0)
    shared = set(read_manifest(ds, 1).shards.column("shard").to_pylist()) & set(
        read_manifest(ds, 2).shards.column("shard").to_pylist()
    )
    name = sorted(shared)[0]
    rewrite_arrow(ds / V1 / "shards.arrow", "checksum", {name: "0" * 16}, "shard")
    report = audit_json([str(ds)], capsys, expect=1)
    assert kinds(report) == {"record_conflict": 1}
    assert report["findings"][0]["shard"] == name


# --- sources -------------------------------------------------------------------------------------


def test_changed_and_vanished_sources(
    ds: Path, src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "data"
    shutil.copytree(src, copy)
    rows = samples(ds)
    changed, gone = rows[2], rows[9]
    with open(copy / changed["source"], "ab") as f:
        f.write(b"\0")
    (copy / gone["source"]).unlink()
    assert audit_json([str(ds)], capsys, expect=0)["sources"]["checked"] == 0
    report = audit_json([str(ds), "--source", str(copy)], capsys, expect=1)
    assert report["sources"]["checked"] == 25
    found = {(f["kind"], f["source"]) for f in report["findings"]}
    assert found == {("source_changed", changed["source"]), ("source_missing", gone["source"])}
    # --config names the same root
    config = write_config(tmp_path, copy, ds)
    report = audit_json([str(ds), "--config", str(config)], capsys, expect=1)
    assert {(f["kind"], f["source"]) for f in report["findings"]} == found


# --- repair --------------------------------------------------------------------------------------


def test_repair_restores_the_original_pixels(
    ds: Path,
    src: Path,
    tmp_path: Path,
    originals: dict[str, np.ndarray],
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = samples(ds)
    flip_byte(ds, rows[20])
    (ds / "shards/v000001-00000.npy").unlink()
    config = write_config(tmp_path, src, ds)
    report = audit_json([str(ds), "--repair", "--config", str(config)], capsys, expect=0)
    assert report["exit_code"] == 0 and not report["clean"]
    repair = report["repair"]
    assert repair["version"] == 2 and repair["failed"] == []
    hows = {r["sample_id"]: r["how"] for r in repair["repaired"]}
    lost = {s["sample_id"] for s in rows if s["shard"] == "shards/v000001-00000.npy"}
    damaged = {s["sample_id"] for s in rows if s["shard"] == rows[20]["shard"]}
    assert set(hows) == lost | damaged
    assert {hows[i] for i in lost | {rows[20]["sample_id"]}} == {"restored"}
    assert {hows[i] for i in damaged - {rows[20]["sample_id"]}} == {"copied"}
    assert repair["after"]["clean"] and repair["after"]["version"] == 2
    repaired = samples(ds, 2)
    assert len(repaired) == len(originals)
    for s in repaired:
        np.testing.assert_array_equal(pixels(ds, s), originals[s["sample_id"]])
    assert all(s["shard"].startswith("shards/v000002-") for s in repaired if s["sample_id"] in hows)
    # the pinned version 1 is untouched, damage included
    audit_json([str(ds), "--version", "1"], capsys, expect=1)
    audit_json([str(ds)], capsys, expect=0)


def test_repair_fixes_a_wrong_manifest_checksum(
    ds: Path, src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A writer's bug, not damage: the record matches the wrong value. (Bytes changed after the
    commit are refused: see test_repair_refuses_a_manifest_changed_after_its_commit.)"""
    victim = samples(ds)[4]
    wrong = "f" * 16 if victim["checksum"] != "f" * 16 else "0" * 16
    rewrite_arrow(ds / V1 / "manifest.arrow", "checksum", {victim["sample_id"]: wrong}, "sample_id")
    config = write_config(tmp_path, src, ds)
    report = audit_json([str(ds), "--repair", "--config", str(config)], capsys, expect=0)
    assert [(r["sample_id"], r["how"]) for r in report["repair"]["repaired"]] == [
        (victim["sample_id"], "record_fixed")
    ]


def test_repair_refuses_a_manifest_changed_after_its_commit(
    ds: Path, src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A height changed in place (the bytes of one int32) passes every value check; the commit
    record alone tells, and repair must not seal it into a new version."""
    victim = samples(ds)[4]
    table = ipc.open_file(ds / V1 / "manifest.arrow").read_all()
    heights = table.column("source_height").to_pylist()
    assert heights.count(victim["source_height"]) >= 1
    path = ds / V1 / "manifest.arrow"
    data = bytearray(path.read_bytes())
    column = np.frombuffer(np.array(heights, np.int32).tobytes(), np.uint8)
    at = bytes(data).find(column.tobytes())
    assert at > 0  # the column's buffer, found by its exact bytes
    data[at + 4 * 4 + 1] ^= 0xFE  # second byte of row 4's height: 386 -> 65154-like
    path.write_bytes(bytes(data))
    changed = ipc.open_file(path).read_all().column("source_height")[4].as_py()
    assert changed != victim["source_height"]  # still a valid table, one value off
    config = write_config(tmp_path, src, ds)
    code, _, err = run_cli(["audit", str(ds), "--repair", "--config", str(config)], capsys)
    (error,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and "manifest is damaged" in error and "Traceback" not in err
    assert list_versions(ds) == [1]
    report = audit_json([str(ds)], capsys, expect=1)
    assert [f["message"] for f in report["findings"]] == [
        "versions/v000001/manifest.arrow: bytes changed after the commit (blake3)"
    ]
    code, _, err = run_cli(["show", str(ds)], capsys)
    assert code == 2 and "bytes changed after the commit" in err


def test_repair_says_which_samples_cannot_be_repaired(
    ds: Path, src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "data"
    shutil.copytree(src, copy)
    rows = samples(ds)
    flip_byte(ds, rows[1])
    flip_byte(ds, rows[12])
    with open(copy / rows[12]["source"], "ab") as f:
        f.write(b"\0")
    config = write_config(tmp_path, copy, ds)
    report = audit_json([str(ds), "--repair", "--config", str(config)], capsys, expect=1)
    (failed,) = report["repair"]["failed"]
    assert failed["sample_id"] == rows[12]["sample_id"] and "changed" in failed["reason"]
    assert rows[1]["sample_id"] in {r["sample_id"] for r in report["repair"]["repaired"]}
    after = report["repair"]["after"]
    assert bad_ids(after) == {rows[12]["sample_id"]} and "source_changed" in kinds(after)


def test_repair_takes_the_writer_lock(
    ds: Path, src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flip_byte(ds, samples(ds)[0])
    config = write_config(tmp_path, src, ds)
    with DatasetLock(ds):
        code, _, err = run_cli(
            ["audit", str(ds), "-q", "--repair", "--config", str(config)], capsys
        )
    assert code == 2 and "another etl process" in err
    assert list_versions(ds) == [1]
    report = audit_json([str(ds), "--repair", "--config", str(config)], capsys, expect=0)
    assert report["repair"]["version"] == 2
    report = audit_json([str(ds), "--repair", "--config", str(config)], capsys, expect=0)
    assert report["repair"] is None  # clean: nothing to repair, nothing written
    assert list_versions(ds) == [1, 2]


def test_repair_refuses_another_config_and_needs_one(
    ds: Path, src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flip_byte(ds, samples(ds)[0])
    before = tree_state(ds)
    config = write_config(tmp_path, src, ds, height=24)
    code, _, err = run_cli(["audit", str(ds), "-q", "--repair", "--config", str(config)], capsys)
    assert code == 2 and "other output settings" in err and "stages" in err
    code, _, err = run_cli(["audit", str(ds), "--repair"], capsys)
    assert code == 2 and "--config" in err
    assert tree_state(ds) == before


# --- sampling, reports, read-only ----------------------------------------------------------------


def test_sample_rate_is_reproducible_by_seed(ds: Path) -> None:
    rows = samples(ds)
    corrupted = set(range(0, 25, 2))
    for i in corrupted:
        flip_byte(ds, rows[i])
    k = math.ceil(0.4 * 25)
    found = []
    for seed in (7, 7, 8):
        report = audit(ds, AuditOptions(sample_rate=0.4, seed=seed, jobs=1))
        assert report.samples_verified == k and report.seed == seed
        found.append({f.sample_id for f in report.bad_samples})
        drawn = set(np.random.default_rng(seed).choice(25, size=k, replace=False).tolist())
        assert found[-1] == {rows[i]["sample_id"] for i in corrupted & drawn}
    assert found[0] == found[1] != found[2]
    unseeded = audit(ds, AuditOptions(sample_rate=0.4, jobs=1))
    again = audit(ds, AuditOptions(sample_rate=0.4, seed=unseeded.seed, jobs=1))
    assert {f.sample_id for f in unseeded.bad_samples} == {f.sample_id for f in again.bad_samples}


def test_reports_json_and_arrow(
    ds: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flip_byte(ds, samples(ds)[5])
    printed = audit_json([str(ds), "--report", str(tmp_path / "r.json")], capsys, expect=1)
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["findings"] == printed["findings"] and written["counts"] == printed["counts"]
    assert {f["kind"] for f in written["findings"]} == {"sample_checksum", "shard_checksum"}
    code, _, _ = run_cli(
        ["audit", str(ds), "-q", "-j", "1", "--report", str(tmp_path / "r.arrow")], capsys
    )
    assert code == 1
    with ipc.open_file(tmp_path / "r.arrow") as reader:
        table = reader.read_all()
    summary = json.loads(table.schema.metadata[b"etl.audit"])
    assert summary["exit_code"] == 1 and summary["counts"] == printed["counts"]
    assert sorted(table["kind"].to_pylist()) == sorted(f["kind"] for f in printed["findings"])
    assert set(table["version"].to_pylist()) == {1}


def test_human_output_names_the_bad_sample(ds: Path, capsys: pytest.CaptureFixture[str]) -> None:
    victim = samples(ds)[6]
    flip_byte(ds, victim)
    code, out, _ = run_cli(["audit", str(ds)], capsys)  # default jobs: in-process when small
    assert code == 1
    assert "sample_checksum" in out and victim["sample_id"] in out
    assert f"{victim['shard'].removeprefix('shards/')}:{victim['row']}" in out


def test_two_jobs_find_the_same(ds: Path) -> None:
    rows = samples(ds)
    flip_byte(ds, rows[3])
    (ds / rows[24]["shard"]).unlink()
    one = audit(ds, AuditOptions(jobs=1))
    two = audit(ds, AuditOptions(jobs=2))
    assert one.ordered() == two.ordered() and one.exit_code == two.exit_code == 1


def test_audit_never_writes_without_repair(
    ds: Path, src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = samples(ds)
    flip_byte(ds, rows[0])
    (ds / rows[-1]["shard"]).write_bytes(b"short")
    before = tree_state(ds)
    config = write_config(tmp_path, src, ds)
    for extra in (
        [],
        ["--fast"],
        ["--sample-rate", "0.5", "--seed", "1"],
        ["--source", str(src)],
        ["--config", str(config)],
        ["--report", str(tmp_path / "r.arrow")],
    ):
        code, _, _ = run_cli(["audit", str(ds), "-q", "-j", "1", *extra], capsys)
        assert code == 1
    assert tree_state(ds) == before


# --- a byte flipped anywhere, met the way a user meets it -----------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "at"),
    [
        (f"{V1}/manifest.arrow", 5),
        (f"{V1}/manifest.arrow", 0.5),
        (f"{V1}/shards.arrow", 5),
        (f"{V1}/shards.arrow", 0.5),
        (f"{V1}/rejects.arrow", 5),
        (f"{V1}/rejects.arrow", 0.5),
        (f"{V1}/commit.json", 0.5),
        ("shards/v000001-00000.npy", 20),  # inside the .npy header's shape text
        ("shards/v000001-00000.npy", 0.5),
    ],
)
def test_etl_audit_names_any_committed_file_with_a_flipped_byte(
    ds: Path, target: str, at: float
) -> None:
    path = ds / target
    offset = int(at) if at >= 1 else int(path.stat().st_size * at)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x41
    path.write_bytes(bytes(data))
    done = subprocess.run(
        [sys.executable, "-m", "etl", "audit", str(ds), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    named = [f for f in report["findings"] if target in f["message"] or target == f["shard"]]
    assert named, report["findings"]
    if target.startswith("shards/"):  # a sampled audit counts the samples it cannot read
        again = subprocess.run(
            [sys.executable, "-m", "etl", "audit", str(ds), "--sample-rate", "1", "--seed", "1"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode == 1 and "Traceback" not in again.stderr
        assert "none of" not in again.stdout, again.stdout


def test_a_version_from_before_commit_records_audits_clean_with_a_note(
    ds: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = ds / V1 / "manifest.arrow"
    table = ipc.open_file(path).read_all()
    metadata = {**table.schema.metadata, b"etl.tool_version": b'"0.1.0"'}
    with ipc.new_file(str(path), table.schema.with_metadata(metadata)) as writer:
        writer.write_table(table.replace_schema_metadata(metadata))
    (ds / V1 / "commit.json").unlink()
    report = audit_json([str(ds)], capsys, expect=0)
    assert any("before commit records" in note for note in report["notes"])
    (ds / V1 / "commit.json").write_text("{}")  # a record that is there must be right
    report = audit_json([str(ds)], capsys, expect=1)
    assert report["findings"][0]["message"].startswith(f"{V1}/commit.json: unreadable")
