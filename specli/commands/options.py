"""The options of the commands that load models, declared once.

run, chat, bench, doctor and serve take the same model, draft, sampling and hardware
options from here (`Annotated` aliases, as huggingface_hub's CLI declares its own), and
`session_spec` turns them into a SessionSpec in one place. This module is the CLI's: it
imports Typer, and only what the values become (nothing is loaded).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional, Union

import typer

from specli.llama.backend import LoadSettings
from specli.decode.engine import DraftTokens
from specli.errors import UsageError
from specli.models.resolve import ResolvedModels
from specli.llama.rpc import parse_endpoints
from specli.decode.sampling import DEFAULT_MIN_P, DEFAULT_TOP_K, DEFAULT_TOP_P, SamplingSettings
from specli.session import SessionSpec

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
    if value is None:
        return ()
    try:
        return tuple(str(endpoint) for endpoint in parse_endpoints(value))
    except UsageError as error:
        raise typer.BadParameter(error.message.split(": ", 1)[-1] + (f" ({error.hint})" if error.hint else "")) from None


def parse_draft_tokens(value: Optional[str]) -> Union[DraftTokens, None]:
    """-k N|auto; None where -k was not given (the pair's default, else auto)."""
    hint = "'-k' / '--draft-tokens'"
    if value is None or value == "auto":
        return value
    try:
        number = int(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a whole number or 'auto'", param_hint=hint) from None
    if number < 1:
        raise typer.BadParameter("must be at least 1 (use --draft none for plain decoding)", param_hint=hint)
    return number


def draft_tokens_for(given: Union[DraftTokens, None], models: ResolvedModels) -> DraftTokens:
    """-k as given; not given: the pair's own default where it sets one, else auto."""
    if given is not None:
        return given
    return models.draft_tokens if models.draft_tokens is not None else "auto"


# --- Model -----------------------------------------------------------------------
Pair = Annotated[Optional[str], typer.Option("-m", "--model", envvar="SPECLI_MODEL", metavar="PAIR", rich_help_panel=MODEL,
                                             help="A pair from `specli list`, downloaded when missing.")]
Target = Annotated[Optional[str], typer.Option("--target", metavar="MODEL", rich_help_panel=MODEL,
                                               help="Target GGUF or Hub owner/repo:QUANT (default: the embedded Gemma 3 270M).")]
Draft = Annotated[Optional[str], typer.Option("--draft", "-md", metavar="MODEL", rich_help_panel=MODEL,
                                              help="Draft GGUF, Hub owner/repo:QUANT, ngram, or none (plain decoding).")]
# --- Drafting --------------------------------------------------------------------
DraftTokensOption = Annotated[Optional[str], typer.Option("-k", "--draft-tokens", "--draft-max", metavar="N|auto",
                                                          show_default=False, rich_help_panel=DRAFTING,
                                                          help="Per step, or auto (default: the pair's, else auto).")]
DraftMinP = Annotated[float, typer.Option("--draft-min-p", metavar="P", callback=_probability, rich_help_panel=DRAFTING,
                                          show_default=False, help="Draft model: stop under this p.")]
Exact = Annotated[bool, typer.Option("--exact", rich_help_panel=DRAFTING, help="Bit for bit what plain writes.")]
NoLookup = Annotated[bool, typer.Option("--no-ngram", rich_help_panel=DRAFTING,
                                        help="No lookup before a draft model.")]
# --- Sampling --------------------------------------------------------------------
Temperature = Annotated[float, typer.Option("--temp", metavar="T", callback=_not_negative, rich_help_panel=SAMPLING,
                                            help="Temperature; 0 is greedy.")]
TopK = Annotated[int, typer.Option("--top-k", metavar="K", callback=_not_negative, rich_help_panel=SAMPLING,
                                   help="Keep the k likeliest tokens (0: off).")]
TopP = Annotated[float, typer.Option("--top-p", metavar="P", callback=_probability, rich_help_panel=SAMPLING,
                                     help="Nucleus threshold (1: off).")]
MinP = Annotated[float, typer.Option("--min-p", metavar="P", callback=_probability, rich_help_panel=SAMPLING,
                                     help="Drop tokens under p x the best one's (0: off).")]
RepeatPenalty = Annotated[float, typer.Option("--repeat-penalty", metavar="X", callback=_positive, rich_help_panel=SAMPLING,
                                              help="Penalise repeated tokens (1: off).")]
RepeatLastN = Annotated[int, typer.Option("--repeat-last-n", metavar="N", callback=_not_negative, rich_help_panel=SAMPLING,
                                          help="How far back --repeat-penalty looks.")]
Seed = Annotated[Optional[int], typer.Option("-s", "--seed", metavar="N", callback=_not_negative, rich_help_panel=SAMPLING,
                                             help="Seed; the same seed repeats a run.")]
# --- Output ----------------------------------------------------------------------
Verbose = Annotated[bool, typer.Option("--verbose", rich_help_panel=OUTPUT, help="Show llama.cpp's log.")]
# --- Hardware --------------------------------------------------------------------
GpuLayers = Annotated[Optional[int], typer.Option("--gpu-layers", "-ngl", metavar="N", callback=_layers, rich_help_panel=HARDWARE,
                                                  help="Target layers on the GPU (-1: all).")]
DraftGpuLayers = Annotated[Optional[int], typer.Option("--draft-gpu-layers", "-ngld", metavar="N", callback=_layers,
                                                       rich_help_panel=HARDWARE, help="Draft layers on the GPU (default: as the target).")]
CtxSize = Annotated[int, typer.Option("-c", "--ctx-size", metavar="N", callback=_context, rich_help_panel=HARDWARE,
                                      help="Context size in tokens.")]
Threads = Annotated[Optional[int], typer.Option("-t", "--threads", metavar="N", callback=_positive, rich_help_panel=HARDWARE,
                                                help="CPU threads (default: all cores).")]
Repack = Annotated[bool, typer.Option("--repack/--no-repack", rich_help_panel=HARDWARE, help="CPU weight repacking (--exact picks it).")]
Servers = Annotated[Optional[str], typer.Option("--rpc", metavar="LIST", callback=_servers, rich_help_panel=HARDWARE,
                                                help="Target layers on rpc-servers (HOST:PORT,...).")]
VerifyOnDevice = Annotated[bool, typer.Option("--verify-on-device", rich_help_panel=HARDWARE,
                                              help="Greedy runs: llama.cpp takes each verified row's argmax on its device.")]
DraftServers = Annotated[Optional[str], typer.Option("--draft-rpc", metavar="LIST", callback=_servers, rich_help_panel=HARDWARE,
                                                     help="Draft layers on rpc-servers.")]

DEFAULT_CTX_SIZE = 4096


@dataclass(frozen=True)
class Hardware:
    """Where the two models run: -ngl, -ngld, -c, -t, --repack, --rpc, --draft-rpc, --verify-on-device."""

    gpu_layers: int | None = None
    draft_gpu_layers: int | None = None
    ctx_size: int = DEFAULT_CTX_SIZE
    threads: int | None = None
    repack: bool = True
    rpc: tuple[str, ...] = ()
    draft_rpc: tuple[str, ...] = ()
    verify_on_device: bool = False

    @property
    def asks_for_gpu(self) -> bool:
        """-ngl or -ngld given for local layers (with --rpc, layers go to the servers)."""
        return (self.gpu_layers is not None or self.draft_gpu_layers is not None) and not (self.rpc or self.draft_rpc)


@dataclass(frozen=True)
class Drafting:
    """How the draft proposes besides which draft it is: --draft-min-p and --exact."""

    draft_min_p: float = 0.0
    exact: bool = False
    lookup: bool = True  # with a draft model: n-gram lookup in front of it


def session_spec(models: ResolvedModels, hardware: Hardware, sampling: SamplingSettings, *,
                 seed: int | None = None, drafting: Drafting = Drafting(), verbose: bool = False) -> SessionSpec:
    """The models and their settings as one SessionSpec; refuses settings that cannot work together."""
    layers = -1 if hardware.gpu_layers is None else hardware.gpu_layers
    draft_layers = layers if hardware.draft_gpu_layers is None else hardware.draft_gpu_layers
    if hardware.rpc and layers == 0:
        raise UsageError("--rpc with --gpu-layers 0 puts no layer on the servers", "drop --gpu-layers 0")
    if hardware.draft_rpc and not isinstance(models.draft, Path):
        raise UsageError(f"--draft-rpc places a draft model's layers; --draft {models.draft} has none")
    if hardware.draft_rpc and draft_layers == 0:
        raise UsageError("--draft-rpc with --draft-gpu-layers 0 puts no layer on the servers")
    load = dict(ctx_size=hardware.ctx_size, threads=hardware.threads, repack=hardware.repack)
    return SessionSpec(
        target=models.target,
        draft=models.draft,
        target_load=LoadSettings(layers, rpc=hardware.rpc, **load),
        draft_load=LoadSettings(draft_layers, rpc=hardware.draft_rpc, **load),
        sampling=sampling,
        seed=seed,
        draft_min_p=drafting.draft_min_p,
        exact=drafting.exact,
        verify_on_device=hardware.verify_on_device,
        verbose=verbose,
        draft_lookup=drafting.lookup,
    )


def sampling_settings(temp: float, top_k: int = DEFAULT_TOP_K, top_p: float = DEFAULT_TOP_P, min_p: float = DEFAULT_MIN_P,
                      repeat_penalty: float = 1.0, repeat_last_n: int = 64) -> SamplingSettings:
    return SamplingSettings(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n)
