"""`source: parquet`: tables of encoded images written by pyarrow and by Hugging Face `datasets`
(Image and ClassLabel features), as Parquet, Arrow IPC files and Arrow IPC streams, packed end
to end; every stored sample is compared with an independent Pillow decode of the row's bytes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

import tests.helpers.encoded as encoded
from etl.config import load_config
from etl.errors import SourceError
from etl.run import pipeline
from tests.helpers.encoded import etl_run, picture, reasons, reference, stored


def write_config(tmp_path: Path, extra: str = "", files: str = '["*.parquet"]') -> Path:
    return encoded.write_config(
        tmp_path, f"  kind: parquet\n  path: tables\n  files: {files}\n{extra}"
    )


@pytest.fixture
def tables(tmp_path: Path) -> Path:
    folder = tmp_path / "tables"
    folder.mkdir()
    return folder


def test_a_pyarrow_table_with_ids_labels_and_splits(tmp_path: Path, tables: Path) -> None:
    images = [picture(i) for i in range(7)]
    table = pa.table(
        {
            "id": [f"img-{i}" for i in range(7)],
            "image": pa.array(images, pa.binary()),
            "label": ["cat", "dog", "cat", "bird", "dog", "cat", "bird"],
            "split": ["train", "test", None, "train", "test", "train", "train"],
            "caption": ["not read"] * 7,
        }
    )
    pq.write_table(table, tables / "part-0.parquet", row_group_size=3)
    extra = "  id_column: id\n  split_column: split"
    config = load_config(write_config(tmp_path, extra))
    report = pipeline.run(config)
    assert report.packed_new == 7 and report.rejected == 0
    got = stored(config.output.dir)
    assert set(got) == {f"part-0.parquet/img-{i}" for i in range(7)}
    classes = sorted({"cat", "dog", "bird"})
    for i in range(7):
        pixels, row = got[f"part-0.parquet/img-{i}"]
        assert np.array_equal(pixels, reference(images[i]))
        assert row["class_name"] == table["label"][i].as_py()
        assert row["label"] == classes.index(row["class_name"])
        if table["split"][i].as_py() is not None:
            assert row["split"] == table["split"][i].as_py()
    assert not pipeline.run(config).committed  # a rerun finds every row unchanged


def test_arrow_ipc_files_and_streams_and_row_numbers(tmp_path: Path, tables: Path) -> None:
    images = [picture(i) for i in range(6)]
    table = pa.table({"image": pa.array(images, pa.large_binary()), "label": [0, 1, 2, 0, 1, 2]})
    with ipc.new_file(str(tables / "a.arrow"), table.schema) as writer:
        writer.write_table(table.slice(0, 3), max_chunksize=2)
    with ipc.new_stream(str(tables / "b.arrow"), table.schema) as writer:
        writer.write_table(table.slice(3), max_chunksize=2)
    config = load_config(write_config(tmp_path, files='["*.arrow"]'))
    assert pipeline.run(config).packed_new == 6
    got = stored(config.output.dir)
    for i in range(6):
        source = f"{'a' if i < 3 else 'b'}.arrow/{i % 3}"  # the row number in its file
        pixels, row = got[source]
        assert np.array_equal(pixels, reference(images[i]))
        assert row["label"] == i % 3  # integer labels keep their numbers


def test_hugging_face_datasets_image_and_classlabel(
    tmp_path: Path, tables: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    datasets = pytest.importorskip("datasets")
    names = ["airplane", "zebra", "cat"]  # not sorted: the feature's order is the label order
    images = [picture(i) for i in range(6)]
    labels = [2, 0, 1, 1, 0, 2]
    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=names)}
    )
    dataset = datasets.Dataset.from_dict(
        {"img": [{"bytes": b, "path": None} for b in images], "label": labels},
        features=features,
    )
    dataset.to_parquet(str(tables / "train-00000-of-00001.parquet"))
    dataset.save_to_disk(str(tables / "saved"))
    extra = "  image_column: img"
    files = '["*.parquet", "saved/*.arrow"]'
    config = load_config(write_config(tmp_path, extra, files))
    report = pipeline.run(config)
    assert report.packed_new == 12  # no validate stage: duplicates are allowed
    got = stored(config.output.dir)
    saved = sorted(s for s in got if s.startswith("saved/"))
    assert len(saved) == 6 and len(got) == 12
    for i in range(6):
        for source in (f"train-00000-of-00001.parquet/{i}", saved[i]):
            pixels, row = got[source]
            assert np.array_equal(pixels, reference(images[i]))
            assert row["class_name"] == names[labels[i]]
            assert row["label"] == labels[i]  # the Hub's numbers, not sorted names


def test_bad_rows_are_rejects_naming_file_and_row(tmp_path: Path, tables: Path) -> None:
    good = picture(1)
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    rows = [
        ("ok", {"bytes": good, "path": None}, 1),
        ("null-image", None, 1),
        ("path-only", {"bytes": None, "path": "elsewhere/x.jpg"}, 1),
        ("garbage", {"bytes": b"not an image", "path": None}, 1),
        ("no-label", {"bytes": picture(2), "path": None}, None),
        ("minus-one", {"bytes": picture(3), "path": None}, -1),
        ("too-big-label", {"bytes": picture(4), "path": None}, 7),
        ("twice", {"bytes": picture(5), "path": None}, 0),
        ("twice", {"bytes": picture(6), "path": None}, 0),
        ("", {"bytes": picture(8), "path": None}, 0),
    ]
    table = pa.table(
        {
            "id": [r[0] for r in rows],
            "image": pa.array([r[1] for r in rows], image_type),
            "label": pa.array([r[2] for r in rows], pa.int64()),
        }
    )
    schema = table.schema.with_metadata(
        {
            b"huggingface": (
                b'{"info": {"features": {"image": {"_type": "Image"}, "label": '
                b'{"names": ["a", "b"], "_type": "ClassLabel"}}}}'
            )
        }
    )
    pq.write_table(table.cast(schema), tables / "t.parquet")
    (tables / "broken.parquet").write_bytes(b"PAR1 this is no parquet file PAR1")
    whole = (tables / "t.parquet").read_bytes()
    (tables / "cut.parquet").write_bytes(whole[: len(whole) // 2])
    os.mkfifo(tables / "fifo.parquet")
    config_path = write_config(tmp_path, "  id_column: id")
    config = load_config(config_path)
    report = etl_run(config_path)
    got = stored(config.output.dir)
    assert set(got) == {"t.parquet/ok"}
    assert np.array_equal(got["t.parquet/ok"][0], reference(good))
    assert got["t.parquet/ok"][1]["class_name"] == "b"
    assert reasons(config.output.dir) == {
        "t.parquet/null-image": "no_image",
        "t.parquet/path-only": "no_image",
        "t.parquet/garbage": "unreadable",
        "t.parquet/no-label": "unknown_label",
        "t.parquet/minus-one": "unknown_label",
        "t.parquet/too-big-label": "unknown_label",
        "t.parquet/twice": "duplicate_key",
        "t.parquet/row 9": "bad_row",
        "broken.parquet": "unreadable",
        "cut.parquet": "unreadable",
        "fifo.parquet": "not_a_file",
    }
    assert report["rejected"] == 11


def test_a_missing_column_is_a_one_line_error(tmp_path: Path, tables: Path) -> None:
    pq.write_table(pa.table({"picture": [picture(1)], "label": [0]}), tables / "x.parquet")
    config = load_config(write_config(tmp_path))
    with pytest.raises(SourceError, match=r"x.parquet: no column 'image' \(source.image_column\)"):
        pipeline.run(config)
    proc = subprocess.run(
        [sys.executable, "-m", "etl", "run", str(tmp_path / "pipeline.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "no column 'image'" in proc.stderr
    assert not (tmp_path / "out" / "versions").exists()


def test_a_changed_row_is_repacked_and_the_rest_reused(tmp_path: Path, tables: Path) -> None:
    images = [picture(i) for i in range(5)]
    pq.write_table(pa.table({"image": images, "label": ["a"] * 5}), tables / "t.parquet")
    config = load_config(write_config(tmp_path))
    assert pipeline.run(config).packed_new == 5
    images[3] = picture(50)
    pq.write_table(pa.table({"image": images, "label": ["a"] * 5}), tables / "t.parquet")
    report = pipeline.run(config)
    assert (report.packed_new, report.reused) == (1, 4)
    got = stored(config.output.dir)
    assert set(got) == {f"t.parquet/{i}" for i in range(5)}
    for i in range(5):
        assert np.array_equal(got[f"t.parquet/{i}"][0], reference(images[i]))


def test_audit_compares_each_row_with_the_table_now(tmp_path: Path, tables: Path) -> None:
    from etl.maintenance.audit import AuditOptions, audit

    images = [picture(i) for i in range(4)]
    table = pa.table({"id": ["a", "b", "c", "d"], "image": images, "label": [0, 1, 0, 1]})
    pq.write_table(table, tables / "t.parquet")
    config = load_config(write_config(tmp_path, "  id_column: id"))
    pipeline.run(config)
    options = AuditOptions(records=config.source)
    assert audit(config.output.dir, options).clean
    images[2] = picture(40)
    changed = pa.table({"id": ["a", "c", "d"], "image": [images[i] for i in (0, 2, 3)]})
    labels = pa.array([0, 0, None], pa.int64())  # d lost its label
    pq.write_table(changed.append_column("label", labels), tables / "t.parquet")
    report = audit(config.output.dir, options)
    assert report.sources_checked == 4
    found = {f.source: (f.kind, f.message) for f in report.findings}
    assert found == {
        "t.parquet/b": ("source_missing", "no longer in the source"),
        "t.parquet/c": ("source_changed", "content changed since it was packed"),
        "t.parquet/d": ("source_missing", found["t.parquet/d"][1]),
    }
    assert found["t.parquet/d"][1].startswith("now rejected (unknown_label: ")


def test_files_by_split_give_their_records_that_split(tmp_path: Path, tables: Path) -> None:
    images = [picture(i) for i in range(6)]
    for name, rows in (("train-0", (0, 1, 2)), ("train-1", (3,)), ("test-0", (4, 5))):
        table = pa.table({"image": [images[i] for i in rows], "label": [i % 2 for i in rows]})
        pq.write_table(table, tables / f"{name}.parquet")
    files = '{train: ["train-*.parquet"], test: ["test-*.parquet"]}'
    config = load_config(write_config(tmp_path, files=files))
    assert pipeline.run(config).packed_new == 6
    splits = {source: row["split"] for source, (_, row) in stored(config.output.dir).items()}
    assert splits == {
        "train-0.parquet/0": "train",
        "train-0.parquet/1": "train",
        "train-0.parquet/2": "train",
        "train-1.parquet/0": "train",
        "test-0.parquet/0": "test",
        "test-0.parquet/1": "test",
    }
    both = load_config(write_config(tmp_path, files='{train: ["*.parquet"], test: ["test-*"]}'))
    with pytest.raises(SourceError, match=r"'test-0.parquet' is in splits 'train' and 'test'"):
        pipeline.run(both)


def test_an_id_twice_far_apart_in_a_table_is_a_duplicate_of_that_table(
    tmp_path: Path, tables: Path
) -> None:
    """Ids are checked on the sorted listing, not in a set of every id: two rows of one table
    with one id (150 rows and two read batches apart) become one `duplicate_key` reject naming
    the table, whose message comes from a plain pyarrow read of the rejects; the same id in
    another table is another sample."""
    count = 200
    ids = [f"img-{i:03d}" for i in range(count)]
    ids[153] = "img-003"
    images = [picture(i % 5) for i in range(count)]
    pq.write_table(
        pa.table({"id": ids, "image": pa.array(images, pa.binary()), "label": ["a"] * count}),
        tables / "big.parquet",
    )
    pq.write_table(
        pa.table({"id": ["img-003"], "image": pa.array([picture(9)], pa.binary()), "label": ["b"]}),
        tables / "other.parquet",
    )
    config_path = write_config(tmp_path, "  id_column: id")
    report = etl_run(config_path)
    out = load_config(config_path).output.dir
    assert reasons(out) == {"big.parquet/img-003": "duplicate_key"}
    got = stored(out)
    assert len(got) == count - 2 + 1 and "other.parquet/img-003" in got
    assert np.array_equal(got["other.parquet/img-003"][0], reference(picture(9)))
    [reject] = encoded.latest(out, "rejects")
    assert reject["message"] == "the id appears more than once in big.parquet"
    assert report["rejected"] == 1
