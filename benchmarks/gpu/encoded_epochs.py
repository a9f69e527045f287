"""`formats.encoded --gpu`: an aspect-kept JPEG pack read onto the GPU four ways (decoded on the
device by torchvision's nvJPEG or nvImageCodec, or in the workers; cropped on the device or in
the workers), each epoch's samples/s and peak GPU memory. Needs CUDA."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.formats.encoded import RESIZES, pack


def gpu_epochs(
    out: Path, decode: str, workers: int, crop_in_workers: bool, decoder: str | None = None
) -> dict[str, Any]:
    """Samples/s and peak GPU memory of 3 epochs of 224 `RandomResizedCrop`s onto the GPU
    (the first a warm-up): decoded in the workers or on the device (by `decoder`), or cropped
    in the workers."""
    import torch

    from loaders import DeviceLoader, PackedDataset, RandomResizedCrop, make_loader

    crop = RandomResizedCrop(224, seed=0)
    ds = PackedDataset.open(out)
    if crop_in_workers:
        ds = ds.with_crop(crop)
    loader = make_loader(
        ds, batch_size=256, shuffle=True, num_workers=workers, persistent_workers=workers > 0,
        with_indices=True,
    )  # fmt: skip
    device = DeviceLoader(
        loader, dtype=torch.float32, augment=None if crop_in_workers else crop, decode=decode,
        decoder=decoder,
    )  # fmt: skip
    rates, peaks = [], []
    for epoch in range(3):
        loader.set_epoch(epoch)
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        start = time.perf_counter()
        count = 0
        for batch in device:
            count += len(batch[1])
        torch.cuda.synchronize()
        rates.append(count / (time.perf_counter() - start))
        peaks.append(torch.cuda.max_memory_allocated() / 2**20)
    return {"samples_per_s": statistics.median(rates[1:]), "peak_mib": peaks,
            "decoder": device.decoder_name or "workers"}  # fmt: skip


def gpu_main(photos: Path, n: int, work: Path) -> dict[str, Any]:
    """The GPU table: one aspect-kept JPEG pack read four ways onto the GPU."""
    import torch

    folder = work / "gpu-jpeg"
    pack(folder, photos, "jpeg", RESIZES["aspect 256/512"])
    cores = os.cpu_count() or 2
    workers = max(2, min(8, cores // 2))
    runs: dict[str, tuple[Any, ...]] = {
        f"decode + crop on the GPU, {workers} workers gather": ("device", workers, False),
        "decode + crop on the GPU, 2 workers gather": ("device", 2, False),
        f"the same by nvImageCodec, {workers} workers gather": (
            "device",
            workers,
            False,
            "nvimgcodec",
        ),
        f"decode in {workers} workers, crop on the GPU": ("workers", workers, False),
        f"decode + crop in {workers} workers": ("workers", workers, True),
    }
    table = {name: gpu_epochs(folder / "out", *how) for name, how in runs.items()}
    print(f"{n} photos, {torch.cuda.get_device_name(0)}, {cores} cores")
    print("| 224 RandomResizedCrop onto the GPU | samples/s | peak GPU MiB, epochs 1-3 | decoder |")
    print("|---|---:|---|---|")
    for name, r in table.items():
        peaks = ", ".join(f"{p:.0f}" for p in r["peak_mib"])
        print(f"| {name} | {r['samples_per_s']:,.0f} | {peaks} | {r['decoder']} |")
    return table
