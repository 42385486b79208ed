"""Typer declarations. Each command hands off to library code; every error becomes one line
and an exit code in one place (`ERRORS`, applied by `Group.main`)."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from specli import __version__
from specli.commands import options as opt
from specli.config import debug_enabled
from specli.errors import SpecliError, UsageError

DEFAULT_MAX_TOKENS = 256

# --- errors: one table, applied once ------------------------------------------------

# Typer's exceptions come from the click it uses (its own copy in recent releases).
_click = sys.modules[typer.BadParameter.__module__]


def _internal(error: BaseException) -> tuple[str, str | None, int]:
    return (f"internal error: {type(error).__name__}: {error}",
            "rerun with SPECLI_DEBUG=1 for the traceback, and report it", 1)


def _usage(error) -> tuple[str, str | None, int]:
    context = getattr(error, "ctx", None)
    return error.format_message(), f"see `{context.command_path} --help`" if context is not None else None, error.exit_code


# (exception type, what it says: message, hint, exit code), the first match wins. A message
# of None prints nothing (the help is already on the screen).
ERRORS: tuple[tuple[type[BaseException], Callable[[BaseException], tuple[str | None, str | None, int]]], ...] = (
    (SpecliError, lambda error: (error.message, error.hint, error.exit_code)),  # type: ignore[attr-defined]
    (getattr(_click, "NoArgsIsHelpError", ()), lambda error: (None, None, 2)),
    (_click.ClickException, _usage),
    (typer.Abort, lambda error: ("aborted", None, 1)),
    (KeyboardInterrupt, lambda error: ("interrupted", None, 130)),
    (Exception, _internal),
)


def report(error: BaseException) -> int:
    """One line on stderr for `error`, by ERRORS; returns the exit code."""
    for kind, describe in ERRORS:
        if kind and isinstance(error, kind):
            message, hint, code = describe(error)
            if message is not None:
                print(f"specli: error: {message}" + (f" (hint: {hint})" if hint else ""), file=sys.stderr)
            return code
    raise error


class _PlainOption(TyperOption):
    def display_type_rich(self, ctx):  # a flag shows no <bool>
        return None if self.is_flag else super().display_type_rich(ctx)


class _PlainArgument(TyperArgument):
    def display_type_rich(self, ctx):  # the metavar says it: no <list[str]>
        return None

    def _usage_display_name(self) -> str:  # PAIR... or [PROMPT], as click writes them, not {PAIR}...
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")


def _plain(param):
    """Help shows each option's metavar (N, PATH, PAIR), never Typer's type placeholders."""
    if type(param) is TyperOption:
        param.__class__ = _PlainOption
    elif type(param) is TyperArgument:
        param.__class__ = _PlainArgument
    return param


class Group(TyperGroup):
    """specli's command group: whatever a command raises leaves the process through `report`
    (with SPECLI_DEBUG=1, as a traceback), in a terminal and under Typer's test runner alike."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            _plain(param)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        return option and _plain(option)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            code = super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                                **extra)
        except Exception as error:  # noqa: BLE001 - every error, by the table
            if debug_enabled():
                raise
            code = report(error)
        except KeyboardInterrupt as error:
            code = report(error)
        if standalone_mode:
            sys.exit(code or 0)
        return code


class Command(TyperCommand):
    """A command whose help shows no type placeholders (see _plain)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            _plain(param)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        return option and _plain(option)


app = typer.Typer(
    name="specli",
    cls=Group,
    help="Local speculative generation: a small draft proposes tokens, the target verifies them in one pass.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _report_console():
    """A Rich console for a report on stdout. In a pipe, as wide as the lines need (Rich would
    squeeze them into 80 columns and cut the values short), for grep, tee and copy."""
    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else 1000)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"specli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    """Local speculative generation with llama.cpp."""


# --- run / chat --------------------------------------------------------------------


class ColorMode(str, Enum):
    auto = "auto"
    always = "always"
    never = "never"


@app.command("run", cls=Command)
@app.command("chat", cls=Command, help="Chat with the target, turn by turn: the same options as run, and no prompt.")
def run(
    ctx: typer.Context,
    prompt: Annotated[
        Optional[str],
        typer.Argument(metavar="PROMPT", show_default=False,
                       help="The prompt; - reads stdin (read too when stdin is piped). None on a terminal: a chat."),
    ] = None,
    *,
    prompt_option: Annotated[Optional[str], typer.Option("-p", "--prompt", metavar="TEXT", rich_help_panel=opt.MODEL, help="The prompt, as llama.cpp takes it.")] = None,
    file: Annotated[Optional[Path], typer.Option("-f", "--file", metavar="PATH", rich_help_panel=opt.MODEL, help="Read the prompt from this file.")] = None,
    model: opt.Pair = None,
    target: opt.Target = None,
    draft: opt.Draft = None,
    chat: Annotated[Optional[bool], typer.Option("--chat/--no-chat", rich_help_panel=opt.MODEL, help="Use the target's chat template (default: if it has one).")] = None,
    system: Annotated[Optional[str], typer.Option("--system", metavar="TEXT", rich_help_panel=opt.MODEL, help="System message for chat models.")] = None,
    draft_tokens: opt.DraftTokensOption = None,
    draft_min_p: opt.DraftMinP = 0.0,
    exact: opt.Exact = False,
    no_ngram: opt.NoLookup = False,
    max_tokens: Annotated[Optional[int], typer.Option("-n", "--max-tokens", "--n-predict", metavar="N", callback=opt._positive, rich_help_panel=opt.SAMPLING, help="Tokens to write (default 256; a chat: no limit).")] = None,
    temp: opt.Temperature = 0.0,
    top_k: opt.TopK = opt.DEFAULT_TOP_K,
    top_p: opt.TopP = opt.DEFAULT_TOP_P,
    min_p: opt.MinP = opt.DEFAULT_MIN_P,
    repeat_penalty: opt.RepeatPenalty = 1.0,
    repeat_last_n: opt.RepeatLastN = 64,
    seed: opt.Seed = None,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", metavar="TEXT", rich_help_panel=opt.SAMPLING, help="Stop at this text, not printed (repeatable).")] = None,
    color: Annotated[ColorMode, typer.Option("--color", metavar="WHEN", rich_help_panel=opt.OUTPUT, help="auto, always or never.")] = ColorMode.auto,
    json_output: Annotated[bool, typer.Option("--json", rich_help_panel=opt.OUTPUT, help="JSON Lines: each token, then stats.")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", rich_help_panel=opt.OUTPUT, help="No legend and no stats line.")] = False,
    verbose: opt.Verbose = False,
    gpu_layers: opt.GpuLayers = None,
    draft_gpu_layers: opt.DraftGpuLayers = None,
    ctx_size: opt.CtxSize = opt.DEFAULT_CTX_SIZE,
    threads: opt.Threads = None,
    repack: opt.Repack = True,
    rpc: opt.Servers = None,
    draft_rpc: opt.DraftServers = None,
) -> None:
    """Generate text: the draft proposes, the target verifies, and the output is the target's own."""
    from specli.models import resolve
    from specli.commands import runner
    from specli.decode.engine import GenerationOptions
    from specli.prompt import read_prompt

    if prompt_option is not None:
        if prompt is not None:
            raise UsageError("give the prompt either as an argument or with -p, not both")
        prompt = prompt_option
    conversation = ctx.info_name == "chat" or (prompt is None and file is None and sys.stdin.isatty())
    if conversation and json_output:
        raise UsageError("--json needs a prompt: a chat is for people", 'specli run --json "prompt"')
    text = None if conversation else read_prompt(prompt, file, sys.stdin)
    k = opt.parse_draft_tokens(draft_tokens)
    resolve.check_draft_spelling(draft)
    models = resolve.resolve_models(model, target, draft)
    hardware = opt.Hardware(gpu_layers, draft_gpu_layers, ctx_size, threads, repack, rpc or (), draft_rpc or ())
    sampling = opt.sampling_settings(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n)
    spec = opt.session_spec(models, hardware, sampling, seed=seed, drafting=opt.Drafting(draft_min_p, exact, not no_ngram),
                            verbose=verbose)
    if hardware.asks_for_gpu:
        runner.warn_without_gpu(sys.stderr)
    if not quiet and not json_output:
        resolve.warn_if_self_drafting(spec, sys.stderr)
    limit = max_tokens or (1 << 30 if conversation else DEFAULT_MAX_TOKENS)
    options = GenerationOptions(limit, sampling, tuple(stop or ()))
    output = runner.Output(color.value, json_output, quiet)
    if text is None:
        from specli.commands.chat import chat as converse

        code = converse(spec, options, opt.draft_tokens_for(k, models), output, system)
    else:
        code = runner.execute(spec, runner.Prompt(text, system, chat), options, opt.draft_tokens_for(k, models), output)
    raise typer.Exit(code)


# --- models: pull / list / rm ----------------------------------------------


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
    """Download the target and draft of each pair into the Hugging Face cache; print their paths."""
    from specli.models import hub
    from specli.commands import listing
    from specli.models.registry import load_registry

    registry = load_registry()
    for pair in [registry.get(name) for name in pairs]:
        if dry_run:
            listing.print_pull_plan(hub.plan_pull(pair))
            continue
        target, draft = hub.pull_pair(pair)
        typer.echo(str(target))
        if isinstance(draft, Path):
            typer.echo(str(draft))


@app.command("list", cls=Command)
def list_pairs(
    *,
    as_json: Annotated[bool, typer.Option("--json", help="Print the pairs as JSON, for scripts.")] = False,
    check: Annotated[bool, typer.Option("--check", help="Check every pair's Hub files (names, sizes, pins), downloading nothing; exit 1 on a problem.")] = False,
) -> None:
    """List the known pairs: their models, sizes on disk, and whether they are downloaded."""
    import json

    from specli.models import hub
    from specli.commands import listing
    from specli.models.registry import load_registry

    if check:
        report = hub.check_pairs(load_registry().pairs.values())
        listing.print_check(report)
        raise typer.Exit(1 if report.problems else 0)
    statuses = [hub.pair_status(pair) for pair in load_registry().pairs.values()]
    if as_json:
        typer.echo(json.dumps([listing.pair_json(status) for status in statuses], indent=2))
    else:
        listing.print_pairs_table(statuses)


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


# --- doctor / bench ----------------------------------------------------------------


@app.command("doctor", cls=Command)
def doctor(
    *,
    model: Annotated[Optional[str], typer.Option("-m", "--model", metavar="PAIR", rich_help_panel=opt.MODEL, help="Also report this pair's stored verify costs and exact batch sizes.")] = None,
    target: Annotated[Optional[str], typer.Option("--target", metavar="MODEL", rich_help_panel=opt.MODEL, help="... or this GGUF's (or Hub owner/repo:QUANT's).")] = None,
    draft: opt.Draft = None,
    calibrate: Annotated[bool, typer.Option("--calibrate", rich_help_panel=opt.MODEL, help="Measure them now and store them (the embedded model without -m/--target).")] = False,
    as_json: Annotated[bool, typer.Option("--json", rich_help_panel=opt.OUTPUT, help="Print the report as one JSON object, for scripts.")] = False,
    gpu_layers: opt.GpuLayers = None,
    draft_gpu_layers: opt.DraftGpuLayers = None,
    ctx_size: opt.CtxSize = opt.DEFAULT_CTX_SIZE,
    threads: opt.Threads = None,
    repack: opt.Repack = True,
    rpc: Annotated[Optional[str], typer.Option("--rpc", metavar="LIST", callback=opt._servers, rich_help_panel=opt.HARDWARE, help="Check these llama.cpp rpc-servers, HOST:PORT,... (with a model: its costs over them).")] = None,
    draft_rpc: opt.DraftServers = None,
) -> None:
    """Check the installation: llama.cpp build and GPU support, devices, caches, registry; with a model, its costs."""
    import json

    from specli.doctor import check_model, diagnose, print_report
    from specli.render import notifier

    report = diagnose(rpc or ())
    if model is not None or target is not None or calibrate:
        from specli.models import resolve
        from specli.decode.sampling import SamplingSettings

        models = resolve.resolve_models(model, target, draft or "ngram")
        hardware = opt.Hardware(gpu_layers, draft_gpu_layers, ctx_size, threads, repack, rpc or (), draft_rpc or ())
        spec = opt.session_spec(models, hardware, SamplingSettings())
        report.model = check_model(spec, calibrate, notifier(sys.stderr, quiet=as_json))
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        print_report(report, _report_console())
    raise typer.Exit(1 if report.problems else 0)


@app.command("bench", cls=Command)
def bench(
    *,
    model: opt.Pair = None,
    target: opt.Target = None,
    draft: Annotated[Optional[str], typer.Option("--draft", "-md", metavar="MODEL", rich_help_panel=opt.MODEL, help="Draft GGUF, Hub owner/repo:QUANT or ngram (default: the pair's, else ngram).")] = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", metavar="PATH", rich_help_panel=opt.MODEL, help="Workloads: a TOML file of [\\[workload]] tables (default: the shipped ones).")] = None,
    draft_tokens: Annotated[str, typer.Option("-k", "--draft-tokens", metavar="LIST", rich_help_panel=opt.DRAFTING, help="Draft lengths to compare, e.g. auto,2,4,8,16.")] = "auto,2,4,8,16",
    draft_min_p: opt.DraftMinP = 0.0,
    exact: Annotated[bool, typer.Option("--exact", rich_help_panel=opt.DRAFTING, help="Cap verify batches at the exact size, plain runs too.")] = False,
    no_ngram: opt.NoLookup = False,
    runs: Annotated[int, typer.Option("--runs", metavar="N", callback=opt._positive, rich_help_panel=opt.SAMPLING, help="Measured runs of each configuration, after a warm-up.")] = 5,
    max_tokens: Annotated[Optional[int], typer.Option("-n", "--max-tokens", metavar="N", callback=opt._positive, rich_help_panel=opt.SAMPLING, help="Override every workload's token budget.")] = None,
    temp: Annotated[float, typer.Option("--temp", metavar="T", callback=opt._not_negative, rich_help_panel=opt.SAMPLING, help="Temperature; 0 (greedy) also checks outputs against plain.")] = 0.0,
    top_k: opt.TopK = opt.DEFAULT_TOP_K,
    top_p: opt.TopP = opt.DEFAULT_TOP_P,
    min_p: opt.MinP = opt.DEFAULT_MIN_P,
    repeat_penalty: opt.RepeatPenalty = 1.0,
    repeat_last_n: opt.RepeatLastN = 64,
    seed: Annotated[int, typer.Option("-s", "--seed", metavar="N", callback=opt._not_negative, rich_help_panel=opt.SAMPLING, help="Seed for sampling.")] = 0,
    json_output: Annotated[bool, typer.Option("--json", rich_help_panel=opt.OUTPUT, help="The report as one JSON object.")] = False,
    verbose: opt.Verbose = False,
    gpu_layers: opt.GpuLayers = None,
    draft_gpu_layers: opt.DraftGpuLayers = None,
    ctx_size: opt.CtxSize = opt.DEFAULT_CTX_SIZE,
    threads: opt.Threads = None,
    repack: opt.Repack = True,
    rpc: opt.Servers = None,
    draft_rpc: opt.DraftServers = None,
    verify_on_device: opt.VerifyOnDevice = False,
) -> None:
    """Compare plain and speculative decoding on the same prompts: tok/s, speedup, acceptance, recommended K."""
    import json

    from specli.models import resolve
    from specli.bench import benchmark, load_workloads, parse_configs, print_progress, render_report

    configs = parse_configs(draft_tokens)
    models = resolve.resolve_models(model, target, draft)
    if models.draft == "none":
        raise UsageError("bench compares against plain decoding by itself: give --draft a model file or ngram")
    hardware = opt.Hardware(gpu_layers, draft_gpu_layers, ctx_size, threads, repack, rpc or (), draft_rpc or (),
                            verify_on_device)
    sampling = opt.sampling_settings(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n)
    spec = opt.session_spec(models, hardware, sampling, seed=seed, drafting=opt.Drafting(draft_min_p, exact, not no_ngram),
                            verbose=verbose)
    report = benchmark(spec, load_workloads(prompts), configs, runs, max_tokens,
                       progress=None if json_output else print_progress)
    if json_output:
        print(json.dumps(report, indent=1))
    else:
        render_report(report, _report_console())


def main() -> None:
    """Entry point (`specli`, `python -m specli`)."""
    app()


# --- serve -------------------------------------------------------------------------

SERVER = "Server"


@app.command("serve", cls=Command)
def serve(
    *,
    model: opt.Pair = None,
    target: opt.Target = None,
    draft: opt.Draft = None,
    host: Annotated[str, typer.Option("--host", metavar="HOST", rich_help_panel=SERVER, help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", metavar="PORT", callback=opt._check(lambda v: 0 <= v < 65536, "is not a port"), rich_help_panel=SERVER, help="Port (0: any free one).")] = 8080,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="SPECLI_API_KEY", metavar="KEY", show_envvar=False, rich_help_panel=SERVER, help="Require this bearer key (or SPECLI_API_KEY).")] = None,
    queue: Annotated[int, typer.Option("--queue", metavar="N", callback=opt._not_negative, rich_help_panel=SERVER, help="Requests that may wait; more get 503.")] = 8,
    memory: Annotated[bool, typer.Option("--memory/--no-memory", rich_help_panel=SERVER, help="N-gram lookup searches recent answers too.")] = True,
    draft_tokens: opt.DraftTokensOption = None,
    draft_min_p: opt.DraftMinP = 0.0,
    exact: opt.Exact = False,
    no_ngram: opt.NoLookup = False,
    temp: opt.Temperature = 0.0,
    top_k: opt.TopK = opt.DEFAULT_TOP_K,
    top_p: opt.TopP = opt.DEFAULT_TOP_P,
    min_p: opt.MinP = opt.DEFAULT_MIN_P,
    repeat_penalty: opt.RepeatPenalty = 1.0,
    verbose: opt.Verbose = False,
    gpu_layers: opt.GpuLayers = None,
    draft_gpu_layers: opt.DraftGpuLayers = None,
    ctx_size: opt.CtxSize = opt.DEFAULT_CTX_SIZE,
    threads: opt.Threads = None,
    repack: opt.Repack = True,
    rpc: opt.Servers = None,
    draft_rpc: opt.DraftServers = None,
) -> None:
    """Serve the pair over an OpenAI-compatible HTTP API; sampling options are defaults a request may override."""
    from specli.models import resolve
    from specli.serve import ServeSettings
    from specli.serve import serve as run_server

    k = opt.parse_draft_tokens(draft_tokens)
    resolve.check_draft_spelling(draft)
    models = resolve.resolve_models(model, target, draft)
    hardware = opt.Hardware(gpu_layers, draft_gpu_layers, ctx_size, threads, repack, rpc or (), draft_rpc or ())
    sampling = opt.sampling_settings(temp, top_k, top_p, min_p, repeat_penalty)
    spec = opt.session_spec(models, hardware, sampling, drafting=opt.Drafting(draft_min_p, exact, not no_ngram),
                            verbose=verbose)
    settings = ServeSettings(host, port, api_key or None, queue, memory, model, opt.draft_tokens_for(k, models))
    raise typer.Exit(run_server(spec, settings))
