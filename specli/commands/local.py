"""`specli list --local`: the GGUF models other tools keep on this machine, and the pairs they form."""

from __future__ import annotations

import json

import typer

from specli.commands.pairs import _home, output_width

THROUGH_TEXT = "*"


def list_local(*, as_json: bool, verbose: bool) -> None:
    from specli.models.hub import format_size
    from specli.models.local import local_models, pairs

    summaries, problems = local_models()
    found = pairs(summaries)
    if as_json:
        typer.echo(json.dumps({
            "models": [{"store": s.store, "name": s.name, "path": s.path, "size_bytes": s.size,
                        "architecture": s.architecture, "quantisation": s.quantisation, "vocabulary": s.family}
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
    rows = [(s.name, s.store, s.architecture, s.quantisation, format_size(s.size), s.family, _home(s.path))
            for s in summaries]
    _table(("MODEL", "STORE", "ARCH", "QUANT", "SIZE", "VOCABULARY", "PATH"), rows)
    typer.echo("")
    if not found:
        typer.echo("no pairs: no two models share a vocabulary")
        return
    _table(("TARGET", "DRAFT"), [(p.target.name, p.draft.name + (THROUGH_TEXT if p.through_text else ""))
                                 for p in found])
    if any(p.through_text for p in found):
        typer.echo("* drafts through text: its BOS/EOS settings are not the target's")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    from rich.console import Console
    from rich.table import Table

    width = output_width()
    console = Console(width=width or 1000, highlight=False, soft_wrap=False)
    table = Table(box=None, pad_edge=False, header_style="bold")
    for index, name in enumerate(header):
        table.add_column(name, overflow="fold", no_wrap=width is None)
    for row in rows:
        table.add_row(*row)
    with console.capture() as captured:
        console.print(table)
    for line in captured.get().splitlines():
        typer.echo(line.rstrip())
