"""`specli run` as a function: read the prompt, resolve the models, stream events to a renderer.

The CLI builds the domain objects (SessionSpec, GenerationOptions, Prompt, Output) and calls
`execute`; everything here raises SpecliError subclasses for the CLI to report, and returns
the process exit code.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from specli.errors import PromptError, SpecliError, UsageError

if TYPE_CHECKING:
    from specli.engine import GenerationOptions
    from specli.session import SessionSpec

EXIT_OK = 0
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Prompt:
    text: str
    system: str | None = None
    chat: bool | None = None  # None: when the target has a chat template


@dataclass(frozen=True)
class Output:
    colour: str = "auto"  # auto | always | never
    json: bool = False
    quiet: bool = False


def read_prompt(prompt: str | None, prompt_file: Path | None, stdin: IO[str]) -> str:
    """The prompt from the argument, `-`, -f FILE, or piped stdin — exactly one of them.
    Refused here, before any model loads, when it is empty."""
    text = _read_prompt(prompt, prompt_file, stdin)
    if not text.strip():
        raise PromptError("the prompt is empty", "give a prompt as an argument, with -f FILE, or on stdin")
    return text


def _read_prompt(prompt: str | None, prompt_file: Path | None, stdin: IO[str]) -> str:
    if prompt_file is not None:
        if prompt not in (None, "-"):
            raise PromptError("give the prompt either as an argument or with -f, not both")
        try:
            data = prompt_file.read_bytes()
        except FileNotFoundError as error:
            raise PromptError(f"prompt file not found: {prompt_file}") from error
        except OSError as error:
            raise PromptError(f"cannot read prompt file {prompt_file}: {error.strerror or error}") from error
        return _decode_prompt(data, f"prompt file {prompt_file}")
    if prompt == "-" or (prompt is None and not _isatty(stdin)):
        buffer = getattr(stdin, "buffer", None)
        if buffer is None:  # a text stream without bytes underneath (tests)
            text = _check_text(stdin.read(), "the prompt on stdin")
        else:
            text = _decode_prompt(buffer.read(), "the prompt on stdin")
        # `echo "$P" | specli run` prompts with "$P", as `specli run "$P"` does (llm and Ollama alike).
        return text[:-1] if text.endswith("\n") else text
    if prompt is None:
        raise PromptError("no prompt given", 'specli run "your prompt", or pipe it on stdin')
    return _check_text(prompt, "the prompt")


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
    draft_tokens: int | None = None  # the pair's fixed number of draft tokens, if it sets one


def resolve_models(pair: str | None, target: str | Path | None, draft: str | None) -> ResolvedModels:
    """--target/--draft as given (a file, or a Hub reference pulled into the cache); -m PAIR through
    the registry (pulling missing files); neither: the embedded demo model with n-gram drafting."""
    if target is not None and pair is not None:
        raise SpecliError("give either -m PAIR or --target PATH, not both")
    if target is not None:
        return ResolvedModels(model_file(target), _draft_path_or_kind(draft or "ngram"))
    if pair is None:
        from specli.demo import embedded_model_path

        return ResolvedModels(embedded_model_path(), _draft_path_or_kind(draft or "ngram"))
    from specli import hub
    from specli.registry import load_registry

    entry = load_registry().get(pair)
    target_path, pair_draft = hub.resolve_pair(entry, download=True)
    chosen = _draft_path_or_kind(draft) if draft else (pair_draft or "none")
    return ResolvedModels(target_path, chosen, entry.draft_tokens)


def _draft_path_or_kind(draft: str | Path) -> Path | str:
    if isinstance(draft, str) and draft in ("ngram", "none"):
        return draft
    return model_file(draft)


def model_file(model: str | Path) -> Path:
    """A local file, which always wins; else a Hub reference (`owner/repo:QUANT`, `owner/repo/file.gguf`),
    pulled into the Hugging Face cache; else the path as given, for the loader to say what is wrong."""
    path = Path(model).expanduser()
    if path.exists() or "/" not in str(model):
        return path
    from specli import hub

    return hub.resolve_reference(str(model)) or path


def check_draft_spelling(draft: str | None) -> None:
    """--draft ngrm: a misspelt proposer, not a missing file."""
    import difflib

    if draft is None or draft in ("ngram", "none") or Path(draft).exists() or "/" in draft or "." in draft:
        return
    close = difflib.get_close_matches(draft, ["ngram", "none"], n=1, cutoff=0.6)
    if close:
        raise UsageError(f"--draft {draft}: no such file or proposer", f"did you mean --draft {close[0]}?")


def warn_if_self_drafting(spec: SessionSpec, stderr: IO[str]) -> None:
    """A draft that is the target itself costs as much as the target: it cannot speed anything up."""
    if isinstance(spec.draft, Path) and spec.draft.exists() and spec.draft.resolve() == spec.target.resolve():
        stderr.write("specli: warning: the draft is the target itself; drafting costs as much as it saves "
                     "(use --draft ngram, or a smaller model of the same family)\n")


def warn_without_gpu(stderr: IO[str]) -> None:
    """--gpu-layers asked for on a build that cannot offload: say so, and run on the CPU."""
    from specli.backend import supports_gpu_offload

    if not supports_gpu_offload():
        from specli.doctor import GPU_INSTALL_HINT

        stderr.write(f"specli: warning: this llama-cpp-python build has no GPU support; running on the CPU ({GPU_INSTALL_HINT})\n")


def execute(spec: SessionSpec, prompt: Prompt, options: GenerationOptions, draft_tokens: int | None,
            output: Output = Output(), stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> int:
    """Run one generation, streaming to stdout. draft_tokens None: -k auto. Returns the exit code."""
    from specli.adaptive import AdaptiveDraftLength
    from specli.engine import Finished, StepRecord, Token, check_prompt_fits
    from specli.render import JsonRenderer, TextRenderer, use_colour
    from specli.prompt import prompt_tokens
    from specli import rpc
    from specli.session import open_session

    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr

    def notice(message: str) -> None:
        if not output.quiet and not output.json:
            stderr.write(f"specli: {message}\n")
            stderr.flush()

    with open_session(spec, notice) as session:
        if session.exact_batch == 1 and spec.draft != "none":
            notice("--exact: no verify batch above one row gives one-token logits on this build; decoding plainly")
        tokens = prompt_tokens(session.target, prompt.text, system=prompt.system, chat=prompt.chat)
        check_prompt_fits(len(tokens), session.target.n_ctx)
        draft_length = session.draft_length(draft_tokens)
        engine = session.engine(draft_length, options)
        renderer = (
            JsonRenderer(stdout)
            if output.json
            else TextRenderer(stdout, stderr, colour=use_colour(output.colour, stdout), quiet=output.quiet)
        )
        sampling = options.sampling
        extra = {
            "draft_tokens": draft_tokens or ("auto" if isinstance(draft_length, AdaptiveDraftLength) else 0),
            "draft_min_p": spec.draft_min_p if isinstance(spec.draft, Path) else None,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "min_p": sampling.min_p,
            "seed": session.seed,
            "target": spec.target.name,
            "draft": spec.draft.name if isinstance(spec.draft, Path) else spec.draft,
            "lossless": True,
            "exact": spec.exact,
            "exact_batch": session.exact_batch,
            "repack": session.spec.target_load.repack,
        }
        if isinstance(draft_length, AdaptiveDraftLength):
            extra["costs"] = session.costs().source
        if spec.target_load.rpc:
            extra["rpc"] = list(spec.target_load.rpc)
        if spec.draft_load.rpc and isinstance(spec.draft, Path):
            extra["draft_rpc"] = list(spec.draft_load.rpc)
        events = engine.generate(tokens)
        steps: list[StepRecord] = []

        def flush_partial() -> None:  # an RPC server went away: what was generated still shows
            engine.stats.finish_reason = "error"
            renderer.finish(engine.stats, extra)

        with rpc.on_fault(flush_partial):
            try:
                renderer.start()
                for event in events:
                    if isinstance(event, Token):
                        renderer.token(event)
                    elif isinstance(event, StepRecord):
                        steps.append(event)
                        renderer.step_done()  # flush once per step
                    elif isinstance(event, Finished):
                        break
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
        if isinstance(draft_length, AdaptiveDraftLength):
            session.learn(steps)
        if engine.stats.finish_reason == "context":
            notice(f"warning: the context ({session.target.n_ctx} tokens) is full; output stopped early (raise --ctx-size)")
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
