"""`codec: {kind: jpeg, original: true}` (#58): a JPEG source that needs no resize is stored as
its own bytes, its metadata gone, wherever those decode to exactly the validated pixels; every
other source is encoded again. Checked end to end with Pillow, pyarrow and numpy reads of the
output (tests/helpers/codecs.py) against Pillow reads of the sources."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from etl.config import load_config
from tests.helpers.cli import cli
from tests.helpers.codecs import read_plainly, stored_of

SIZE = (32, 40)  # height, width: every source but `big` is already this size when upright


def photo(height: int, width: int, seed: int) -> Image.Image:
    """Smooth colour with grain: a photo-like image JPEG keeps well."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([120 + 90 * np.sin(x / (5 + c) + y / (7 + c)) for c in range(3)], -1)
    return Image.fromarray(np.clip(base + rng.normal(0, 3, base.shape), 0, 255).astype(np.uint8))


def jpeg(image: Image.Image, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=85, **options)
    return buffer.getvalue()


def scan_of(data: bytes) -> bytes:
    """A JPEG's entropy-coded data: from its first scan header to its end-of-image marker."""
    start = data.index(b"\xff\xda")
    return data[start : data.index(b"\xff\xd9", start) + 2]


def write_sources(folder: Path) -> dict[str, bytes]:
    exif = Image.Exif()
    exif[0x010F] = "SecretCam"  # Make
    exif[0x0112] = 1  # upright
    rotated = Image.Exif()
    rotated[0x0112] = 6  # shown turned 90 degrees clockwise: stored 40 high, 32 wide
    sources = {
        "plain.jpg": jpeg(photo(*SIZE, 1), exif=exif, comment="private comment") + b"TRAILER",
        "chroma444.jpg": jpeg(photo(*SIZE, 2), subsampling=0),
        "rotated.jpg": jpeg(photo(40, 32, 3), exif=rotated),
        "big.jpg": jpeg(photo(64, 80, 4)),
        "cmyk.jpg": jpeg(photo(*SIZE, 5).convert("CMYK")),
        "progressive.jpg": jpeg(photo(*SIZE, 6), progressive=True),
    }
    for name, data in sources.items():
        (folder / "images" / "all").mkdir(parents=True, exist_ok=True)
        (folder / "images" / "all" / name).write_bytes(data)
    return sources


def write_config(folder: Path, codec: str, name: str = "pipeline.yaml") -> Path:
    """pipeline.yaml of the sources in `folder`, resized to SIZE and stored with `codec`."""
    path = folder / name
    path.write_text(
        "source: {kind: folder, path: images}\n"
        f"stages: [decode: {{}}, resize: {{size: [{SIZE[0]}, {SIZE[1]}]}}]\n"
        f"output: {{dir: out, codec: {codec}}}\n"
    )
    return path


def pack(folder: Path, codec: str, capsys: pytest.CaptureFixture[str]) -> dict[str, bytes]:
    """Each source's stored bytes, by file name, after `etl run` with `codec`."""
    code, _, err = cli(["run", str(write_config(folder, codec)), "--quiet"], capsys)
    assert code == 0, err
    _, rows = read_plainly(folder / "out")
    assert {row["sample_codec"] for row in rows} == {"jpeg"}
    return {Path(row["source"]).name: stored_of(folder / "out", row) for row in rows}


def pillow(data: bytes) -> np.ndarray:
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    return np.asarray(ImageOps.fit(image, (SIZE[1], SIZE[0]), Image.Resampling.BILINEAR))


@pytest.mark.timeout(120)
def test_a_source_of_the_right_size_is_stored_as_its_own_bytes_without_its_metadata(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sources = write_sources(tmp_path)
    stored = pack(tmp_path, "{kind: jpeg, original: true}", capsys)
    for name in ("plain.jpg", "chroma444.jpg"):
        assert scan_of(sources[name]) in stored[name], f"{name}: its scan was encoded again"
        assert np.array_equal(
            np.asarray(Image.open(io.BytesIO(stored[name]))), pillow(sources[name])
        )
    leaked = [
        part
        for part in (b"SecretCam", b"private comment", b"TRAILER", b"Exif")
        if part in stored["plain.jpg"]
    ]
    assert not leaked, leaked
    assert len(stored["plain.jpg"]) < len(sources["plain.jpg"])
    # rotated by EXIF, resized, CMYK, progressive: encoded again, close to what Pillow makes
    for name in ("rotated.jpg", "big.jpg", "cmyk.jpg", "progressive.jpg"):
        assert scan_of(sources[name]) not in stored[name], name
        decoded = np.asarray(Image.open(io.BytesIO(stored[name]))).astype(int)
        assert decoded.shape == (*SIZE, 3), name
        assert np.abs(decoded - pillow(sources[name])).mean() < 8, name  # JPEG q90, 4:2:0


@pytest.mark.timeout(120)
def test_without_the_key_every_source_is_encoded_again_and_the_digest_is_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sources = write_sources(tmp_path)
    stored = pack(tmp_path, "jpeg", capsys)
    assert all(scan_of(sources[name]) not in stored[name] for name in sources)
    digests = {
        codec: load_config(write_config(tmp_path, codec, "digest.yaml")).digest()
        for codec in ("jpeg", "{kind: jpeg, original: false}", "{kind: jpeg, original: true}")
    }
    assert digests["jpeg"] == digests["{kind: jpeg, original: false}"]
    assert digests["jpeg"] != digests["{kind: jpeg, original: true}"]


@pytest.mark.timeout(120)
def test_a_source_within_keep_aspects_sides_is_stored_as_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Samples that keep their aspect ratio: a source already within `shorter` and `longer`
    (no upscale) needs no resize and is stored as its own scan; a larger one is encoded again
    at its new size."""
    small, large = jpeg(photo(30, 50, 7)), jpeg(photo(90, 120, 8))
    (tmp_path / "images" / "all").mkdir(parents=True)
    (tmp_path / "images" / "all" / "small.jpg").write_bytes(small)
    (tmp_path / "images" / "all" / "large.jpg").write_bytes(large)
    (tmp_path / "pipeline.yaml").write_text(
        "source: {kind: folder, path: images}\n"
        "stages: [decode: {}, resize: {mode: keep_aspect, shorter: 32, longer: 64}]\n"
        "output: {dir: out, codec: {kind: jpeg, original: true}}\n"
    )
    code, _, err = cli(["run", str(tmp_path / "pipeline.yaml"), "--quiet"], capsys)
    assert code == 0, err
    _, rows = read_plainly(tmp_path / "out")
    stored = {Path(r["source"]).name: (r, stored_of(tmp_path / "out", r)) for r in rows}
    row, data = stored["small.jpg"]
    assert (row["sample_height"], row["sample_width"]) == (30, 50) and scan_of(small) in data
    row, data = stored["large.jpg"]
    assert (row["sample_height"], row["sample_width"]) == (32, 43) and scan_of(large) not in data
    assert Image.open(io.BytesIO(data)).size == (43, 32)


def test_original_is_for_jpeg_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "images").mkdir()
    (tmp_path / "pipeline.yaml").write_text(
        "source: {kind: folder, path: images}\n"
        "stages: [decode: {}, resize: {size: [32, 40]}]\n"
        "output: {dir: out, codec: {kind: zlib, original: true}}\n"
    )
    code, _, err = cli(["run", str(tmp_path / "pipeline.yaml")], capsys)
    assert code != 0 and "original is for kind jpeg" in err and "Traceback" not in err
