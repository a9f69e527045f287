"""The `etl` Typer app, its consoles and the entry point that maps our errors to exit codes.

Commands live in sibling modules by capability (run.py, ...) and register themselves on `app`;
they parse arguments, call the library and print. Anything that is not an `EtlError` is a bug
and keeps its traceback.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
from typing import Annotated, Any

import typer
from rich.console import Console

from etl.engine import interrupt
from etl.errors import EtlError
from etl.storage.transport import ALLOW_ENV

app = typer.Typer(
    name="etl",
    help="Pack images into uint8 memmap shards with an Arrow manifest, for PyTorch training.\n\n"
    "Example:  etl sample-data data/sample && etl run pipeline.yaml",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
# NOTE: markup off (paths and messages may hold "[...]"), soft wrap on (a long path stays one
# line for scripts that grep it); style through rich Text objects where it matters.


@app.callback()
def _commands(
    allow_protocol: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-protocol",
            metavar="PROTOCOL",
            help="Also reach URLs of this protocol (repeat for more), besides the stores "
            "s3, gs, gcs, az, abfs and abfss, e.g. --allow-protocol http; for this command "
            "and the processes it starts.",
        ),
    ] = None,
) -> None:
    """Keeps `etl <command>` a group when only the one command's module was imported
    (`etl.cli.COMMAND_MODULES`): Typer runs a lone command as the app itself otherwise. Takes
    the options every command shares."""
    if allow_protocol:  # NOTE [ no request nobody asked for ]: the user's word, to children too
        given = os.environ.get(ALLOW_ENV, "").split(",")
        os.environ[ALLOW_ENV] = ",".join(p for p in [*given, *allow_protocol] if p.strip())


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters but tab and newline: C0, DEL and C1 (ESC begins a terminal's commands,
CSI is 0x9b)."""


class _TerminalConsole(Console):
    """A console that shows a control character in what it prints as its escape (`\\x1b`):
    a source name, a sample id or a class name is someone's text, and `\\x1b]52;` in it would
    write the clipboard, `\\x1b[2J` clear the screen. Every string a print or a table cell
    renders passes `render_str`; rich's own styling is added after it."""

    def render_str(self, text: str, **options: Any) -> Any:
        return super().render_str(_CONTROL.sub(_escape, text), **options)


def _escape(found: re.Match[str]) -> str:
    return f"\\x{ord(found.group()):02x}"


err = _TerminalConsole(stderr=True, markup=False, highlight=False, soft_wrap=True)
out = _TerminalConsole(markup=False, highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> None:
    """Console entry point. Click handles usage errors and --help; our errors become one line on
    stderr and their exit code; SIGINT and SIGTERM one line and 130 or 143 (see
    etl.engine.interrupt). Always ends in SystemExit."""
    try:
        with interrupt.handled():
            app(args=argv, prog_name="etl")
    except EtlError as exc:
        err.print(f"error: {exc}", highlight=False, markup=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except interrupt.Interrupted as exc:
        err.print(exc.message, highlight=False, markup=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    finally:  # NOTE [ signals after the command ]: through the exit handlers too
        atexit.unregister(interrupt.exit_quietly)
        atexit.register(interrupt.exit_quietly)  # runs before the ones registered earlier
        if argv is None:  # the etl command itself (not a call in someone's process)
            interrupt.exit_quietly()
