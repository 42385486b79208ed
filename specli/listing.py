"""Views of the registry for people and scripts: the `pull --dry-run` plan, the `list`
table and its JSON, the `list --check` problems. Results go to stdout."""

from __future__ import annotations

import typer


def print_pull_plan(plan) -> None:
    from specli import hub

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


def print_pairs_table(statuses) -> None:
    """Aligned columns, never wrapped, the path last: readable in a terminal and with grep."""
    from pathlib import Path

    from specli import hub

    rows = [("PAIR", "TARGET", "DRAFT", "SIZE", "STATUS", "TARGET PATH")]
    for status in statuses:
        pair, target = status.pair, status.models[0]
        draft = pair.draft if pair.draft == "ngram" else model_short_name(pair.draft)
        size = hub.format_size(status.size) if status.size else "-"
        path = str(target.path).replace(str(Path.home()), "~", 1) if target.path else "-"
        rows.append((pair.name, model_short_name(pair.target), draft, size, status.state, path))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)]
        typer.echo("  ".join([*cells, row[-1]]).rstrip())


def model_short_name(ref) -> str:
    if ref.file:
        return ref.file
    return ref.path.name if ref.path else f"package {ref.package}"


def pair_json(status) -> dict:
    pair = status.pair
    models = {model.role: model_json(model) for model in status.models}
    return {
        "name": pair.name,
        "description": pair.description,
        "status": status.state,
        "size_bytes": status.size,
        "draft_tokens": pair.draft_tokens,
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
