"""`specli serve`: the pair behind an OpenAI-compatible HTTP API."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Optional

import typer

from specli.commands import options as opt
from specli.commands.app import Command, app

SERVER = "Server"


@app.command("serve", cls=Command)
@opt.with_options(opt.MODELS, opt.TEMPLATE_OPTIONS, opt.DRAFTING_OPTIONS, opt.SAMPLING_OPTIONS, opt.HARDWARE_OPTIONS)
def serve(
    ctx: typer.Context,
    *,
    host: Annotated[str, typer.Option("--host", metavar="HOST", rich_help_panel=SERVER, help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", metavar="PORT", callback=opt._check(lambda v: 0 <= v < 65536, "is not a port"), rich_help_panel=SERVER, help="Port (0: any free one).")] = 8080,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="SPECLI_API_KEY", metavar="KEY", show_envvar=False, rich_help_panel=SERVER, help="Require this bearer key (or SPECLI_API_KEY).")] = None,
    queue: Annotated[int, typer.Option("--queue", metavar="N", callback=opt._not_negative, rich_help_panel=SERVER, help="Requests that may wait; more get 503.")] = 8,
    memory: Annotated[bool, typer.Option("--memory/--no-memory", rich_help_panel=SERVER, help="N-gram lookup searches recent answers too.")] = True,
) -> None:
    """Serve the pair over an OpenAI-compatible HTTP API, with a chat page at /; sampling options are defaults a request may override."""
    from specli.serve.server import ServeSettings
    from specli.serve.server import serve as run_server

    from specli.llama import mtp

    models = opt.models(ctx.params)
    defaults = opt.generation_request(models, ctx.params, max_tokens=opt.NO_LIMIT)
    settings = ServeSettings(host, port, api_key or None, queue, memory, ctx.params["model"], defaults)
    spec = opt.session_spec(models, ctx.params)
    # A request may ask for draft "mtp" wherever the target's NextN layers can draft.
    spec = replace(spec, mtp=spec.mtp or (mtp.supports_mtp() and mtp.nextn_layers(spec.target) > 0))
    raise typer.Exit(run_server(spec, settings))
