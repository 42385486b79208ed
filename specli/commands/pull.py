"""`specli pull`: download a pair's target, draft and projector into the Hugging Face cache."""

from __future__ import annotations

from typing import Annotated

import typer

from specli.commands.app import Command, app


@app.command("pull", cls=Command)
def pull(
    pairs: Annotated[
        list[str],
        typer.Argument(metavar="PAIR", help="Names of the pairs to download, as `specli list` shows them."),
    ],
    *,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Show what would be downloaded, with sizes, and download nothing."),
    ] = False,
) -> None:
    """Download the target, draft and image projector of each pair into the Hugging Face cache; print their paths."""
    from specli.models import hub
    from specli.models.registry import load_registry

    registry = load_registry()
    for pair in [registry.get(name) for name in pairs]:
        if dry_run:
            print_pull_plan(hub.plan_pull(pair))
            continue
        target, draft = hub.pull_pair(pair)
        typer.echo(str(target))
        if draft is not None:
            typer.echo(str(draft))
        if pair.projector is not None:  # pulled with the target
            typer.echo(str(hub.resolve_model(pair.projector, download=False, pair_name=pair.name)))


def print_pull_plan(plan) -> None:
    """Each file of the pair, its size, and whether it is cached; then what is left to download."""
    from specli.models import hub
    from specli.models.registry import ModelRef

    typer.echo(plan.pair.name)
    for role, ref in plan.pair.models():
        if ref.repo is None:
            typer.echo(f"  {role:<6}  {ref.label}  local")
        for file in (file for file in plan.files if file.role == role):
            state = "cached" if file.cached or file.in_blobs else "download"
            typer.echo(f"  {role:<6}  {file.repo}/{file.filename}  {hub.format_size(file.size)}  {state}")
    if not isinstance(plan.pair.draft, ModelRef):
        typer.echo(f"  draft   {plan.pair.draft_kind} (no model)")
    typer.echo(f"  to download: {hub.format_size(plan.download_size)}")
