"""Every failure a user can cause has one class here; the CLI prints its message on one line.

Anything that is not an `EtlError` is a bug in this project and keeps its traceback.
"""

from __future__ import annotations


class EtlError(Exception):
    """Base of all user-facing errors. `exit_code` is what the CLI exits with."""

    exit_code = 2


class ConfigError(EtlError):
    """pipeline.yaml is malformed, has an unknown key, a wrong type or an impossible value."""


class SourceError(EtlError):
    """The source folder or listing cannot be read as declared."""


class ManifestError(EtlError):
    """A manifest is missing, of an unknown format version, or inconsistent with its shards."""


class ShardError(EtlError):
    """A shard file is missing, truncated, or not the shape/dtype its manifest records."""


class LockError(EtlError):
    """Another writer holds the output directory."""


class ExecutionError(EtlError):
    """The parallel engine failed as a whole (not a single bad image: those become rejects)."""
