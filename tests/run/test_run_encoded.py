"""Samples stored encoded (`output.codec`, format version 3), end to end as a user meets them:
`etl run`, a stranger's read of the format (pyarrow, numpy, Pillow; docs/FORMAT.md), `etl audit`
and its repair, compaction, incremental reruns, and a raw pack that stays what it was.

Oracles: Pillow's own decode of the source, resized as the stage says; a raw pack of the same
photos (zlib is exact, so its pixels must equal the raw pack's byte for byte)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from etl.config import load_config
from etl.maintenance.housekeeping import compact
from tests.helpers.cli import cli
from tests.helpers.codecs import pixels_of, read_plainly, stored_of, write_config, write_photos

pytestmark = pytest.mark.timeout(180)


def _pack(folder: Path, codec: str, capsys: pytest.CaptureFixture[str], **options: str) -> Path:
    if not (folder / "images").exists():
        write_photos(folder / "images")
    config = write_config(folder, codec, **options)
    code, _, err = cli(["run", str(config), "--quiet"], capsys)
    assert code == 0, err
    return folder / "out"


def _by_source(rows: list[dict]) -> dict[str, dict]:
    return {r["source"]: r for r in rows}


def test_jpeg_pack_reads_with_numpy_and_pillow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stranger's read: each sample's bytes from the flat shard with numpy are a JPEG that
    Pillow decodes to the stored size, within JPEG q90's error of the raw pack of the same
    photos (PSNR above 30 dB); the manifest says format 3, the codec,
    each sample's bytes; and the samples take under a fifth of their raw bytes."""
    write_photos(tmp_path / "images")
    shutil.copytree(tmp_path / "images", tmp_path / "raw" / "images")
    raw_out = _pack(tmp_path / "raw", "raw", capsys)
    out = _pack(tmp_path, "jpeg", capsys)
    meta, rows = read_plainly(out)
    assert json.loads(meta[b"etl.format_version"]) == 3
    assert json.loads(meta[b"etl.codec"]) == {"kind": "jpeg", "quality": 90, "min_ratio": 1.0}
    assert json.loads(meta[b"etl.sample_shape"]) == [32, 40, 3]
    assert len(rows) == 12
    raw_by = _by_source(read_plainly(raw_out)[1])
    stored = raw = 0
    for row in rows:
        assert row["sample_codec"] == "jpeg"
        assert stored_of(out, row)[:2] == b"\xff\xd8"
        pixels = pixels_of(out, row)
        assert pixels.shape == (32, 40, 3)
        twin = raw_by[row["source"]]
        expected = np.load(raw_out / twin["shard"], mmap_mode="r")[twin["row"]]
        error = np.mean((pixels.astype(np.float64) - expected) ** 2)
        assert 10 * np.log10(255**2 / error) > 30  # PSNR, dB: q90 at 4:2:0 on busy 32x40
        stored += row["sample_bytes"]
        raw += 32 * 40 * 3
    assert stored < raw / 2  # ~600 bytes of each is JPEG headers at 32x40; ratios: benchmarks
    code, text, _ = cli(["inspect", str(out)], capsys)
    assert code == 0 and "codec jpeg q90: 12 jpeg" in text


@pytest.mark.parametrize("resize", ["size: [32, 40]", "mode: keep_aspect, shorter: 24, longer: 40"])
def test_zlib_is_exact_against_a_raw_pack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], resize: str
) -> None:
    """zlib over raw rows is lossless: every sample decoded (plain zlib, no code of ours) is
    byte for byte the raw pack's, at a fixed size and with the aspect kept; the raw pack is
    format 1 or 2 with no codec columns, exactly as before codecs existed."""
    write_photos(tmp_path / "images")
    (tmp_path / "raw").mkdir()
    shutil.copytree(tmp_path / "images", tmp_path / "raw" / "images")
    raw_out = _pack(tmp_path / "raw", "raw", capsys, resize=resize)
    out = _pack(tmp_path, "zlib", capsys, resize=resize)
    raw_meta, raw_rows = read_plainly(raw_out)
    meta, rows = read_plainly(out)
    assert b"etl.codec" not in raw_meta and "sample_codec" not in raw_rows[0]
    assert json.loads(raw_meta[b"etl.format_version"]) == (2 if "keep_aspect" in resize else 1)
    assert json.loads(meta[b"etl.format_version"]) == 3
    raw_by = _by_source(raw_rows)
    for row in rows:
        twin = raw_by[row["source"]]
        data = np.load(raw_out / twin["shard"], mmap_mode="r")
        if twin.get("sample_offset") is None:
            expected = np.asarray(data[twin["row"]])
        else:
            h, w = twin["sample_height"], twin["sample_width"]
            expected = data[twin["sample_offset"] : twin["sample_offset"] + h * w * 3].reshape(
                h, w, 3
            )
        assert row["sample_codec"] in ("zlib", "raw")
        np.testing.assert_array_equal(pixels_of(out, row), expected)
        assert row["checksum"] != twin["checksum"] or row["sample_codec"] == "raw"


FORMAT_1_COLUMNS = [
    "sample_id", "source", "source_size", "source_mtime_ns", "source_ctime_ns", "source_inode",
    "source_hash", "source_height", "source_width", "label", "class_name", "split", "shard",
    "row", "checksum",
]  # fmt: skip


def test_raw_config_keeps_its_digest_and_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`codec: raw` (the default) shapes nothing new: the digest of a config without the key,
    with it, and the digest recorded by the format 1 fixture packed before codecs existed agree
    with what they were; the packs are byte for byte the same files."""
    write_photos(tmp_path / "a" / "images")
    shutil.copytree(tmp_path / "a" / "images", tmp_path / "b" / "images")
    plain = tmp_path / "a" / "pipeline.yaml"
    plain.write_text(
        "source: {kind: folder, path: images}\nstages: [decode: {}, resize: {size: [32, 40]}]\n"
        "output: {dir: out, samples_per_shard: 5}\nrun: {n_jobs: 2}\n"
    )
    explicit = write_config(tmp_path / "b", "raw")
    assert load_config(plain).digest() == load_config(explicit).digest()
    assert "codec" not in load_config(plain).output_shaping().get("samples", {})
    for config in (plain, explicit):
        assert cli(["run", str(config), "--quiet"], capsys)[0] == 0
    a, b = tmp_path / "a" / "out", tmp_path / "b" / "out"
    for shard in sorted((a / "shards").iterdir()):
        assert shard.read_bytes() == (b / "shards" / shard.name).read_bytes()
    meta_a, rows_a = read_plainly(a)
    meta_b, rows_b = read_plainly(b)
    stat = {"source_mtime_ns", "source_ctime_ns", "source_inode"}  # two copies of the photos
    assert [{k: v for k, v in r.items() if k not in stat} for r in rows_a] == [
        {k: v for k, v in r.items() if k not in stat} for r in rows_b
    ]
    assert list(rows_a[0]) == FORMAT_1_COLUMNS  # docs/FORMAT.md's table before codecs existed
    assert meta_a[b"etl.config_digest"] == meta_b[b"etl.config_digest"]
    assert b"etl.codec" not in meta_a and json.loads(meta_a[b"etl.format_version"]) == 1


def test_audit_names_a_changed_byte_and_repair_restores_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A byte flipped inside one JPEG sample: `etl audit` names that sample (checksums cover
    the stored bytes); `--repair` encodes it again from its source, and the repaired version
    decodes (with Pillow) to what the sample held before."""
    out = _pack(tmp_path, "jpeg", capsys)
    _, rows = read_plainly(out)
    victim = rows[3]
    before = pixels_of(out, victim)
    path = out / victim["shard"]
    data = bytearray(path.read_bytes())
    data[128 + victim["sample_offset"] + victim["sample_bytes"] // 2] ^= 0x40
    path.write_bytes(bytes(data))
    code, text, _ = cli(["audit", str(out), "--json"], capsys)
    assert code != 0
    report = json.loads(text)
    bad = {f["sample_id"] for f in report["findings"] if f["kind"].startswith("sample_")}
    assert bad == {victim["sample_id"]}
    config = tmp_path / "pipeline.yaml"
    code, _, err = cli(["audit", str(out), "--repair", "--config", str(config), "--quiet"], capsys)
    assert code == 0, err
    assert cli(["audit", str(out), "--quiet"], capsys)[0] == 0
    _, repaired = read_plainly(out, 2)
    after = _by_source(repaired)[victim["source"]]
    assert after["sample_codec"] == "jpeg" and after["shard"] != victim["shard"]
    np.testing.assert_array_equal(pixels_of(out, after), before)
    for row in repaired:  # every other sample of the damaged shard was copied, still decodes
        assert pixels_of(out, row).shape == (32, 40, 3)


def test_incremental_rerun_reuses_encoded_rows_and_codec_change_needs_rebuild(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Adding photos packs only them (the old rows and shards are kept as they were); changing
    the codec is output-shaping: one line naming `output.codec`... and `--rebuild` repacks."""
    out = _pack(tmp_path, "jpeg", capsys)
    _, first = read_plainly(out)
    write_photos(tmp_path / "more", count=4, seed=9)
    for path in (tmp_path / "more").rglob("*.png"):
        target = tmp_path / "images" / path.parent.name / f"new-{path.name}"
        shutil.copy(path, target)
    config = tmp_path / "pipeline.yaml"
    code, _, err = cli(["run", str(config), "--quiet"], capsys)
    assert code == 0, err
    _, second = read_plainly(out, 2)
    assert len(second) == 16
    kept = _by_source(second)
    for row in first:
        assert kept[row["source"]] == row  # same shard, row, offset, bytes, checksum
    write_config(tmp_path, "{kind: jpeg, quality: 70}")
    code, _, err = cli(["run", str(config), "--quiet"], capsys)
    assert code != 0 and "samples.codec.quality" in err and "--rebuild" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = cli(["run", str(config), "--quiet", "--rebuild"], capsys)
    assert code == 0, err
    _, third = read_plainly(out, 3)
    assert sum(r["sample_bytes"] for r in third) < sum(r["sample_bytes"] for r in second)


def test_min_ratio_stores_raw_where_encoding_does_not_pay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`min_ratio: 1000` (no JPEG is that small): every sample is stored raw in a format 3
    dataset, each row saying so, its bytes its pixels; the loaders read it as they read any."""
    out = _pack(tmp_path, "{kind: jpeg, min_ratio: 1000}", capsys)
    _, rows = read_plainly(out)
    assert {r["sample_codec"] for r in rows} == {"raw"}
    assert {r["sample_bytes"] for r in rows} == {32 * 40 * 3}
    from loaders import PackedDataset

    dataset = PackedDataset.open(out)
    order = dataset.manifest_rows(range(len(dataset))).column("source").to_pylist()
    by = _by_source(rows)
    for i, source in enumerate(order):
        np.testing.assert_array_equal(dataset[i][0].numpy(), pixels_of(out, by[source]))


def test_compaction_copies_encoded_bytes_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Removing photos, then compacting: the live samples move to new shards with their
    encoded bytes and checksums unchanged, and the audit is clean."""
    out = _pack(tmp_path, "jpeg", capsys)
    _, first = read_plainly(out)
    bytes_before = {row["source"]: stored_of(out, row) for row in first}
    for path in sorted((tmp_path / "images").rglob("*.png"))[:8]:
        path.unlink()
    assert cli(["run", str(tmp_path / "pipeline.yaml"), "--quiet"], capsys)[0] == 0
    report = compact(out, keep_last=1, min_dead_fraction=0.1, grace=0)
    assert report.new_version is not None and report.rewritten_shards
    _, rows = read_plainly(out, report.new_version)
    before = _by_source(first)
    assert len(rows) == 4
    assert any(row["shard"] != before[row["source"]]["shard"] for row in rows)
    for row in rows:
        old = before[row["source"]]
        assert stored_of(out, row) == bytes_before[row["source"]]
        assert row["checksum"] == old["checksum"] and row["sample_bytes"] == old["sample_bytes"]
    assert cli(["audit", str(out), "--quiet"], capsys)[0] == 0


def test_codec_config_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad codec settings: one line naming the key, exit code 2, no traceback."""
    write_photos(tmp_path / "images", count=2)
    cases = {
        "webp": "output.codec.kind",
        "{kind: zlib, quality: 80}": "quality is for kind jpeg",
        "{kind: jpeg, quality: 101}": "output.codec.quality",
        "{kind: jpeg, min_ratio: 0.5}": "output.codec.min_ratio",
        "raw, layout: CHW, checksum: xxh3_64": None,
        "jpeg, layout: CHW": "use layout: HWC",
    }
    for codec, expected in cases.items():
        config = write_config(tmp_path, codec)
        code, _, err = cli(["run", str(config), "--dry-run", "--quiet"], capsys)
        if expected is None:
            assert code == 0, err
            continue
        assert code == 2 and expected in err, (codec, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
