"""What long work tells its caller: a phase starts with a total, advances, stops.

The library default is silent; `etl.cli.progress.BarProgress` draws bars from the same calls.
Run, audit and repair all report through this one protocol.
"""

from __future__ import annotations


class Progress:
    """Silent progress; subclass it to show something."""

    def start(self, phase: str, total: int) -> None:
        """A phase ('hash', 'pack', 'verify', 'sources', 'repair') begins with `total` items."""

    def advance(self, n: int) -> None:
        """`n` more items of the current phase are done."""

    def stop(self) -> None:
        """The current phase is over."""
