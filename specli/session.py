"""Wiring: load the target and the draft, check they fit together."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Literal, Union

import numpy as np

from specli.decode.adaptive import MAX_DRAFT, AdaptiveDraftPolicy
from specli.llama.backend import LoadSettings, Model, library_versions, supports_gpu_offload
from specli.decode.costs import (CALIBRATION_SIZES, FIRST_RUN_SIZES, PRIOR_LOOP, CostSource, CostStore, StepCosts, VerifyCurve,
                          calibrate, draft_key, exact_key, prior_costs, settings_key)
from specli.config import cache_dir
from specli.llama.devices import compute_fingerprint
from specli.errors import VocabMismatchError
from specli.decode.engine import DraftPolicy, DraftTokens, Engine, FixedDraftPolicy, GenerationOptions
from specli.decode.exact import exact_batch_size
from specli.decode.proposers import (DraftModelProposer, LookupThenModel, NGramProposer, NoProposer, Proposer, draft_model_of,
                              translates)
from specli.decode.sampling import SamplingSettings
from specli.decode.translate import TranslatedDraft, cost_per_target_token
from specli.llama.vocab import check_vocab_compatible

DraftSpec = Union[Path, Literal["ngram", "none"]]
CATCH_UP_BATCH = 16  # a draft model's catch-up is priced per token of a batch this long


@dataclass(frozen=True)
class SessionSpec:
    target: Path
    draft: DraftSpec = "ngram"
    target_load: LoadSettings = LoadSettings()
    draft_load: LoadSettings = LoadSettings()
    sampling: SamplingSettings = SamplingSettings()
    seed: int | None = None
    draft_min_p: float = 0.0
    exact: bool = False  # cap verify batches at the size that gives plain decoding's logits bit for bit
    verify_on_device: bool = False  # GenerationOptions.verify_on_device for the session's generations
    verbose: bool = False
    draft_lookup: bool = True  # with a draft model: n-gram lookup in front of it (--no-ngram: off)


@dataclass
class Session:
    """A loaded target and proposer, reusable across generations."""

    spec: SessionSpec
    target: Model
    proposer: Proposer
    seed: int = 0
    exact_batch: int | None = None  # with spec.exact: the largest verify batch that is bit-identical
    _cost_store: CostStore | None = field(default=None, repr=False)

    def engine(self, policy: DraftPolicy, options: GenerationOptions) -> Engine:
        return Engine(self.target, self.proposer, policy, options, self.seed)

    def draft_policy(self, draft_tokens: DraftTokens, *, proposer: Proposer | None = None,
                     costs: StepCosts | None = None, most: int | None = None) -> DraftPolicy:
        """-k N: N draft tokens a step; -k auto: the adaptive policy, priced with `costs` (by
        default the stored costs, or the prior until some are stored). Never more than `most`,
        by default what an --exact batch allows. `proposer`: the one the engine will use, if
        not the session's."""
        proposer = proposer or self.proposer
        if most is None:
            most = MAX_DRAFT if self.exact_batch is None else self.exact_batch - 1
        if proposer.name == "none":
            return FixedDraftPolicy(0)
        if draft_tokens == "auto":
            return AdaptiveDraftPolicy(costs or self.costs(), prior=proposer.prior, draft_tokens=most)
        return FixedDraftPolicy(min(draft_tokens, most))

    def costs(self, *, measure: bool = True) -> StepCosts:
        """This target's stored costs; where none are stored, a quick calibration made now and
        stored (measure=False: the prior instead). With a draft model, its stored cost per
        token; where none is stored, its decode timed now and stored (measure=False: priced by
        its file size). What a run's steps take is never stored, so a model's first run drafts
        as every later one does."""
        stored = self._store().costs(self._costs_key())
        if stored is None and measure:
            return self.calibrate(FIRST_RUN_SIZES, repeats=1, source="first run")
        if stored is None:
            return self._prior()
        measured = self._draft_measurements()
        if measured is None and measure and draft_model_of(self.proposer) is not None:
            self._calibrate_draft()  # the target's costs are stored, this draft's not yet
            measured = self._draft_measurements()
        if measured is not None:
            seconds, catch_up, acceptance = measured
            return replace(stored, draft_per_token=seconds, draft_catch_up=catch_up, draft_acceptance=acceptance)
        # Not measured: priced by its file size, catching up a token at a decode's cost.
        seconds = self._draft_size_ratio() * VerifyCurve(stored.verify).cost(1)
        return replace(stored, draft_per_token=seconds, draft_catch_up=seconds)

    def _draft_measurements(self) -> tuple[float, float, float | None] | None:
        """The draft model's stored cost per token, catch-up cost per token and agreement
        (None through text), or None if they are not all stored."""
        store, key = self._store(), self._draft_key()
        seconds, catch_up, acceptance = store.get(key), store.get(key + "|catch_up"), store.get(key + "|acceptance")
        if not all(isinstance(value, (int, float)) for value in (seconds, catch_up)):
            return None
        if not isinstance(acceptance, (int, float)):
            if not translates(self.proposer):
                return None
            acceptance = None
        return float(seconds), float(catch_up), None if acceptance is None else float(acceptance)

    def _prior(self) -> StepCosts:
        gpu = supports_gpu_offload() and self.spec.target_load.gpu_layers != 0
        return prior_costs(gpu, self._draft_size_ratio())

    def calibrate(self, sizes: tuple[int, ...] = CALIBRATION_SIZES, repeats: int = 2,
                  source: CostSource = "calibrated") -> StepCosts:
        """Time the target's verify batches, and a draft model's one-token decode, now and store
        them (`specli bench`, `doctor --calibrate`; a first run's quick one: see costs)."""
        target = self.target
        sizes = tuple(size for size in sizes if size < min(target.n_ctx, target.batch_size))
        target.rewind(0)
        token = target.bos if target.bos >= 0 else 0
        verify = calibrate(lambda tokens: target.decode(tokens, all_logits=True), target.rewind, token, sizes, repeats)
        stored = self._store().costs(self._costs_key())
        loop = stored.loop if stored is not None and stored.source != "prior" else PRIOR_LOOP * verify[1]
        costs = StepCosts(verify, 0.0, loop, source)
        self._store().put_costs(self._costs_key(), costs)
        if draft_model_of(self.proposer) is not None:
            self._calibrate_draft()
        return self.costs(measure=False)

    def _calibrate_draft(self) -> float:
        """Time the draft model's one-token decode and store it as its cost per drafted token.
        Its own time, where it runs: its file size against the target's says nothing when the
        target's decodes cross a network (--rpc). Through text, a drafted token is priced per
        target token, with the round trip through both tokenizers; its catch-up stays per draft
        token, as Proposer.behind counts the draft's own tokens."""
        drafter = draft_model_of(self.proposer)
        assert drafter is not None
        drafter.forget()
        draft = drafter.model
        token = draft.bos if draft.bos >= 0 else 0  # its own vocabulary's, where it differs
        timed = calibrate(lambda tokens: draft.decode(tokens), draft.rewind, token, (1, CATCH_UP_BATCH), repeats=5)
        seconds, catch_up = timed[1], timed[CATCH_UP_BATCH] / CATCH_UP_BATCH
        if translates(self.proposer):
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
        return draft_key(self._costs_key(), self.spec.draft, self.spec.draft_load)

    def _draft_size_ratio(self) -> float:
        draft = self.spec.draft
        if not isinstance(draft, Path):
            return 0.0
        return draft.stat().st_size / max(1, self.target.path.stat().st_size)

    def close(self) -> None:
        self.proposer.close()
        self.target.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def build_key() -> str:
    """The llama.cpp build and the devices it sees, as stored costs are keyed by them."""
    return f"{library_versions()['llama_cpp_python']}|{compute_fingerprint()}"


def open_session(spec: SessionSpec, notice: Callable[[str], None] | None = None) -> Session:
    """Load the target and the proposer. With spec.exact, first find (or read) the exact verify
    batch size with repacking on and off, and load with the setting that allows the larger;
    `notice` hears of a measurement before it starts."""
    exact_batch = None
    if spec.exact:
        spec, exact_batch = _exact_settings(spec, notice)
    # One seed keys every sampled token (the draft's and the target's) by its position, so
    # a --seed run repeats exactly, whatever the draft lengths.
    seed = spec.seed if spec.seed is not None else int(np.random.SeedSequence().entropy % (1 << 63))
    target = Model(spec.target, spec.target_load, verbose=spec.verbose)
    try:
        proposer = NoProposer() if exact_batch == 1 else _open_proposer(spec, target, seed, notice)
    except BaseException:
        target.close()
        raise
    return Session(spec, target, proposer, seed, exact_batch)


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


def _open_proposer(spec: SessionSpec, target: Model, seed: int,
                   notice: Callable[[str], None] | None = None) -> Proposer:
    if spec.draft == "none":
        return NoProposer()
    if spec.draft == "ngram":
        return NGramProposer()
    draft = Model(spec.draft, spec.draft_load, verbose=spec.verbose)
    model: Proposer = DraftModelProposer(draft, spec.sampling, seed, spec.draft_min_p)
    try:
        try:
            check_vocab_compatible(target, draft)
        except VocabMismatchError as refused:
            # Its tokens mean nothing to the target: it drafts through text instead.
            if notice is not None:
                notice(f"{refused.message}: drafting through text (the draft's tokens are re-tokenized for the target)")
            model = TranslatedDraft(target, model)
    except BaseException:
        draft.close()
        raise
    return LookupThenModel(NGramProposer(), model) if spec.draft_lookup else model
