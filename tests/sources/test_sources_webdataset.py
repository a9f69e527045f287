"""`source: webdataset`: tar shards written by webdataset's own writer and by plain tarfile,
packed end to end; every stored sample is compared with an independent Pillow decode of the
member bytes, and every hostile member is a reject naming shard and key."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

import tests.helpers.encoded as encoded
from etl.config import load_config
from etl.errors import SourceError
from etl.run import pipeline
from tests.helpers.encoded import (
    add_member,
    etl_run,
    picture,
    reference,
    rejects_of,
    stored,
)

MAX_FILE_BYTES = 1 << 20


def write_config(tmp_path: Path, extra: str = "", files: str = '["*.tar"]') -> Path:
    source = f"  kind: webdataset\n  path: shards\n  files: {files}\n"
    return encoded.write_config(tmp_path, f"{source}  max_file_bytes: {MAX_FILE_BYTES}\n{extra}")


def write_shard(path: Path, images: dict[str, bytes], label: bytes = b"1") -> None:
    """A plain tarfile shard: <key>.jpg and <key>.cls per sample."""
    with tarfile.open(path, "w") as tar:
        for key, image in images.items():
            add_member(tar, f"{key}.jpg", image)
            add_member(tar, f"{key}.cls", label)


def test_shards_from_webdatasets_writer_are_packed(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    shards = tmp_path / "shards"
    shards.mkdir()
    members: dict[str, bytes] = {}
    with wds.ShardWriter(str(shards / "train-%03d.tar"), maxcount=4) as sink:
        for i in range(10):
            key = f"sample{i:04d}"
            image = picture(i)
            extension = "png" if i % 2 else "jpg"
            sink.write({"__key__": key, extension: image, "cls": i % 3})
            members[key] = image
    config = load_config(write_config(tmp_path))
    report = pipeline.run(config)
    assert report.packed_new == 10 and report.rejected == 0
    out = config.output.dir
    got = stored(out)
    expected_sources = {
        f"train-{i // 4:03d}.tar/sample{i:04d}": (f"sample{i:04d}", i % 3) for i in range(10)
    }
    assert set(got) == set(expected_sources)
    for source, (key, label) in expected_sources.items():
        pixels, row = got[source]
        assert np.array_equal(pixels, reference(members[key])), source
        assert row["class_name"] == str(label)
        assert row["label"] == label  # integer labels keep their numbers
    # a rerun reads every shard again, finds the same content and packs nothing
    again = pipeline.run(config)
    assert again.packed_new == 0 and not again.committed


def test_labels_from_json_members_and_class_names(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    images = {f"k{i}": picture(i) for i in range(4)}
    with tarfile.open(shards / "a.tar", "w") as tar:
        for i, (key, image) in enumerate(images.items()):
            add_member(tar, f"{key}.jpeg" if i % 2 == 0 else f"{key}.png", image)
            add_member(tar, f"{key}.json", json.dumps({"label": ["cat", "dog"][i % 2]}).encode())
    config = load_config(write_config(tmp_path, "  label_member: json\n  label_field: label"))
    report = pipeline.run(config)
    assert report.packed_new == 4, rejects_of(config.output.dir)
    got = stored(config.output.dir)
    for i, key in enumerate(images):
        pixels, row = got[f"a.tar/{key}"]
        assert np.array_equal(pixels, reference(images[key]))
        assert row["class_name"] == ["cat", "dog"][i % 2]
        assert row["label"] == i % 2  # sorted class names


def test_hostile_members_are_rejects_naming_shard_and_key(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    good = picture(1)
    with tarfile.open(shards / "h.tar", "w") as tar:
        add_member(tar, "ok.jpg", good)
        add_member(tar, "ok.cls", b"2")
        add_member(tar, "../escape.jpg", picture(2))
        add_member(tar, "../escape.cls", b"1")
        add_member(tar, "/abs/olute.jpg", picture(3))
        add_member(tar, "/abs/olute.cls", b"1")
        add_member(tar, "link.jpg", b"", type=tarfile.SYMTYPE, linkname="/etc/passwd")
        add_member(tar, "link.cls", b"1")
        add_member(tar, "hard.jpg", b"", type=tarfile.LNKTYPE, linkname="ok.jpg")
        add_member(tar, "hard.cls", b"1")
        add_member(tar, "dev.jpg", b"", type=tarfile.CHRTYPE)
        add_member(tar, "dev.cls", b"1")
        add_member(tar, "nolabel.png", picture(5))
        add_member(tar, "noimage.txt", b"caption")
        add_member(tar, "noimage.cls", b"1")
        add_member(tar, "badlabel.jpg", picture(6))
        add_member(tar, "badlabel.cls", b"-1")
        add_member(tar, "twice.jpg", picture(7))
        add_member(tar, "twice.cls", b"1")
        add_member(tar, "between.jpg", picture(8))
        add_member(tar, "between.cls", b"1")
        add_member(tar, "twice.jpg", picture(9))  # the key again, not next to its first members
        add_member(tar, "dup.jpg", picture(10))
        add_member(tar, "dup.jpg", picture(11))  # the same member twice in one sample
        add_member(tar, "dup.cls", b"1")
        add_member(tar, "README", b"no extension at all")
        add_member(tar, "notutf8-\udcff.jpg", picture(12))
        add_member(tar, "notutf8-\udcff.cls", b"0")
    # a member far over max_file_bytes, written sparse so the test stays small on disk
    with tarfile.open(shards / "huge.tar", "w") as tar:
        info = tarfile.TarInfo("big.jpg")
        info.size = MAX_FILE_BYTES * 3
        tar.addfile(info, io.BytesIO(bytes(info.size)))
        add_member(tar, "big.cls", b"1")
    config_path = write_config(tmp_path)
    config = load_config(config_path)
    report = etl_run(config_path)
    rejects = rejects_of(config.output.dir)
    got = stored(config.output.dir)
    assert set(got) == {"h.tar/ok", "h.tar/between", "hex:" + b"h.tar/notutf8-\xff".hex()}
    assert np.array_equal(got["h.tar/ok"][0], reference(good))
    assert got["h.tar/ok"][1]["label"] == 2
    reasons = {source: reason for source, (reason, _) in rejects.items()}
    assert reasons == {
        "h.tar/../escape": "outside_root",
        "h.tar//abs/olute": "outside_root",
        "h.tar/link": "not_a_file",
        "h.tar/hard": "not_a_file",
        "h.tar/dev": "not_a_file",
        "h.tar/nolabel": "unknown_label",
        "h.tar/noimage": "no_image",
        "h.tar/badlabel": "unknown_label",
        "h.tar/twice": "duplicate_key",
        "h.tar/dup": "duplicate_key",
        "h.tar/README": "no_image",
        "huge.tar/big": "file_too_large",
    }
    assert report["rejected"] == len(reasons)
    assert not (tmp_path / "etc").exists() and not (tmp_path / "abs").exists()  # nothing extracted


def test_truncated_and_foreign_shards_keep_what_came_before(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    images = [picture(i) for i in range(3)]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for i, image in enumerate(images):
            add_member(tar, f"s{i}.jpg", image)
            add_member(tar, f"s{i}.cls", b"0")
    whole = buffer.getvalue()
    # cut inside the third image: two samples survive
    third = whole.index(b"s2.jpg")  # its header; the data follows in the next 512-byte block
    (shards / "cut.tar").write_bytes(whole[: third + 512 + 100])
    # cut inside a member that is skipped (a caption after the second sample's image)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        add_member(tar, "a.jpg", images[0])
        add_member(tar, "a.cls", b"0")
        add_member(tar, "a.txt", b"x" * 5000)
    skipped = buffer.getvalue()
    (shards / "cut-skipped.tar").write_bytes(skipped[: skipped.index(b"x" * 100) + 1000])
    (shards / "foreign.tar").write_bytes(b"this is not a tar file at all" * 40)
    (shards / "empty.tar").write_bytes(b"")
    os.mkfifo(shards / "fifo.tar")
    config_path = write_config(tmp_path)
    config = load_config(config_path)
    report = etl_run(config_path)
    got = stored(config.output.dir)
    assert set(got) == {"cut.tar/s0", "cut.tar/s1"}
    for i in (0, 1):
        assert np.array_equal(got[f"cut.tar/s{i}"][0], reference(images[i]))
    reasons = {s: r for s, (r, _) in rejects_of(config.output.dir).items()}
    assert reasons == {
        "cut.tar": "truncated",
        "cut.tar/s2": "truncated",
        "cut-skipped.tar": "truncated",
        "cut-skipped.tar/a": "truncated",
        "foreign.tar": "unreadable",
        "empty.tar": "unreadable",
        "fifo.tar": "not_a_file",
    }
    assert report["packed_new"] == 2


def test_a_rewritten_shard_repacks_only_what_changed(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()

    images = {f"k{i}": picture(i * 2) for i in range(5)}
    write_shard(shards / "s.tar", images)
    config = load_config(write_config(tmp_path))
    assert pipeline.run(config).packed_new == 5
    images["k2"] = picture(99)
    del images["k4"]
    images["k9"] = picture(98)
    write_shard(shards / "s.tar", images)
    report = pipeline.run(config)
    assert (report.packed_new, report.reused, report.samples_total) == (2, 3, 5)
    got = stored(config.output.dir)
    assert set(got) == {f"s.tar/{key}" for key in images}
    for source, (pixels, _) in got.items():
        assert np.array_equal(pixels, reference(images[source.split("/", 1)[1]])), source


def test_config_mistakes_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "shards").mkdir()
    config = load_config(write_config(tmp_path, files='["nothing-*.tar"]'))
    with pytest.raises(SourceError, match=r"source.files: 'nothing-\*.tar' matches nothing"):
        pipeline.run(config)
    bad = write_config(tmp_path, files='["../*.tar"]')
    proc = subprocess.run(
        [sys.executable, "-m", "etl", "run", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {bad}:4: source.files: ")
    assert "without '..'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_audit_lists_the_shards_again_and_names_what_changed(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()

    images = {f"k{i}": picture(i * 2) for i in range(4)}
    write_shard(shards / "s.tar", images)
    config_path = write_config(tmp_path)
    assert pipeline.run(load_config(config_path)).packed_new == 4

    def audit(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "etl", "audit", str(tmp_path / "out"), "--json", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    clean = audit("--config", str(config_path))
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["sources"] == {"root": str(shards), "checked": 4}
    images["k1"] = picture(77)
    del images["k3"]
    write_shard(shards / "s.tar", images)
    found = audit("--config", str(config_path))
    assert found.returncode == 1
    findings = {f["source"]: f["kind"] for f in json.loads(found.stdout)["findings"]}
    assert findings == {"s.tar/k1": "source_changed", "s.tar/k3": "source_missing"}
    # the shards moved: --source names the folder they are in now
    shards.rename(tmp_path / "moved")
    moved = audit("--config", str(config_path), "--source", str(tmp_path / "moved"))
    assert {f["source"] for f in json.loads(moved.stdout)["findings"]} == {"s.tar/k1", "s.tar/k3"}
    # without the config, a folder of files is the wrong idea: one line, exit 2
    wrong = audit("--source", str(tmp_path / "moved"))
    assert wrong.returncode == 2 and "pass --config" in wrong.stderr
    assert wrong.stderr.count("\n") == 1


def test_compressed_shards_are_packed_through_the_spool(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    images = {f"k{i}": picture(i) for i in range(4)}
    for suffix, mode in (("tar.gz", "w:gz"), ("tar.xz", "w:xz"), ("tar", "w")):
        with tarfile.open(shards / f"s.{suffix}", mode) as tar:
            for key, image in images.items():
                add_member(tar, f"{key}.png", image)
                add_member(tar, f"{key}.cls", b"3")
    config = load_config(write_config(tmp_path, files='["*.tar*"]'))
    assert pipeline.run(config).packed_new == 12
    got = stored(config.output.dir)
    for suffix in ("tar.gz", "tar.xz", "tar"):
        for key, image in images.items():
            pixels, row = got[f"s.{suffix}/{key}"]
            assert np.array_equal(pixels, reference(image)) and row["label"] == 3
