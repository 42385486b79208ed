"""Typer declarations. Each command hands off to library code; errors become one line here."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from specli import __version__
from specli.config import debug_enabled
from specli.errors import SpecliError, UsageError
from specli.sampling import DEFAULT_MIN_P, DEFAULT_TOP_K, DEFAULT_TOP_P

DEFAULT_MAX_TOKENS = 256

def _plain_types_in_help() -> None:
    """Help shows each option's metavar (N, PATH, PAIR), never Typer's <bool> for a flag nor
    <list[str]> for an argument, whose name says it already."""
    from typer.core import TyperArgument, TyperOption

    shown = TyperOption.display_type_rich

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)

    def usage_name(self) -> str:  # PAIR... or [PROMPT], as click writes them, not {PAIR}...
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")

    TyperOption.display_type_rich = display_type_rich
    TyperArgument.display_type_rich = lambda self, ctx: None
    TyperArgument._usage_display_name = usage_name


_plain_types_in_help()

app = typer.Typer(
    name="specli",
    help="Local speculative generation: a small draft proposes tokens, the target verifies them in one pass.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


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


# --- run -------------------------------------------------------------------


@contextmanager
def user_errors():
    """Library errors become one line on stderr and an exit code (traceback with SPECLI_DEBUG=1)."""
    try:
        yield
    except SpecliError as error:
        if debug_enabled():
            raise
        _print_error(error.message, error.hint)
        raise typer.Exit(error.exit_code) from None


class ColorMode(str, Enum):
    auto = "auto"
    always = "always"
    never = "never"


MODEL, DRAFTING, SAMPLING, OUTPUT, HARDWARE = "Model", "Drafting", "Sampling", "Output", "Hardware"


def _check(test, requirement: str):
    """An option callback: the value (None passes) must meet `test`, else exit 2 saying why."""

    def callback(value):
        if value is not None and not test(value):
            raise typer.BadParameter(f"{value} {requirement}")
        return value

    return callback


_positive = _check(lambda v: v > 0, "must be above 0")
_not_negative = _check(lambda v: v >= 0, "must be 0 or more")
_probability = _check(lambda v: 0 <= v <= 1, "must be between 0 and 1")
_layers = _check(lambda v: v >= -1, "must be -1 (all) or more")
_context = _check(lambda v: v >= 32, "must be at least 32")


def _servers(value: Optional[str]) -> tuple[str, ...]:
    """--rpc / --draft-rpc: HOST:PORT[,HOST:PORT...] (exit 2 on a misspelling)."""
    from specli.rpc import parse_endpoints

    if value is None:
        return ()
    try:
        return tuple(str(endpoint) for endpoint in parse_endpoints(value))
    except UsageError as error:
        raise typer.BadParameter(error.message.split(": ", 1)[-1] + (f" ({error.hint})" if error.hint else "")) from None


# run's and bench's --rpc and --draft-rpc (HOST:PORT,... parsed into a tuple of endpoints).
Servers = Annotated[Optional[str], typer.Option("--rpc", metavar="LIST", callback=_servers, rich_help_panel=HARDWARE,
                                                help="Target layers on rpc-servers (HOST:PORT,...).")]
DraftServers = Annotated[Optional[str], typer.Option("--draft-rpc", metavar="LIST", callback=_servers,
                                                     rich_help_panel=HARDWARE, help="Draft layers on rpc-servers.")]


def _draft_tokens(value: str) -> Optional[int]:
    hint = "'-k' / '--draft-tokens'"
    if value == "auto":
        return None
    try:
        number = int(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a whole number or 'auto'", param_hint=hint) from None
    if number < 1:
        raise typer.BadParameter("must be at least 1 (use --draft none for plain decoding)", param_hint=hint)
    return number


@app.command("run")
@app.command("chat", help="Chat with the target, turn by turn: the same options as run, and no prompt.")
def run(
    ctx: typer.Context,
    prompt: Annotated[
        Optional[str],
        typer.Argument(metavar="PROMPT", show_default=False,
                       help="The prompt; - reads stdin (read too when stdin is piped). None on a terminal: a chat."),
    ] = None,
    *,
    prompt_option: Annotated[Optional[str], typer.Option("-p", "--prompt", metavar="TEXT", rich_help_panel=MODEL, help="The prompt, as llama.cpp takes it.")] = None,
    file: Annotated[Optional[Path], typer.Option("-f", "--file", metavar="PATH", rich_help_panel=MODEL, help="Read the prompt from this file.")] = None,
    model: Annotated[Optional[str], typer.Option("-m", "--model", envvar="SPECLI_MODEL", metavar="PAIR", rich_help_panel=MODEL, help="A pair from `specli list`, downloaded when missing.")] = None,
    target: Annotated[Optional[str], typer.Option("--target", metavar="MODEL", rich_help_panel=MODEL, help="Target GGUF or Hub owner/repo:QUANT (default: the embedded Gemma 3 270M).")] = None,
    draft: Annotated[Optional[str], typer.Option("--draft", "-md", metavar="MODEL", rich_help_panel=MODEL, help="Draft GGUF, Hub owner/repo:QUANT, ngram, or none (plain decoding).")] = None,
    chat: Annotated[Optional[bool], typer.Option("--chat/--no-chat", rich_help_panel=MODEL, help="Use the target's chat template (default: if it has one).")] = None,
    system: Annotated[Optional[str], typer.Option("--system", metavar="TEXT", rich_help_panel=MODEL, help="System message for chat models.")] = None,
    draft_tokens: Annotated[str, typer.Option("-k", "--draft-tokens", "--draft-max", metavar="N|auto", rich_help_panel=DRAFTING, help="Draft tokens per step, or auto.")] = "auto",
    draft_min_p: Annotated[float, typer.Option("--draft-min-p", metavar="P", callback=_probability, rich_help_panel=DRAFTING, help="A draft model stops below this top probability.")] = 0.0,
    exact: Annotated[bool, typer.Option("--exact", rich_help_panel=DRAFTING, help="Write what --draft none --exact writes, bit for bit.")] = False,
    max_tokens: Annotated[Optional[int], typer.Option("-n", "--max-tokens", "--n-predict", metavar="N", callback=_positive, rich_help_panel=SAMPLING, help="Tokens to write (default 256; a chat: no limit).")] = None,
    temp: Annotated[float, typer.Option("--temp", metavar="T", callback=_not_negative, rich_help_panel=SAMPLING, help="Temperature; 0 is greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", metavar="K", callback=_not_negative, rich_help_panel=SAMPLING, help="Keep the k likeliest tokens (0: off).")] = DEFAULT_TOP_K,
    top_p: Annotated[float, typer.Option("--top-p", metavar="P", callback=_probability, rich_help_panel=SAMPLING, help="Nucleus threshold (1: off).")] = DEFAULT_TOP_P,
    min_p: Annotated[float, typer.Option("--min-p", metavar="P", callback=_probability, rich_help_panel=SAMPLING, help="Drop tokens under p x the best one's (0: off).")] = DEFAULT_MIN_P,
    repeat_penalty: Annotated[float, typer.Option("--repeat-penalty", metavar="X", callback=_positive, rich_help_panel=SAMPLING, help="Penalise repeated tokens (1: off).")] = 1.0,
    repeat_last_n: Annotated[int, typer.Option("--repeat-last-n", metavar="N", callback=_not_negative, rich_help_panel=SAMPLING, help="How far back --repeat-penalty looks.")] = 64,
    seed: Annotated[Optional[int], typer.Option("-s", "--seed", metavar="N", callback=_not_negative, rich_help_panel=SAMPLING, help="Seed; the same seed repeats a run.")] = None,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", metavar="TEXT", rich_help_panel=SAMPLING, help="Stop at this text, not printed (repeatable).")] = None,
    color: Annotated[ColorMode, typer.Option("--color", metavar="WHEN", rich_help_panel=OUTPUT, help="auto, always or never.")] = ColorMode.auto,
    json_output: Annotated[bool, typer.Option("--json", rich_help_panel=OUTPUT, help="JSON Lines: each token, then stats.")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", rich_help_panel=OUTPUT, help="No legend and no stats line.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", rich_help_panel=OUTPUT, help="Show llama.cpp's log.")] = False,
    gpu_layers: Annotated[Optional[int], typer.Option("--gpu-layers", "-ngl", metavar="N", callback=_layers, rich_help_panel=HARDWARE, help="Target layers on the GPU (-1: all).")] = None,
    draft_gpu_layers: Annotated[Optional[int], typer.Option("--draft-gpu-layers", "-ngld", metavar="N", callback=_layers, rich_help_panel=HARDWARE, help="Draft layers on the GPU (default: as the target).")] = None,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size", metavar="N", callback=_context, rich_help_panel=HARDWARE, help="Context size in tokens.")] = 4096,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", metavar="N", callback=_positive, rich_help_panel=HARDWARE, help="CPU threads (default: all cores).")] = None,
    repack: Annotated[bool, typer.Option("--repack/--no-repack", rich_help_panel=HARDWARE, help="CPU weight repacking (--exact picks it).")] = True,
    rpc: Servers = None,
    draft_rpc: DraftServers = None,
) -> None:
    """Generate text: the draft proposes, the target verifies, and the output is the target's own."""
    from specli import runner
    from specli.engine import GenerationOptions
    from specli.sampling import SamplingSettings

    with user_errors():
        if prompt_option is not None:
            if prompt is not None:
                raise UsageError("give the prompt either as an argument or with -p, not both")
            prompt = prompt_option
        conversation = ctx.info_name == "chat" or (prompt is None and file is None and sys.stdin.isatty())
        if conversation and json_output:
            raise UsageError("--json needs a prompt: a chat is for people", 'specli run --json "prompt"')
        text = None if conversation else runner.read_prompt(prompt, file, sys.stdin)
        runner.check_draft_spelling(draft)
        models = runner.resolve_models(model, target, draft)
        sampling = SamplingSettings(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n)
        spec = _session_spec(models, sampling, seed, draft_min_p, gpu_layers, draft_gpu_layers, ctx_size, threads,
                             repack, exact, verbose, rpc, draft_rpc)
        if (gpu_layers is not None or draft_gpu_layers is not None) and not (rpc or draft_rpc):
            runner.warn_without_gpu(sys.stderr)  # with --rpc, layers go to the servers
        if not quiet and not json_output:
            runner.warn_if_self_drafting(spec, sys.stderr)
        limit = max_tokens or (1 << 30 if conversation else DEFAULT_MAX_TOKENS)
        options = GenerationOptions(limit, sampling, tuple(stop or ()))
        k = _draft_tokens(draft_tokens) or models.draft_tokens
        output = runner.Output(color.value, json_output, quiet)
        if text is None:
            from specli.chat import chat as converse

            code = converse(spec, options, k, output, system)
        else:
            code = runner.execute(spec, runner.Prompt(text, system, chat), options, k, output)
    raise typer.Exit(code)


def _session_spec(models, sampling, seed: int | None, draft_min_p: float, gpu_layers: int | None,
                  draft_gpu_layers: int | None, ctx_size: int, threads: int | None, repack: bool, exact: bool,
                  verbose: bool, rpc: tuple[str, ...] = (), draft_rpc: tuple[str, ...] = ()):
    """run's and bench's models and settings as one SessionSpec."""
    from specli.backend import LoadSettings
    from specli.session import SessionSpec

    layers = -1 if gpu_layers is None else gpu_layers
    draft_layers = layers if draft_gpu_layers is None else draft_gpu_layers
    if rpc and layers == 0:
        raise UsageError("--rpc with --gpu-layers 0 puts no layer on the servers", "drop --gpu-layers 0")
    if draft_rpc and not isinstance(models.draft, Path):
        raise UsageError(f"--draft-rpc places a draft model's layers; --draft {models.draft} has none")
    if draft_rpc and draft_layers == 0:
        raise UsageError("--draft-rpc with --draft-gpu-layers 0 puts no layer on the servers")
    return SessionSpec(
        target=models.target,
        draft=models.draft,
        target_load=LoadSettings(layers, ctx_size, threads=threads, repack=repack, rpc=rpc),
        draft_load=LoadSettings(draft_layers, ctx_size, threads=threads, repack=repack, rpc=draft_rpc),
        sampling=sampling,
        seed=seed,
        draft_min_p=draft_min_p,
        exact=exact,
        verbose=verbose,
    )


# --- models: pull / list / rm ----------------------------------------------


@app.command("pull")
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
    from specli import hub, listing
    from specli.registry import load_registry

    with user_errors():
        registry = load_registry()
        for pair in [registry.get(name) for name in pairs]:
            if dry_run:
                listing.print_pull_plan(hub.plan_pull(pair))
                continue
            target, draft = hub.pull_pair(pair)
            typer.echo(str(target))
            if isinstance(draft, Path):
                typer.echo(str(draft))


@app.command("list")
def list_pairs(
    *,
    as_json: Annotated[bool, typer.Option("--json", help="Print the pairs as JSON, for scripts.")] = False,
    check: Annotated[bool, typer.Option("--check", help="Check every pair's Hub files (names, sizes, pins), downloading nothing; exit 1 on a problem.")] = False,
) -> None:
    """List the known pairs: their models, sizes on disk, and whether they are downloaded."""
    import json

    from specli import hub, listing
    from specli.registry import load_registry

    if check:
        with user_errors():
            report = hub.check_pairs(load_registry().pairs.values())
        listing.print_check(report)
        raise typer.Exit(1 if report.problems else 0)
    with user_errors():
        statuses = [hub.pair_status(pair) for pair in load_registry().pairs.values()]
    if as_json:
        typer.echo(json.dumps([listing.pair_json(status) for status in statuses], indent=2))
    else:
        listing.print_pairs_table(statuses)


@app.command("rm")
def remove(
    pairs: Annotated[
        list[str],
        typer.Argument(metavar="PAIR", help="Names of the pairs whose downloaded files to delete."),
    ],
) -> None:
    """Delete a pair's downloaded files from the Hugging Face cache, keeping files other downloaded pairs use."""
    from specli import hub
    from specli.registry import load_registry

    with user_errors():
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


# --- bench / doctor --------------------------------------------------------


@app.command("doctor")
def doctor(
    *,
    model: Annotated[Optional[str], typer.Option("-m", "--model", metavar="PAIR", help="Also report this pair's stored verify costs and exact batch sizes.")] = None,
    target: Annotated[Optional[str], typer.Option("--target", metavar="MODEL", help="... or this GGUF's (or Hub owner/repo:QUANT's).")] = None,
    calibrate: Annotated[bool, typer.Option("--calibrate", help="Measure them now and store them (the embedded model without -m/--target).")] = False,
    gpu_layers: Annotated[Optional[int], typer.Option("--gpu-layers", "-ngl", metavar="N", callback=_layers, help="Target layers on the GPU (-1: all), as run will use them.")] = None,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size", metavar="N", callback=_context, help="Context size, as run will use it.")] = 4096,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", metavar="N", callback=_positive, help="CPU threads, as run will use them.")] = None,
    rpc: Annotated[Optional[str], typer.Option("--rpc", metavar="LIST", callback=_servers, help="Check these llama.cpp rpc-servers, HOST:PORT,... (with a model: its costs over them).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object, for scripts.")] = False,
) -> None:
    """Check the installation: llama.cpp build and GPU support, devices, caches, registry; with a model, its costs."""
    import json

    from specli.doctor import check_model, diagnose, print_report

    report = diagnose(rpc)
    if model is not None or target is not None or calibrate:
        from specli import runner
        from specli.sampling import SamplingSettings

        with user_errors():
            models = runner.resolve_models(model, target, "ngram")
            spec = _session_spec(models, SamplingSettings(), None, 0.0, gpu_layers, None, ctx_size, threads, True,
                                 False, False, rpc)
            notice = None if as_json else (lambda message: print(f"specli: {message}", file=sys.stderr, flush=True))
            report.model = check_model(spec, calibrate, notice)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        from rich.console import Console

        # In a pipe, long values (install commands, paths) stay on one line for grep and copy.
        print_report(report, Console(highlight=False, width=None if sys.stdout.isatty() else 1000))
    raise typer.Exit(1 if report.problems else 0)


@app.command("bench")
def bench(
    *,
    model: Annotated[Optional[str], typer.Option("-m", "--model", envvar="SPECLI_MODEL", metavar="PAIR", rich_help_panel=MODEL, help="A pair from `specli list`, downloaded when missing.")] = None,
    target: Annotated[Optional[str], typer.Option("--target", metavar="MODEL", rich_help_panel=MODEL, help="Target GGUF or Hub owner/repo:QUANT (default: the embedded model).")] = None,
    draft: Annotated[Optional[str], typer.Option("--draft", "-md", metavar="MODEL", rich_help_panel=MODEL, help="Draft GGUF, Hub owner/repo:QUANT or ngram (default: the pair's, else ngram).")] = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", metavar="PATH", rich_help_panel=MODEL, help="Workloads: a TOML file of [\\[workload]] tables (default: the shipped ones).")] = None,
    draft_tokens: Annotated[str, typer.Option("-k", "--draft-tokens", metavar="LIST", rich_help_panel=DRAFTING, help="Draft lengths to compare, e.g. auto,2,4,8,16.")] = "auto,2,4,8,16",
    draft_min_p: Annotated[float, typer.Option("--draft-min-p", metavar="P", callback=_probability, rich_help_panel=DRAFTING, help="A draft model stops below this top probability.")] = 0.0,
    exact: Annotated[bool, typer.Option("--exact", rich_help_panel=DRAFTING, help="Cap verify batches at the exact size, plain runs too.")] = False,
    runs: Annotated[int, typer.Option("--runs", metavar="N", callback=_positive, rich_help_panel=SAMPLING, help="Measured runs of each configuration, after a warm-up.")] = 5,
    max_tokens: Annotated[Optional[int], typer.Option("-n", "--max-tokens", metavar="N", callback=_positive, rich_help_panel=SAMPLING, help="Override every workload's token budget.")] = None,
    temp: Annotated[float, typer.Option("--temp", metavar="T", callback=_not_negative, rich_help_panel=SAMPLING, help="Temperature; 0 (greedy) also checks outputs against plain.")] = 0.0,
    seed: Annotated[int, typer.Option("-s", "--seed", metavar="N", callback=_not_negative, rich_help_panel=SAMPLING, help="Seed for sampling.")] = 0,
    json_output: Annotated[bool, typer.Option("--json", rich_help_panel=OUTPUT, help="The report as one JSON object.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", rich_help_panel=OUTPUT, help="Show llama.cpp's log.")] = False,
    gpu_layers: Annotated[Optional[int], typer.Option("--gpu-layers", "-ngl", metavar="N", callback=_layers, rich_help_panel=HARDWARE, help="Layers on the GPU (-1: all).")] = None,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size", metavar="N", callback=_context, rich_help_panel=HARDWARE, help="Context size in tokens.")] = 4096,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", metavar="N", callback=_positive, rich_help_panel=HARDWARE, help="CPU threads (default: all cores).")] = None,
    repack: Annotated[bool, typer.Option("--repack/--no-repack", rich_help_panel=HARDWARE, help="CPU weight repacking (--exact picks it).")] = True,
    rpc: Servers = None,
    draft_rpc: DraftServers = None,
) -> None:
    """Compare plain and speculative decoding on the same prompts: tok/s, speedup, acceptance, recommended K."""
    import json

    from rich.console import Console

    from specli import bench as benchmark
    from specli import runner
    from specli.errors import UsageError
    from specli.sampling import SamplingSettings

    with user_errors():
        configs = benchmark.parse_configs(draft_tokens)
        models = runner.resolve_models(model, target, draft)
        if models.draft == "none":
            raise UsageError("bench compares against plain decoding by itself: give --draft a model file or ngram")
        sampling = SamplingSettings.for_temperature(temp)
        spec = _session_spec(models, sampling, seed, draft_min_p, gpu_layers, None, ctx_size, threads, repack, exact,
                             verbose, rpc, draft_rpc)
        report = benchmark.execute(spec, benchmark.load_workloads(prompts), configs, runs, max_tokens,
                                   progress=None if json_output else benchmark.print_progress)
        if json_output:
            print(json.dumps(report, indent=1))
        else:
            benchmark.render_report(report, Console())


def _print_error(message: str, hint: str | None = None) -> None:
    text = f"specli: error: {message}"
    if hint:
        text += f" (hint: {hint})"
    print(text, file=sys.stderr)


def fail(message: str, hint: str | None = None, code: int = 1) -> None:
    """Print one line on stderr and exit; the only place errors leave the process."""
    _print_error(message, hint)
    raise SystemExit(code)


def main() -> None:
    """Entry point: every way out of the process is one line on stderr and an exit code."""
    try:
        code = app(standalone_mode=False)
    except SpecliError as error:
        if debug_enabled():
            raise
        fail(error.message, error.hint, error.exit_code)
    except KeyboardInterrupt:
        if debug_enabled():
            raise
        fail("interrupted", None, 130)
    except Exception as error:  # click's usage errors (Typer vendors click privately), then bugs
        if debug_enabled():
            raise
        context = getattr(error, "ctx", None)
        if type(error).__name__ == "NoArgsIsHelpError":
            raise SystemExit(2) from None  # Typer has printed the help already
        if hasattr(error, "format_message") and isinstance(getattr(error, "exit_code", None), int):
            hint = f"see `{context.command_path} --help`" if context is not None else None
            fail(error.format_message(), hint, error.exit_code)
        if type(error).__name__ == "Abort":
            fail("aborted", None, 1)
        fail(f"internal error: {type(error).__name__}: {error}", "rerun with SPECLI_DEBUG=1 for the traceback, and report it")
    raise SystemExit(code or 0)
