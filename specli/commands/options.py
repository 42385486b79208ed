"""The options of the commands that load models, declared once.

run, chat, bench, doctor and serve take the same model, draft, sampling and hardware
options from here (`Annotated` aliases, as huggingface_hub's CLI declares its own), and
`session_spec` and `generation_request` turn a command's parsed options into a SessionSpec
and a GenerationRequest, each in one place. This module is the CLI's: it imports Typer,
and only what the values become (nothing is loaded).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Annotated, Any, Callable, Mapping, Optional, Union, get_type_hints

import typer

from specli import drafts
from specli.decode.constraint import Constraint
from specli.decode.constraint_sources import ConstraintSource, SourceKind, write_constraint
from specli.decode.request import AUTO, DraftTokens, GenerationRequest, parse_draft_tokens, parse_draft_tokens_list
from specli.decode.sampling import DEFAULT_MIN_P, DEFAULT_TOP_K, DEFAULT_TOP_P, SamplingSettings  # noqa: F401 (defaults)
from specli.errors import UsageError
from specli.llama.backend import STATE_CHECKPOINTS, LoadSettings
from specli.llama.rpc import parse_endpoints
from specli.models.resolve import ResolvedModels
from specli.prompt import read_chat_template, read_constraint_file
from specli.session import SessionSpec

MODEL, DRAFTING, SAMPLING, FORMAT, OUTPUT, HARDWARE = "Model", "Drafting", "Sampling", "Format", "Output", "Hardware"


def check(test, requirement: str):
    """An option callback: the value (None passes) must meet `test`, else exit 2 saying why
    (shared by the commands, as are `positive` and `not_negative`)."""

    def callback(value):
        if value is not None and not test(value):
            raise typer.BadParameter(f"{value} {requirement}")
        return value

    return callback


positive = check(lambda v: v > 0, "must be above 0")
not_negative = check(lambda v: v >= 0, "must be 0 or more")
_probability = check(lambda v: 0 <= v <= 1, "must be between 0 and 1")
_layers = check(lambda v: v >= -1, "must be -1 (all) or more")
_context = check(lambda v: v >= 32, "must be at least 32")


def _servers(value: Optional[str]) -> tuple[str, ...]:
    """--rpc / --draft-rpc: HOST:PORT[,HOST:PORT...] (exit 2 on a misspelling)."""
    if value is None:
        return ()
    try:
        return tuple(str(endpoint) for endpoint in parse_endpoints(value))
    except UsageError as error:
        raise typer.BadParameter(error.message.split(": ", 1)[-1] + (f" ({error.hint})" if error.hint else "")) from None


def _draft_tokens(value: Optional[str]) -> Union[DraftTokens, None]:
    """-k N|auto; None where -k was not given (the pair's default, else auto)."""
    try:
        return None if value is None else parse_draft_tokens(value)
    except UsageError as error:
        raise typer.BadParameter(error.message, param_hint="'-k' / '--draft-tokens'") from None


def _draft_tokens_list(value: str) -> list[DraftTokens]:
    """bench -k auto,2,4: each a draft length, as -k takes one."""
    try:
        return parse_draft_tokens_list(value)
    except UsageError as error:
        raise typer.BadParameter(error.message, param_hint="'-k' / '--draft-tokens'") from None


# --- Model -----------------------------------------------------------------------
Pair = Annotated[Optional[str], typer.Option("-m", "--model", envvar="SPECLI_MODEL", metavar="PAIR", rich_help_panel=MODEL,
                                             help="A pair from `specli list`, downloaded when missing.")]
Target = Annotated[Optional[str], typer.Option("--target", metavar="MODEL", rich_help_panel=MODEL,
                                               help="GGUF, Hub owner/repo:QUANT or ollama:NAME (default: embedded Gemma).")]
Draft = Annotated[Optional[str], typer.Option("--draft", "-md", metavar="MODEL", rich_help_panel=MODEL,
                                              help=f"GGUF, owner/repo:QUANT, ollama:NAME, or a draft kind: {drafts.words()}.")]
# --- Drafting --------------------------------------------------------------------
DraftTokensOption = Annotated[Optional[str], typer.Option("-k", "--draft-tokens", "--draft-max", metavar="N|auto",
                                                          callback=_draft_tokens, show_default=False,
                                                          rich_help_panel=DRAFTING,
                                                          help="Per step, or auto (default: the pair's, else auto).")]
DraftTokensList = Annotated[str, typer.Option("-k", "--draft-tokens", metavar="LIST", callback=_draft_tokens_list,
                                              rich_help_panel=DRAFTING, help="Draft lengths to compare, e.g. auto,2,4,8,16.")]
DraftMinP = Annotated[float, typer.Option("--draft-min-p", metavar="P", callback=_probability, rich_help_panel=DRAFTING,
                                          show_default=False, help="Draft model: stop under this p.")]
Exact = Annotated[bool, typer.Option("--exact", rich_help_panel=DRAFTING, help="Bit for bit what plain writes.")]
NoLookup = Annotated[bool, typer.Option("--no-ngram", rich_help_panel=DRAFTING,
                                        help="No lookup before a draft model.")]
# --- Sampling --------------------------------------------------------------------
Temperature = Annotated[float, typer.Option("--temp", metavar="T", callback=not_negative, rich_help_panel=SAMPLING,
                                            show_default=False, help="Temperature (default 0: greedy).")]
TopK = Annotated[int, typer.Option("--top-k", metavar="K", callback=not_negative, rich_help_panel=SAMPLING,
                                   show_default=False, help="Top-k (default 40; 0: off).")]
TopP = Annotated[float, typer.Option("--top-p", metavar="P", callback=_probability, rich_help_panel=SAMPLING,
                                     show_default=False, help="Top-p (default 0.95; 1: off).")]
MinP = Annotated[float, typer.Option("--min-p", metavar="P", callback=_probability, rich_help_panel=SAMPLING,
                                     show_default=False, help="Min-p (default 0.05; 0: off).")]
RepeatPenalty = Annotated[float, typer.Option("--repeat-penalty", metavar="X", callback=positive, rich_help_panel=SAMPLING,
                                              show_default=False, help="Repeat penalty (default 1: off).")]
RepeatLastN = Annotated[int, typer.Option("--repeat-last-n", metavar="N", callback=not_negative, rich_help_panel=SAMPLING,
                                          show_default=False, help="Tokens it looks back (default 64).")]
Seed = Annotated[Optional[int], typer.Option("-s", "--seed", metavar="N", callback=not_negative, rich_help_panel=SAMPLING,
                                             help="Seed; the same seed repeats a run.")]
# --- Format: the chat template, and a constraint (llama.cpp's spellings) ----------
ChatTemplateFile = Annotated[Optional[Path], typer.Option("--chat-template-file", metavar="FILE", rich_help_panel=FORMAT,
                                                          help="Use this Jinja chat template instead.")]
Grammar = Annotated[Optional[str], typer.Option("--grammar", metavar="GBNF", rich_help_panel=FORMAT,
                                                help="Write only what this grammar allows.")]
GrammarFile = Annotated[Optional[Path], typer.Option("--grammar-file", metavar="FILE", rich_help_panel=FORMAT,
                                                     help="Read the GBNF grammar from this file.")]
JsonSchema = Annotated[Optional[str], typer.Option("-j", "--json-schema", metavar="JSON", rich_help_panel=FORMAT,
                                                   help="JSON this schema allows ('{}': any).")]
JsonSchemaFile = Annotated[Optional[Path], typer.Option("-jf", "--json-schema-file", metavar="FILE",
                                                        rich_help_panel=FORMAT,
                                                        help="Read the JSON schema from this file.")]
Mmproj = Annotated[Optional[Path], typer.Option("--mmproj", metavar="FILE", rich_help_panel=FORMAT,
                                              help="Image projector (default: beside it).")]
# --- Output ----------------------------------------------------------------------
Verbose = Annotated[bool, typer.Option("--verbose", rich_help_panel=OUTPUT, help="Show llama.cpp's log.")]
# --- Hardware --------------------------------------------------------------------
GpuLayers = Annotated[Optional[int], typer.Option("--gpu-layers", "-ngl", metavar="N", callback=_layers, rich_help_panel=HARDWARE,
                                                  help="Target layers on the GPU (-1: all).")]
DraftGpuLayers = Annotated[Optional[int], typer.Option("--draft-gpu-layers", "-ngld", metavar="N", callback=_layers,
                                                       rich_help_panel=HARDWARE, help="Draft layers on the GPU (default: as the target).")]
CtxSize = Annotated[int, typer.Option("-c", "--ctx-size", metavar="N", callback=_context, rich_help_panel=HARDWARE,
                                      help="Context size in tokens.")]
Threads = Annotated[Optional[int], typer.Option("-t", "--threads", metavar="N", callback=positive, rich_help_panel=HARDWARE,
                                                help="CPU threads (default: all).")]
Repack = Annotated[bool, typer.Option("--repack/--no-repack", rich_help_panel=HARDWARE, help="CPU weight repacking (--exact picks it).")]
Servers = Annotated[Optional[str], typer.Option("--rpc", metavar="LIST", callback=_servers, rich_help_panel=HARDWARE,
                                                help="Target layers on rpc-servers (HOST:PORT,...).")]
VerifyOnDevice = Annotated[bool, typer.Option("--verify-on-device", rich_help_panel=HARDWARE,
                                              help="Greedy runs: llama.cpp takes each verified row's argmax on its device.")]
DraftServers = Annotated[Optional[str], typer.Option("--draft-rpc", metavar="LIST", callback=_servers, rich_help_panel=HARDWARE,
                                                     help="Draft layers on rpc-servers.")]

DEFAULT_CTX_SIZE = 4096
DEFAULT_MAX_TOKENS = 256
DEFAULT_PARALLEL = 4  # serve's requests and run --batch's prompts at once, as llama-server's automatic slots
NO_LIMIT = 1 << 30  # a chat's turns and a server's requests: until the model ends, or the context is full


def _group(**options: tuple[Any, Any]) -> tuple[inspect.Parameter, ...]:
    return tuple(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
                 for name, (annotation, default) in options.items())


# Groups of options several commands take, each declared here once. `with_options` adds them
# to a command; their values reach it in ctx.params, where session_spec, generation_request,
# hardware and sampling find them by name.
MODELS = _group(model=(Pair, None), target=(Target, None), draft=(Draft, None))
TEMPLATE_OPTIONS = _group(chat_template_file=(ChatTemplateFile, None))
VISION_OPTIONS = _group(mmproj=(Mmproj, None))
DRAFTING_OPTIONS = _group(draft_tokens=(DraftTokensOption, None), draft_min_p=(DraftMinP, 0.0), exact=(Exact, False),
                          no_ngram=(NoLookup, False))
SAMPLING_OPTIONS = _group(temperature=(Temperature, 0.0), top_k=(TopK, DEFAULT_TOP_K), top_p=(TopP, DEFAULT_TOP_P),
                          min_p=(MinP, DEFAULT_MIN_P), repeat_penalty=(RepeatPenalty, 1.0),
                          repeat_last_n=(RepeatLastN, 64), seed=(Seed, None))
CONSTRAINT_OPTIONS = _group(grammar=(Grammar, None), grammar_file=(GrammarFile, None), json_schema=(JsonSchema, None),
                            json_schema_file=(JsonSchemaFile, None))
HARDWARE_OPTIONS = _group(verbose=(Verbose, False), gpu_layers=(GpuLayers, None),
                          draft_gpu_layers=(DraftGpuLayers, None), ctx_size=(CtxSize, DEFAULT_CTX_SIZE),
                          threads=(Threads, None), repack=(Repack, True), rpc=(Servers, None),
                          draft_rpc=(DraftServers, None))


def with_options(*groups: tuple[inspect.Parameter, ...]) -> Callable[[Callable], Callable]:
    """Add the option groups to a command's declaration (Typer reads its signature). The
    command itself is called with the parameters it declares; the groups' values it reads
    from ctx.params."""

    def declare(command: Callable) -> Callable:
        signature = inspect.signature(command, eval_str=True)
        own = set(signature.parameters)
        added = [parameter for group in groups for parameter in group if parameter.name not in own]

        @functools.wraps(command)
        def call(*args: Any, **kwargs: Any) -> Any:
            return command(*args, **{name: value for name, value in kwargs.items() if name in own})

        # Arguments first, then the groups (help lists each panel's options in this order), then its own.
        params = list(signature.parameters.values())
        split = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.KEYWORD_ONLY), len(params))
        call.__signature__ = signature.replace(parameters=[*params[:split], *added, *params[split:]])  # type: ignore[attr-defined]
        call.__annotations__ = {**get_type_hints(command, include_extras=True),
                                **{parameter.name: parameter.annotation for parameter in added}}
        return call

    return declare


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


def _picked(params: Mapping[str, Any], cls: type) -> dict[str, Any]:
    """The parsed options (a command's ctx.params) that are fields of `cls`, by name: each
    command declares the options it takes, and the domain objects are built here, once."""
    return {field.name: params[field.name] for field in fields(cls) if field.name in params}


def models(params: Mapping[str, Any]) -> ResolvedModels:
    """-m, --target and --draft: the files to load (pulled from the Hub where they are not
    cached yet), and the draft kind."""
    return drafts.resolve_models(params.get("model"), params.get("target"), params.get("draft"),
                                 speedup=lambda target, draft: stored_speedup(target, draft, default_load()))


def default_load() -> LoadSettings:
    """The settings a command loads a model with when no hardware option is given."""
    return LoadSettings(-1, rpc=(), ctx_size=DEFAULT_CTX_SIZE, threads=None, repack=True)


def stored_speedup(target: Path, draft: Path | None, load: LoadSettings, kind: str | None = None) -> float | None:
    """`draft`'s speed-up for `target` as `specli drafts --measure` timed it (None: not
    measured); `draft` None: that of `kind`'s own layers (the target's NextN layers')."""
    return drafts.stored_speedup(target, draft, load, kind)


def hardware(params: Mapping[str, Any]) -> Hardware:
    return Hardware(**_picked(params, Hardware))


def sampling(params: Mapping[str, Any]) -> SamplingSettings:
    return SamplingSettings(**_picked(params, SamplingSettings))


def session_spec(models: ResolvedModels, params: Mapping[str, Any]) -> SessionSpec:
    """The models and where they run, as one SessionSpec; refuses settings that cannot work together."""
    where = hardware(params)
    layers = -1 if where.gpu_layers is None else where.gpu_layers
    draft_layers = layers if where.draft_gpu_layers is None else where.draft_gpu_layers
    if where.rpc and layers == 0:
        raise UsageError("--rpc with --gpu-layers 0 puts no layer on the servers", "drop --gpu-layers 0")
    if where.draft_rpc and models.draft_model is None:
        raise UsageError(f"--draft-rpc places a draft model's layers; --draft {models.draft} has none")
    if where.draft_rpc and draft_layers == 0:
        raise UsageError("--draft-rpc with --draft-gpu-layers 0 puts no layer on the servers")
    load = dict(ctx_size=where.ctx_size, threads=where.threads, repack=where.repack)
    asked = params.get("draft_tokens")
    if asked is None:
        asked = models.draft_tokens if models.draft_tokens is not None else AUTO
    return SessionSpec(
        target=models.target,
        draft_model=models.draft_model,
        # --parallel N (run --batch, serve): N sequences of the target, each of -c positions;
        # a recurrent target's snapshots as long as the run drafts (bench: its longest -k)
        target_load=LoadSettings(layers, rpc=where.rpc, sequences=params.get("parallel") or 1,
                                 recurrent_snapshots=drafts.snapshots((models.draft,), asked if isinstance(asked, list)
                                                                      else [asked]), **load),
        draft_load=LoadSettings(draft_layers, rpc=where.draft_rpc, sequences=params.get("parallel") or 1, **load),
        exact=params.get("exact", False),
        verify_on_device=where.verify_on_device,
        verbose=params.get("verbose", False),
        chat_template=read_chat_template(path) if (path := params.get("chat_template_file")) is not None else None,
        loads=(models.draft,),
        projector=params.get("mmproj"),
        nextn_file=models.nextn_file,
    )


def conversing(spec: SessionSpec) -> SessionSpec:
    """The spec for a conversation (chat, serve): a recurrent or hybrid target keeps state
    checkpoints on the host, so that each turn restores one and decodes only what is new."""
    return replace(spec, checkpoints=STATE_CHECKPOINTS)


def with_projector(spec: SessionSpec, models: ResolvedModels, *, needed: bool,
                   notice: Callable[[str], None] | None = None) -> SessionSpec:
    """The spec with its projector: --mmproj, else the pair's, else the one beside the target
    (llama.cpp's mmproj-*.gguf): where images are `needed` (a target with none refuses them in
    one line), or, with a `notice` (serve, chat), wherever there is one, said in one line."""
    from specli.models import resolve

    if spec.projector is not None or not (needed or notice):
        return spec
    found = resolve.projector(models)
    if found is not None and notice is not None:
        where = "the pair's" if models.projector else "the model's"
        notice(f"images: reading them with {found.name}, {where} (--mmproj to choose)")
    if found is None and not needed:
        return spec
    if found is None:
        raise UsageError(f"{spec.target.name} has no projector to read images with (no mmproj*.gguf beside it"
                         + (", nor in its repo)" if models.reference else ")"),
                         "give --mmproj FILE, the projector made for this model")
    return replace(spec, projector=found)


def default_parallel(spec: SessionSpec, *, alone: bool = False) -> int:
    """--parallel's default: DEFAULT_PARALLEL (llama-server's automatic slots, hybrid targets
    too), or 1 where `alone` and the spec loads a kind that drafts in one sequence only."""
    return 1 if alone and drafting_alone(spec) else DEFAULT_PARALLEL


def drafting_alone(spec: SessionSpec) -> list[str]:
    """The draft kinds the spec loads that draft in one sequence only (the target's NextN
    layers): beside other sequences (--parallel above 1) they cannot draft."""
    return [kind.name for kind in drafts.KINDS.values() if kind.alone(spec) and kind.is_wanted(spec)]


def beside_others(models: ResolvedModels, alone: list[str], parallel: int,
                  notice: Callable[[str], None]) -> ResolvedModels:
    """--parallel above 1 with kinds that draft alone: n-gram lookup drafts instead, said in one line."""
    notice(f"--parallel {parallel}: {', '.join(alone)} drafts in one sequence only; drafting with n-gram lookup "
           "(--parallel 1 drafts with it)")
    return replace(models, draft=drafts.NGRAM.name if models.draft in alone else models.draft, draft_model=None)


def generation_request(models: ResolvedModels, params: Mapping[str, Any], *, max_tokens: int) -> GenerationRequest:
    """The generation the options ask for. -k not given: the pair's own draft length where it
    sets one, else auto."""
    draft_tokens = params.get("draft_tokens")
    if draft_tokens is None:
        draft_tokens = models.draft_tokens if models.draft_tokens is not None else AUTO
    return GenerationRequest(
        max_tokens=max_tokens,
        sampling=sampling(params),
        stop=tuple(params.get("stop") or ()),
        seed=params.get("seed"),
        draft=models.draft,
        draft_tokens=draft_tokens,
        lookup=not params.get("no_ngram", False),
        draft_min_p=params.get("draft_min_p", 0.0),
        exact=params.get("exact", False),
        constraint=constraint(params),
    )


def constraint(params: Mapping[str, Any]) -> Constraint | None:
    """--grammar, --grammar-file, -j or -jf: the constraint it gives (write_constraint refuses two)."""
    sources = []
    if (grammar := params.get("grammar")) is not None:
        sources.append(ConstraintSource("--grammar", SourceKind.GRAMMAR, lambda: Constraint.gbnf(grammar, "--grammar")))
    if (grammar_file := params.get("grammar_file")) is not None:
        sources.append(ConstraintSource("--grammar-file", SourceKind.GRAMMAR, lambda: Constraint.gbnf(
            read_constraint_file(grammar_file, "grammar file"), f"grammar in {grammar_file}")))
    if (schema := params.get("json_schema")) is not None:
        sources.append(ConstraintSource("--json-schema", SourceKind.JSON,
                                        lambda: Constraint.json_schema(schema, "--json-schema")))
    if (schema_file := params.get("json_schema_file")) is not None:
        sources.append(ConstraintSource("--json-schema-file", SourceKind.JSON, lambda: Constraint.json_schema(
            read_constraint_file(schema_file, "JSON schema file"), f"JSON schema in {schema_file}")))
    return write_constraint(sources)
