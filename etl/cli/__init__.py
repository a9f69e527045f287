"""The `etl` command line. `main` imports the command modules (which registers their commands on
`etl.cli.app.app`) and runs it; on a node installed without the ETL's packages (the format and
the loaders alone) it says in one line how to install them."""

from __future__ import annotations

import sys

ETL_PACKAGES = frozenset({"PIL", "simplejpeg", "yaml", "typer", "joblib", "pydantic", "rich"})
"""Top-level modules of the `etl` extra (pyproject.toml): what packing and the CLI import."""


def main(argv: list[str] | None = None) -> None:
    try:
        from etl.cli import audit, inspect, run, versions  # noqa: F401  (registers their commands)
        from etl.cli.app import main as run_app
    except ModuleNotFoundError as exc:
        if exc.name not in ETL_PACKAGES:
            raise
        print(
            f"error: the etl command needs the ETL packages ({exc.name} is missing): "
            "pip install 'etl-memmap[etl]'",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    run_app(argv)


__all__ = ["main"]
