"""The `etl` command line. Importing this package registers every command on `app`."""

from etl.cli import audit, inspect, run, versions  # noqa: F401  (registers their commands)
from etl.cli.app import app, main

__all__ = ["app", "main"]
