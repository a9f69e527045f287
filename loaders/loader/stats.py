"""Where a loader's time went: how long the training loop waited for each batch, how long it
worked on it between batches, and how the making of the batches in this process split into
its stages (`loaders.read.timing`), as plain numbers for a logger and as one line."""

from __future__ import annotations

import logging
import time
from typing import Any

from loaders.read.timing import MakingTimes


class LoopTimes:
    """The training loop's side of a pass: seconds it waited inside `next()` for each batch,
    and seconds it spent between batches (its own work)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.batches = 0
        self.wait = 0.0
        self.step = 0.0
        self._left: float | None = None

    def asked(self) -> float:
        """The loop asks for its next batch: the time its step since the last batch took ends."""
        now = time.perf_counter()
        if self._left is not None:
            self.step += now - self._left
        return now

    def handed(self, asked: float) -> None:
        """The batch asked for at `asked` is handed to the loop now."""
        now = time.perf_counter()
        self.batches += 1
        self.wait += now - asked
        self._left = now

    def paused(self) -> None:
        """The pass ended or was left: what follows is not a step of it."""
        self._left = None


def making_times(dataset: object) -> MakingTimes:
    """The times of the batches made in this process from `dataset` (a fresh, empty record
    where it keeps none: a dataset of someone else's)."""
    times = getattr(getattr(dataset, "memory", None), "times", None)
    return times if isinstance(times, MakingTimes) else MakingTimes()


def summary(loop: LoopTimes, making: MakingTimes) -> dict[str, Any]:
    """The stats a loader reports (`PackedLoader.stats`): plain numbers for a logger."""
    busy = loop.wait + loop.step
    stages = {name: round(value, 6) for name, value in making.stages.items()}
    slowest = max(stages, key=stages.__getitem__) if any(stages.values()) else None
    return {
        "batches": loop.batches,
        "wait_s": round(loop.wait, 6),
        "step_s": round(loop.step, 6),
        "waited": round(loop.wait / busy, 4) if busy else 0.0,
        "made_here": making.batches,
        "make_s": round(making.seconds, 6),
        "stages_s": stages,
        "slowest_stage": slowest,
    }


def line(stats: dict[str, Any], slowest_rank: tuple[int, float] | None = None) -> str:
    """One line for a log: "the loop waited 12.0% of its time for data; the slowest stage is
    crop (71% of making a batch)" (and, across ranks, which waited most)."""
    text = f"the loop waited {stats['waited']:.1%} of its time for data"
    text += f" ({stats['wait_s']:.2f} s over {stats['batches']} batches)"
    slowest = stats["slowest_stage"]
    if slowest is not None and stats["make_s"]:
        share = stats["stages_s"][slowest] / stats["make_s"]
        text += f"; the slowest stage is {slowest} ({share:.0%} of making a batch)"
    elif stats["batches"] and not stats["made_here"]:
        text += "; batches are made in worker processes (their stages are not timed)"
    if slowest_rank is not None:
        text += f"; rank {slowest_rank[0]} waited most ({slowest_rank[1]:.1%})"
    return text


def epoch_line(stats: dict[str, Any]) -> str:
    """`line` of a pass that ended; under torch.distributed every rank calls it at the end of
    its pass (ranks deliver equal numbers of batches), and the line names the rank that waited
    most."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return line(stats)
    waited: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(waited, float(stats["waited"]))
    rank = max(range(len(waited)), key=lambda r: waited[r])
    return line(stats, (rank, waited[rank]))


def log_epoch(stats: dict[str, Any]) -> None:
    """Log the pass's `epoch_line` on the "loaders" logger, at INFO."""
    logging.getLogger("loaders").info(epoch_line(stats))


def log_values(stats: dict[str, Any], prefix: str = "loader/") -> dict[str, float]:
    """`stats` as the flat numbers a logger takes: "loader/waited", "loader/wait_s", ...,
    "loader/read_s" for each stage (the slowest stage's name is left to `line`)."""
    values = {f"{prefix}{k}": float(v) for k, v in stats.items() if isinstance(v, int | float)}
    values |= {f"{prefix}{name}_s": float(v) for name, v in stats["stages_s"].items()}
    return values
