"""`specli drafts TARGET`: the models on this machine that can draft for a target, best first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from specli import drafts as kinds
from specli.commands.app import Command, app
from specli.errors import UsageError

if TYPE_CHECKING:
    from specli.llama.backend import LoadSettings
    from specli.models.local import Summary


@app.command("drafts", cls=Command)
def drafts(
    target: Annotated[str, typer.Argument(metavar="TARGET", help="A pair from `specli list` (downloaded), a GGUF path, "
                                                                 "ollama:NAME, or a Hub owner/repo:QUANT (its header only).")],
    *,
    as_json: Annotated[bool, typer.Option("--json", help="Print the candidates as JSON, for scripts.")] = False,
    hub: Annotated[bool, typer.Option("--hub", help="Also search the Hub for GGUFs of the target's family, checked from their headers (nothing is downloaded).")] = False,
    search: Annotated[str | None, typer.Option("--search", metavar="WORDS", help="With --hub: search for these words (default: the target's general.basename).")] = None,
    measure: Annotated[bool, typer.Option("--measure", help="Load each local draft with the target, measure its costs and agreement (as a first run does) and time it against plain decoding; the list then shows each one's speed-up.")] = False,
) -> None:
    """List the models that can draft for TARGET, best first (the first local one is what --draft auto takes)."""
    from specli.commands.options import default_load, stored_speedup
    from specli.models.local import draft_candidates, hub_candidates

    path = _target_file(target)
    load = default_load()
    if measure:
        _measure(path, target, load)

    def speedup(target_path: Path, draft: Path) -> float | None:
        return stored_speedup(target_path, draft, load)

    mine, candidates = draft_candidates(path, target, speedup)
    gains = {c.draft.path: speedup(Path(mine.path), Path(c.draft.path)) if isinstance(path, Path) else None
             for c in candidates}
    own = _own_layers(path, load)  # by kind: (the target's layers it drafts with, their stored speed-up)
    remote, problems = hub_candidates(mine, search) if hub else ([], [])
    for problem in problems:
        typer.echo(f"specli: {problem}", err=True)
    if as_json:
        listing = _listing(mine, candidates, gains, remote if hub else None)
        for name, (layers, gain) in own.items():
            listing[name] = {kinds.KINDS[name].own_field: layers, "speedup": gain}
        typer.echo(json.dumps(listing, indent=2))
        return
    _print_local(target, mine, candidates, gains, _what(next(iter(own), None)))
    for name, (layers, gain) in own.items():
        said = f"measured {gain:.2f}x" if gain is not None else \
            "no speed-up stored (its costs favoured no draft length)" if measure else "speed-up: --measure"
        typer.echo(f"{_what(name)}: {layers}, {said}; --draft {name} drafts with them")
    if hub:
        _print_hub(target, mine, remote)


def _what(kind: str | None) -> str:
    """What a kind drafts with, in words (None: n-gram lookup, which needs nothing)."""
    return kinds.KINDS[kind].help.split(": ", 1)[1] if kind is not None else "n-gram lookup"


def _own_layers(path: Path | Summary, load: LoadSettings) -> dict[str, tuple[int, float | None]]:
    """By draft kind: the target's own layers it drafts with, where this build can (a Hub file:
    none), and their stored speed-up."""
    from specli.commands.options import stored_speedup

    if not isinstance(path, Path):
        return {}
    return {name: (layers, stored_speedup(path, None, load, kind=name))
            for name, layers in kinds.own_layers(path).items()}


def _measure(path: Path | Summary, target: str, load: LoadSettings) -> None:
    """Load each local draft with the target and time it, storing its speed-up (pricing's);
    then each kind that drafts with the target's own layers."""
    from specli.models.local import Summary, draft_candidates
    from specli.session import SessionSpec, open_session

    if isinstance(path, Summary):  # a Hub file, judged from its header
        raise UsageError("--measure loads the target: give a downloaded one", "specli pull, or a GGUF path")
    _, found = draft_candidates(path, target)
    for candidate in found:
        typer.echo(f"specli: measuring {candidate.draft.name} with the target", err=True)
        with open_session(SessionSpec(path, Path(candidate.draft.path), load, load)) as session:
            session.pricing.measure_speedup(session.engine_for, kinds.MODEL.name)
    for name in kinds.own_layers(path):
        typer.echo(f"specli: measuring {_what(name)}", err=True)
        with open_session(SessionSpec(path, None, load, loads=(name,))) as session:
            session.pricing.measure_speedup(session.engine_for, name)


def _listing(mine: Summary, candidates: list, gains: dict, remote: list | None) -> dict:
    """The candidates as `--json` prints them (`remote`: the Hub's, with --hub)."""
    size = max(1, mine.size)  # a Hub file's size, where its listing gives none: 0
    listing = {"target": {"name": mine.name, "path": mine.path, "size_bytes": mine.size, "vocabulary": mine.family},
               "drafts": [{"name": c.draft.name, "store": c.draft.store, "path": c.draft.path,
                           "size_bytes": c.draft.size, "size_ratio": c.draft.size / size,
                           "through_text": c.through_text, "speedup": gains[c.draft.path]}
                          for c in candidates]}
    if remote is not None:
        listing["hub"] = [{"name": c.draft.name, "size_bytes": c.draft.size, "size_ratio": c.draft.size / size,
                           "through_text": c.through_text, "header_bytes_fetched": c.fetched} for c in remote]
    return listing


def _print_local(target: str, mine: Summary, candidates: list, gains: dict, fallback: str = "n-gram lookup") -> None:
    from specli.commands.tables import home_path, print_table
    from specli.models.hub import format_size

    if not candidates:
        typer.echo(f"no model on this machine shares {target}'s vocabulary ({mine.family}); "
                   f"--draft auto drafts with {fallback}", err=True)
        return
    size = max(1, mine.size)
    rows = [(c.draft.name, c.draft.store, format_size(c.draft.size), f"{c.draft.size / size:.0%}",
             "through text" if c.through_text else "same vocabulary",
             f"{gains[c.draft.path]:.2f}x" if gains[c.draft.path] is not None else "-", home_path(c.draft.path))
            for c in candidates]
    print_table(("DRAFT", "STORE", "SIZE", "OF TARGET", "DRAFTS", "SPEED-UP", "PATH"), rows,
                paths="specli drafts TARGET --json")
    if not any(gain is not None for gain in gains.values()):
        typer.echo("speed-ups: specli drafts TARGET --measure")


def _print_hub(target: str, mine: Summary, remote: list) -> None:
    from specli.commands.tables import print_table
    from specli.models.hub import format_size

    typer.echo("")
    if not remote:
        typer.echo(f"on the Hub: nothing found that shares {target}'s vocabulary")
        return
    size = max(1, mine.size)
    print_table(("ON THE HUB", "SIZE", "OF TARGET", "DRAFTS", "HEADER READ"),
                [(c.draft.name, format_size(c.draft.size), f"{c.draft.size / size:.0%}",
                  "through text" if c.through_text else "same vocabulary", format_size(c.fetched))
                 for c in remote])


def _target_file(target: str) -> Path | Summary:
    """A downloaded pair's target, a file or an Ollama model; else a Hub reference's summary,
    from its header read remotely. Nothing is downloaded."""
    from specli.errors import SpecliError
    from specli.models import hub
    from specli.models.local import remote_summary
    from specli.models.registry import load_registry
    from specli.models.resolve import model_file

    registry = load_registry()
    if target in registry.pairs:
        path, _ = hub.resolve_pair(registry.get(target), download=False)
        return path
    path = Path(target).expanduser()
    if path.is_file() or target.startswith("ollama:"):
        return model_file(target)
    cached = hub.cached_reference(target)
    if cached is not None:
        return cached
    remote = remote_summary(target) if "/" in target else None
    if remote is not None:
        return remote
    raise SpecliError(f"{target}: no such pair, file or Ollama model",
                      "give a pair from `specli list`, a GGUF path, ollama:NAME[:TAG] or a Hub owner/repo:QUANT")
