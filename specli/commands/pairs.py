"""`specli list` and `specli rm`: the known pairs, what is downloaded, and removing it; and
`specli list --local`, the GGUF models other tools keep on this machine.

The table is Rich's: in a pipe every line is whole (the target's path last, for grep); on a
terminal it fits the width, the path column going first, then the model names wrapping in
their cells. `--json` gives every file and path."""

from __future__ import annotations

import json
import textwrap
from typing import Annotated

import typer

from specli.commands.app import Command, app
from specli.commands.tables import WHOLE, echo_table, home_path, output_width, print_table

HEADER = ("PAIR", "TARGET", "DRAFT", "SIZE", "STATUS", "TARGET PATH")
DRAFTED_BY = ", drafted by "
THROUGH_TEXT = "*"  # ends the name of a draft with a vocabulary of its own
IMAGES = " (img)"  # ends the name of a local model with a projector beside it
THROUGH_TEXT_NOTE = "* drafts through text: its vocabulary is not the target's"


@app.command("list", cls=Command)
def list_pairs(
    *,
    as_json: Annotated[bool, typer.Option("--json", help="Print the pairs as JSON, for scripts.")] = False,
    check: Annotated[bool, typer.Option("--check", help="Check every pair's Hub files (names, sizes, pins), downloading nothing; exit 1 on a problem.")] = False,
    local: Annotated[bool, typer.Option("--local", help="List the GGUF models other tools keep here (Hugging Face cache, Ollama, LM Studio, llama.cpp) and the pairs they form.")] = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="With --local: say which stores are missing and what could not be read.")] = False,
) -> None:
    """List the known pairs: their models, sizes on disk, downloaded or not (--local: the models on this machine)."""
    from specli.models import hub
    from specli.models.registry import load_registry

    if local:
        list_local(as_json=as_json, verbose=verbose)
        return
    if check:
        report = hub.check_pairs(load_registry().pairs.values())
        print_check(report)
        raise typer.Exit(1 if report.problems else 0)
    statuses = [hub.pair_status(pair) for pair in load_registry().pairs.values()]
    if as_json:
        typer.echo(json.dumps([pair_json(status) for status in statuses], indent=2))
    else:
        print_pairs_table(statuses)


@app.command("rm", cls=Command)
def remove(
    pairs: Annotated[
        list[str],
        typer.Argument(metavar="PAIR", help="Names of the pairs whose downloaded files to delete."),
    ],
) -> None:
    """Delete a pair's downloaded files from the Hugging Face cache, keeping files other downloaded pairs use."""
    from specli.models import hub
    from specli.models.registry import load_registry

    registry = load_registry()
    for pair in [registry.get(name) for name in pairs]:
        removal = hub.plan_removal(pair, registry)
        for label, user in removal.kept:
            typer.echo(f"keeping {label}: the downloaded pair {user} uses it too", err=True)
        if not removal.entries:
            typer.echo(f"{pair.name}: no downloaded files to remove", err=True)
            continue
        size = hub.format_size(removal.freed)
        typer.echo(f"removing {pair.name}: {len(removal.entries)} file(s), freeing {size}", err=True)
        for path in hub.remove_files(removal):
            typer.echo(str(path))


def print_pairs_table(statuses, width: int | None = None) -> None:
    """One row per pair; a draft that drafts through text ends with `*`, and a line under the
    table says what that means. Where the whole table is wider than the terminal, the path
    column goes (`specli list --json` has it) and each pair's models share one column,
    "TARGET, drafted by DRAFT" without `.gguf`, which Rich wraps to the width."""
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    from specli.models import hub
    from specli.models.demo import embedded_model

    width = width if width is not None else output_width()
    console = Console(width=width or WHOLE, highlight=False, soft_wrap=False)
    rows, embedded = [], None
    for status in statuses:
        pair, target = status.pair, status.models[0]
        draft = model_name(status.models[1]) + (THROUGH_TEXT if pair.cross_vocabulary else "") \
            if len(status.models) > 1 else pair.draft_kind
        size = pair.download_size or (status.size if status.downloaded else None)
        rows.append((pair.name, model_name(target), draft, hub.format_size(size) if size else "-", status.state,
                     home_path(target.path) if target.path else "-"))
        if target.ref.package is not None and target.downloaded:
            embedded = embedded_model()
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in HEADER:
        table.add_column(name, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    unbounded = console.options.update_width(1 << 20)
    whole = Measurement.get(console, unbounded, table).maximum <= console.width
    if not whole:
        table = Table(box=None, pad_edge=False, header_style="bold")
        # The figures stay whole; the names wrap in their cells, the models first.
        table.add_column("PAIR", overflow="fold", ratio=1)
        table.add_column("TARGET, DRAFTED BY", overflow="fold", ratio=2)
        for index, name in enumerate(HEADER[3:5], start=3):
            table.add_column(name, no_wrap=True, min_width=max(len(row[index]) for row in [HEADER, *rows]))
        for pair, target, draft, size, state, _ in rows:
            table.add_row(pair, f"{_bare(target)}{DRAFTED_BY}{_bare(draft)}", size, state)
    echo_table(console, table)
    if any(status.pair.cross_vocabulary for status in statuses):
        for line in textwrap.wrap(THROUGH_TEXT_NOTE, width or len(THROUGH_TEXT_NOTE), subsequent_indent="  "):
            typer.echo(line)
    if embedded is not None and (not whole or not embedded.assembled):  # a row shows no path for it
        later = "" if embedded.assembled else " (written on first run)"
        typer.echo(f"embedded model: {home_path(embedded.path)}{later}")
    if not whole:
        typer.echo("file paths: specli list --json")


def _bare(name: str) -> str:
    """A model's name without `.gguf`, and a split model's without its part number."""
    from specli.models.registry import SPLIT_GGUF

    match = SPLIT_GGUF.match(name)
    if match:
        return match["stem"]
    mark = THROUGH_TEXT if name.endswith(THROUGH_TEXT) else ""
    name = name[: -len(mark)] if mark else name
    return (name[: -len(".gguf")] if name.lower().endswith(".gguf") else name) + mark


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
        "draft": models.get("draft", pair.draft_kind),
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


# --- specli list --local: the GGUF models other tools keep here, and the pairs they form ---


def list_local(*, as_json: bool, verbose: bool) -> None:
    from specli.models.hub import format_size
    from specli.models.local import local_models, pairs

    summaries, problems = local_models()
    found = pairs(summaries)
    if as_json:
        typer.echo(json.dumps({
            "models": [{"store": s.store, "name": s.name, "path": s.path, "size_bytes": s.size,
                        "architecture": s.architecture, "quantisation": s.quantisation, "vocabulary": s.family,
                        "projector": s.projector or None}
                       for s in summaries],
            "pairs": [{"target": p.target.name, "draft": p.draft.name, "through_text": p.through_text,
                       "target_path": p.target.path, "draft_path": p.draft.path} for p in found],
            "problems": problems}, indent=2))
        return
    if verbose:
        for problem in problems:
            typer.echo(f"specli: {problem}", err=True)
    elif any(not problem.startswith(tuple(f"{name}: no store" for name in ("hf", "ollama", "lmstudio", "llama.cpp")))
             for problem in problems):
        unread = sum(1 for problem in problems if ": no store at " not in problem)
        typer.echo(f"specli: {unread} file(s) or folder(s) could not be read (-v says which)", err=True)
    if not summaries:
        typer.echo("no GGUF models found in the Hugging Face cache, Ollama, LM Studio or llama.cpp's cache", err=True)
        return
    rows = [(s.name + (IMAGES if s.projector else ""), s.store, s.architecture, s.quantisation, format_size(s.size),
             s.family, home_path(s.path)) for s in summaries]
    print_table(("MODEL", "STORE", "ARCH", "QUANT", "SIZE", "VOCABULARY", "PATH"), rows)
    if any(s.projector for s in summaries):
        typer.echo(f"{IMAGES.strip()} takes images: a projector (mmproj) lies beside it")
    typer.echo("")
    if not found:
        typer.echo("no pairs: no two models share a vocabulary")
        return
    print_table(("TARGET", "DRAFT"), [(p.target.name, p.draft.name + (THROUGH_TEXT if p.through_text else ""))
                                      for p in found])
    if any(p.through_text for p in found):
        typer.echo("* drafts through text: its BOS/EOS settings are not the target's")

