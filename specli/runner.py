"""`specli run` as a function: resolve the models, read the prompt, stream events to a renderer.

The CLI declares options and calls `execute`; everything here raises SpecliError subclasses
for the CLI to report, and returns the process exit code.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from specli.errors import PromptError, SpecliError
from specli.sampling import SamplingSettings

EXIT_OK = 0
EXIT_INTERRUPTED = 130
# A draft model stops drafting once its top probability falls below --draft-min-p. Off by
# default: how confidence maps to acceptance depends on the pair (a draft with flat
# distributions can still agree with its target), and -k auto already sizes drafts from
# measured acceptance. Measured on the synthetic memory-bound pair: a 0.3 cut-off gave
# 16.5 tok/s against 35.4 without it.
DEFAULT_DRAFT_MIN_P = 0.0
CALIBRATION_NOTICE = "specli: timing this model's verify batches for -k auto (once per model and settings)\n"


@dataclass
class RunRequest:
    prompt: str | None = None
    prompt_file: Path | None = None
    system: str | None = None
    pair: str | None = None
    target: Path | None = None
    draft: str | None = None  # a path, "ngram" or "none"; None: the pair's, else ngram
    draft_tokens: int | None = None  # None: auto
    draft_min_p: float | None = None  # None: DEFAULT_DRAFT_MIN_P
    max_tokens: int = 256
    sampling: SamplingSettings = SamplingSettings()
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    chat: bool | None = None
    gpu_layers: int = -1
    draft_gpu_layers: int | None = None
    gpu_layers_explicit: bool = False
    ctx_size: int = 4096
    threads: int | None = None
    repack: bool = True
    colour: str = "auto"
    json: bool = False
    quiet: bool = False
    verbose: bool = False


def read_prompt(request: RunRequest, stdin: IO[str]) -> str:
    """The prompt from the argument, `-`, -f FILE, or piped stdin — exactly one of them."""
    if request.prompt_file is not None:
        if request.prompt not in (None, "-"):
            raise PromptError("give the prompt either as an argument or with -f, not both")
        try:
            data = request.prompt_file.read_bytes()
        except FileNotFoundError as error:
            raise PromptError(f"prompt file not found: {request.prompt_file}") from error
        except OSError as error:
            raise PromptError(f"cannot read prompt file {request.prompt_file}: {error.strerror or error}") from error
        return _decode_prompt(data, f"prompt file {request.prompt_file}")
    if request.prompt == "-" or (request.prompt is None and not _isatty(stdin)):
        buffer = getattr(stdin, "buffer", None)
        if buffer is None:  # a text stream without bytes underneath (tests)
            return _check_text(stdin.read(), "the prompt on stdin")
        return _decode_prompt(buffer.read(), "the prompt on stdin")
    if request.prompt is None:
        raise PromptError("no prompt given", 'specli run "your prompt", or pipe it on stdin')
    return _check_text(request.prompt, "the prompt")


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


def _decode_prompt(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PromptError(
            f"{what} is not UTF-8 text (byte {data[error.start]:#04x} at offset {error.start})",
            "convert it first, e.g. iconv -f latin1 -t utf-8",
        ) from None


def _check_text(text: str, what: str) -> str:
    """Arguments and text streams carry undecodable bytes as surrogates: refuse them here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        try:
            return _decode_prompt(text.encode("utf-8", "surrogateescape"), what)
        except UnicodeEncodeError:
            raise PromptError(f"{what} is not UTF-8 text (character {error.start})") from None
    return text


@dataclass(frozen=True)
class ResolvedModels:
    target: Path
    draft: Path | str  # a path, "ngram" or "none"
    pair_draft_tokens: int | None = None


def resolve_models(request: RunRequest) -> ResolvedModels:
    """--target/--draft as given; -m PAIR through the registry (pulling missing files);
    neither: the embedded demo model with n-gram drafting."""
    if request.target is not None and request.pair is not None:
        raise SpecliError("give either -m PAIR or --target PATH, not both")
    if request.target is not None:
        draft = request.draft or "ngram"
        return ResolvedModels(request.target, _draft_path_or_kind(draft))
    if request.pair is None:
        from specli.demo import embedded_model_path

        return ResolvedModels(embedded_model_path(), _draft_path_or_kind(request.draft or "ngram"))
    from specli import hub
    from specli.registry import load_registry

    pair = load_registry().get(request.pair)
    target, pair_draft = hub.resolve_pair(pair, download=True)
    draft = _draft_path_or_kind(request.draft) if request.draft else (pair_draft or "none")
    return ResolvedModels(target, draft, pair.draft_tokens)


def _draft_path_or_kind(draft: str | Path) -> Path | str:
    if isinstance(draft, Path):
        return draft
    return draft if draft in ("ngram", "none") else Path(draft)


def execute(request: RunRequest, stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> int:
    """Run one generation, streaming to stdout. Returns the exit code."""
    from specli.backend import LoadSettings, supports_gpu_offload
    from specli.engine import Finished, GenerationOptions, Token, check_prompt_fits
    from specli.prompt import prompt_tokens
    from specli.render import JsonRenderer, TextRenderer, use_colour
    from specli.session import SessionSpec, open_session

    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    prompt = read_prompt(request, sys.stdin)
    if not prompt.strip():  # refused before any model is loaded
        raise PromptError("the prompt is empty", "give a prompt as an argument, with -f FILE, or on stdin")
    models = resolve_models(request)
    if request.gpu_layers_explicit and request.gpu_layers != 0 and not supports_gpu_offload():
        from specli.doctor import GPU_INSTALL_HINT

        stderr.write(f"specli: warning: this llama-cpp-python build has no GPU support; running on the CPU ({GPU_INSTALL_HINT})\n")
    target_load = LoadSettings(request.gpu_layers, request.ctx_size, threads=request.threads, repack=request.repack)
    draft_layers = request.gpu_layers if request.draft_gpu_layers is None else request.draft_gpu_layers
    draft_load = LoadSettings(draft_layers, request.ctx_size, threads=request.threads, repack=request.repack)
    fixed_k = request.draft_tokens or models.pair_draft_tokens
    draft_min_p = request.draft_min_p if request.draft_min_p is not None else DEFAULT_DRAFT_MIN_P
    spec = SessionSpec(
        target=models.target,
        draft=models.draft,
        target_load=target_load,
        draft_load=draft_load,
        sampling=request.sampling,
        seed=request.seed,
        draft_min_confidence=draft_min_p,
        verbose=request.verbose,
    )
    with open_session(spec) as session:
        tokens = prompt_tokens(session.target, prompt, system=request.system, chat=request.chat)
        check_prompt_fits(len(tokens), session.target.n_ctx)  # before the adaptive policy's calibration
        notice = None if request.quiet or request.json else lambda: stderr.write(CALIBRATION_NOTICE)
        draft_length = session.draft_length(fixed_k, notice)
        options = GenerationOptions(request.max_tokens, request.sampling, tuple(request.stop))
        engine = session.engine(draft_length, options)
        renderer = (
            JsonRenderer(stdout)
            if request.json
            else TextRenderer(stdout, stderr, colour=use_colour(request.colour, stdout), quiet=request.quiet)
        )
        extra = {
            "draft_tokens": fixed_k or "auto",
            "draft_min_p": draft_min_p if isinstance(models.draft, Path) else None,
            "temperature": request.sampling.temperature,
            "top_k": request.sampling.top_k,
            "top_p": request.sampling.top_p,
            "min_p": request.sampling.min_p,
            "seed": session.seed,
            "target": models.target.name,
            "draft": models.draft.name if isinstance(models.draft, Path) else models.draft,
            "lossless": True,
        }
        events = engine.generate(tokens)
        try:
            renderer.start()
            for event in events:
                if isinstance(event, Token):
                    renderer.token(event)
                elif isinstance(event, Finished):
                    break
                if isinstance(event, Token) and event.source == "target":
                    renderer.step_done()  # a target token closes each step: flush once per step
        except KeyboardInterrupt:
            events.close()  # the engine's own cleanup runs: the stats get their timings
            engine.stats.finish_reason = "interrupted"
            _finish_quietly(renderer, engine.stats, extra)
            return EXIT_INTERRUPTED
        except BrokenPipeError:
            _silence_stdout()
            return EXIT_OK
        try:
            renderer.finish(engine.stats, extra)
        except BrokenPipeError:
            _silence_stdout()
            return EXIT_OK
        if engine.stats.finish_reason == "context" and not request.json and not request.quiet:
            stderr.write(
                f"specli: warning: the context ({session.target.n_ctx} tokens) is full; output stopped early "
                "(raise --ctx-size)\n"
            )
    return EXIT_OK


def _finish_quietly(renderer, stats, extra) -> None:
    try:
        renderer.finish(stats, extra)
    except (BrokenPipeError, KeyboardInterrupt):
        _silence_stdout()


def _silence_stdout() -> None:
    """The reader went away (`| head`): point stdout at /dev/null so exit flushes nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
