"""Batched augmentation and the CUDA feed, measured side by side in one run.

    python -m benchmarks.load.augment [--quick] [--tiny] [--device cuda]

On the CPU (always): `loaders.augment.crops.RandomResizedCrop` on a batch against a per-sample loop
of the same torch ops (crop, `F.interpolate`, flip; what a per-sample `transform` does) and against
kornia's `RandomResizedCrop` given the same boxes (when kornia is installed), with the pixel
difference of each from the exact per-sample reference and from antialiased resizing
(torchvision's default for tensors).

With CUDA (`--device cuda`, the default when present): host-to-device GB/s from pinned and from
pageable batches against the device's own copy limit (a large pinned copy); whether the copy is
hidden behind compute (a training-like step longer than the copy, fed by `DeviceLoader` with its
side stream against copies on the compute stream); `DeviceLoader` + augmentation throughput for
224x224 crops at batch 256 from page-cached shards, against a per-sample transform in the
dataset and against the copy limit; and GPU memory over an epoch. `--device cpu` runs those
sections on the CPU too (without pinned memory), which is what the smoke test does.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.common import cpu_model, table
from benchmarks.load.throughput import write_synthetic
from loaders import DeviceLoader, PackedDataset, make_loader
from loaders.augment.crops import RandomResizedCrop, resized_crop
from loaders.augment.draws import crop_boxes, flips

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def timed(run: Callable[[], Any], device: torch.device, rounds: int) -> float:
    """Median seconds of `rounds` calls (after one warm-up), synchronised on CUDA."""
    times = []
    for _ in range(rounds + 1):
        _sync(device)
        start = time.perf_counter()
        run()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def per_sample(
    images: torch.Tensor,
    boxes: np.ndarray,
    mirrored: np.ndarray,
    size: int,
    antialias: bool = False,
) -> Any:
    """The same crop as a per-sample loop: what a per-sample torch transform does (with
    `antialias`, torchvision's default for tensors)."""
    out = []
    for image, (top, left, h, w), flip in zip(images, boxes.tolist(), mirrored, strict=True):
        crop = image[None, :, top : top + h, left : left + w].float()
        one = F.interpolate(
            crop, (size, size), mode="bilinear", align_corners=False, antialias=antialias
        )[0]
        out.append(one.flip(-1) if flip else one)
    return torch.stack(out)


def kornia_crop(size: int) -> Callable[[torch.Tensor, np.ndarray, np.ndarray], Any] | None:
    """kornia's RandomResizedCrop + flip with our boxes passed in, or None without kornia."""
    try:
        from kornia.augmentation import RandomHorizontalFlip
        from kornia.augmentation import RandomResizedCrop as KorniaCrop
    except ImportError:
        return None
    crop, flip = KorniaCrop((size, size), p=1.0), RandomHorizontalFlip(p=1.0)

    def run(images: torch.Tensor, boxes: np.ndarray, mirrored: np.ndarray) -> Any:
        top, left, h, w = (torch.from_numpy(c).float() for c in boxes.T)
        corners = torch.stack(
            [
                torch.stack([left, top], -1),
                torch.stack([left + w - 1, top], -1),
                torch.stack([left + w - 1, top + h - 1], -1),
                torch.stack([left, top + h - 1], -1),
            ],
            dim=1,
        ).to(images.device)
        params = crop.forward_parameters(images.shape)
        params["src"] = corners
        out = crop(images.float(), params=params)
        where = torch.from_numpy(mirrored).to(images.device)
        return torch.where(where[:, None, None, None], flip(out), out)

    return run


def photo_like(batch: int, side: int) -> torch.Tensor:
    """uint8 NCHW images with photo-like smoothness: noise at 1/8 resolution, upsampled. Pixel
    differences between resamplers on pure noise would measure the noise, not the method."""
    rng = np.random.default_rng(0)
    coarse = torch.from_numpy(rng.random((batch, 3, side // 8, side // 8), dtype=np.float32))
    fine = F.interpolate(coarse * 255, (side, side), mode="bicubic", align_corners=False)
    return fine.clamp(0, 255).round().to(torch.uint8)


def report_cpu(batch: int, stored: int, size: int, rounds: int) -> None:
    device = torch.device("cpu")
    images = photo_like(batch, stored)
    index = np.arange(batch)
    boxes, mirrored = crop_boxes(0, 0, index, stored, stored), flips(0, 0, index)
    augment = RandomResizedCrop(size, seed=0)
    index_t = torch.from_numpy(index)
    reference = per_sample(images, boxes, mirrored, size)
    box_t, flip_t = torch.from_numpy(boxes), torch.from_numpy(mirrored)
    contenders: dict[str, Callable[[], Any]] = {
        "loaders RandomResizedCrop (on the CPU: a loop of F.interpolate)": lambda: augment(
            images, index_t, 0
        ),
        "loaders resized_crop(batched=True): one grid_sample, the CUDA path": lambda: resized_crop(
            images, box_t, flip_t, (size, size), batched=True
        ),
        "per-sample loop: crop + F.interpolate + flip": lambda: per_sample(
            images, boxes, mirrored, size
        ),
    }
    kornia = kornia_crop(size)
    if kornia is not None:
        contenders["kornia RandomResizedCrop + flip, our boxes"] = lambda: kornia(
            images, boxes, mirrored
        )
    smooth = per_sample(images, boxes, mirrored, size, antialias=True)
    rows = []
    loop_time = None
    timings = {name: timed(run, device, rounds) for name, run in contenders.items()}
    loop_time = timings["per-sample loop: crop + F.interpolate + flip"]
    for name, run in contenders.items():
        out = run()
        diff = (out - reference).abs()
        vs_smooth = (out - smooth).abs().mean()
        rows.append(
            [
                name,
                f"{batch / timings[name]:,.0f}",
                f"{loop_time / timings[name]:.2f}x",
                f"{float(diff.max()):.3g} / {float(diff.mean()):.3g}",
                f"{float(vs_smooth):.2f}",
            ]
        )
    print(
        f"\n### CPU: random resized crop {stored}->{size} + flip, batch {batch}, "
        f"{torch.get_num_threads()} threads\n"
    )
    header = [
        "contender",
        "samples/s",
        "vs per-sample loop",
        "vs exact reference: max / mean abs (0-255)",
        "vs antialiased: mean abs",
    ]
    print(table(header, rows))
    if kornia is None:
        print("\nkornia is not installed (pip install kornia): its row is missing.")


def _feed(
    loader: Iterable[Any], steps: int, step: Callable[[torch.Tensor], Any], device: torch.device
) -> tuple[float, float]:
    """(seconds to the first batch: workers' start-up and the first copy; seconds per batch
    after it) over `steps` batches of `loader`, each followed by `step`."""
    done, start, first = 0, time.perf_counter(), 0.0
    for images, *_ in loader:
        step(images)
        done += 1
        if done == 1:
            _sync(device)
            first = time.perf_counter() - start
            start = time.perf_counter()
        if done == steps:
            break
    _sync(device)
    return first, (time.perf_counter() - start) / max(done - 1, 1)


def _copy_limit(device: torch.device, batch_bytes: int) -> float:
    """Bytes/s of a 1 GiB pinned host-to-device copy (NaN off CUDA), after printing what a
    batch of `batch_bytes` copies at, pinned and pageable."""
    if device.type != "cuda":
        return float("nan")
    big = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    target = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    limit = big.numel() / timed(lambda: target.copy_(big, non_blocking=True), device, 3)
    pinned = torch.empty(batch_bytes, dtype=torch.uint8, pin_memory=True)
    pageable = torch.empty(batch_bytes, dtype=torch.uint8)
    rows = []
    for name, source in (("pinned", pinned), ("pageable", pageable)):
        seconds = timed(lambda s=source: s.to(device, non_blocking=True), device, 10)
        rows.append(
            [
                f"{name} batch of {batch_bytes >> 20} MiB",
                f"{batch_bytes / seconds / 1e9:.1f}",
                f"{batch_bytes / seconds / limit:.0%}",
            ]
        )
    rows.append(["limit: 1 GiB pinned copy", f"{limit / 1e9:.1f}", "100%"])
    print(table(["host -> device", "GB/s", "of limit"], rows))
    return limit  # its 2 GiB freed on return: they must not count in the memory measured after


def _overlap(
    device: torch.device, loader: Any, fed: Callable[[], DeviceLoader], steps: int
) -> None:
    """On CUDA: a compute step alone, with `fed()`'s batches copied on the side stream, and
    with the same pinned batches copied on the compute stream (each copy between two steps
    instead of beside them)."""
    weights = torch.randn(4096, 4096, device=device)

    def compute(_: torch.Tensor) -> None:
        for _ in range(8):
            weights.matmul(weights)

    alone = timed(lambda: compute(weights), device, 5)
    _, side = _feed(fed(), steps, compute, device)
    plain_batches = ((b.images.to(device, non_blocking=True), b.labels) for b in loader)
    _, plain = _feed(plain_batches, steps, compute, device)
    rows = [
        ["compute alone", f"{alone * 1e3:.1f}", "1.00x"],
        ["DeviceLoader (side stream) + augment", f"{side * 1e3:.1f}", f"{side / alone:.2f}x"],
        ["copy on the compute stream", f"{plain * 1e3:.1f}", f"{plain / alone:.2f}x"],
    ]
    print(table(["step", "ms", "vs compute alone"], rows))


def _epoch_memory(device: torch.device, fed: Callable[[], DeviceLoader], batch: int, size: int,
                  batch_bytes: int) -> None:  # fmt: skip
    """On CUDA: GPU memory before, after and at its peak over an epoch of `fed()`."""
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    _feed(fed(), 10**9, lambda images: None, device)
    after = torch.cuda.memory_allocated(device)
    peak = torch.cuda.max_memory_allocated(device)
    print(
        f"\nGPU memory over an epoch of DeviceLoader + RandomResizedCrop: {before >> 20} "
        f"MiB before, {after >> 20} MiB after, peak {(peak - before) >> 20} MiB above "
        f"before (a batch of {batch_bytes >> 20} MiB uint8, its float32 crops "
        f"{batch * size * size * 3 * 4 >> 20} MiB)"
    )


def report_device(device: torch.device, workdir: Path, quick: bool, tiny: bool) -> None:
    """The feed on `device`: the copy limit (CUDA), each way of feeding crops, their overlap
    with compute and the GPU memory of an epoch (CUDA)."""
    cuda = device.type == "cuda"
    stored, size, batch = (32, 24, 16) if tiny else (256, 224, 256)
    write_synthetic(workdir, (8 if tiny else (256 if quick else 768)) << 20, (stored, stored, 3))
    print(f"\n### {torch.cuda.get_device_name(device) if cuda else 'CPU'}: the feed\n")
    batch_bytes = batch * stored * stored * 3
    limit = _copy_limit(device, batch_bytes)
    if cuda:
        torch.cuda.empty_cache()
    ds = PackedDataset.open(workdir)
    augment = RandomResizedCrop(size, seed=0)
    steps = 4 if tiny else (20 if quick else 60)
    loader = make_loader(ds, batch_size=batch, shuffle=True, with_indices=True, num_workers=2)
    in_process = make_loader(ds, batch_size=batch, shuffle=True, with_indices=True)

    def on_device(source: Any = loader, **kw: Any) -> DeviceLoader:
        return DeviceLoader(source, device, dtype=torch.float32, mean=MEAN, std=STD, **kw)

    def per_sample_transform(image: torch.Tensor) -> torch.Tensor:
        top, left = (stored - size) // 2, (stored - size) // 2
        crop = image.permute(2, 0, 1)[None, :, top : top + size, left : left + size].float()
        resized = F.interpolate(crop, (size, size), mode="bilinear", align_corners=False)
        return resized[0].to(torch.uint8)

    slow = make_loader(
        PackedDataset.open(workdir, transform=per_sample_transform),
        batch_size=batch,
        shuffle=True,
        num_workers=2,
    )
    feeds: list[tuple[str, Callable[[], DeviceLoader]]] = [
        (
            "DeviceLoader + RandomResizedCrop (batched, on device)",
            lambda: on_device(augment=augment),
        ),
        ("the same, 0 workers", lambda: on_device(in_process, augment=augment)),
        (
            "DeviceLoader, per-sample transform in the dataset",
            lambda: DeviceLoader(
                slow, device, dtype=torch.float32, mean=MEAN, std=STD, layout="CHW"
            ),
        ),
        ("DeviceLoader, no augmentation", lambda: on_device()),
    ]
    rows = []
    for name, run in feeds:
        first, per_batch = _feed(run(), steps, lambda images: None, device)
        of_limit = f"{batch / per_batch / (limit / (stored * stored * 3)):.0%}" if cuda else "-"
        rows.append([name, f"{first * 1e3:.0f}", f"{batch / per_batch:,.0f}", of_limit])
    print(
        f"\n{size}x{size} crops from {stored}x{stored} shards, batch {batch}, 2 workers unless "
        "said; the first batch (workers' start-up included) apart:\n"
    )
    print(table(["feed", "first batch ms", "samples/s after it", "of copy limit"], rows))
    if cuda:
        _overlap(device, loader, lambda: on_device(augment=augment), steps)
        torch.cuda.empty_cache()  # the weights of its compute step are gone
        _epoch_memory(device, lambda: on_device(augment=augment), batch, size, batch_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, smaller data")
    parser.add_argument("--tiny", action="store_true", help="seconds: checks that it runs")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", "CUDA is not available", RuntimeWarning)
    print(f"# load.augment, {date.today()}, {cpu_model()}, torch {torch.__version__}")
    if args.tiny:
        report_cpu(batch=8, stored=32, size=24, rounds=1)
    else:
        report_cpu(batch=256, stored=256, size=224, rounds=2 if args.quick else 5)
    if args.device is None:
        print("\nNo CUDA device: the GPU sections did not run (--device cpu runs them here).")
        return
    with tempfile.TemporaryDirectory() as work:
        report_device(torch.device(args.device), Path(work), args.quick, args.tiny)


if __name__ == "__main__":
    main()
