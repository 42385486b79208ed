"""Wiring: load the target and the draft, check they fit together."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Literal, Union

import numpy as np

from specli.adaptive import MAX_DRAFT, AdaptiveDraftLength
from specli.backend import LoadSettings, Model, library_versions, supports_gpu_offload
from specli.costs import (CALIBRATION_SIZES, LEARN_MIN_SAMPLES, PRIOR_LOOP, CostStore, StepCosts, VerifyCurve, calibrate,
                          learn, prior_costs)
from specli.config import cache_dir
from specli.devices import compute_fingerprint
from specli.engine import DraftLength, Engine, FixedDraftLength, GenerationOptions, StepRecord
from specli.errors import VocabMismatchError
from specli.exact import exact_batch_size
from specli.proposers import DraftModelProposer, NGramProposer, NoProposer, Proposer
from specli.sampling import SamplingSettings

DraftSpec = Union[Path, Literal["ngram", "none"]]
COSTS_VERSION = 3  # part of the stored costs' key: a change in how they are measured measures again
VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo-2"}
# The rules llama.cpp's common/speculative.cpp applies before pairing a draft and a target.
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5


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
    verbose: bool = False


@dataclass
class Session:
    """A loaded target and proposer, reusable across generations."""

    spec: SessionSpec
    target: Model
    proposer: Proposer
    seed: int = 0
    exact_batch: int | None = None  # with spec.exact: the largest verify batch that is bit-identical
    _cost_store: CostStore | None = field(default=None, repr=False)

    def engine(self, draft_length: DraftLength, options: GenerationOptions) -> Engine:
        return Engine(self.target, self.proposer, draft_length, options, self.seed)

    def draft_length(self, draft_tokens: int | None) -> DraftLength:
        """A fixed number of draft tokens, or (None) the adaptive policy, priced with the
        stored costs (or the prior, until some are stored)."""
        most = MAX_DRAFT if self.exact_batch is None else self.exact_batch - 1
        if draft_tokens is not None:
            return FixedDraftLength(min(draft_tokens, most))
        if self.proposer.name == "none":
            return FixedDraftLength(0)
        return AdaptiveDraftLength(self.costs(), prior=self.proposer.prior, draft_tokens=most)

    def costs(self) -> StepCosts:
        """This target's stored costs (a calibration, else an earlier run's), else the prior;
        with a draft model, its stored cost per token, else one priced by its file size."""
        stored = self._store().costs(self._costs_key())
        if stored is None:
            return self._prior()
        draft = self._store().get(self._draft_key())
        if isinstance(draft, (int, float)):
            return replace(stored, draft_per_token=float(draft))
        return replace(stored, draft_per_token=self._draft_size_ratio() * VerifyCurve(stored.verify).cost(1))

    def _prior(self) -> StepCosts:
        gpu = supports_gpu_offload() and self.spec.target_load.gpu_layers != 0
        return prior_costs(gpu, self._draft_size_ratio())

    def calibrate(self) -> StepCosts:
        """Time the target's verify batches, and a draft model's one-token decode, now and store
        them (`specli bench`, `doctor --calibrate`)."""
        target = self.target
        sizes = tuple(size for size in CALIBRATION_SIZES if size < min(target.n_ctx, target.batch_size))
        target.rewind(0)
        token = target.bos if target.bos >= 0 else 0
        verify = calibrate(lambda tokens: target.decode(tokens, all_logits=True), target.rewind, token, sizes)
        stored = self._store().costs(self._costs_key())
        loop = stored.loop if stored is not None and stored.source != "prior" else PRIOR_LOOP * verify[1]
        costs = StepCosts(verify, 0.0, loop, "calibrated")
        self._store().put_costs(self._costs_key(), costs)
        if isinstance(self.proposer, DraftModelProposer):
            # The draft's own cost per token, where it runs: its file size against the
            # target's says nothing when the target's decodes cross a network (--rpc).
            self.proposer.forget()
            draft = self.proposer.model
            seconds = calibrate(lambda tokens: draft.decode(tokens), draft.rewind, token, (1,), repeats=5)[1]
            self._store().put(self._draft_key(), seconds)
        return self.costs()

    def learn(self, steps: list[StepRecord]) -> None:
        """After a run: store the costs its steps measured, where none are stored yet. Later runs
        read them; this run's choices never did (see specli.costs)."""
        store = self._store()
        key = self._costs_key()
        if store.costs(key) is None:
            learned = learn(steps, self._prior())
            if learned is not None:
                store.put_costs(key, replace(learned, draft_per_token=0.0))
        if isinstance(self.proposer, DraftModelProposer) and store.get(self._draft_key()) is None:
            drafting = [step.draft_seconds / step.drafted for step in steps if step.drafted]
            if len(drafting) >= LEARN_MIN_SAMPLES:
                store.put(self._draft_key(), statistics.median(drafting))

    def _store(self) -> CostStore:
        if self._cost_store is None:
            self._cost_store = CostStore(cache_dir() / "costs.json")
        return self._cost_store

    def _costs_key(self) -> str:
        return settings_key(self.target.path, self.spec.target_load)

    def _draft_key(self) -> str:
        draft = self.spec.draft
        if not isinstance(draft, Path):
            return f"{self._costs_key()}|draft:{draft}"
        info = draft.stat()
        load = self.spec.draft_load
        return f"{self._costs_key()}|draft:{draft.resolve()}|{info.st_size}|{info.st_mtime_ns}|{load.gpu_layers}{_servers_key(load)}"

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


def settings_key(path: Path, load: LoadSettings) -> str:
    """Stored costs and exactness hold for this model file, its settings, this llama.cpp build
    and devices, and the RPC servers it runs on."""
    info = path.stat()
    parts = (path.resolve(), info.st_size, info.st_mtime_ns, load.gpu_layers, load.threads, load.repack,
             load.ctx_size, library_versions()["llama_cpp_python"], compute_fingerprint(), f"v{COSTS_VERSION}")
    return "|".join(str(part) for part in parts) + _servers_key(load)


def _servers_key(load: LoadSettings) -> str:
    """The RPC servers a model spreads over (nothing without --rpc, so the keys stored
    before --rpc existed still hold)."""
    return f"|rpc:{','.join(load.rpc)}" if load.rpc else ""


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
        proposer = NoProposer() if exact_batch == 1 else _open_proposer(spec, target, seed)
    except BaseException:
        target.close()
        raise
    return Session(spec, target, proposer, seed, exact_batch)


def exact_batch_sizes(spec: SessionSpec, notice: Callable[[str], None] | None = None, *, measure: bool = True,
                      again: bool = False) -> dict[bool, int]:
    """The exact verify batch size with repacking on (True) and off (False), measured once per
    model, settings and build and stored with the costs. measure=False: only what is stored;
    again=True: measured anew."""
    store = CostStore(cache_dir() / "costs.json")
    sizes: dict[bool, int] = {}
    for repack in (True, False):
        load = replace(spec.target_load, repack=repack)
        key = settings_key(spec.target, load) + "|exact"
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


def _open_proposer(spec: SessionSpec, target: Model, seed: int) -> Proposer:
    if spec.draft == "none":
        return NoProposer()
    if spec.draft == "ngram":
        return NGramProposer()
    draft = Model(spec.draft, spec.draft_load, verbose=spec.verbose)
    try:
        check_vocab_compatible(target, draft)
    except BaseException:
        draft.close()
        raise
    return DraftModelProposer(draft, spec.sampling, seed, spec.draft_min_p)


def check_vocab_compatible(target: Model, draft: Model) -> None:
    """Refuse a draft whose tokens would not mean the same thing to the target.

    The rule of llama.cpp's common/speculative.cpp (common_speculative_are_compatible), in its
    order: the same vocabulary type; the same add_bos flag and, when BOS is added, the same BOS
    id; the same add_eos flag and, when EOS is added, the same EOS id; sizes at most 128 tokens
    apart; and the same text for every token from id 5 up to the smaller size. A BOS or EOS the
    tokenizer does not add is not compared (Gemma 3 GGUFs end turns with different EOS ids).
    """
    names = f"draft {draft.path.name} and target {target.path.name}"
    hint = "pick a draft from the same model family"
    if target.vocab_type != draft.vocab_type:
        raise VocabMismatchError(
            f"{names} use different tokenizers "
            f"({VOCAB_TYPES.get(draft.vocab_type, draft.vocab_type)} vs {VOCAB_TYPES.get(target.vocab_type, target.vocab_type)})",
            hint,
        )
    if target.add_bos != draft.add_bos or (target.add_bos and target.bos != draft.bos):
        raise VocabMismatchError(
            f"{names} disagree on the BOS token (draft {draft.bos}, add={draft.add_bos}; "
            f"target {target.bos}, add={target.add_bos})",
            hint,
        )
    if target.add_eos != draft.add_eos or (target.add_eos and target.eos != draft.eos):
        raise VocabMismatchError(
            f"{names} disagree on the EOS token (draft {draft.eos}, add={draft.add_eos}; "
            f"target {target.eos}, add={target.add_eos})",
            hint,
        )
    if abs(target.n_vocab - draft.n_vocab) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise VocabMismatchError(
            f"{names} have vocabularies of {draft.n_vocab} and {target.n_vocab} tokens "
            f"(more than {VOCAB_MAX_SIZE_DIFFERENCE} apart)",
            hint,
        )
    if target.path.resolve() == draft.path.resolve():
        return  # the same file: identical by construction
    for token in range(VOCAB_CHECK_START_TOKEN_ID, min(target.n_vocab, draft.n_vocab)):
        if target.token_text(token) != draft.token_text(token):
            raise VocabMismatchError(
                f"{names} differ at token id {token} "
                f"(draft {draft.token_text(token)!r}, target {target.token_text(token)!r})",
                hint,
            )
