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
        typer.Argument(help="The prompt. Use - to read it from stdin (read too when stdin is piped and no prompt is given)."),
    ] = None,
    *,
    model: Annotated[
        Optional[str],
        typer.Option("-m", "--model", envvar="SPECLI_MODEL", help="A pair from models.toml (see `specli list`); missing files are downloaded."),
    ] = None,
    target: Annotated[
        Optional[str],
        typer.Option("--target", help="Target GGUF file or Hub model (owner/repo:QUANT, owner/repo/file.gguf), instead of a pair. With neither, the embedded Gemma 3 270M demo runs."),
    ] = None,
    draft: Annotated[
        Optional[str],
        typer.Option("--draft", help="Draft GGUF file or Hub model (as --target), 'ngram' (prompt lookup, no model) or 'none' (plain decoding)."),
    ] = None,
    draft_tokens: Annotated[
        str, typer.Option("-k", "--draft-tokens", help="Draft tokens per step: a number, or 'auto' to adapt to what is accepted.")
    ] = "auto",
    draft_min_p: Annotated[
        float,
        typer.Option("--draft-min-p", min=0.0, max=1.0, help="A draft model stops drafting when its top probability falls below this (0: off)."),
    ] = 0.0,
    max_tokens: Annotated[Optional[int], typer.Option("-n", "--max-tokens", min=1, help="Stop after this many tokens (default 256; in a chat, the context's room).")] = None,
    temp: Annotated[float, typer.Option("--temp", min=0.0, help="Sampling temperature; 0 is greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", min=0, help="Sample among the k most likely tokens (0: off).")] = DEFAULT_TOP_K,
    top_p: Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, help="Nucleus sampling threshold (1: off).")] = DEFAULT_TOP_P,
    min_p: Annotated[float, typer.Option("--min-p", min=0.0, max=1.0, help="Drop tokens below this fraction of the best one's probability (0: off).")] = DEFAULT_MIN_P,
    seed: Annotated[Optional[int], typer.Option("--seed", min=0, help="Seed for sampling; the same seed repeats a run exactly.")] = None,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", help="Stop when this text appears (repeatable); it is not printed.")] = None,
    chat: Annotated[
        Optional[bool], typer.Option("--chat/--no-chat", help="Wrap the prompt in the target's chat template (default: when it has one).")
    ] = None,
    system: Annotated[Optional[str], typer.Option("--system", help="System message for chat models.")] = None,
    file: Annotated[Optional[Path], typer.Option("-f", "--file", help="Read the prompt from this file.")] = None,
    gpu_layers: Annotated[Optional[int], typer.Option("--gpu-layers", min=-1, help="Target layers to offload to the GPU (-1: all, the default).")] = None,
    draft_gpu_layers: Annotated[Optional[int], typer.Option("--draft-gpu-layers", min=-1, help="Draft layers to offload to the GPU (default: as --gpu-layers).")] = None,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size", min=32, help="Context size in tokens, prompt included.")] = 4096,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", min=1, help="CPU threads (default: all cores).")] = None,
    repack: Annotated[
        bool,
        typer.Option("--repack/--no-repack", help="llama.cpp's CPU weight repacking (--exact chooses it itself)."),
    ] = True,
    exact: Annotated[
        bool,
        typer.Option("--exact", help="Write exactly what --draft none --exact writes on this build: verify batches are capped at the size whose logits are bit-identical to one-token decoding."),
    ] = False,
    color: Annotated[ColorMode, typer.Option("--color", help="Colour drafted vs target-written text.")] = ColorMode.auto,
    json_output: Annotated[bool, typer.Option("--json", help="JSON Lines on stdout: one object per token, then stats.")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="No legend and no stats line on stderr.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Show llama.cpp's own log lines.")] = False,
) -> None:
    """Generate text: the draft proposes, the target verifies, and the output is the target's own."""
    from specli import runner
    from specli.engine import GenerationOptions
    from specli.sampling import SamplingSettings

    conversation = ctx.info_name == "chat" or (prompt is None and file is None and sys.stdin.isatty())
    with user_errors():
        if conversation and json_output:
            raise UsageError("--json needs a prompt: a chat is for people", 'specli run --json "prompt"')
        text = None if conversation else runner.read_prompt(prompt, file, sys.stdin)
        if gpu_layers is not None or draft_gpu_layers is not None:
            runner.warn_without_gpu(sys.stderr)
        models = runner.resolve_models(model, target, draft)
        sampling = SamplingSettings(temp, top_k, top_p, min_p)
        spec = _session_spec(models, sampling, seed, draft_min_p, gpu_layers, draft_gpu_layers, ctx_size, threads,
                             repack, exact, verbose)
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
                  verbose: bool):
    """run's and bench's models and settings as one SessionSpec."""
    from specli.backend import LoadSettings
    from specli.session import SessionSpec

    layers = -1 if gpu_layers is None else gpu_layers
    draft_layers = layers if draft_gpu_layers is None else draft_gpu_layers
    return SessionSpec(
        target=models.target,
        draft=models.draft,
        target_load=LoadSettings(layers, ctx_size, threads=threads, repack=repack),
        draft_load=LoadSettings(draft_layers, ctx_size, threads=threads, repack=repack),
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
        typer.Argument(metavar="PAIR...", help="Names of the pairs to download, as `specli list` shows them."),
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
        typer.Argument(metavar="PAIR...", help="Names of the pairs whose downloaded files to delete."),
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
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object, for scripts.")] = False,
) -> None:
    """Check the installation: llama.cpp build and GPU support, devices, cache and free disk, registry, downloaded pairs."""
    import json

    from specli.doctor import diagnose, print_report

    report = diagnose()
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
    model: Annotated[Optional[str], typer.Option("-m", "--model", envvar="SPECLI_MODEL", help="A pair from models.toml; missing files are downloaded.")] = None,
    target: Annotated[Optional[str], typer.Option("--target", help="Target GGUF file or Hub model (owner/repo:QUANT, owner/repo/file.gguf). With neither -m nor --target, the embedded demo model.")] = None,
    draft: Annotated[Optional[str], typer.Option("--draft", help="Draft GGUF file, Hub model (as --target) or 'ngram' (default: the pair's draft, else ngram).")] = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="Workloads TOML file (\\[[workload]] name, kind, prompt, max_tokens); default: the shipped workloads.")] = None,
    draft_tokens: Annotated[str, typer.Option("-k", "--draft-tokens", help="Comma-separated draft lengths to compare, 'auto' included, e.g. auto,2,4,8,16.")] = "auto,2,4,8,16",
    runs: Annotated[int, typer.Option("--runs", min=1, help="Measured runs per configuration and workload (after one warm-up).")] = 5,
    draft_min_p: Annotated[float, typer.Option("--draft-min-p", min=0.0, max=1.0, help="A draft model stops drafting when its top probability falls below this (0: off).")] = 0.0,
    max_tokens: Annotated[Optional[int], typer.Option("-n", "--max-tokens", min=1, help="Override every workload's token budget.")] = None,
    temp: Annotated[float, typer.Option("--temp", min=0.0, help="Sampling temperature (0: greedy, and outputs are checked against plain decoding).")] = 0.0,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed for sampling.")] = 0,
    gpu_layers: Annotated[Optional[int], typer.Option("--gpu-layers", min=-1, help="Layers to offload to the GPU (-1: all, the default).")] = None,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size", min=32, help="Context size in tokens.")] = 4096,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", min=1, help="CPU threads (default: all cores).")] = None,
    repack: Annotated[bool, typer.Option("--repack/--no-repack", help="llama.cpp's CPU weight repacking (--exact chooses it itself).")] = True,
    exact: Annotated[bool, typer.Option("--exact", help="Cap verify batches at the exact-safe size, as `run --exact` does (plain decoding too).")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Show llama.cpp's own log lines.")] = False,
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
                             verbose)
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
