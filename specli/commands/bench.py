"""`specli bench`: plain against speculative decoding on the same prompts, in one process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from specli.commands import options as opt
from specli.commands.app import Command, app
from specli.commands.tables import report_console
from specli.decode.request import AUTO, DraftKind
from specli.errors import UsageError


@app.command("bench", cls=Command)
@opt.with_options(opt.MODELS, opt.DRAFTING_OPTIONS, opt.SAMPLING_OPTIONS, opt.HARDWARE_OPTIONS)
def bench(
    ctx: typer.Context,
    *,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", metavar="PATH", rich_help_panel=opt.MODEL, help="Workloads: a TOML file of [\\[workload]] tables (default: the shipped ones).")] = None,
    draft_tokens: opt.DraftTokensList = f"{AUTO},2,4,8,16",
    runs: Annotated[int, typer.Option("--runs", metavar="N", callback=opt._positive, rich_help_panel=opt.SAMPLING, help="Measured runs of each configuration, after a warm-up.")] = 5,
    max_tokens: Annotated[Optional[int], typer.Option("-n", "--max-tokens", metavar="N", callback=opt._positive, rich_help_panel=opt.SAMPLING, help="Override every workload's token budget.")] = None,
    json_output: Annotated[bool, typer.Option("--json", rich_help_panel=opt.OUTPUT, help="The report as one JSON object.")] = False,
    verify_on_device: opt.VerifyOnDevice = False,
) -> None:
    """Compare plain and speculative decoding on the same prompts: tok/s, speedup, acceptance, recommended K."""
    # Greedy runs (the default) are checked against plain's text too; sampled runs are keyed
    # by --seed (0 when not given), so every configuration draws the same tokens.
    from specli.bench import benchmark, load_workloads, print_progress, render_report

    models = opt.models(ctx.params)
    if models.draft is DraftKind.NONE:
        raise UsageError("bench compares against plain decoding by itself: give --draft a model file or ngram")
    spec = opt.session_spec(models, ctx.params)
    request = opt.generation_request(models, {**ctx.params, "draft_tokens": AUTO, "seed": ctx.params["seed"] or 0},
                                     max_tokens=opt.DEFAULT_MAX_TOKENS)
    report = benchmark(spec, request, load_workloads(prompts), draft_tokens, runs, max_tokens,
                       progress=None if json_output else print_progress)
    if json_output:
        typer.echo(json.dumps(report, indent=1))
    else:
        render_report(report, report_console())
