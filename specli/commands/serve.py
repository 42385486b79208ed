"""`specli serve`: the pair behind an OpenAI-compatible HTTP API."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Annotated, Optional

import typer

from specli import drafts
from specli.commands import options as opt
from specli.commands.app import Command, app

SERVER = "Server"


@app.command("serve", cls=Command)
@opt.with_options(opt.MODELS, opt.TEMPLATE_OPTIONS, opt.VISION_OPTIONS, opt.DRAFTING_OPTIONS, opt.SAMPLING_OPTIONS,
                  opt.HARDWARE_OPTIONS)
def serve(
    ctx: typer.Context,
    *,
    host: Annotated[str, typer.Option("--host", metavar="HOST", rich_help_panel=SERVER, help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", metavar="PORT", callback=opt.check(lambda v: 0 <= v < 65536, "is not a port"), rich_help_panel=SERVER, help="Port (0: any free one).")] = 8080,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="SPECLI_API_KEY", metavar="KEY", show_envvar=False, rich_help_panel=SERVER, help="Require this bearer key (or SPECLI_API_KEY).")] = None,
    parallel: Annotated[Optional[int], typer.Option("-np", "--parallel", metavar="N", callback=opt.positive, rich_help_panel=SERVER, help="Requests generated at once, one decode a step, each with -c positions (default 4; 1 where chained MTP layers draft).")] = None,
    queue: Annotated[int, typer.Option("--queue", metavar="N", callback=opt.not_negative, rich_help_panel=SERVER, help="Requests that may wait; more get 503.")] = 8,
    memory: Annotated[bool, typer.Option("--memory/--no-memory", rich_help_panel=SERVER, help="N-gram lookup searches recent answers too.")] = True,
    metrics: Annotated[bool, typer.Option("--metrics", rich_help_panel=SERVER, help="Serve Prometheus metrics at /metrics.")] = False,
    allow_image_urls: Annotated[bool, typer.Option("--allow-image-urls", rich_help_panel=SERVER, help="Fetch the http(s) image URLs requests name (off: data: URLs only; the server fetches what a client names).")] = False,
    allow_host: Annotated[Optional[list[str]], typer.Option("--allow-host", metavar="NAME", rich_help_panel=SERVER, help="Also answer requests whose Host is NAME (repeatable; * any). IP addresses, localhost and this machine's name are always answered.")] = None,
    allow_origin: Annotated[Optional[list[str]], typer.Option("--allow-origin", metavar="ORIGIN", rich_help_panel=SERVER, help="Let web pages from ORIGIN (https://app.example) use the API (repeatable; * any). The page at / and pages on localhost always may.")] = None,
) -> None:
    """Serve the pair over an OpenAI-compatible HTTP API, with a chat page at /; sampling options are defaults a request may override."""
    from specli.render import notifier
    from specli.serve.guard import Access
    from specli.serve.server import ServeSettings
    from specli.serve.server import serve as run_server

    models = opt.models(ctx.params)
    # what a request may ask to draft with
    spec = drafts.for_server(opt.session_spec(models, ctx.params), notifier(sys.stderr))
    alone = opt.drafting_alone(spec)  # chained NextN layers: one sequence only
    parallel = parallel or opt.default_parallel(spec, alone=True)
    if parallel > 1 and alone:
        models = opt.beside_others(models, alone, parallel, notifier(sys.stderr))
        spec = opt.session_spec(models, ctx.params)
    spec = opt.conversing(spec)
    spec = replace(spec, target_load=replace(spec.target_load, sequences=parallel),
                   draft_load=replace(spec.draft_load, sequences=parallel))
    spec = opt.with_projector(spec, models, needed=False, notice=notifier(sys.stderr))
    defaults = opt.generation_request(models, ctx.params, max_tokens=opt.NO_LIMIT)
    access = Access(hosts=tuple(allow_host or ()), origins=tuple(origin.rstrip("/") for origin in allow_origin or ()))
    settings = ServeSettings(host, port, api_key or None, queue, memory, ctx.params["model"], defaults, access,
                             metrics, allow_image_urls)
    raise typer.Exit(run_server(spec, settings))
