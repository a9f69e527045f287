"""What `loaders.loader.trace` costs: the samples of one step of a long ImageNet-sized run, and
every step that read one sample.

    python -m benchmarks.load.trace [--samples 1281167] [--batch 256] [--step 10000000]

An order sampler over `--samples` indices (the random order, as `shuffle=True` makes it) and a
state whose history is recorded as the loader records it, every epoch read through and one
resumed mid-epoch, batches of `--batch` on one rank, up to `--step` (about 2,000 epochs at the
defaults): `samples_at` of the last step (median of 5),
and `steps_of` one sample over the first 20 epochs (one order drawn per epoch). No dataset is
opened: tracing needs the order, not the pixels. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

from loaders.loader.trace import samples_at, steps_of
from loaders.order.history import RunHistory, encode
from loaders.order.samplers import ShuffleSampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=1_281_167)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--step", type=int, default=10_000_000)
    args = parser.parse_args()
    order = ShuffleSampler(args.samples, True, seed=0, rank=0, world_size=1)
    loader = SimpleNamespace(order=order)
    per_epoch = -(-args.samples // args.batch)
    epochs = args.step // per_epoch + 1
    run = RunHistory()  # as the loader records them: each epoch read through, one resume
    skipped = min(1000, per_epoch // 2)  # batches the resumed epoch had read before its state
    for epoch in range(epochs):
        resumed = epoch == epochs // 2
        run.began(epoch, 0, skipped * args.batch if resumed else 0, order, args.batch)
        run.ended(per_epoch - skipped if resumed else per_epoch)
    entries = run.entries
    history = encode(entries)
    state = {"step": args.step + 1, "history": history}
    times = []
    for _ in range(5):
        start = time.perf_counter()
        batch = samples_at(loader, state, args.step)
        times.append(time.perf_counter() - start)
    sample = int(batch[0])
    first = {"step": 20 * per_epoch, "history": encode(entries[:1])}
    start = time.perf_counter()
    read = steps_of(loader, first, sample)
    over = time.perf_counter() - start
    print(
        f"{args.samples:,} samples, batches of {args.batch} ({per_epoch:,} a epoch): the "
        f"history of step {args.step:,} ({epochs:,} epochs, one resumed mid-epoch) is "
        f"{len(entries)} entries, {len(history):,} bytes\n"
        f"samples_at(step {args.step:,}): {statistics.median(times) * 1000:.0f} ms (median of 5)\n"
        f"steps_of(one sample, 20 epochs): {over:.2f} s, read {len(read)} times"
    )


if __name__ == "__main__":
    main()
