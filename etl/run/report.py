"""What a run reports: `RunReport`, printed by `etl run` and given as JSON by `--json`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


@dataclass
class RunReport:
    output: Path | str
    """The dataset folder, or its URL in object storage."""
    version: int | None
    """The version committed, or the unchanged latest one when there was nothing to do."""
    committed: bool
    listed: int
    packed_new: int
    reused: int
    rejected: int
    rejects_by_reason: dict[str, int]
    plan_counts: Mapping[str, int]
    shards_written: int
    bytes_written: int
    samples_total: int
    seconds: float
    dry_run: bool = False
    notes: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds spent in each phase that ran: list, hash (starting the workers included),
    plan, pack, commit; the rest of `seconds` is checks, the lock and cleaning up."""

    @property
    def images_per_second(self) -> float:
        return self.packed_new / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "output": str(self.output),
            "version": self.version,
            "committed": self.committed,
            "dry_run": self.dry_run,
            "listed": self.listed,
            "packed_new": self.packed_new,
            "reused": self.reused,
            "samples_total": self.samples_total,
            "rejected": self.rejected,
            "rejects_by_reason": self.rejects_by_reason,
            "plan": dict(self.plan_counts),
            "shards_written": self.shards_written,
            "bytes_written": self.bytes_written,
            "seconds": round(self.seconds, 3),
            "images_per_second": round(self.images_per_second, 1),
            "notes": self.notes,
            "phases": {name: round(seconds, 3) for name, seconds in self.phases.items()},
        }


def by_reason(rejects: pa.Table) -> dict[str, int]:
    """How many rejects there are of each reason, sorted by reason."""
    counts = pc.value_counts(rejects.column("reason")).to_pylist()
    return {c["values"]: c["counts"] for c in sorted(counts, key=lambda c: c["values"])}
