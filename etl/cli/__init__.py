"""The `etl` command line. `main` imports the command modules (which registers their commands on
`etl.cli.app.app`) and runs it; on a node installed without the ETL's packages (the format and
the loaders alone) it says in one line how to install them.

Modules:
- `app`:      the Typer app, its consoles, and our errors mapped to exit codes
- `audit`:    `etl audit`: verify a dataset against its manifest, and repair it
- `inspect`:  `etl init`, `etl inspect` and `etl show`
- `progress`: progress bars with rate and ETA on stderr
- `report`:   `etl report`: a version as one self-contained HTML page
- `run`:      `etl run`, `etl validate` and `etl sample-data`
- `trace`:    `etl trace`: which samples a run read at a step, from its saved state
- `versions`: `etl versions`, `etl diff` and `etl compact`
- `views`:    `etl view`: what a view file selects
"""

from __future__ import annotations

import atexit
import importlib
import sys

from etl.engine import interrupt

ETL_PACKAGES = frozenset(
    {"PIL", "simplejpeg", "yaml", "typer", "joblib", "pydantic", "rich", "jinja2"}
)
"""Top-level modules of the `etl` extra (pyproject.toml): what packing and the CLI import."""


COMMAND_MODULES = {
    "run": "run",
    "validate": "run",
    "sample-data": "run",
    "audit": "audit",
    "init": "inspect",
    "inspect": "inspect",
    "show": "inspect",
    "versions": "versions",
    "diff": "versions",
    "compact": "versions",
    "view": "views",
    "trace": "trace",
    "report": "report",
}
"""Each command and the module of `etl.cli` that registers it: a command imports its own
module only (`etl run` skips the audit's, the viewer's, ... imports: about 0.1 s of every
run on 2 cores); `--help` or an unknown name imports them all."""


def main(argv: list[str] | None = None) -> None:
    # NOTE [ signals after the command ]: registered before anything a command imports
    # (multiprocessing's, loky's exit handlers), so it runs after them, last
    atexit.unregister(interrupt.end_with_late_signal)
    atexit.register(interrupt.end_with_late_signal)
    _arrow_without_pandas()
    args = sys.argv[1:] if argv is None else argv
    try:
        _register(args)
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
    from etl.format import commit

    commit.INVOKED_AS = ["etl", *args]  # what a version this command commits says made it
    try:
        run_app(argv)
    finally:
        commit.INVOKED_AS = None  # a library call after it, in this process, is not it


def _register(args: list[str]) -> None:
    """Import the module of the command named in `args` (every module if it names none)."""
    named = next((arg for arg in args if not arg.startswith("-")), None)
    module = COMMAND_MODULES.get(named or "")
    for name in [module] if module else sorted(set(COMMAND_MODULES.values())):
        importlib.import_module(f"etl.cli.{name}")


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
