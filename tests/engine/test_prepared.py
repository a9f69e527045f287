"""Samples the hash phase decoded, kept for the pack phase (`etl.engine.prepared`): written
whole, read back as written, and used only where their content hash is the one the plan
recorded; a damaged one is never stored, the object is read again instead."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import fsspec
import numpy as np
import pytest
from PIL import Image

from etl.config import load_config
from etl.engine.fill import fill_shard, fill_spec, prepare_kept
from etl.engine.prepared import Prepared, prepared_path, take_prepared, write_prepared
from etl.format.shards import ShardWriter
from etl.images.rejects import Reject
from etl.sources.kept import kept_path

URL = "memory://photos-bucket/cat/a.png"


def png(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((12, 10, 3), value, np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture
def config(tmp_path: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "pipeline.yaml").write_text(
        "source: {kind: folder, path: 'memory://photos-bucket'}\n"
        "stages: [decode: {}, resize: {size: [4, 4], mode: stretch}]\n"
        "output: {dir: out, checksum: sha256}\n"
    )
    return load_config(tmp_path / "pipeline.yaml")


@pytest.mark.parametrize(
    "outcome",
    [
        Prepared(np.arange(48, dtype=np.uint8).reshape(4, 4, 3), (4, 4, 3), "raw", 12, 10),
        Prepared(np.frombuffer(b"\xff\xd8jpeg", np.uint8), (4, 4, 3), "jpeg", 12, 10),
        Reject("corrupt", 'a message with "quotes"\nand a newline'),
    ],
)
def test_what_is_written_is_read_back_once(outcome: Prepared | Reject, tmp_path: Path) -> None:
    path = tmp_path / "x.sample"
    write_prepared(path, "abc", outcome)
    content_hash, back = take_prepared(path)  # type: ignore[misc]
    assert content_hash == "abc" and not path.exists()
    if isinstance(outcome, Reject):
        assert isinstance(back, Reject)
        assert (back.reason, back.message) == (outcome.reason, outcome.message)
    else:
        assert isinstance(back, Prepared)
        assert back.stored.tobytes() == outcome.stored.tobytes()
        assert back.stored.shape == outcome.stored.shape
        assert (back.shape, back.codec, back.height, back.width) == (
            outcome.shape, outcome.codec, outcome.height, outcome.width,
        )  # fmt: skip
    assert take_prepared(path) is None


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:10],  # the header cut short
        lambda data: data[:-1],  # a byte of the pixels missing
        lambda data: data + b"x",  # a byte too many
        lambda data: b"not json\n" + data,
        lambda data: data.replace(b'"stored_shape"', b'"stored_shap"'),
        lambda data: b"",
    ],
)
def test_a_damaged_kept_sample_is_not_one(damage, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "x.sample"
    write_prepared(path, "abc", Prepared(np.zeros((4, 4, 3), np.uint8), (4, 4, 3), "raw", 4, 4))
    path.write_bytes(damage(path.read_bytes()))
    assert take_prepared(path) is None


def fill(config, keep: Path, content_hash: str, root: Path):  # type: ignore[no-untyped-def]
    """What `fill_shard` made of the one source at URL: its outcome, and the shard (a stored
    sample) read back with numpy."""
    root.mkdir(exist_ok=True)
    spec, sources = fill_spec(config), [("cat/a.png", URL, content_hash)]
    with ShardWriter(root, "shard.npy", 1, config.stored_shape, config.output.checksum) as writer:
        (outcome,) = fill_shard(writer, spec, sources, "changed", keep)
        writer.finish()
    shard = np.load(root / "shard.npy") if (root / "shard.npy").exists() else None
    return outcome, shard


def test_a_kept_sample_is_stored_only_under_the_plans_hash(config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The hash phase decodes a kept object (`prepare_kept`); the pack phase stores that sample
    where the plan's hash is the one it was made under, and otherwise reads the object again
    (here: not in the store, so a reject, never the kept sample)."""
    keep = tmp_path / "objects"
    keep.mkdir()
    data = png(200)
    content_hash = hashlib.sha256(data).hexdigest()
    kept_path(keep, URL).write_bytes(data)
    prepare_kept(keep, URL, content_hash, fill_spec(config), {})
    assert not kept_path(keep, URL).exists(), "the sample stands for the object"
    assert prepared_path(kept_path(keep, URL)).is_file()
    expected = np.asarray(Image.open(io.BytesIO(data)).resize((4, 4), Image.Resampling.BILINEAR))

    assert not fsspec.filesystem("memory").exists(URL), "the store never had it"
    other_hash = hashlib.sha256(b"other bytes").hexdigest()
    outcome, _ = fill(config, keep, other_hash, tmp_path / "a")
    assert isinstance(outcome, Reject) and outcome.reason == "io_error", outcome

    prepare_kept(keep, URL, content_hash, fill_spec(config), {})  # nothing kept: nothing made
    kept_path(keep, URL).write_bytes(data)
    prepare_kept(keep, URL, content_hash, fill_spec(config), {})
    outcome, shard = fill(config, keep, content_hash, tmp_path / "b")
    assert outcome.height == 12 and outcome.width == 10
    assert np.array_equal(shard[0], expected)
    assert not prepared_path(kept_path(keep, URL)).exists(), "taken once"


def test_a_kept_object_that_is_not_an_image_is_kept_as_its_reject(config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    keep = tmp_path / "objects"
    keep.mkdir()
    data = png(7)[:30]
    content_hash = hashlib.sha256(data).hexdigest()
    kept_path(keep, URL).write_bytes(data)
    prepare_kept(keep, URL, content_hash, fill_spec(config), {})
    outcome, _ = fill(config, keep, content_hash, tmp_path / "out")
    assert isinstance(outcome, Reject) and outcome.reason in {"truncated", "corrupt", "unreadable"}
