"""The `etl` command line. `main` imports the command modules (which registers their commands on
`etl.cli.app.app`) and runs it; on a node installed without the ETL's packages (the format and
the loaders alone) it says in one line how to install them."""

from __future__ import annotations

import sys

ETL_PACKAGES = frozenset({"PIL", "simplejpeg", "yaml", "typer", "joblib", "pydantic", "rich"})
"""Top-level modules of the `etl` extra (pyproject.toml): what packing and the CLI import."""


def main(argv: list[str] | None = None) -> None:
    _arrow_without_pandas()
    try:
        from etl.cli import audit, inspect, run, versions, views  # noqa: F401  (registers them)
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


def _arrow_without_pandas() -> None:
    """Keep pyarrow from importing pandas in the command's process.

    The first array pyarrow builds makes it try `import pandas`, to tell a pandas object from
    anything else; with pandas installed that import costs 0.5-0.8 s (pandas 3.1, 2 cores), more
    than listing and hashing a thousand files. The command never hands pyarrow a pandas object,
    so pyarrow's first try is made here with pandas hidden; pyarrow tries again when asked for
    pandas (`Table.to_pandas`), so nothing is lost."""
    if "pandas" in sys.modules:
        return
    try:
        import pyarrow as pa
    except ModuleNotFoundError:
        return  # the format's own packages missing: main's message says what to install
    sys.meta_path.insert(0, _NoPandas)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(_NoPandas)


class _NoPandas:
    """An import finder that says pandas is not installed (for `_arrow_without_pandas`)."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        if name == "pandas":
            raise ModuleNotFoundError("hidden from pyarrow's first array", name=name)


__all__ = ["main"]
