"""The reduced JPEG decode as the default (#60), end to end: a new dataset packs with it and says
so; a dataset packed before keeps packing the way it was packed (exact, or drafted by the rule
of its day), never a mix of two decodes in one version, never a rebuild nobody asked for; and
`draft: false` is the exact decode, one key away.

Oracles: Pillow's own JPEG draft (`Image.draft`, which keeps the request it is given) and
`ImageOps.fit`, written here apart from `etl.images`; plain pyarrow and numpy reads."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from PIL import Image, ImageOps

from tests.helpers.cli import cli
from tests.helpers.packed import rewrite_sealed

pytestmark = pytest.mark.timeout(180)
SIZE = (24, 24)


def write_photos(folder: Path, count: int, seed: int, start: int = 0) -> None:
    """Smooth 400x300 and 300x400 JPEGs: to 24x24 a reduction of 12.5x, where every decode
    differs: a gap of 2 decodes at 1/4, the old rule (never below the output) at 1/8."""
    rng = np.random.default_rng(seed)
    for i in range(start, start + count):
        height, width = (400, 300) if i % 2 else (300, 400)
        y, x = np.mgrid[0:height, 0:width].astype(np.float64)
        phase = rng.uniform(0, 6.28, 3)
        pixels = np.stack(
            [127 + 100 * np.sin(x / (17 + 5 * c) + y / (29 + c) + phase[c]) for c in range(3)], -1
        )
        pixels += rng.normal(0, 5, pixels.shape)
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        (folder / ("a" if i % 3 else "b")).mkdir(parents=True, exist_ok=True)
        image.save(folder / ("a" if i % 3 else "b") / f"{i:03d}.jpg", quality=90)


def write_config(folder: Path, draft: str | None) -> Path:
    key = "" if draft is None else f", draft: {draft}"
    path = folder / "pipeline.yaml"
    path.write_text(
        "source: {kind: folder, path: images}\n"
        f"stages: [decode: {{}}, resize: {{size: [{SIZE[0]}, {SIZE[1]}]{key}}}]\n"
        "output: {dir: out, samples_per_shard: 4}\nrun: {n_jobs: 2}\n"
    )
    return path


def run(config: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code, _, err = cli(["run", str(config), "--quiet", *extra], capsys)
    return code, err


def manifest(out: Path, version: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    table = ipc.open_file(out / "versions" / f"v{version:06d}" / "manifest.arrow").read_all()
    metadata = {k.decode(): json.loads(v) for k, v in (table.schema.metadata or {}).items()}
    return metadata, table.to_pylist()


def pixels(out: Path, row: dict[str, Any]) -> np.ndarray:
    return np.asarray(np.load(out / row["shard"], mmap_mode="r")[row["row"]], np.float64)


def oracle(path: Path, gap: float | None) -> np.ndarray:
    """Pillow's decode of a JPEG, drafted so it keeps `gap` times what a 24x24 centre crop needs
    (None: in full), then `ImageOps.fit` to 24x24 bilinear."""
    with Image.open(path) as image:
        if gap is not None:
            scale = max(SIZE[1] / image.width, SIZE[0] / image.height)
            need = (math.ceil(image.width * scale), math.ceil(image.height * scale))
            gapped = (min(s, math.ceil(gap * n)) for s, n in zip(image.size, need, strict=True))
            image.draft("RGB", tuple(gapped))
        fitted = ImageOps.fit(image.convert("RGB"), (SIZE[1], SIZE[0]), Image.Resampling.BILINEAR)
        return np.asarray(fitted, np.float64)


def closest(got: np.ndarray, path: Path) -> float | None:
    """Which decode `got` came from: the gap (1 or 2, or None: in full) whose oracle it is
    nearest; they differ, so a sample tells its decode."""
    candidates = {gap: np.abs(got - oracle(path, gap)).mean() for gap in (None, 1.0, 2.0)}
    best = sorted(candidates.values())
    assert best[0] < best[1] / 2, f"{path.name}: the decodes do not tell apart: {candidates}"
    return min(candidates, key=lambda gap: candidates[gap])


def test_a_new_dataset_packs_with_the_reduced_decode_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No `draft:` in a new dataset's config: every sample is the reduced decode (keeping twice
    the output), the manifest records it (resize draft true, `samples.decode.reducing_gap` 2),
    and `etl inspect` shows it; `draft: false` is the exact decode, one key away."""
    write_photos(tmp_path / "images", 8, seed=1)
    config = write_config(tmp_path, None)
    assert run(config, capsys)[0] == 0
    meta, rows = manifest(tmp_path / "out", 1)
    resize = next(s for s in meta["etl.config"]["stages"] if s["kind"] == "resize")
    assert resize["draft"] is True
    assert meta["etl.config"]["samples"] == {"decode": {"reducing_gap": 2.0}}
    for row in rows:
        assert closest(pixels(tmp_path / "out", row), tmp_path / "images" / row["source"]) == 2.0
    code, text, _ = cli(["inspect", str(tmp_path / "out")], capsys)
    assert code == 0 and "decode: JPEG at 1/2-1/8 scale where it keeps 2.0x the output" in text

    exact = tmp_path / "exact"
    shutil.copytree(tmp_path / "images", exact / "images")
    assert run(write_config(exact, "false"), capsys)[0] == 0
    meta, rows = manifest(exact / "out", 1)
    assert "samples" not in meta["etl.config"]
    for row in rows:
        assert closest(pixels(exact / "out", row), exact / "images" / row["source"]) is None


def test_a_dataset_packed_exact_before_keeps_packing_exact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dataset packed when the exact decode was the default (its record: draft false, no
    decode section), rerun with the same pipeline.yaml (no `draft:` key): no refusal, no
    rebuild, the digest unchanged, and the new photos decoded exact like the old ones."""
    write_photos(tmp_path / "images", 6, seed=2)
    config = write_config(tmp_path, "false")  # what the former default recorded, byte for byte
    assert run(config, capsys)[0] == 0
    write_config(tmp_path, None)  # the user's file never named it
    write_photos(tmp_path / "images", 4, seed=3, start=6)
    code, err = run(config, capsys)
    assert code == 0, err
    first, _ = manifest(tmp_path / "out", 1)
    meta, rows = manifest(tmp_path / "out", 2)
    assert meta["etl.config_digest"] == first["etl.config_digest"]
    assert len(rows) == 10
    for row in rows:
        assert closest(pixels(tmp_path / "out", row), tmp_path / "images" / row["source"]) is None
    code, err = run(write_config(tmp_path, "true"), capsys)  # explicit: output-shaping
    assert code != 0 and "stages" in err and "--rebuild" in err


def test_a_dataset_drafted_by_the_old_rule_keeps_that_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dataset packed with `draft: true` before the gap (its record: draft true, no decode
    section; the old rule decoded down to the output size), rerun with its config: no
    refusal, the digest unchanged, and the new photos decoded by the old rule, so the version
    never mixes two decodes. `--rebuild` then moves it to the new rule."""
    write_photos(tmp_path / "images", 6, seed=4)
    config = write_config(tmp_path, "true")
    assert run(config, capsys)[0] == 0
    _age_to_the_old_rule(tmp_path / "out")
    write_photos(tmp_path / "images", 6, seed=5, start=6)
    code, err = run(config, capsys)
    assert code == 0, err
    first, _ = manifest(tmp_path / "out", 1)
    meta, rows = manifest(tmp_path / "out", 2)
    assert meta["etl.config_digest"] == first["etl.config_digest"]
    assert "samples" not in meta["etl.config"]
    new = [r for r in rows if r["shard"].startswith("shards/v000002-")]
    assert new
    for row in new:
        assert closest(pixels(tmp_path / "out", row), tmp_path / "images" / row["source"]) == 1.0
    assert run(config, capsys, "--rebuild")[0] == 0
    meta, rows = manifest(tmp_path / "out", 3)
    assert meta["etl.config"]["samples"] == {"decode": {"reducing_gap": 2.0}}


def _age_to_the_old_rule(out: Path) -> None:
    """Make version 1 what the code before the gap wrote for `draft: true`: its pixels decoded
    by the old rule, its record without the decode section, the digest of that record."""
    from etl.config import load_config

    path = out / "versions" / "v000001" / "manifest.arrow"
    table = ipc.open_file(path).read_all()
    metadata = dict(table.schema.metadata or {})
    recorded = json.loads(metadata[b"etl.config"])
    del recorded["samples"]
    canonical = json.dumps(recorded, sort_keys=True, separators=(",", ":"))
    import hashlib

    metadata[b"etl.config"] = json.dumps(recorded).encode()
    metadata[b"etl.config_digest"] = json.dumps(
        hashlib.sha256(canonical.encode()).hexdigest()[:16]
    ).encode()
    config = load_config(out.parent / "pipeline.yaml")
    old = config.resolved(recorded)
    assert old.reducing_gap == 1.0 and old.digest() == json.loads(metadata[b"etl.config_digest"])
    rewrite_sealed(
        path, pa.Table.from_batches(table.to_batches(), table.schema.with_metadata(metadata))
    )
