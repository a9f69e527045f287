"""Samples stored encoded (`output.codec`, #58): bytes on disk, pack rate, and the loader's
decode rate against a bare decode loop, raw beside JPEG and zlib, in one run.

    python -m benchmarks.formats.encoded [--photos 1000] [--rounds 3] [--json FILE]

The photos are `benchmarks.photos` (crops of scikit-image's bundled photographs, 300-640 px
JPEGs). Each codec packs them with `etl run` twice over, at a fixed 224x224 (center_crop) and
with the aspect kept (shorter 256, longer 512), in interleaved rounds so a noisy neighbour slows
every variant alike:

- **bytes**: the shard bytes of each pack, as a fraction of the raw pack's (goal for JPEG q90:
  at most 1/6 of raw);
- **pack rate**: photos/s of the whole `etl run` command (interpreter start included), and JPEG's
  and zlib's as a fraction of raw's (goal: JPEG at least 0.9x);
- **crop**: samples/s of a whole epoch of the aspect-kept packs cropped to 224 in the workers
  (`PackedDataset.with_crop(RandomResizedCrop(224))`), raw and JPEG, 0 and 2 workers, beside a
  bare loop of decode + crop + uint8 resize over the same JPEG bytes in one process (goal:
  a worker core at least 0.9x of it);
- **store**: the 224 raw and JPEG packs in moto's S3 server (127.0.0.1), a cold epoch each
  (empty cache; whole shards, or ranged GETs of the rows): bytes moved from the store and
  samples/s (goal: JPEG at most a sixth of raw's bytes);
- **read**: samples/s of a whole epoch of the fixed-size packs through `make_loader` (batches of
  256, shuffled, page-cached) with 0 workers and with 2, beside a **bare loop** over the same
  stored JPEG bytes in one process (`simplejpeg.decode_jpeg` of each into a preallocated batch:
  the decode limit of one core). A worker's decode rate is compared with it per core.

`--gpu` (on a CUDA machine, inside `benchmarks/gpu_check.sh`) reads an aspect-kept JPEG pack
onto the GPU five ways instead: decoded and cropped on the GPU (`DeviceLoader(decode="device")`,
torchvision's nvJPEG) with 8 and 2 workers gathering the stored bytes, the same with
nvImageCodec's (`decoder="nvimgcodec"`, where installed), decoded in the workers
and cropped on the GPU, and decoded and cropped in the workers (`with_crop`); samples/s and the
peak GPU memory of each of 3 epochs (flat, or the decoder leaks).

No result is asserted: the README records the figures with the machine and the date.
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
from benchmarks.photos import make_photos

CODECS = ("raw", "jpeg", "zlib")
RESIZES = {
    "224 fixed": "{size: [224, 224], mode: center_crop}",
    "aspect 256/512": "{mode: keep_aspect, shorter: 256, longer: 512}",
}


def write_config(folder: Path, photos: Path, codec: str, resize: str) -> Path:
    path = folder / "pipeline.yaml"
    path.write_text(
        f"source: {{kind: folder, path: {json.dumps(str(photos))}}}\n"
        f"stages: [decode: {{}}, resize: {resize}]\n"
        f"output: {{dir: {json.dumps(str(folder / 'out'))}, shard_size: 64MiB, codec: {codec}}}\n"
    )
    return path


def pack(folder: Path, photos: Path, codec: str, resize: str) -> tuple[float, int]:
    """(seconds of the whole `etl run` command, shard bytes) of one fresh pack."""
    if (folder / "out").exists():
        subprocess.run(["rm", "-rf", str(folder / "out")], check=True)
    folder.mkdir(parents=True, exist_ok=True)
    config = write_config(folder, photos, codec, resize)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "etl", "run", str(config), "--quiet"], check=True)
    seconds = time.perf_counter() - start
    shards = sum(p.stat().st_size for p in (folder / "out" / "shards").glob("*.npy"))
    return seconds, shards


def epoch_rate(out: Path, workers: int) -> float:
    """Samples/s of one shuffled epoch through `make_loader` (after a warm-up epoch)."""
    from loaders import PackedDataset, make_loader

    ds = PackedDataset.open(out)
    loader = make_loader(
        ds, batch_size=256, shuffle=True, num_workers=workers, pin_memory=False,
        persistent_workers=workers > 0,
    )  # fmt: skip
    for _ in loader:  # warm-up: page cache, workers, verify="once" hashes each row once
        pass
    start = time.perf_counter()
    count = sum(len(batch[1]) for batch in loader)
    return count / (time.perf_counter() - start)


def crop_rate(out: Path, workers: int) -> float:
    """Samples/s of one epoch of 224 `RandomResizedCrop`s made in the workers
    (`PackedDataset.with_crop`), after a warm-up epoch."""
    from loaders import PackedDataset, RandomResizedCrop, make_loader

    ds = PackedDataset.open(out).with_crop(RandomResizedCrop(224, seed=0))
    loader = make_loader(
        ds, batch_size=256, shuffle=True, num_workers=workers, pin_memory=False,
        persistent_workers=workers > 0,
    )  # fmt: skip
    for _ in loader:  # warm-up: page cache, workers, each row checked once
        pass
    loader.set_epoch(1)
    start = time.perf_counter()
    count = sum(len(batch[1]) for batch in loader)
    return count / (time.perf_counter() - start)


def bare_crop_rate(out: Path) -> float:
    """Samples/s of a bare loop over an aspect-kept JPEG pack's stored bytes, in this process:
    simplejpeg decode, a random box (torchvision's rule), crop, uint8 bilinear resize to 224
    into a preallocated batch: the least a worker must do per sample."""
    import simplejpeg
    import torch
    import torch.nn.functional as F

    from loaders.augment.draws import crop_boxes

    torch.set_num_threads(1)
    blobs = _stored_jpegs(out)
    boxes = crop_boxes(0, 0, np.arange(len(blobs)), 256, 256)
    batch = torch.empty((256, 3, 224, 224), dtype=torch.uint8)
    start = time.perf_counter()
    for i, blob in enumerate(blobs):
        image = torch.from_numpy(simplejpeg.decode_jpeg(blob, "RGB")).permute(2, 0, 1)[None]
        top, left, h, w = (int(v) for v in boxes[i])
        region = image[:, :, top : top + h, left : left + w]
        batch[i % 256] = F.interpolate(region, (224, 224), mode="bilinear", align_corners=False)[0]
    return len(blobs) / (time.perf_counter() - start)


def _stored_jpegs(out: Path) -> list[bytes]:
    with ipc.open_file(out / "versions" / "v000001" / "manifest.arrow") as f:
        rows = f.read_all().select(["shard", "sample_offset", "sample_bytes"]).to_pylist()
    shards = {name: np.load(out / name, mmap_mode="r") for name in {r["shard"] for r in rows}}
    return [
        bytes(shards[r["shard"]][r["sample_offset"] : r["sample_offset"] + r["sample_bytes"]])
        for r in rows
    ]


def bare_rate(out: Path) -> float:
    """Samples/s of simplejpeg decoding every stored JPEG of a fixed-size pack into a
    preallocated batch, in this process: the decode limit of one core."""
    import simplejpeg

    blobs = _stored_jpegs(out)
    batch = np.empty((256, 224, 224, 3), np.uint8)
    start = time.perf_counter()
    for i, blob in enumerate(blobs):
        simplejpeg.decode_jpeg(blob, "RGB", buffer=batch[i % 256])
    return len(blobs) / (time.perf_counter() - start)


def store_epochs(packs: dict[str, Path], rounds: int) -> dict[str, dict[str, float]]:
    """Each 224 pack uploaded to moto's S3 server (its own process, 127.0.0.1), then a cold
    epoch of each (an empty cache; whole shards fetched, or `ranged` GETs of the rows): bytes
    the epoch moved from the store, samples/s, median of `rounds`."""
    import fsspec

    from benchmarks.load.from_store import create_bucket, free_port, options, start_server
    from etl.storage.location import StoreOptions
    from loaders import PackedDataset, make_loader

    port = free_port()
    server = start_server(port)
    found: dict[str, dict[str, list[float]]] = {}
    try:
        create_bucket(port, "bench")
        fs = fsspec.filesystem("s3", **options(port))
        for codec, out in packs.items():
            fs.put(str(out), f"bench/{codec}", recursive=True)
        with tempfile.TemporaryDirectory(prefix="bench-encoded-cache-") as tmp:
            for r in range(rounds):
                for codec in packs:
                    for ranged in (False, True):
                        cache = Path(tmp) / f"{codec}-{ranged}-{r}"
                        store = StoreOptions(cache_dir=cache, storage_options=options(port),
                                             ranged=ranged)  # fmt: skip
                        start = time.perf_counter()
                        ds = PackedDataset.open(f"s3://bench/{codec}", store=store)
                        loader = make_loader(ds, batch_size=256, shuffle=True, pin_memory=False)
                        count = sum(len(batch[1]) for batch in loader)
                        seconds = time.perf_counter() - start
                        moved = _moved(ds, cache, ranged)
                        key = f"{codec}, {'ranged GETs' if ranged else 'whole shards'}"
                        row = found.setdefault(key, {"rate": [], "bytes": []})
                        row["rate"].append(count / seconds)
                        row["bytes"].append(moved)
    finally:
        server.kill()
        server.wait()
    return {k: {m: statistics.median(v) for m, v in row.items()} for k, row in found.items()}


def _moved(ds: Any, cache: Path, ranged: bool) -> float:
    """Bytes an epoch took from the store: the shard files in the cache, or with ranged GETs
    each sample's stored bytes (one GET each), plus the version's files either way."""
    version = sum(p.stat().st_size for p in cache.rglob("*.arrow"))
    if not ranged:
        return float(version + sum(p.stat().st_size for p in cache.rglob("*.npy")))
    sel = ds.selection
    if sel.stored is not None:
        rows = int(sel.stored[:, 0].sum())
    else:
        rows = len(sel) * int(np.prod(sel.sample_shape))
    return float(version + rows)


def _pack_rounds(work: Path, photos: Path, count: int, rounds: int) -> list[dict[str, Any]]:
    """Each resize and codec packed once a round (the order rotated): shard bytes and pack
    rate, each against raw's of the same samples."""
    times: dict[str, list[float]] = {}
    sizes: dict[str, int] = {}
    for r in range(rounds):
        order = [(n, c) for n in RESIZES for c in CODECS]
        order = order[r % len(order) :] + order[: r % len(order)]  # rotate each round
        for name, codec in order:
            key = f"{name} {codec}"
            seconds, shard_bytes = pack(
                work / key.replace(" ", "-").replace("/", "-"), photos, codec, RESIZES[name]
            )
            times.setdefault(key, []).append(seconds)
            sizes[key] = shard_bytes
    table = []
    for name in RESIZES:
        raw_key = f"{name} raw"
        for codec in CODECS:
            key = f"{name} {codec}"
            ratios = [t_raw / t for t_raw, t in zip(times[raw_key], times[key], strict=True)]
            table.append({
                "samples": name, "codec": codec,
                "bytes": sizes[key], "of_raw": sizes[key] / sizes[raw_key],
                "pack_photos_per_s": count / statistics.median(times[key]),
                "pack_rate_of_raw": statistics.median(ratios),
            })  # fmt: skip
    return table


def _read_rounds(fixed: dict[str, Path], rounds: int) -> dict[str, Any]:
    """Epochs of the fixed-size datasets, each codec with 0 and 2 workers, against a bare
    simplejpeg loop: medians, and medians of the per-round ratios."""
    reads = []
    for _ in range(rounds):
        row = {"bare simplejpeg loop, 1 process": bare_rate(fixed["jpeg"])}
        for codec in CODECS:
            for workers in (0, 2):
                row[f"{codec}, {workers} workers"] = epoch_rate(fixed[codec], workers)
        reads.append(row)
    return {
        "read": {k: statistics.median(r[k] for r in reads) for k in reads[0]},
        "read_of_bare": {
            k: statistics.median(r[k] / r["bare simplejpeg loop, 1 process"] for r in reads)
            for k in reads[0]
        },
    }


def _crop_rounds(aspect: dict[str, Path], rounds: int) -> dict[str, Any]:
    """Epochs of random crops of the aspect-kept datasets, against a bare loop that decodes,
    crops and resizes each photo: medians, and medians of the per-round ratios."""
    bare = "bare loop: decode + crop + resize, 1 process"
    crops = []
    for _ in range(rounds):
        row = {bare: bare_crop_rate(aspect["jpeg"])}
        for codec in ("raw", "jpeg"):
            for workers in (0, 2):
                row[f"{codec}, {workers} workers"] = crop_rate(aspect[codec], workers)
        crops.append(row)
    return {
        "crop": {k: statistics.median(r[k] for r in crops) for k in crops[0]},
        "crop_of_bare": {k: statistics.median(r[k] / r[bare] for r in crops) for k in crops[0]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gpu", action="store_true", help="only the GPU table (needs CUDA)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "etl-memmap"
    photos = cache / f"bench-photos-{args.photos}"
    make_photos(photos, args.photos)
    if args.gpu:
        from benchmarks.gpu.encoded_epochs import gpu_main

        with tempfile.TemporaryDirectory(prefix="bench-encoded-gpu-") as tmp:
            table = gpu_main(photos, args.photos, Path(tmp))  # benchmarks/gpu/encoded_epochs.py
        if args.json:
            args.json.write_text(json.dumps(table, indent=2))
        return
    results: dict[str, Any] = {"photos": args.photos, "cpu": cpu_model(), "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="bench-encoded-") as tmp:
        work = Path(tmp)
        results["pack"] = _pack_rounds(work, photos, args.photos, args.rounds)
        fixed = {c: work / f"224-fixed-{c}" / "out" for c in CODECS}
        results.update(_read_rounds(fixed, args.rounds))
        results["store"] = store_epochs({c: fixed[c] for c in ("raw", "jpeg")}, args.rounds)
        aspect = {c: work / f"aspect-256-512-{c}" / "out" for c in ("raw", "jpeg")}
        results.update(_crop_rounds(aspect, args.rounds))
    print_tables(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def print_tables(results: dict[str, Any]) -> None:
    print(f"{results['photos']} photos, {results['cpu']}, {results['cores']} cores")
    print("| samples | codec | shard bytes | of raw | pack photos/s | pack rate of raw |")
    print("|---|---|---:|---:|---:|---:|")
    for r in results["pack"]:
        print(
            f"| {r['samples']} | {r['codec']} | {r['bytes'] / 2**20:.1f} MiB | "
            f"{r['of_raw']:.1%} | {r['pack_photos_per_s']:.0f} | {r['pack_rate_of_raw']:.2f}x |"
        )
    print("\n| 224 fixed, one epoch | samples/s | of the bare loop |")
    print("|---|---:|---:|")
    for name, rate in results["read"].items():
        print(f"| {name} | {rate:,.0f} | {results['read_of_bare'][name]:.2f}x |")
    print(
        "\n| 224 fixed, a cold epoch from moto (127.0.0.1) | bytes moved | of raw's | samples/s |"
    )
    print("|---|---:|---:|---:|")
    store = results["store"]
    for name, row in store.items():
        raw = store[name.replace("jpeg", "raw")]["bytes"]
        print(f"| {name} | {row['bytes'] / 2**20:.1f} MiB | {row['bytes'] / raw:.1%} | "
              f"{row['rate']:,.0f} |")  # fmt: skip
    print(
        "\n| aspect 256/512, 224 RandomResizedCrop in the workers | samples/s | of the bare loop |"
    )
    print("|---|---:|---:|")
    for name, rate in results["crop"].items():
        print(f"| {name} | {rate:,.0f} | {results['crop_of_bare'][name]:.2f}x |")


if __name__ == "__main__":
    main()
