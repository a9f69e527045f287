"""Per-sample columns (`columns:`) end to end, as a user meets them: `etl run` carries a
listing's, a Parquet table's, a WebDataset sample's and a Python record's values into the
manifest as typed Arrow columns; a value that does not fit is a reject naming where; a rerun
that changes only a value commits it without decoding a picture; diff, audit, repair and
compaction keep them. The oracle is the values as the test wrote them, read back with plain
pyarrow and pandas, and the pixels against a plain Pillow decode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tests.helpers.encoded as encoded
from tests.helpers.columns import (
    COLUMNS_YAML,
    read_csv,
    write_captioned,
    write_csv,
    write_listing_config,
)
from tests.helpers.encoded import (
    add_member,
    etl_run,
    picture,
    reference,
    rejects_of,
    stored,
)


def etl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m etl ARGS` as a user runs it, under a time limit."""
    return subprocess.run(
        [sys.executable, "-m", "etl", *args], capture_output=True, text=True, timeout=180, cwd=cwd
    )


def test_a_csv_listing_carries_typed_columns(tmp_path: Path) -> None:
    expected = write_captioned(tmp_path / "photos")
    rows = read_csv(tmp_path / "photos" / "list.csv")
    bad = {
        "bad0.png": {"quality": "abc"},  # line 14
        "bad1.png": {"boxes": '[[1, "x"]]'},  # line 15
        "bad2.png": {"meta": '{"origin": "a", "year": 40000}'},  # line 16
        "bad3.png": {"quality": ""},  # line 17: required
        "bad4.png": {"quality": "nan"},  # line 18
        "bad5.png": {"meta": '{"origin": "a", "year": 1, "lens": 3}'},  # line 19
        "bad6.png": {"embedding": "[1.5e300]"},  # line 20: not a float32
    }
    for k, (name, change) in enumerate(bad.items()):
        (tmp_path / "photos" / name).write_bytes(picture(100 + k))
        rows.append({**rows[0], "path": name, **change})
    write_csv(tmp_path / "photos" / "list.csv", rows)
    report = etl_run(write_listing_config(tmp_path))
    out = tmp_path / "out"
    assert report["packed_new"] == len(expected) and report["rejected"] == len(bad)

    # the manifest as plain pyarrow reads it: the declared types, then the values written
    version = sorted((out / "versions").iterdir())[-1]
    with pa.ipc.open_file(version / "manifest.arrow") as reader:
        table = reader.read_all()
    assert table.schema.field("caption").type == pa.string()
    assert table.schema.field("score").type == pa.float32()
    assert table.schema.field("boxes").type == pa.list_(pa.list_(pa.float32()))
    assert table.schema.field("meta").type == pa.struct(
        [("origin", pa.string()), ("year", pa.int16())]
    )
    for source, (pixels, row) in stored(out).items():
        want = expected[source]
        assert np.array_equal(pixels, reference((tmp_path / "photos" / source).read_bytes()))
        assert {k: row[k] for k in ("caption", "score", "embedding", "boxes", "meta")} == {
            k: want[k] for k in ("caption", "score", "embedding", "boxes", "meta")
        }, source
    assert stored(out)["img00.png"][1]["caption"] == "000"  # digits stay text

    # pandas reads it without our code
    frame = pytest.importorskip("pandas").read_feather(version / "manifest.arrow")
    assert dict(zip(frame["source"], frame["caption"], strict=True)) == {
        s: v["caption"] for s, v in expected.items()
    }

    found = rejects_of(out)
    assert {s: r for s, (r, _) in found.items()} == dict.fromkeys(bad, "bad_column")
    messages = {s: m for s, (_, m) in found.items()}
    assert "line 14: column 'score': 'abc' is not float32" in messages["bad0.png"]
    assert "line 15: column 'boxes' at [0][1]: 'x' is not float32" in messages["bad1.png"]
    assert (
        "line 16: column 'meta' at .year: 40000 is out of range for int16" in (messages["bad2.png"])
    )
    assert "line 17: column 'score' is required" in messages["bad3.png"]
    assert "line 18: column 'score': NaN" in messages["bad4.png"]
    assert "line 19: column 'meta': no field 'lens'" in messages["bad5.png"]
    assert "line 20: column 'embedding' at [0]: 1.5e+300 is out of range" in messages["bad6.png"]


@pytest.mark.slow
def test_a_changed_value_is_a_new_version_that_decodes_nothing(tmp_path: Path) -> None:
    expected = write_captioned(tmp_path / "photos")
    config = write_listing_config(tmp_path)
    out = tmp_path / "out"
    first = etl_run(config)
    assert first["packed_new"] == len(expected)
    assert not etl_run(config)["committed"]  # the same values: nothing to commit

    rows = read_csv(tmp_path / "photos" / "list.csv")
    rows[3]["caption"] = "a new caption"
    rows[5]["boxes"] = "[[9, 9, 9, 9]]"
    write_csv(tmp_path / "photos" / "list.csv", rows)
    second = etl_run(config)
    assert second["committed"] and second["version"] == 2
    assert second["packed_new"] == 0 and second["reused"] == len(expected)
    got = stored(out)
    assert got[rows[3]["path"]][1]["caption"] == "a new caption"
    assert got[rows[5]["path"]][1]["boxes"] == [[9.0, 9.0, 9.0, 9.0]]
    diff = etl("diff", str(out), "1", "2", "--json")
    assert diff.returncode == 0, diff.stderr
    changed = {c["source"]: c["columns"] for c in json.loads(diff.stdout)["changed"]}
    assert changed == {rows[3]["path"]: ["caption"], rows[5]["path"]: ["boxes"]}

    # a column added to the config needs no --rebuild and decodes nothing either
    added = COLUMNS_YAML + "  origin_text: {type: string, from: caption}\n"
    third = etl_run(write_listing_config(tmp_path, added))
    assert third["committed"] and third["packed_new"] == 0
    assert got[rows[0]["path"]][1]["caption"] == stored(out)[rows[0]["path"]][1]["origin_text"]
    shown = etl("diff", str(out), "2", "3")
    assert "columns + origin_text" in shown.stdout, shown.stdout

    # and a dataset packed before columns existed takes them the same way
    inspect = etl("inspect", str(out), "--json")
    columns = json.loads(inspect.stdout)["columns"]
    assert columns["origin_text"] == {"type": "string", "values": len(expected)}
    assert columns["boxes"]["type"] == "list<list<float32>>"


@pytest.mark.slow
def test_audit_repair_and_compaction_keep_the_columns(tmp_path: Path) -> None:
    expected = write_captioned(tmp_path / "photos")
    config = write_listing_config(tmp_path)
    out = tmp_path / "out"
    etl_run(config)
    assert etl("audit", str(out)).returncode == 0
    before = {s: row for s, (_, row) in stored(out).items()}

    # a byte of a shard flipped: the repair re-packs it, the values stay
    shard = out / before["img03.png"]["shard"]
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert etl("audit", str(out)).returncode != 0
    repaired = etl("audit", str(out), "--repair", "--config", str(config))
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    after = stored(out)
    for source, row in before.items():
        assert after[source][1]["caption"] == row["caption"] == expected[source]["caption"]
        assert after[source][1]["meta"] == expected[source]["meta"]

    # fewer rows listed, then compacted: the kept samples keep their values
    rows = read_csv(tmp_path / "photos" / "list.csv")
    write_csv(tmp_path / "photos" / "list.csv", rows[:4])
    etl_run(config)
    compacted = etl("compact", str(out), "--min-dead", "0.1", "--grace", "0")
    assert compacted.returncode == 0, compacted.stdout + compacted.stderr
    kept = stored(out)
    assert set(kept) == {r["path"] for r in rows[:4]}
    for source, (pixels, row) in kept.items():
        assert row["boxes"] == expected[source]["boxes"]
        assert np.array_equal(pixels, reference((tmp_path / "photos" / source).read_bytes()))
    assert etl("audit", str(out)).returncode == 0

    # a changed byte in the manifest (a value) is found by the audit
    version = sorted((out / "versions").iterdir())[-1] / "manifest.arrow"
    raw = bytearray(version.read_bytes())
    at = raw.find(b"photo 001")
    assert at > 0
    raw[at] = ord("P")
    version.write_bytes(bytes(raw))
    audit = etl("audit", str(out))
    assert audit.returncode != 0 and "manifest.arrow" in audit.stdout + audit.stderr


@pytest.mark.slow
def test_parquet_listing_and_parquet_tables_carry_their_own_types(tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(4):
        (photos / f"p{i}.png").write_bytes(picture(2 * i + 1))
    listing = pa.table(
        {
            "path": [f"p{i}.png" for i in range(4)],
            "label": ["a", "b", "a", "b"],
            "tags": [["x", "y"], [], None, ["z"]],
            "count": pa.array([1, 2, 3, 4], pa.int64()),
            "weight": ["1.5", "2.5", "heavy", "4"],  # text in a float column: row 2 a reject
        }
    )
    pq.write_table(listing, photos / "list.parquet")
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        "source: {kind: listing, path: photos/list.parquet}\n"
        "stages: [{decode: {}}, {resize: {size: [12, 16]}}]\n"
        "output: {dir: out}\nrun: {backend: threading}\n"
        "columns: {tags: list<string>, count: int8, weight: float64}\n"
    )
    report = etl_run(config)
    assert report["packed_new"] == 0 and report["rejected"] == 4
    messages = {s: m for s, (_, m) in rejects_of(tmp_path / "out").items()}
    assert "row 0: column 'weight': '1.5' is not float64" in messages["p0.png"]  # no parsing

    # the same listing with weight as numbers
    pq.write_table(
        listing.set_column(4, "weight", pa.array([1.5, 2.5, None, 4.0])), photos / "list.parquet"
    )
    report = etl_run(config)
    assert report["packed_new"] == 4 and report["rejected"] == 0
    got = stored(tmp_path / "out")
    assert [got[f"p{i}.png"][1]["tags"] for i in range(4)] == [["x", "y"], [], None, ["z"]]
    assert [got[f"p{i}.png"][1]["weight"] for i in range(4)] == [1.5, 2.5, None, 4.0]

    # a Parquet source: the table's other columns, a value that overflows a reject
    tables = tmp_path / "tables"
    tables.mkdir()
    images = [picture(i) for i in range(5)]
    pq.write_table(
        pa.table(
            {
                "image": pa.array(images, pa.binary()),
                "label": ["a", "b", "a", "b", "a"],
                "caption": [f"caption {i}" for i in range(5)],
                "boxes": [[[1.0, 2.0]], [], [[3.0, 4.0], [5.0, 6.0]], None, [[7.0, 8.0]]],
                "level": pa.array([1, 2, 300, 4, 5], pa.int32()),
            }
        ),
        tables / "t.parquet",
    )
    source = "  kind: parquet\n  path: tables\n  files: ['*.parquet']\n"
    (tmp_path / "p").mkdir()
    path = encoded.write_config(tmp_path / "p", source)
    (tmp_path / "p" / "tables").symlink_to(tables)
    path.write_text(
        path.read_text() + "columns: {caption: string, boxes: list<list<float32>>, level: uint8}\n"
    )
    report = etl_run(path)
    assert report["packed_new"] == 4 and report["rejected"] == 1
    rows = stored(tmp_path / "p" / "out")
    for i in (0, 1, 3, 4):
        pixels, row = rows[f"t.parquet/{i}"]
        assert np.array_equal(pixels, reference(images[i]))
        assert row["caption"] == f"caption {i}" and row["level"] == i + 1
    assert rows["t.parquet/3"][1]["boxes"] is None
    assert (
        "row 2: column 'level': 300 is out of range for uint8"
        in (rejects_of(tmp_path / "p" / "out")["t.parquet/2"][1])
    )


def test_webdataset_json_and_text_members(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    images = {f"s{i}": picture(i) for i in range(5)}
    with tarfile.open(shards / "a.tar", "w") as tar:
        for i, (key, image) in enumerate(images.items()):
            add_member(tar, f"{key}.jpg", image)
            add_member(tar, f"{key}.cls", str(i % 2).encode())
            if i != 1:
                add_member(tar, f"{key}.txt", f"text of {key}".encode())
            record: Any = {"boxes": [[i, i, i + 1, i + 1]], "score": i / 2}
            add_member(tar, f"{key}.json", json.dumps(record if i != 3 else [1]).encode())
    path = encoded.write_config(tmp_path, "  kind: webdataset\n  path: shards\n")
    path.write_text(
        path.read_text()
        + "columns:\n  caption: {type: string, from: .txt}\n  boxes: list<list<int32>>\n"
        + "  score: float64\n"
    )
    report = etl_run(path)
    assert report["packed_new"] == 4 and report["rejected"] == 1
    got = stored(tmp_path / "out")
    for i, (key, image) in enumerate(images.items()):
        if i == 3:
            continue
        pixels, row = got[f"a.tar/{key}"]
        assert np.array_equal(pixels, reference(image))
        assert row["caption"] == (None if i == 1 else f"text of {key}")
        assert row["boxes"] == [[i, i, i + 1, i + 1]] and row["score"] == i / 2
    reason, message = rejects_of(tmp_path / "out")["a.tar/s3"]
    assert reason == "bad_column" and "the .json member: holds a JSON list" in message


def test_python_records_carry_their_keys(tmp_path: Path) -> None:
    (tmp_path / "records.py").write_text(
        "from tests.helpers.encoded import picture\n"
        "def records():\n"
        "    for i in range(5):\n"
        "        score = 'high' if i == 3 else i * 1.5\n"
        "        yield {'id': f'r{i}', 'data': picture(i), 'label': i % 2,\n"
        "               'caption': f'record {i}', 'score': score}\n"
    )
    path = encoded.write_config(tmp_path, "  kind: python\n  function: records:records\n")
    path.write_text(path.read_text() + "columns: {caption: string, score: float32}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "etl", "run", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert proc.returncode == 0, proc.stderr
    got = stored(tmp_path / "out")
    assert {s: (r["caption"], r["score"]) for s, (_, r) in got.items()} == {
        f"r{i}": (f"record {i}", i * 1.5) for i in (0, 1, 2, 4)
    }
    reason, message = rejects_of(tmp_path / "out")["r3"]
    assert reason == "bad_column" and message == "record 3: column 'score': 'high' is not float32"


@pytest.mark.slow
def test_bad_column_configs_are_one_line_errors(tmp_path: Path) -> None:
    write_captioned(tmp_path / "photos", count=2)
    cases = {
        "columns: {caption: strin}": "unknown type 'strin'",
        "columns: {label: string}": "the manifest has a column 'label' already",
        "columns: {'my col': string}": "a column name is letters",
        "columns: {x: 'list<int8'}": "expected '>'",
        "columns: {nowhere: string}": "no column 'nowhere' (columns:)",
    }
    for columns, said in cases.items():
        proc = etl("run", str(write_listing_config(tmp_path, columns + "\n")))
        assert proc.returncode == 2, (columns, proc.stdout, proc.stderr)
        assert said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    folder = tmp_path / "tree"
    (folder / "cats").mkdir(parents=True)
    (folder / "cats" / "a.png").write_bytes(picture(1))
    config = tmp_path / "folder.yaml"
    config.write_text(
        "source: {kind: folder, path: tree}\nstages: [{decode: {}}, {resize: {size: [8, 8]}}]\n"
        "output: {dir: out2}\ncolumns: {caption: string}\n"
    )
    proc = etl("run", str(config))
    assert proc.returncode == 2 and "a folder source carries no per-sample values" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "out2").exists()


@pytest.mark.slow
def test_show_draws_samples_by_their_columns(tmp_path: Path) -> None:
    expected = write_captioned(tmp_path / "photos")
    etl_run(write_listing_config(tmp_path))
    out = tmp_path / "out"
    sheet = tmp_path / "sheet.png"
    args = ["show", str(out), "--where", "score >= 2", "--with", "caption", "-n", "100"]
    proc = etl(*args, "--json", "-o", str(sheet))
    assert proc.returncode == 0, proc.stderr
    cells = json.loads(proc.stdout)["cells"]
    assert {c["source"] for c in cells} == {s for s, v in expected.items() if v["score"] >= 2}
    assert all(c["caption"] == expected[c["source"]]["caption"] for c in cells)
    assert sheet.stat().st_size > 0
    for bad, said in (
        (["--with", "nope"], "no per-sample column ['nope']"),
        (["--where", "nope > 1"], "nope"),
        (["--where", "score > 100"], "no sample of version 1 matches the filters"),
    ):
        proc = etl("show", str(out), *bad, "-o", str(tmp_path / "x.png"))
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_column_named_twice_is_one_line_naming_it(tmp_path: Path) -> None:
    """A CSV header or a table may repeat a name: which one is meant cannot be known, for the
    columns a run always read (path, label) as for declared ones."""
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "a.png").write_bytes(picture(1))
    for header, said in (
        ("path,label,label", "column 'label' appears 2 times"),
        ("path,path,label", "column 'path' appears 2 times"),
        ("path,label,caption,caption", "column 'caption' appears 2 times"),
    ):
        cells = ",".join(["a.png", *["x"] * (header.count(","))])
        (photos / "list.csv").write_text(f"{header}\n{cells}\n")
        proc = etl("run", str(write_listing_config(tmp_path, "columns: {caption: string}\n")))
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    tables = tmp_path / "tables"
    tables.mkdir()
    table = pa.Table.from_arrays(
        [pa.array([picture(1)], pa.binary()), pa.array(["a"]), pa.array(["x"]), pa.array(["y"])],
        names=["image", "label", "caption", "caption"],
    )
    pq.write_table(table, tables / "t.parquet")
    (tmp_path / "p").mkdir()
    path = encoded.write_config(tmp_path / "p", "  kind: parquet\n  path: ../tables\n")
    path.write_text(path.read_text() + "columns: {caption: string}\n")
    proc = etl("run", str(path))
    assert proc.returncode == 2 and "column 'caption' appears 2 times" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_columns_of_a_dataset_packed_into_a_bucket(
    endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`etl run` into object storage publishes the columns; a training node reads them by
    URL, with the values the listing wrote."""
    from loaders import PackedDataset, make_loader
    from tests.helpers.stores import new_bucket, point_at

    point_at(endpoint, monkeypatch, tmp_path / "cache")
    new_bucket(endpoint, "columns")
    expected = write_captioned(tmp_path / "photos", count=6)
    config = write_listing_config(tmp_path)
    config.write_text(config.read_text().replace("dir: out", "dir: s3://columns/ds"))
    proc = subprocess.run(
        [sys.executable, "-m", "etl", "run", str(config), "--json"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    ds = PackedDataset.open("s3://columns/ds", columns=["caption", "boxes"])
    for batch in make_loader(ds, batch_size=4):
        sources = ds.manifest_rows(batch.indices).column("source").to_pylist()
        assert batch.columns["caption"] == [expected[s]["caption"] for s in sources]
        assert batch.columns["boxes"] == [expected[s]["boxes"] for s in sources]
