"""The README section of `benchmarks.pack.throughput`: settings, the speed table, the goals,
draft's error, the fixed cost and memory, from its `Results`."""

from __future__ import annotations

from benchmarks.pack.contenders import HEIGHT, SAMPLES_PER_SHARD, WIDTH
from benchmarks.pack.measures import FIXED_REPEATS, Results


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def markdown(results: Results) -> str:
    """The README section: settings, the speed table, the goals, draft's error, memory."""
    s, m = results.settings, results.machine
    labels: dict[str, str] = s["labels"]
    lines = [
        f"Packing {s['images']:,} photos (random crops of scikit-image's photographs, 300-640 px "
        f"a side, mean {s['mean_kb']:.0f} KB, {s['mean_pixels'] / 1e3:.0f} kpixels) into "
        f"{HEIGHT}x{WIDTH} RGB (center_crop, bilinear), {SAMPLES_PER_SHARD} samples a shard; "
        f"median of {s['repeats']} interleaved rounds in one run "
        "(`python -m benchmarks.pack.throughput`).",
        "",
        f"Machine: {m['cores']} cores, {m['cpu']}, {m['os']}; Python {m['python']}, "
        f"Pillow {m['pillow']}, numpy {m['numpy']}, joblib {m['joblib']}; {m['date']}; "
        f"load average {m['load_before']:.1f} before, {m['load_after']:.1f} after.",
        "",
        "| run | images/s | CPU ms/image | vs bare loop | output = bare loop's |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, label in labels.items():
        same = results.identical.get(key)
        identical = "" if same is None else f"{same:,}/{s['images']:,}"
        lines.append(
            f"| {label} | {results.rate(key):.0f} | {results.cpu_ms(key):.2f} | "
            f"{results.ratio(key, 'bare'):.2f} | {identical} |"
        )
    lines += [
        "",
        "CPU ms/image is the CPU time of the whole process tree (parent and workers) per image: "
        "unlike images/s it hardly changes when other programs take turns on the cores. "
        "A pipeline with `n_jobs: 1` runs in the calling process whatever the backend (joblib "
        "does not start a pool for one job), so `sequential` is also the loky 1-job figure.",
        "",
        "| goal | measured | target | met |",
        "|---|---:|---:|:-:|",
        *_speed_goal_rows(results),
        *_fixed_cost_rows(results),
        *_memory_goal_rows(results),
        "",
        *_fixed_cost_text(results),
        f"Draft against full decode on these photos, after the {HEIGHT}x{WIDTH} resize, in 0-255 "
        f"levels: mean absolute difference {results.pixel_diff['mean']:.2f}; the per-image mean "
        f"is at most {results.pixel_diff['p99_image']:.2f} for 99% of the photos, "
        f"{results.pixel_diff['max_image']:.2f} for the worst.",
        "",
        "Peak resident memory of a cold `python -m etl run` with `n_jobs: 2` (the kernel's VmHWM "
        "per process; the whole tree sampled every 20 ms):",
        "",
        "| photos | shards of | wall | parent | largest worker | whole tree |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    lines += _memory_rows(results)
    return "\n".join(lines)


def _speed_goal_rows(results: Results) -> list[str]:
    """The goals of packing speed, each measured against its target."""
    vs_naive = results.ratio("loky2", "naive")
    vs_bare2 = results.ratio("loky2", "bare_x2")
    draft_vs_naive = results.ratio("loky2_draft", "naive")
    overhead = 1 - results.ratio("seq", "bare")
    overhead2 = 1 - results.ratio("loky2", "bare", per=2)
    cpu_overhead = results.cpu_ms("seq") / results.cpu_ms("bare") - 1
    speedup = results.ratio("loky2", "seq")
    ceiling = results.ratio("bare_x2", "bare")
    draft1 = results.ratio("seq_draft", "bare")
    draft2 = results.ratio("loky2_draft", "bare")

    return [
        f"| full decode, pipeline 2 jobs / naive writer | {vs_naive:.2f}x | >= 1.2x | "
        f"{yes(vs_naive >= 1.2)} |",
        f"| full decode, pipeline 2 jobs / bare loop in 2 processes | {vs_bare2:.0%} | >= 90% | "
        f"{yes(vs_bare2 >= 0.9)} |",
        f"| draft, pipeline 2 jobs / naive writer at full decode | {draft_vs_naive:.2f}x | "
        f">= 1.5x | {yes(draft_vs_naive >= 1.5)} |",
        f"| per-core overhead, 1 - (pipeline 1 job / bare loop), images/s | {overhead:.1%} | "
        f"< 10% | {yes(overhead < 0.10)} |",
        f"| the same in CPU time, pipeline / bare loop - 1 | {cpu_overhead:.1%} | (info) | |",
        f"| per-core overhead at 2 jobs, 1 - (pipeline 2 jobs / 2 / bare loop) | {overhead2:.1%} "
        "| (info) | |",
        f"| speedup, pipeline 2 jobs / 1 job | {speedup:.2f}x | >= 1.8x | {yes(speedup >= 1.8)} |",
        f"| what the machine allowed: bare loop in 2 processes / 1 process | {ceiling:.2f}x | "
        "(info) | |",
        f"| draft, pipeline 1 job / bare full-decode loop | {draft1:.2f}x | > 1 | "
        f"{yes(draft1 > 1)} |",
        f"| draft, pipeline 2 jobs / bare full-decode loop | {draft2:.2f}x | > 1 | "
        f"{yes(draft2 > 1)} |",
    ]


def _memory_rows(results: Results) -> list[str]:
    """One row of the memory table a cold run measured."""
    lines = []
    for mem in results.memory:
        shard = (
            f"{mem.samples_per_shard} samples"
            if mem.samples_per_shard is not None
            else "256 MiB (default)"
        )
        lines.append(
            f"| {mem.images:,} | {shard} | {mem.seconds:.1f} s | {_mib(mem.parent_peak)} | "
            f"{_mib(mem.worker_peak)} | {_mib(mem.total_peak)} |"
        )
    return lines


MEMORY_GOAL = 425e6
"""Bytes: the whole process tree's peak in the run that issue #12 measured (2 jobs)."""


def _fixed(results: Results) -> float | None:
    """Seconds of a cold run on FIXED_IMAGES photos beyond what the steady 2-job rate needs."""
    fixed = results.fixed
    return None if fixed is None else fixed.wall - fixed.images / results.rate("loky2")


def _fixed_cost_rows(results: Results) -> list[str]:
    seconds = _fixed(results)
    if seconds is None or results.fixed is None:
        return []
    return [
        f"| fixed cost of a cold `etl run` on {results.fixed.images} photos: wall - photos / "
        f"(2-job rate) | {seconds:.2f} s | < 1 s | {yes(seconds < 1)} |"
    ]


def _memory_goal_rows(results: Results) -> list[str]:
    if not results.memory:
        return []
    peak = results.memory[0].total_peak
    return [
        f"| peak memory of the whole process tree, {results.memory[0].images:,} photos | "
        f"{peak / 1e6:.0f} MB | <= 425 MB | {yes(peak <= MEMORY_GOAL)} |"
    ]


def _fixed_cost_text(results: Results) -> list[str]:
    fixed, seconds = results.fixed, _fixed(results)
    if fixed is None or seconds is None:
        return []
    steady = fixed.images / results.rate("loky2")
    phases = ", ".join(f"{name} {value:.2f} s" for name, value in fixed.phases.items())
    return [
        f"Fixed cost: a cold `python -m etl run` on {fixed.images} photos took {fixed.wall:.2f} s "
        f"(median of {FIXED_REPEATS}), of which {steady:.2f} s is what its photos take at the "
        f"steady 2-job rate. Inside the run ({fixed.run:.2f} s): {phases}; the hash phase "
        "includes starting the two worker processes. Outside it "
        f"({fixed.wall - fixed.run:.2f} s): starting Python, imports and exit.",
        "",
    ]


def yes(ok: bool) -> str:
    return "yes" if ok else "**no**"
