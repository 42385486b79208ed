"""Views of the registry for people and scripts: the `pull --dry-run` plan, the `list`
table and its JSON, the `list --check` problems. Results go to stdout."""

from __future__ import annotations

import typer


def print_pull_plan(plan) -> None:
    from specli.models import hub

    typer.echo(plan.pair.name)
    for role, ref in plan.pair.models():
        if ref.repo is None:
            typer.echo(f"  {role:<6}  {ref.label}  local")
        for file in (file for file in plan.files if file.role == role):
            state = "cached" if file.cached or file.in_blobs else "download"
            typer.echo(f"  {role:<6}  {file.repo}/{file.filename}  {hub.format_size(file.size)}  {state}")
    if plan.pair.draft == "ngram":
        typer.echo("  draft   ngram (no model)")
    typer.echo(f"  to download: {hub.format_size(plan.download_size)}")


PAIRS_HEADER = ("PAIR", "TARGET", "DRAFT", "SIZE", "STATUS", "TARGET PATH")
NAME_COLUMNS = (1, 2)  # shortened when the table is too wide
SHORTEST_NAME = 20  # below this, the names go on a line of their own instead
DRAFTED_BY = ", drafted by "
GAP = "  "
THROUGH_TEXT = "*"  # ends the name of a draft with a vocabulary of its own; shortening keeps a name's end
THROUGH_TEXT_NOTE = "* drafts through text: its vocabulary is not the target's"


def print_pairs_table(statuses, width: int | None = None) -> None:
    """Aligned columns, the path last, one line per pair. Where the terminal is narrower, the path
    column goes and the model names are shortened in the middle (their quant stays); narrower still,
    each pair's models fold onto a second line. No line is wider than the terminal (a path aside);
    in a pipe, lines are whole, for grep. A draft that drafts through text ends with `*`, and a
    line under the table says what that means."""
    from specli.models import hub

    width = width if width is not None else output_width()
    rows = [PAIRS_HEADER]
    embedded = None
    for status in statuses:
        pair, target = status.pair, status.models[0]
        draft = pair.draft if pair.draft == "ngram" else model_name(status.models[1])
        size = pair.download_size or (status.size if status.downloaded else None)
        rows.append((pair.name, model_name(target), draft, hub.format_size(size) if size else "-", status.state,
                     _home(target.path) if target.path else "-"))
        if target.ref.package is not None and target.downloaded:
            from specli.models.demo import embedded_model

            embedded = embedded_model()
    through_text = [status.pair.cross_vocabulary for status in statuses]
    marked = _marked(rows, through_text)
    if width is None or _line_width(_column_widths(marked)) <= width:
        _print_table(marked, _column_widths(marked)[:-1])
        _print_note(through_text, width)
        if embedded is not None and not embedded.assembled:  # its row shows no path
            typer.echo(f"embedded model: {_home(embedded.path)} (written on first run)")
        return
    rows = [rows[0][:-1]] + [(row[0], _bare(row[1]), _bare(row[2]), *row[3:-1]) for row in rows[1:]]
    marked = _marked(rows, through_text)
    widths = _fitted_widths(marked, width, NAME_COLUMNS, SHORTEST_NAME)
    if _line_width(widths) <= width:
        _print_table(marked, widths)
    else:
        _print_folded(marked, width)
    _print_note(through_text, width)
    if embedded is not None:
        later = "" if embedded.assembled else " (written on first run)"
        typer.echo(f"embedded model: {_home(embedded.path)}{later}")
    typer.echo("file paths: specli list --json")


def output_width() -> int | None:
    """COLUMNS when set, else the terminal's width; None when stdout is not a terminal."""
    import os
    import shutil
    import sys

    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def _marked(rows, through_text: list[bool]):
    """The rows with THROUGH_TEXT after the name of each draft that drafts through text."""
    return [rows[0]] + [(*row[:2], row[2] + THROUGH_TEXT, *row[3:]) if through else row
                        for row, through in zip(rows[1:], through_text)]


def _print_note(through_text: list[bool], width: int | None) -> None:
    import textwrap

    if any(through_text):
        for line in textwrap.wrap(THROUGH_TEXT_NOTE, width or len(THROUGH_TEXT_NOTE), subsequent_indent="  "):
            typer.echo(line)


def _print_table(rows, widths: list[int]) -> None:
    for row in rows:
        typer.echo(_line(row, widths))


def _print_folded(rows, width: int) -> None:
    """PAIR, SIZE and STATUS on one line; the target and its draft on the next, indented."""
    short = [(row[0], row[3], row[4]) for row in rows]
    widths = _fitted_widths(short, width, (0,), len(PAIRS_HEADER[0]))
    typer.echo(_line(short[0], widths))
    room = width - len(GAP) - len(DRAFTED_BY)
    for row, line in zip(rows[1:], short[1:]):
        typer.echo(_line(line, widths))
        target, draft = _share(row[1], row[2], room)
        typer.echo(f"{GAP}{target}{DRAFTED_BY}{draft}")


def _line(row, widths: list[int]) -> str:
    """Each cell padded to its column's width, or shortened to it; a cell beyond the widths as is."""
    cells = [_shorten(cell, width).ljust(width) for cell, width in zip(row, widths)]
    return GAP.join([*cells, *row[len(widths):]]).rstrip()


def _column_widths(rows) -> list[int]:
    return [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]


def _line_width(widths: list[int]) -> int:
    return sum(widths) + len(GAP) * (len(widths) - 1)


def _fitted_widths(rows, width: int, shrinkable: tuple[int, ...], floor: int) -> list[int]:
    """Column widths for `width`: the widest shrinkable column loses a character at a time, down to `floor`."""
    widths = _column_widths(rows)
    excess = _line_width(widths) - width
    while excess > 0:
        column = max(shrinkable, key=lambda index: widths[index])
        if widths[column] <= floor:
            break
        widths[column] -= 1
        excess -= 1
    return widths


def _share(first: str, second: str, room: int) -> tuple[str, str]:
    """Two names in `room` characters: the longer one shortened first."""
    lengths = [len(first), len(second)]
    while sum(lengths) > room and max(lengths) > 8:
        lengths[lengths.index(max(lengths))] -= 1
    return _shorten(first, lengths[0]), _shorten(second, lengths[1])


def _shorten(text: str, width: int) -> str:
    """`qwen2.5-7b…q4_k_m`: the start and the end of a name, which hold the model and the quant."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def _bare(name: str) -> str:
    """A model's name without `.gguf`, and a split model's without its part number."""
    from specli.models.registry import SPLIT_GGUF

    match = SPLIT_GGUF.match(name)
    if match:
        return match["stem"]
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def _home(path) -> str:
    from pathlib import Path

    home, text = str(Path.home()), str(path)
    return "~" + text[len(home):] if home != "/" and text.startswith(home + "/") else text


def model_name(model) -> str:
    """The file name of a model: the Hub file, the local file, or the embedded model's."""
    ref = model.ref
    if ref.file:
        return ref.file
    if ref.path:
        return ref.path.name
    return model.files[0].filename if model.files else f"package {ref.package}"


def pair_json(status) -> dict:
    pair = status.pair
    models = {model.role: model_json(model) for model in status.models}
    return {
        "name": pair.name,
        "description": pair.description,
        "status": status.state,
        "size_bytes": status.size,
        "download_bytes": pair.download_size,
        "draft_tokens": pair.draft_tokens,
        "cross_vocabulary": pair.cross_vocabulary,
        "target": models["target"],
        "draft": models.get("draft", pair.draft),
    }


def model_json(model) -> dict:
    return {
        "source": model.ref.model_dump(mode="json", exclude_none=True),
        "downloaded": model.downloaded,
        "path": str(model.path) if model.path else None,
        "size_bytes": model.size,
        "files": [
            {"file": file.filename, "path": str(file.path) if file.path else None, "size_bytes": file.size}
            for file in model.files
        ],
    }


def print_check(report) -> None:
    """One line per problem on stdout; the count on stderr."""
    for problem in report.problems:
        typer.echo(problem)
    count = len(report.problems)
    typer.echo(f"checked {report.files} file(s) of {report.pairs} pair(s) against {report.endpoint}: "
               f"{count} problem{'' if count == 1 else 's'}", err=True)
