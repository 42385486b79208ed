"""Typer declarations. Each command hands off to library code; errors become one line here."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from specli import __version__
from specli.config import debug_enabled
from specli.errors import SpecliError

app = typer.Typer(
    name="specli",
    help="Local speculative generation: a small draft proposes tokens, the target verifies them in one pass.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"specli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    """Local speculative generation with llama.cpp."""


# --- run -------------------------------------------------------------------


# --- models: pull / list / rm ----------------------------------------------


# --- bench / doctor --------------------------------------------------------


def fail(message: str, hint: str | None = None, code: int = 1) -> None:
    """Print one line on stderr and exit; the only place errors leave the process."""
    text = f"specli: error: {message}"
    if hint:
        text += f" ({hint})"
    print(text, file=sys.stderr)
    raise SystemExit(code)


def main() -> None:
    try:
        app()
    except SpecliError as error:
        if debug_enabled():
            raise
        fail(error.message, error.hint, error.exit_code)
    except KeyboardInterrupt:
        if debug_enabled():
            raise
        print("specli: interrupted", file=sys.stderr)
        raise SystemExit(130)
