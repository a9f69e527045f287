"""Retired versions: a compaction's record that a version is going, and from when.

NOTE [ a grace period ]: a training job that reads on demand (a bounded cache, ranged reads,
shards a local reader maps as it goes) needs its version's files until its epoch ends, so a
compaction retires a version in two steps. First it writes `versions/retired/vNNNNNN.json`
(its time and when its files may go): from then on nobody lists the version, but it stays
whole, opens when pinned (with a warning), and its shards are kept. The first compaction
after `remove_after` removes its files, then the record (and, for a local dataset, the first
run: `etl.format.commit.remove_due_retirements`). `--grace 0` removes them at once.

A record that cannot be read is ignored, never trusted: the version counts as live (nothing
is removed on a damaged record's word).
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

RETIRED_DIR = "retired"
"""The folder, under `versions/`, of retirement records."""
GRACE = 24 * 3600.0
"""Seconds a retired version's files stay by default (`etl compact --grace`)."""
_RECORD = re.compile(r"^v(\d{6})\.json$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_GRACE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_grace(text: str | float) -> float:
    """A grace period as people write it ('24h', '30m', '7d', '0', seconds): seconds.
    ValueError naming it for anything else."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _GRACE.match(str(text))
        if not match:
            raise ValueError(f"grace {text!r}: expected seconds or a number with s, m, h or d")
        seconds = float(match[1]) * _UNITS[match[2] or "s"]
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"grace {text!r}: expected a duration of 0 or more")
    return seconds


@dataclass(frozen=True)
class Retirement:
    """Version `version` was retired at `retired_at` (Unix seconds); its files may be removed
    from `remove_after` on."""

    version: int
    retired_at: float
    remove_after: float

    @staticmethod
    def now(version: int, grace: float) -> Retirement:
        started = time.time()
        return Retirement(version, started, started + grace)

    def due(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.remove_after

    def to_bytes(self) -> bytes:
        body = {
            "version": self.version,
            "retired_at": self.retired_at,
            "remove_after": self.remove_after,
        }
        return json.dumps(body, sort_keys=True).encode()

    @staticmethod
    def parse(data: bytes, version: int) -> Retirement | None:
        """The record of `version` in `data`, None if it is not one (damaged, another
        version's, times that are not finite numbers in order)."""
        try:
            body = json.loads(data)
            stamps = (body["retired_at"], body["remove_after"])
            number = body["version"]
        except (ValueError, KeyError, TypeError, RecursionError):
            return None
        numbers = all(type(s) in (int, float) and math.isfinite(s) for s in stamps)
        if type(number) is not int or number != version or not numbers:
            return None
        if stamps[1] < stamps[0]:
            return None
        return Retirement(version, float(stamps[0]), float(stamps[1]))


def record_name(version: int) -> str:
    """The record's path under `versions/`: 'retired/v000003.json'."""
    return f"{RETIRED_DIR}/v{version:06d}.json"


def version_of_record(name: str) -> int | None:
    match = _RECORD.match(name)
    return int(match[1]) if match else None


def retired_versions(versions_dir: Path) -> dict[int, Retirement]:
    """The readable retirement records in a local `versions/` folder, by version."""
    folder = versions_dir / RETIRED_DIR
    found: dict[int, Retirement] = {}
    if not folder.is_dir():
        return found
    for entry in folder.iterdir():
        number = version_of_record(entry.name)
        if number is None or not entry.is_file():
            continue
        try:
            retirement = Retirement.parse(entry.read_bytes()[: 1 << 16], number)
        except OSError:
            continue
        if retirement is not None:
            found[number] = retirement
    return found
