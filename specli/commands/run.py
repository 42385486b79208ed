"""`specli run` and `specli chat`: one generation streamed to the terminal (colour spans on a
terminal, the text alone in a pipe, JSON lines with --json), or a conversation."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import IO, Annotated, Optional

import typer

from specli.commands import options as opt
from specli.commands.app import Command, app
from specli.decode.adaptive import AdaptiveDraftPolicy
from specli.decode.engine import Engine, check_prompt_fits
from specli.decode.proposers import NoProposer
from specli.decode.request import GenerationRequest
from specli.errors import UsageError
from specli.llama.vision import Image, read_image_file
from specli.prompt import prompt_tokens, prompt_with_images, read_prediction, read_prompt
from specli.render import JsonRenderer, Output, TextRenderer, notifier, use_colour
from specli.session import Session, SessionSpec, open_session
from specli.stream import stream

EXIT_OK = 0
EXIT_INTERRUPTED = 130


class ColorMode(str, Enum):
    auto = "auto"
    always = "always"
    never = "never"


@dataclass(frozen=True)
class Prompt:
    text: str
    system: str | None = None
    chat: bool | None = None  # None: when the target has a chat template
    images: tuple[Image, ...] = ()  # --image: read and checked before any model loads


@app.command("run", cls=Command)
@app.command("chat", cls=Command, help="Chat with the target, turn by turn: the same options as run, and no prompt.")
@opt.with_options(opt.MODELS, opt.DRAFTING_OPTIONS, opt.SAMPLING_OPTIONS, opt.TEMPLATE_OPTIONS, opt.VISION_OPTIONS,
                  opt.CONSTRAINT_OPTIONS, opt.HARDWARE_OPTIONS)
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
    chat: Annotated[Optional[bool], typer.Option("--chat/--no-chat", rich_help_panel=opt.MODEL, help="Use the target's chat template (default: if it has one).")] = None,
    system: Annotated[Optional[str], typer.Option("--system", metavar="TEXT", rich_help_panel=opt.MODEL, help="System message for chat models.")] = None,
    image: Annotated[Optional[list[Path]], typer.Option("--image", metavar="FILE", rich_help_panel=opt.FORMAT, help="An image for the prompt (repeatable).")] = None,
    max_tokens: Annotated[Optional[int], typer.Option("-n", "--max-tokens", "--n-predict", metavar="N", callback=opt.positive, rich_help_panel=opt.SAMPLING, help="Tokens to write (default 256; a chat: no limit).")] = None,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", metavar="TEXT", rich_help_panel=opt.SAMPLING, help="Stop at this text (repeatable).")] = None,
    color: Annotated[ColorMode, typer.Option("--color", metavar="WHEN", rich_help_panel=opt.OUTPUT, help="auto, always or never.")] = ColorMode.auto,
    json_output: Annotated[bool, typer.Option("--json", rich_help_panel=opt.OUTPUT, help="JSON Lines: each token, then stats.")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", rich_help_panel=opt.OUTPUT, help="No legend and no stats line.")] = False,
    prediction: Annotated[Optional[Path], typer.Option("--prediction", metavar="PATH", rich_help_panel=opt.DRAFTING, help="Text the answer should repeat much of (an edit's file).")] = None,
    batch: Annotated[Optional[Path], typer.Option("--batch", metavar="FILE", rich_help_panel=opt.MODEL, help="Prompts, a line each; JSONL out.")] = None,
    parallel: Annotated[Optional[int], typer.Option("-np", "--parallel", metavar="N", callback=opt.positive, rich_help_panel=opt.HARDWARE, help="Prompts at once (default 4).")] = None,
) -> None:
    """Generate text: the draft proposes, the target verifies, and the output is the target's own."""
    from specli.models import resolve

    if prompt_option is not None:
        if prompt is not None:
            raise UsageError("give the prompt either as an argument or with -p, not both")
        prompt = prompt_option
    if batch is not None:
        raise typer.Exit(_batch(ctx, batch, parallel, given=(prompt, file, prediction, image)))
    if parallel is not None:
        raise UsageError("--parallel goes with --batch FILE (or specli serve)")
    conversation = ctx.info_name == "chat" or (prompt is None and file is None and sys.stdin.isatty())
    if conversation and json_output:
        raise UsageError("--json needs a prompt: a chat is for people", 'specli run --json "prompt"')
    text = None if conversation else read_prompt(prompt, file, sys.stdin)
    images = tuple(read_image_file(path) for path in image or ())
    if images and conversation:
        raise UsageError("--image needs a prompt; in a chat, attach one to a turn with /image FILE")
    if prediction is not None and conversation:
        raise UsageError("--prediction needs a prompt: it is what one answer should repeat")
    models = opt.models(ctx.params)
    spec = opt.with_projector(opt.session_spec(models, ctx.params), models, needed=bool(images),
                              notice=notifier(sys.stderr, quiet=quiet) if conversation else None)  # chat: /image
    request = opt.generation_request(models, ctx.params,
                                     max_tokens=max_tokens or (opt.NO_LIMIT if conversation else opt.DEFAULT_MAX_TOKENS))
    if prediction is not None:
        request = replace(request, prediction=read_prediction(prediction))
    if opt.hardware(ctx.params).asks_for_gpu:
        warn_without_gpu(sys.stderr)
    if not quiet and not json_output:
        resolve.warn_if_self_drafting(models, sys.stderr)
    output = Output(color.value, json_output, quiet)
    if text is None:
        from specli.commands.chat import chat as converse

        code = converse(opt.conversing(spec), request, output, system)
    else:
        code = execute(spec, Prompt(text, system, chat, images), request, output)
    raise typer.Exit(code)


def _batch(ctx: typer.Context, path: Path, parallel: int | None, *, given: tuple) -> int:
    """run --batch: every line of the file, `parallel` at a time (specli/commands/batch.py;
    None: the default for the target)."""
    from specli.commands.batch import read_lines, run_batch

    if ctx.info_name == "chat" or any(value is not None for value in given):
        raise UsageError("--batch reads its prompts from FILE: give no prompt, -f, --prediction or chat besides")
    lines = read_lines(path, sys.stdin)
    models = opt.models(ctx.params)
    notice = notifier(sys.stderr, quiet=ctx.params.get("quiet", False))
    asked = opt.session_spec(models, ctx.params)
    alone = opt.drafting_alone(asked)
    parallel = parallel or opt.default_parallel(asked)
    if parallel > 1 and alone:
        models = opt.beside_others(models, alone, parallel, notice)
    spec = opt.session_spec(models, {**ctx.params, "parallel": parallel})
    max_tokens = ctx.params.get("max_tokens") or opt.DEFAULT_MAX_TOKENS
    request = opt.generation_request(models, ctx.params, max_tokens=max_tokens)
    return run_batch(spec, lines, request, system=ctx.params.get("system"), chat=ctx.params.get("chat"),
                     stdout=sys.stdout, notice=notice)


def warn_without_gpu(stderr: IO[str]) -> None:
    """--gpu-layers asked for on a build that cannot offload: say so, and run on the CPU."""
    from specli.install import GPU_INSTALL_HINT
    from specli.llama.backend import supports_gpu_offload

    if not supports_gpu_offload():
        stderr.write(f"specli: warning: this llama-cpp-python build has no GPU support; running on the CPU ({GPU_INSTALL_HINT})\n")


def execute(spec: SessionSpec, prompt: Prompt, request: GenerationRequest, output: Output = Output(),
            stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> int:
    """Run one generation, streaming to stdout. Returns the exit code. A prompt the context
    cannot hold is refused before anything is measured."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    notice = notifier(stderr, quiet=output.quiet or output.json)
    with open_session(spec, notice) as session:
        media = None
        if prompt.images:
            assert session.projector is not None
            tokens, media = prompt_with_images(session.projector, session.target, prompt.text, list(prompt.images),
                                               system=prompt.system, chat=prompt.chat)
        else:
            tokens = prompt_tokens(session.target, prompt.text, system=prompt.system, chat=prompt.chat)
        # before engine_for, which may measure costs
        check_prompt_fits(max(len(tokens), media.cells if media is not None else 0), session.target.n_ctx)
        reason = session.plain_reason(request)
        if reason is not None:
            notice(reason)
        engine = session.engine_for(request, images=media is not None)
        if output.json:
            sink = JsonRenderer(stdout, metadata(session, engine))
        else:
            sink = TextRenderer(stdout, stderr, colour=use_colour(output.colour, stdout), quiet=output.quiet)
        try:
            outcome = stream(engine, tokens, sink, media=media)
        except BrokenPipeError:  # the reader went away (`| head`): a success
            _silence_stdout()
            return EXIT_OK
        session.pricing.review(outcome.stats)
        if outcome.stats.finish_reason == "interrupted":
            return EXIT_INTERRUPTED
        if outcome.stats.finish_reason == "context":
            notice(f"warning: the context ({session.target.n_ctx} tokens) is full; output stopped early (raise --ctx-size)")
    return EXIT_OK


def metadata(session: Session, engine: Engine) -> dict:
    """The settings a --json stats record carries besides the stats."""
    spec, request, sampling = session.spec, engine.request, engine.sampling
    drafting = not isinstance(engine.proposer, NoProposer)
    draft_model = spec.draft_model
    data = {
        "draft_tokens": request.draft_tokens if drafting else 0,
        "draft_min_p": request.draft_min_p if draft_model is not None else None,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "min_p": sampling.min_p,
        "seed": engine.seed,
        "target": spec.target.name,
        "draft": draft_model.name if draft_model is not None else request.draft,
        "lossless": True,
        "exact": request.exact,
        "exact_batch": session.exact().report() if request.exact else None,
        "repack": spec.target_load.repack,
        "memory": session.target.cache_memory(),  # the target's caches, as llama.cpp allocated them
    }
    if isinstance(engine.policy, AdaptiveDraftPolicy):
        data["costs"] = engine.policy.costs.source
    if spec.target_load.rpc:
        data["rpc"] = list(spec.target_load.rpc)
    if spec.draft_load.rpc and draft_model is not None:
        data["draft_rpc"] = list(spec.draft_load.rpc)
    return data


def _silence_stdout() -> None:
    """The reader went away (`| head`): point stdout at /dev/null so exit flushes nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
