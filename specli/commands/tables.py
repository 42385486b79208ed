"""Tables and reports as the commands print them: in a pipe every line is whole (for grep, tee
and copy), on a terminal they fit its width. Rich is imported when a table is printed, never
at a command's import."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import typer

WHOLE = 1000  # a pipe's width: lines are never cut or wrapped


def output_width() -> int | None:
    """COLUMNS when set, else the terminal's width; None when stdout is not a terminal."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def report_console():
    """A Rich console for a report on stdout. In a pipe, as wide as the lines need (Rich would
    squeeze them into 80 columns and cut the values short)."""
    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else WHOLE)


def home_path(path: Path | str) -> str:
    """A path as shown in a table: under the home folder, from `~`."""
    home, text = str(Path.home()), str(path)
    return "~" + text[len(home):] if home != "/" and text.startswith(home + "/") else text


def facts_table():
    """A two-column table of labels and their values, without borders or a header."""
    from rich.table import Table

    facts = Table(show_header=False, box=None, pad_edge=False)
    facts.add_column(style="bold", no_wrap=True)
    facts.add_column(overflow="fold")
    return facts


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]], paths: str = "specli list --local --json") -> None:
    """Rich's table, whole lines in a pipe; on a terminal too narrow for it, without its PATH
    column (`paths`: the command whose `--json` has them)."""
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    width = output_width()
    console = Console(width=width or WHOLE, highlight=False, soft_wrap=False)

    def table(columns: int) -> Table:
        """The first column (a name) folds where the width runs out; the others stay whole."""
        made = Table(box=None, pad_edge=False, header_style="bold")
        for index, name in enumerate(header[:columns]):
            if index == 0:
                made.add_column(name, overflow="fold", ratio=1)
            else:
                made.add_column(name, no_wrap=True, min_width=max(len(row[index]) for row in [header, *rows]))
        for row in rows:
            made.add_row(*row[:columns])
        return made

    whole = table(len(header))
    fits = Measurement.get(console, console.options.update_width(1 << 20), whole).maximum <= console.width
    cut = not fits and header[-1] == "PATH"
    echo_table(console, table(len(header) - 1) if cut else whole)
    if cut:
        typer.echo(f"file paths: {paths}")


def echo_table(console, table) -> None:
    """The table as `console` lays it out, echoed line by line without trailing spaces."""
    with console.capture() as captured:
        console.print(table)
    for line in captured.get().splitlines():
        typer.echo(line.rstrip())
