"""Progress bars with rate and ETA on stderr, shared by every long-running command."""

from __future__ import annotations

from typing import ClassVar

from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.progress import Progress as RichProgress
from rich.progress import Task as RichTask
from rich.text import Text

from etl.cli.app import err
from etl.progress import Progress


class RateColumn(ProgressColumn):
    """Items per second, as a data engineer reads throughput."""

    def render(self, task: RichTask) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:>7.0f}/s" if speed else "      ?/s")


class BarProgress(Progress):
    """A rich progress bar per phase, with rate and ETA, drawn on stderr."""

    LABELS: ClassVar[dict[str, str]] = {
        "hash": "hashing sources",
        "pack": "decode, resize, pack",
        "upload": "upload, verify",
        "trace": "epochs searched",
    }
    BYTE_PHASES: ClassVar[frozenset[str]] = frozenset()
    """Phases counted in bytes (shown as MiB and MiB/s) rather than items."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None

    def start(self, phase: str, total: int) -> None:
        if not self.enabled or total == 0:
            return
        counted: tuple[ProgressColumn, ...] = (
            (DownloadColumn(binary_units=True), TransferSpeedColumn())
            if phase in self.BYTE_PHASES
            else (MofNCompleteColumn(), RateColumn())
        )
        self._bar = RichProgress(
            TextColumn("{task.description:<22}"),
            BarColumn(),
            *counted,
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=err,
            transient=False,
        )
        self._bar.start()
        self._task = self._bar.add_task(self.LABELS.get(phase, phase), total=total)

    def advance(self, n: int) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.advance(self._task, n)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        self._bar = None
        self._task = None
