"""The reduced JPEG decode (`draft:`, #60) against the exact one: packing rate and quality, on
the benchmark photos and on 12 MP camera photos, in one run.

    python -m benchmarks.pack.draft [--photos 300] [--camera 40] [--rounds 3] [--size 224]

Two photo sets: the benchmark photos (`benchmarks.photos`, 300-640 px JPEGs) and 12 MP photos
made from them (`benchmarks.photos.camera_photo`: upscaled to 4032x3024 with Lanczos, luma and
chroma noise added at full resolution, re-encoded at quality 92, 3-5 MB each). Each set is
packed by `etl run` to `--size` (center crop) with `draft: false` (the exact full decode) and
with the default (decoded at 1/2, 1/4 or 1/8 scale where that keeps at least twice the output:
`etl.format.codecs.dct_factor`), in interleaved rounds, timed as whole commands and by their
pack phase (`--json`: the decode and resize, without the interpreter's start). Then the two
packs are compared sample by sample (matched by `sample_id`, read with numpy): PSNR over all
pixels, the lowest PSNR of a sample, the largest pixel difference, and the share of samples
that differ at all. No result is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.ipc as ipc

from benchmarks.common import cpu_model
from benchmarks.photos import make_camera_photos, make_photos


def pack(folder: Path, photos: Path, draft: str, size: int) -> tuple[float, float]:
    """(seconds of one fresh `etl run` of `photos`, seconds of its pack phase) (draft: "false"
    or "default")."""
    subprocess.run(["rm", "-rf", str(folder)], check=True)
    folder.mkdir(parents=True)
    key = ", draft: false" if draft == "false" else ""
    config = folder / "pipeline.yaml"
    config.write_text(
        f"source: {{kind: folder, path: {json.dumps(str(photos))}}}\n"
        f"stages: [decode: {{}}, resize: {{size: [{size}, {size}]{key}}}]\n"
        f"output: {{dir: {json.dumps(str(folder / 'out'))}, shard_size: 64MiB}}\n"
    )
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "etl", "run", str(config), "--json"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    return seconds, float(json.loads(done.stdout)["phases"]["pack"])


def samples(out: Path) -> dict[str, np.ndarray]:
    """Every sample of a fixed-size pack by sample_id, read with pyarrow and numpy."""
    with ipc.open_file(out / "versions" / "v000001" / "manifest.arrow") as f:
        rows = f.read_all().select(["sample_id", "shard", "row"]).to_pylist()
    shards = {name: np.load(out / name, mmap_mode="r") for name in {r["shard"] for r in rows}}
    return {r["sample_id"]: np.asarray(shards[r["shard"]][r["row"]]) for r in rows}


def quality(exact: Path, reduced: Path) -> dict[str, float]:
    a, b = samples(exact), samples(reduced)
    assert a.keys() == b.keys(), "both packs hold the same samples"
    errors = []
    worst, differ, total = 0, 0, 0.0
    for key in a:
        diff = a[key].astype(np.int16) - b[key]
        worst = max(worst, int(np.abs(diff).max()))
        differ += bool(diff.any())
        mse = float(np.mean(diff.astype(np.float64) ** 2))
        total += mse
        errors.append(mse)
    mean = total / len(a)

    def psnr(mse: float) -> float:
        return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)

    return {
        "psnr": psnr(mean), "min_psnr": psnr(max(errors)), "max_diff": worst,
        "differ": differ / len(a),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=300)
    parser.add_argument("--camera", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "etl-memmap"
    sets = {
        f"{args.photos} benchmark photos (300-640 px)": (
            cache / f"bench-photos-{args.photos}",
            args.photos,
        ),
        f"{args.camera} camera photos (12 MP)": (
            cache / f"camera-photos-{args.camera}",
            args.camera,
        ),
    }
    make_photos(sets[next(iter(sets))][0], args.photos)
    make_camera_photos(sets[list(sets)[1]][0], args.camera)
    results: dict[str, Any] = {"cpu": cpu_model(), "cores": os.cpu_count(), "sets": {}}
    with tempfile.TemporaryDirectory(prefix="bench-draft-") as tmp:
        for name, (photos, n) in sets.items():
            times: dict[str, list[tuple[float, float]]] = {"false": [], "default": []}
            for r in range(args.rounds):
                for draft in ("false", "default") if r % 2 == 0 else ("default", "false"):
                    times[draft].append(pack(Path(tmp) / draft, photos, draft, args.size))
            pairs = list(zip(times["false"], times["default"], strict=True))
            results["sets"][name] = {
                "exact_photos_per_s": n / statistics.median(t for t, _ in times["false"]),
                "reduced_photos_per_s": n / statistics.median(t for t, _ in times["default"]),
                "reduced_of_exact": statistics.median(e[0] / d[0] for e, d in pairs),
                "pack_phase_of_exact": statistics.median(e[1] / d[1] for e, d in pairs),
                **quality(Path(tmp) / "false" / "out", Path(tmp) / "default" / "out"),
            }
    print(f"{results['cpu']}, {results['cores']} cores; to {args.size}x{args.size}, center crop")
    print("| photos | exact photos/s | reduced photos/s | reduced of exact (command; pack "
          "phase) | PSNR | lowest PSNR | max diff | samples that differ |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in results["sets"].items():
        print(
            f"| {name} | {r['exact_photos_per_s']:.1f} | {r['reduced_photos_per_s']:.1f} | "
            f"{r['reduced_of_exact']:.2f}x; {r['pack_phase_of_exact']:.2f}x | "
            f"{r['psnr']:.1f} dB | {r['min_psnr']:.1f} dB | {r['max_diff']} | {r['differ']:.0%} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
