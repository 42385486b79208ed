"""A loaded pair and what it costs; and `engine_for`, the one place a generation is built.

The session holds load-time facts only: the target, a draft model (with its KV cache),
whether it drafts through text, the exact verify batch, the stored costs, and what the
target's KV cache holds. A GenerationRequest says everything else; `engine_for` turns it
into the proposer, the draft-length policy and the engine that run it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from specli.config import cache_dir
from specli.decode.adaptive import MAX_DRAFT, AdaptiveDraftPolicy
from specli.decode.constraint import Matcher, Vocabulary
from specli.decode.costs import (
    CALIBRATION_SIZES,
    FIRST_RUN_SIZES,
    PASSES,
    PRIOR_LOOP,
    STALE_RANGE,
    STALE_STEPS,
    Calibration,
    CostSource,
    CostStore,
    StepCosts,
    VerifyCurve,
    calibrate,
    curve_problem,
    prior_costs,
)
from specli.decode.draft_model import DraftModel, DraftModelProposer
from specli.decode.engine import Engine, TargetCache
from specli.decode.events import Stats
from specli.decode.exact import exact_batch_size
from specli.decode.ngram import NGramProposer, TokenIndex
from specli.decode.policy import DraftPolicy, FixedDraftPolicy
from specli.decode.proposers import LookupThenModel, NoProposer, Proposer
from specli.decode.request import AUTO, DraftKind, GenerationRequest
from specli.decode.translate import TranslatedDraft, cost_per_target_token
from specli.errors import CalibrationError, UsageError, VocabMismatchError
from specli.llama.backend import LoadSettings, Model, library_versions, supports_gpu_offload
from specli.llama.devices import compute_fingerprint
from specli.llama.vocab import check_vocab_compatible

CATCH_UP_BATCH = 16  # a draft model's catch-up is priced per token of a batch this long


@dataclass(frozen=True)
class SessionSpec:
    """What to load, and how."""

    target: Path
    draft_model: Path | None = None
    target_load: LoadSettings = LoadSettings()
    draft_load: LoadSettings = LoadSettings()
    # Load for exact decoding: measure (or read) which verify batches give one-token logits
    # bit for bit, with repacking on and off, and load with the setting that allows more.
    exact: bool = False
    # Greedy runs without a repetition penalty verify on the device (Engine's verify_on_device).
    verify_on_device: bool = False
    verbose: bool = False
    chat_template: str | None = None  # --chat-template-file: the template's text, in place of the GGUF's


class Session:
    """A loaded target, and a draft model where one was asked for, reusable across generations."""

    def __init__(self, spec: SessionSpec, target: Model, draft: DraftModel | None = None, *, translated: bool = False,
                 exact_batch: int | None = None, notice: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self.target = target
        self.draft = draft
        self.translated = translated  # the draft model's vocabulary is not the target's: it drafts through text
        self._exact_batch = exact_batch
        self._cache = TargetCache()  # what the target's KV cache holds, across generations
        self._cost_store: CostStore | None = None
        self._costs: StepCosts | None = None  # the costs generations are priced with, once read (costs)
        self._notice = notice  # hears of a calibration the machine was too busy for, or of stale costs
        self._vocabulary: Vocabulary | None = None  # the target's tokens for constraints, built when first needed

    @property
    def exact_batch(self) -> int | None:
        """The largest verify batch that gives one-token logits bit for bit, if measured."""
        return self._exact_batch

    def exact_batch_size(self) -> int:
        """The exact verify batch for the loaded repacking setting: measured at load with
        spec.exact, else now (once per model and settings, then stored)."""
        if self._exact_batch is None:
            self._exact_batch = exact_batch_sizes(self.spec)[self.spec.target_load.repack]
        return self._exact_batch

    def engine_for(self, request: GenerationRequest, *, memory: TokenIndex | None = None) -> Engine:
        """The engine that runs `request` on the loaded models: its proposer and draft-length
        policy are built here and nowhere else. `memory`: recent outputs for lookup to search
        (the server's). What the target's and the draft model's caches hold is kept across
        engines, so a request that shares a prefix with the one before decodes only the rest."""
        request = request.seeded()
        matcher = Matcher(self.vocabulary(), request.constraint) if request.constraint is not None else None
        proposer = self._proposer(request, memory, matcher)
        policy = self._policy(request, proposer)
        max_batch = self.exact_batch_size() if request.exact and not isinstance(proposer, NoProposer) else MAX_DRAFT + 1
        drafting_model = self.draft is not None and request.draft is DraftKind.MODEL and not isinstance(proposer,
                                                                                                          NoProposer)
        return Engine(self.target, proposer, policy, request, cache=self._cache,
                      verify_on_device=self.spec.verify_on_device, matcher=matcher, max_batch=max_batch,
                      draft_model=self.spec.draft_model.name if drafting_model and self.spec.draft_model else "")

    def vocabulary(self) -> Vocabulary:
        """The target's tokens as a constraint reads them, built on the first constrained request."""
        if self._vocabulary is None:
            self._vocabulary = Vocabulary(self.target)
        return self._vocabulary

    def clear_cache(self) -> None:
        """Forget what the target's KV cache holds: the next generation decodes its whole
        prompt, as a fresh `specli run` does (a prompt decoded on top of a kept prefix is
        batched otherwise, and rounds otherwise at a near-tie)."""
        self._cache = TargetCache()

    def drafts_plainly(self, request: GenerationRequest) -> bool:
        """Whether --exact leaves nothing to draft: no verify batch above one row is exact."""
        return request.exact and request.drafts and self.exact_batch_size() == 1

    def _proposer(self, request: GenerationRequest, memory: TokenIndex | None, matcher: Matcher | None) -> Proposer:
        if not request.drafts or self.drafts_plainly(request):
            return NoProposer()
        prediction = self.target.tokenize(request.prediction, add_special=False) if request.prediction else []
        lookup = NGramProposer(references=[memory] if memory is not None else [], prediction=prediction)
        if request.draft is DraftKind.NGRAM:
            return lookup
        if self.draft is None:
            raise UsageError("draft 'model': no draft model is loaded", "load one with --draft MODEL")
        # Through text its tokens are not the target's: the engine checks what it brings instead.
        model: Proposer = DraftModelProposer(self.draft, request.sampling, request.seed or 0, request.draft_min_p,
                                             keyed=not self.translated, constraint=None if self.translated else matcher)
        if self.translated:
            model = TranslatedDraft(self.target, model)  # type: ignore[arg-type]
        # A prediction feeds lookup whatever the draft; without one, --no-ngram is honoured.
        return LookupThenModel(lookup, model) if request.lookup or prediction else model

    def _policy(self, request: GenerationRequest, proposer: Proposer) -> DraftPolicy:
        """-k N: N draft tokens a step; -k auto: the adaptive policy, priced with the stored
        costs. Never longer than an --exact batch allows."""
        if isinstance(proposer, NoProposer):
            return FixedDraftPolicy(0)
        max_draft = self.exact_batch_size() - 1 if request.exact else MAX_DRAFT
        if request.draft_tokens == AUTO:
            return AdaptiveDraftPolicy(self.costs(), prior=proposer.prior, max_draft=max_draft)
        return FixedDraftPolicy(min(request.draft_tokens, max_draft))

    def costs(self, *, measure: bool = True) -> StepCosts:
        """The costs -k auto prices this session's generations with, fixed once read: the
        stored ones; where none can be used (none stored, or the stored curve is implausible
        or stale), a quick calibration made now and stored (measure=False: the prior instead);
        where the machine is too busy to measure, a conservative curve for this session only,
        and nothing stored. With a draft model, its stored cost per token; where none is
        stored, its decode timed now and stored (measure=False: priced by its file size).
        What a run's steps take is never used to price them, so a model's first run drafts as
        every later one does."""
        if measure and self._costs is not None:
            return self._costs
        target = self._stored_costs(say=measure)
        if target is None and not measure:
            return self._prior()
        if target is None:
            target = self._first_run_costs()
        costs = self._with_draft(target, measure)
        if measure:
            self._costs = costs
        return costs

    def _stored_costs(self, *, say: bool) -> StepCosts | None:
        """The target's stored costs, unless they are implausible or marked stale (`say`: a
        line says they will be measured again)."""
        stored = self._store().costs(self._costs_key())
        if stored is None or stored.source in ("prior", "conservative"):
            return None
        problem = curve_problem(stored.verify)
        if problem is None and stored.stale is None:
            return stored
        if say and self._notice is not None:
            why = problem or f"a run's verify steps took {stored.stale:.2f}x their price"
            self._notice(f"the stored verify costs of {self.target.path.name} no longer hold ({why}): measuring them again")
        return None

    def _first_run_costs(self) -> StepCosts:
        """A quick calibration, stored; or, where the machine is too busy, the conservative curve."""
        outcome = self._time_target(FIRST_RUN_SIZES, PASSES)
        if outcome.problem is not None:
            if self._notice is not None:
                self._notice(f"the machine is too busy to measure {self.target.path.name}'s verify costs "
                             f"({outcome.problem}): drafting cautiously this run, measuring again on the next")
            return self._prior(conservative=True)
        return self._store_target(outcome, "first run")

    def _with_draft(self, target: StepCosts, measure: bool) -> StepCosts:
        """The target's costs with the draft model's (measured, or priced by its file size)."""
        if self.draft is None:
            return target
        if target.source in ("prior", "conservative"):  # relative units: the draft by its size too
            return target
        measured = self._draft_measurements()
        if measured is None and measure:
            self._calibrate_draft()  # the target's costs are stored, this draft's not yet
            measured = self._draft_measurements()
        if measured is not None:
            seconds, catch_up, acceptance = measured
            return replace(target, draft_per_token=seconds, draft_catch_up=catch_up, draft_acceptance=acceptance)
        # Not measured: priced by its file size, catching up a token at a decode's cost.
        seconds = self._draft_size_ratio() * VerifyCurve(target.verify).cost(1)
        return replace(target, draft_per_token=seconds, draft_catch_up=seconds)

    def review(self, stats: Stats) -> bool:
        """After a generation: where its verify steps took consistently more or less than the
        stored curve priced them at (Stats.costs_ratio outside STALE_RANGE over at least
        STALE_STEPS steps), mark the stored curve stale, so the next run measures it again, and
        say so. This generation's choices are made already, and so are this session's: only
        the next run's costs change."""
        ratio, costs = stats.costs_ratio, self._costs
        if ratio is None or stats.priced_steps < STALE_STEPS or costs is None or costs.source in ("prior", "conservative"):
            return False
        if STALE_RANGE[0] <= ratio <= STALE_RANGE[1]:
            return False
        stored = self._store().costs(self._costs_key())
        if stored is None or stored.stale is not None:
            return False
        self._store().put_costs(self._costs_key(), replace(stored, stale=ratio))
        if self._notice is not None:
            self._notice(f"this run's verify steps took {ratio:.2f}x what the stored costs priced them at: "
                         "they will be measured again on the next run")
        return True

    def _draft_measurements(self) -> tuple[float, float, float | None] | None:
        """The draft model's stored cost per token, catch-up cost per token and agreement
        (None through text), or None if they are not all stored."""
        store, key = self._store(), self._draft_key()
        seconds, catch_up, acceptance = store.get(key), store.get(key + "|catch_up"), store.get(key + "|acceptance")
        if not all(isinstance(value, (int, float)) for value in (seconds, catch_up)):
            return None
        if not isinstance(acceptance, (int, float)):
            if not self.translated:
                return None
            acceptance = None
        return float(seconds), float(catch_up), None if acceptance is None else float(acceptance)

    def _prior(self, *, conservative: bool = False) -> StepCosts:
        gpu = supports_gpu_offload() and self.spec.target_load.gpu_layers != 0
        return prior_costs(gpu, self._draft_size_ratio(), conservative=conservative)

    def calibrate(self, sizes: tuple[int, ...] = CALIBRATION_SIZES, passes: int = PASSES + 1) -> StepCosts:
        """Time the target's verify batches, and a draft model's one-token decode, now and store
        them (`specli bench`, `doctor --calibrate`; a first run's quick one: see costs). Raises
        CalibrationError, storing nothing, where the machine is too busy to measure."""
        outcome = self._time_target(sizes, passes)
        if outcome.problem is not None:
            raise CalibrationError(f"the machine is too busy to measure {self.target.path.name}'s verify costs "
                                   f"({outcome.problem}); nothing was stored", "measure again when it is quieter")
        self._store_target(outcome, "calibrated")
        if self.draft is not None:
            self._calibrate_draft()
        self._costs = None
        return self.costs()

    def _time_target(self, sizes: tuple[int, ...], passes: int) -> Calibration:
        target = self.target
        sizes = tuple(size for size in sizes if size < min(target.n_ctx, target.batch_size))
        target.rewind(0)
        token = target.bos if target.bos >= 0 else 0
        load = self.spec.target_load
        on_cpu = not load.rpc and (load.gpu_layers == 0 or not supports_gpu_offload())
        threads = min(load.threads or os.cpu_count() or 1, usable_cpus()) if on_cpu else None
        return calibrate(lambda tokens: target.decode(tokens, all_logits=True), target.rewind, token, sizes, passes,
                         threads)

    def _store_target(self, outcome: Calibration, source: CostSource) -> StepCosts:
        stored = self._store().costs(self._costs_key())
        verify = outcome.verify
        loop = stored.loop if stored is not None and stored.source != "prior" else PRIOR_LOOP * verify[1]
        costs = StepCosts(verify, 0.0, loop, source, measured_at=time.time())
        self._store().put_costs(self._costs_key(), costs)
        return costs

    def _calibrate_draft(self) -> float:
        """Time the draft model's one-token decode and store it as its cost per drafted token
        (where the machine is too busy, nothing: 0.0).
        Its own time, where it runs: its file size against the target's says nothing when the
        target's decodes cross a network (--rpc). Through text, a drafted token is priced per
        target token, with the round trip through both tokenizers; its catch-up stays per draft
        token, as Proposer.behind counts the draft's own tokens."""
        assert self.draft is not None
        self.draft.forget()
        draft = self.draft.model
        token = draft.bos if draft.bos >= 0 else 0  # its own vocabulary's, where it differs
        timed = calibrate(lambda tokens: draft.decode(tokens), draft.rewind, token, (1, CATCH_UP_BATCH), passes=4)
        if timed.problem is not None:  # too busy: priced by its file size this time, measured again next
            return 0.0
        seconds, catch_up = timed.verify[1], timed.verify[CATCH_UP_BATCH] / CATCH_UP_BATCH
        if self.translated:
            seconds = cost_per_target_token(self.target, draft, seconds)
        else:  # the same tokens mean the same to both: how often their greedy choices agree
            self._store().put(self._draft_key() + "|acceptance", greedy_agreement(self.target, draft))
        self._store().put(self._draft_key() + "|catch_up", catch_up)
        self._store().put(self._draft_key(), seconds)
        return seconds

    def _store(self) -> CostStore:
        if self._cost_store is None:
            self._cost_store = CostStore(cache_dir() / "costs.json")
        return self._cost_store

    def _costs_key(self) -> str:
        return settings_key(self.target.path, self.spec.target_load, build_key())

    def _draft_key(self) -> str:
        assert self.spec.draft_model is not None
        return draft_key(self._costs_key(), self.spec.draft_model, self.spec.draft_load)

    def _draft_size_ratio(self) -> float:
        draft = self.spec.draft_model
        if draft is None or self.draft is None:
            return 0.0
        return draft.stat().st_size / max(1, self.target.path.stat().st_size)

    def close(self) -> None:
        if self.draft is not None:
            self.draft.close()
        self.target.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def usable_cpus() -> int:
    """The CPUs this process may run on at once: its affinity, and a cgroup's CPU quota (a
    container's `--cpus`) where one is set."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def build_key() -> str:
    """The llama.cpp build and the devices it sees, as stored costs are keyed by them."""
    return f"{library_versions()['llama_cpp_python']}|{compute_fingerprint()}"


def open_session(spec: SessionSpec, notice: Callable[[str], None] | None = None) -> Session:
    """Load the target and the draft model. With spec.exact, first find (or read) the exact
    verify batch size with repacking on and off, and load with the setting that allows the
    larger (where no batch above one row is exact, no draft model is loaded: nothing can be
    drafted); `notice` hears of a measurement before it starts, and of a draft that drafts
    through text."""
    exact_batch = None
    if spec.exact:
        spec, exact_batch = _exact_settings(spec, notice)
    target = Model(spec.target, spec.target_load, verbose=spec.verbose, chat_template=spec.chat_template)
    try:
        if spec.draft_model is None or exact_batch == 1:
            return Session(spec, target, exact_batch=exact_batch, notice=notice)
        draft, translated = _open_draft(spec, target, notice)
    except BaseException:
        target.close()
        raise
    return Session(spec, target, draft, translated=translated, exact_batch=exact_batch, notice=notice)


# A sample for a draft model's agreement with its target: prose, a list, code, numbers.
AGREEMENT_SAMPLE = (
    "The museum opens at nine and closes at five, except on Mondays, when it stays closed all day. "
    "Visitors can buy tickets at the door or online; children under twelve go in for free.\n\n"
    "Shopping list:\n- two loaves of bread\n- a dozen eggs\n- milk\n- three apples\n\n"
    "def average(values):\n    \"\"\"Return the mean of a list of numbers.\"\"\"\n"
    "    return sum(values) / len(values)\n\n"
    "In 2024 the town had 12,400 residents, up from 11,900 in 2020."
)


def greedy_agreement(target: Model, draft: Model, sample: str = AGREEMENT_SAMPLE) -> float:
    """The share of the sample's positions where the draft's greedy next token is the target's,
    each reading the sample itself (teacher-forced): one batched decode of each model, both
    caches left empty. A draft's acceptance on a model's own output is usually higher: this is
    a first guess that the run's record corrects."""
    tokens = target.tokenize(sample)[: min(target.n_ctx, draft.n_ctx, target.batch_size, draft.batch_size)]
    choices = []
    for model in (target, draft):
        model.rewind(0)
        choices.append(np.argmax(model.decode(tokens, all_logits=True), axis=1))
        model.rewind(0)
    return float(np.mean(choices[0] == choices[1]))


MEASURE_TOKENS = 96  # a timed generation of `specli drafts --measure`
MEASURE_ROUNDS = 3


def measure_draft(target: Path, draft: Path, load: LoadSettings) -> float | None:
    """Load the pair, measure (or read) its costs and the draft's agreement as a first run with
    this draft does, then time greedy generations of MEASURE_TOKENS from a sample text, drafted
    by the model alone at the length its costs favour and plain, in MEASURE_ROUNDS alternating
    rounds: the ratio of the median rates is stored as the draft's measured speed-up (None
    where the costs favour no length: a draft through text)."""
    from specli.decode.costs import expected_speedup

    with open_session(SessionSpec(target, draft, load, load)) as session:
        costs = session.costs()
        best = expected_speedup(costs)
        if best is None or session.draft is None:
            return None
        prompt = session.target.tokenize(AGREEMENT_SAMPLE)[:64]
        requests = (GenerationRequest(max_tokens=MEASURE_TOKENS, draft=DraftKind.MODEL, lookup=False,
                                      draft_tokens=best[1]),
                    GenerationRequest(max_tokens=MEASURE_TOKENS, draft=DraftKind.NONE))
        rates: tuple[list[float], list[float]] = ([], [])
        for _ in range(MEASURE_ROUNDS):
            for request, kept in zip(requests, rates):
                engine = session.engine_for(request)
                for _event in engine.generate(prompt):
                    pass
                kept.append(engine.stats.tokens_per_second)
        ratio = float(np.median(rates[0]) / max(np.median(rates[1]), 1e-9))
        session._store().put(session._draft_key() + "|speedup", ratio)
        return ratio


def stored_speedup(target: Path, draft: Path, load: LoadSettings) -> float | None:
    """The draft's speed-up that `specli drafts --measure` timed and stored (None: not measured)."""
    try:
        key = draft_key(settings_key(target, load, build_key()), draft, load) + "|speedup"
    except OSError:
        return None
    value = CostStore(cache_dir() / "costs.json").get(key)
    return float(value) if isinstance(value, (int, float)) else None


def exact_batch_sizes(spec: SessionSpec, notice: Callable[[str], None] | None = None, *, measure: bool = True,
                      again: bool = False) -> dict[bool, int]:
    """The exact verify batch size with repacking on (True) and off (False), measured once per
    model, settings and build and stored with the costs. measure=False: only what is stored;
    again=True: measured anew."""
    store = CostStore(cache_dir() / "costs.json")
    sizes: dict[bool, int] = {}
    for repack in (True, False):
        load = replace(spec.target_load, repack=repack)
        key = exact_key(spec.target, load, build_key())
        stored = store.get(key)
        if isinstance(stored, int) and stored >= 1 and not again:
            sizes[repack] = stored
            continue
        if not measure:
            continue
        if notice is not None:
            notice(f"finding which verify batches are exact with repacking {'on' if repack else 'off'} "
                   "(once per model and settings)")
        with Model(spec.target, load, verbose=spec.verbose) as model:
            sizes[repack] = exact_batch_size(model, min(MAX_DRAFT + 1, model.batch_size))
        store.put(key, sizes[repack])
    return sizes


def _exact_settings(spec: SessionSpec, notice: Callable[[str], None] | None) -> tuple[SessionSpec, int]:
    sizes = exact_batch_sizes(spec, notice)
    repack = sizes[True] >= sizes[False]  # the faster kernels where they allow as much
    spec = replace(spec, target_load=replace(spec.target_load, repack=repack),
                   draft_load=replace(spec.draft_load, repack=repack))
    return spec, sizes[repack]


def _open_draft(spec: SessionSpec, target: Model, notice: Callable[[str], None] | None) -> tuple[DraftModel, bool]:
    """The draft model, and whether it drafts through text (its vocabulary fails llama.cpp's rule)."""
    assert spec.draft_model is not None
    draft = Model(spec.draft_model, spec.draft_load, verbose=spec.verbose)
    try:
        check_vocab_compatible(target, draft)
        return DraftModel(draft), False
    except VocabMismatchError as refused:
        # Its tokens mean nothing to the target: it drafts through text instead.
        if notice is not None:
            notice(f"{refused.message}: drafting through text (the draft's tokens are re-tokenized for the target)")
        return DraftModel(draft), True
    except BaseException:
        draft.close()
        raise


# --- where costs are stored ---------------------------------------------------------

COSTS_VERSION = 4  # part of every key: a change in how costs are measured measures again


def settings_key(path: Path, load: LoadSettings, build: str) -> str:
    """Stored costs and exactness hold for this model file, its settings, this llama.cpp build
    and devices (`build`: build_key()), and the RPC servers it runs on."""
    info = path.stat()
    parts = (path.resolve(), info.st_size, info.st_mtime_ns, load.gpu_layers, load.threads, load.repack,
             load.ctx_size, build, f"v{COSTS_VERSION}")
    return "|".join(str(part) for part in parts) + _servers_key(load)


@dataclass(frozen=True)
class CostsKey:
    """What a stored curve's key says: the model file and the settings and build it holds for."""

    path: Path
    load: LoadSettings
    build: str
    version: int


def parse_settings_key(key: str) -> CostsKey | None:
    """settings_key's parts again (None: not a key of stored costs, or of a format it cannot read)."""
    head, _, servers = key.partition("|rpc:")
    parts = head.split("|")
    try:
        path, _, _, layers, threads, repack, ctx_size = parts[:7]
        build, version = "|".join(parts[7:-1]), int(parts[-1].removeprefix("v"))
        load = LoadSettings(int(layers), ctx_size=int(ctx_size), threads=None if threads == "None" else int(threads),
                            repack=repack == "True", rpc=tuple(servers.split(",")) if servers else ())
    except (ValueError, IndexError):
        return None
    return CostsKey(Path(path), load, build, version)


def _servers_key(load: LoadSettings) -> str:
    """The RPC servers a model spreads over (nothing without --rpc, so the keys stored
    before --rpc existed still hold)."""
    return f"|rpc:{','.join(load.rpc)}" if load.rpc else ""


def exact_key(path: Path, load: LoadSettings, build: str) -> str:
    """Where the exact verify batch size of a model and its settings is stored."""
    return settings_key(path, load, build) + "|exact"


def draft_key(target_key: str, draft: Path, load: LoadSettings) -> str:
    """Where a draft model's cost per token is stored: with its target's key, as it runs beside it."""
    info = draft.stat()
    return f"{target_key}|draft:{draft.resolve()}|{info.st_size}|{info.st_mtime_ns}|{load.gpu_layers}{_servers_key(load)}"
