"""`specli run` as a function: open the session, stream one generation to the terminal
or as JSON lines, and return the exit code.

The CLI builds the domain objects (SessionSpec, GenerationOptions, Prompt, Output) and calls
`execute`; errors are SpecliError subclasses, for the CLI to report.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from specli.decode.adaptive import AdaptiveDraftPolicy
from specli.decode.engine import DraftPolicy, DraftTokens, GenerationOptions
from specli.prompt import prompt_tokens
from specli.render import JsonRenderer, TextRenderer, notifier, use_colour
from specli.session import Session, SessionSpec, open_session
from specli.stream import stream

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


def warn_without_gpu(stderr: IO[str]) -> None:
    """--gpu-layers asked for on a build that cannot offload: say so, and run on the CPU."""
    from specli.llama.backend import supports_gpu_offload
    from specli.install import GPU_INSTALL_HINT

    if not supports_gpu_offload():
        stderr.write(f"specli: warning: this llama-cpp-python build has no GPU support; running on the CPU ({GPU_INSTALL_HINT})\n")


def execute(spec: SessionSpec, prompt: Prompt, options: GenerationOptions, draft_tokens: DraftTokens,
            output: Output = Output(), stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> int:
    """Run one generation, streaming to stdout. Returns the exit code."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    notice = notifier(stderr, quiet=output.quiet or output.json)
    with open_session(spec, notice) as session:
        if session.exact_batch == 1 and spec.draft != "none":
            notice("--exact: no verify batch above one row gives one-token logits on this build; decoding plainly")
        tokens = prompt_tokens(session.target, prompt.text, system=prompt.system, chat=prompt.chat)
        policy = session.draft_policy(draft_tokens)
        engine = session.engine(policy, options)
        if output.json:
            sink = JsonRenderer(stdout, metadata(session, options, draft_tokens, policy))
        else:
            sink = TextRenderer(stdout, stderr, colour=use_colour(output.colour, stdout), quiet=output.quiet)
        try:
            outcome = stream(engine, tokens, sink)
        except BrokenPipeError:  # the reader went away (`| head`): a success
            _silence_stdout()
            return EXIT_OK
        if outcome.stats.finish_reason == "interrupted":
            return EXIT_INTERRUPTED
        if outcome.stats.finish_reason == "context":
            notice(f"warning: the context ({session.target.n_ctx} tokens) is full; output stopped early (raise --ctx-size)")
    return EXIT_OK


def metadata(session: Session, options: GenerationOptions, draft_tokens: DraftTokens, policy: DraftPolicy) -> dict:
    """The settings a --json stats record carries besides the stats."""
    spec, sampling = session.spec, options.sampling
    drafting = session.proposer.name != "none"
    data = {
        "draft_tokens": draft_tokens if drafting else 0,
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
        "repack": spec.target_load.repack,
    }
    if isinstance(policy, AdaptiveDraftPolicy):
        data["costs"] = policy.costs.source
    if spec.target_load.rpc:
        data["rpc"] = list(spec.target_load.rpc)
    if spec.draft_load.rpc and isinstance(spec.draft, Path):
        data["draft_rpc"] = list(spec.draft_load.rpc)
    return data


def _silence_stdout() -> None:
    """The reader went away (`| head`): point stdout at /dev/null so exit flushes nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
