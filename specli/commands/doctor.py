"""`specli doctor`: the installation (llama.cpp build, GPU support, devices, caches, registry,
rpc-servers) and, with a model, its stored costs."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from specli.commands import options as opt
from specli.commands.app import Command, app
from specli.commands.tables import report_console


@app.command("doctor", cls=Command)
@opt.with_options(opt.MODELS, opt.HARDWARE_OPTIONS)
def doctor(
    ctx: typer.Context,
    *,
    calibrate: Annotated[bool, typer.Option("--calibrate", rich_help_panel=opt.MODEL, help="Measure a model's costs now and store them (the embedded model without -m/--target).")] = False,
    as_json: Annotated[bool, typer.Option("--json", rich_help_panel=opt.OUTPUT, help="Print the report as one JSON object, for scripts.")] = False,
) -> None:
    """Check the installation: llama.cpp build and GPU support, devices, caches, registry; with a model, its costs."""
    from specli.doctor import check_model, diagnose, print_report
    from specli.render import notifier

    params = ctx.params
    report = diagnose(params["rpc"] or ())  # --rpc: these servers are checked too
    if params["model"] is not None or params["target"] is not None or calibrate:
        models = opt.models(params)
        report.model = check_model(opt.session_spec(models, params), calibrate, notifier(sys.stderr, quiet=as_json))
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        print_report(report, report_console())
    raise typer.Exit(1 if report.problems else 0)
