"""`specli drafts TARGET`: the models on this machine that can draft for a target, best first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from specli.commands.app import Command, app


@app.command("drafts", cls=Command)
def drafts(
    target: Annotated[str, typer.Argument(metavar="TARGET",
                                          help="A pair from `specli list` (downloaded), a GGUF path, or ollama:NAME.")],
    *,
    as_json: Annotated[bool, typer.Option("--json", help="Print the candidates as JSON, for scripts.")] = False,
) -> None:
    """List the local models that can draft for TARGET, best first (the first is what --draft auto takes)."""
    from specli.commands.pairs import _home, _local_table
    from specli.models.hub import format_size
    from specli.models.local import draft_candidates

    path = _target_file(target)
    mine, candidates = draft_candidates(path, target)
    if as_json:
        typer.echo(json.dumps({"target": {"name": mine.name, "path": mine.path, "size_bytes": mine.size,
                                          "vocabulary": mine.family},
                               "drafts": [{"name": c.draft.name, "store": c.draft.store, "path": c.draft.path,
                                           "size_bytes": c.draft.size, "size_ratio": c.draft.size / mine.size,
                                           "through_text": c.through_text} for c in candidates]}, indent=2))
        return
    if not candidates:
        typer.echo(f"no model on this machine shares {target}'s vocabulary ({mine.family}); "
                   "--draft auto drafts with n-gram lookup", err=True)
        return
    rows = [(c.draft.name, c.draft.store, format_size(c.draft.size), f"{c.draft.size / mine.size:.0%}",
             "through text" if c.through_text else "same vocabulary", _home(c.draft.path)) for c in candidates]
    _local_table(("DRAFT", "STORE", "SIZE", "OF TARGET", "DRAFTS", "PATH"), rows)


def _target_file(target: str) -> Path:
    """A downloaded pair's target, a file, or an Ollama model: nothing is downloaded."""
    from specli.errors import SpecliError
    from specli.models import hub
    from specli.models.registry import load_registry
    from specli.models.resolve import model_file

    registry = load_registry()
    if target in registry.pairs:
        path, _ = hub.resolve_pair(registry.get(target), download=False)
        return path
    path = Path(target).expanduser()
    if path.is_file() or target.startswith("ollama:"):
        return model_file(target)
    raise SpecliError(f"{target}: no such pair, file or Ollama model",
                      "give a pair from `specli list`, a GGUF path, or ollama:NAME[:TAG]")
