"""The Typer app every command registers on, and what they share: every error becomes one
line and an exit code in one place (`ERRORS`, applied by `Group.main`); help shows no type
placeholders. The commands themselves are one module each; `specli.commands.cli` gathers them."""

from __future__ import annotations

import sys
from typing import Annotated, Callable, Optional

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from specli import __version__
from specli.config import debug_enabled
from specli.errors import SpecliError

# --- errors: one table, applied once ------------------------------------------------

# Typer's exceptions come from the click it uses (its own copy in recent releases).
_click = sys.modules[typer.BadParameter.__module__]


def _internal(error: BaseException) -> tuple[str, str | None, int]:
    return (f"internal error: {type(error).__name__}: {error}",
            "rerun with SPECLI_DEBUG=1 for the traceback, and report it", 1)


def _usage(error) -> tuple[str, str | None, int]:
    context = getattr(error, "ctx", None)
    return error.format_message(), f"see `{context.command_path} --help`" if context is not None else None, error.exit_code


# (exception type, what it says: message, hint, exit code), the first match wins. A message
# of None prints nothing (the help is already on the screen).
ERRORS: tuple[tuple[type[BaseException], Callable[[BaseException], tuple[str | None, str | None, int]]], ...] = (
    (SpecliError, lambda error: (error.message, error.hint, error.exit_code)),  # type: ignore[attr-defined]
    (getattr(_click, "NoArgsIsHelpError", ()), lambda error: (None, None, 2)),
    (_click.ClickException, _usage),
    (typer.Abort, lambda error: ("aborted", None, 1)),
    (KeyboardInterrupt, lambda error: ("interrupted", None, 130)),
    (Exception, _internal),
)


def report(error: BaseException) -> int:
    """One line on stderr for `error`, by ERRORS; returns the exit code."""
    for kind, describe in ERRORS:
        if kind and isinstance(error, kind):
            message, hint, code = describe(error)
            if message is not None:
                print(f"specli: error: {message}" + (f" (hint: {hint})" if hint else ""), file=sys.stderr)
            return code
    raise error


class _PlainOption(TyperOption):
    def display_type_rich(self, ctx):  # a flag shows no <bool>
        return None if self.is_flag else super().display_type_rich(ctx)


class _PlainArgument(TyperArgument):
    def display_type_rich(self, ctx):  # the metavar says it: no <list[str]>
        return None

    def _usage_display_name(self) -> str:  # PAIR... or [PROMPT], as click writes them, not {PAIR}...
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")


def _plain(param):
    """Help shows each option's metavar (N, PATH, PAIR), never Typer's type placeholders."""
    if type(param) is TyperOption:
        param.__class__ = _PlainOption
    elif type(param) is TyperArgument:
        param.__class__ = _PlainArgument
    return param


class Group(TyperGroup):
    """specli's command group: whatever a command raises leaves the process through `report`
    (with SPECLI_DEBUG=1, as a traceback), in a terminal and under Typer's test runner alike."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            _plain(param)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        return option and _plain(option)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            code = super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                                **extra)
        except Exception as error:  # noqa: BLE001 - every error, by the table
            if debug_enabled():
                raise
            code = report(error)
        except KeyboardInterrupt as error:
            code = report(error)
        if standalone_mode:
            sys.exit(code or 0)
        return code


class Command(TyperCommand):
    """A command whose help shows no type placeholders (see _plain)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            _plain(param)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        return option and _plain(option)


app = typer.Typer(
    name="specli",
    cls=Group,
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
