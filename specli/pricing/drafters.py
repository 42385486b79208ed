"""Anything that drafts with a model, as pricing measures it: a draft model, the target's NextN
layers, and whatever comes next, each one `Drafter` record.

A drafter is timed the same way (its one-token decode, and a catch-up of CATCH_UP_BATCH
tokens, per token), stored the same way (its cost per token under its key, its catch-up and
greedy agreement beside it) and priced the same way before it is timed (its share of a plain
decode's weights). What differs is in the record: how it decodes and rewinds, what share it
reads, how its agreement is measured (not at all through text), and how a time per drafted
token becomes a time per target token (through text)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from specli.decode.costs import CostStore, StepCosts, VerifyCurve, expected_speedup
from specli.decode.draft_model import DraftModel
from specli.decode.engine import Engine
from specli.decode.mtp import NextnDraft
from specli.decode.request import DraftKind, GenerationRequest
from specli.decode.translate import cost_per_target_token
from specli.llama import mtp
from specli.llama.backend import Model
from specli.pricing.keys import StoreKey

CATCH_UP_BATCH = 16  # a drafter's catch-up is priced per token of a batch this long
DEPTHS = 4  # the draft depths whose agreement is measured where it falls with depth (deeper: the last's)
DEPTH_TOKENS = 32  # the trunk's greedy continuation they are measured along
MTP_SHARE_FLOOR = 0.02  # a NextN layer's decode is never priced below this share of a plain one
MEASURE_TOKENS = 96  # a timed generation of `specli drafts --measure`
MEASURE_ROUNDS = 3

# A sample for a drafter's agreement with its target: prose, a list, code, numbers.
AGREEMENT_SAMPLE = (
    "The museum opens at nine and closes at five, except on Mondays, when it stays closed all day. "
    "Visitors can buy tickets at the door or online; children under twelve go in for free.\n\n"
    "Shopping list:\n- two loaves of bread\n- a dozen eggs\n- milk\n- three apples\n\n"
    "def average(values):\n    \"\"\"Return the mean of a list of numbers.\"\"\"\n"
    "    return sum(values) / len(values)\n\n"
    "In 2024 the town had 12,400 residents, up from 11,900 in 2020."
)


def _same(seconds: float) -> float:
    return seconds


@dataclass(frozen=True)
class Drafter:
    """A model that drafts for the target, as pricing times, stores and prices it.

    kind: the draft a request names to draft with it; key: where its measurements are stored;
    decode, rewind, forget: its own cache (forget: what its owner believes the cache holds);
    token: one it is timed on; share: its decode against the target's before it is timed
    (read only when needed: it may read a file's header); agreement: its greedy agreement with
    the target (None: not measured, it drafts through text); per_target_token: its time per
    drafted token as a time per target token."""

    kind: str  # the draft kind's name
    key: StoreKey
    decode: Callable[[list[int]], object]
    rewind: Callable[[int], None]
    forget: Callable[[], None]
    token: int
    share: Callable[[], float]
    agreement: Callable[[], float] | None
    per_target_token: Callable[[float], float] = _same
    # Its agreement by draft depth (StepCosts.draft_depths), where it falls with depth (the
    # NextN layers, fed their own states); None: its agreement holds at every depth.
    depths: Callable[[], list[float]] | None = None

    def measurements(self, store: CostStore) -> tuple[float, float, float | None] | None:
        """Its stored cost per token, catch-up per token and agreement (None where it is not
        measured), or None if they are not all stored."""
        values = [store.get(key) for key in (self.key, self.key.beside("catch_up"), self.key.beside("acceptance"))]
        measured = values if self.agreement is not None else values[:2]
        if not all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in measured):
            return None
        if self.depths is not None and self.depths_stored(store) is None:
            return None
        seconds, catch_up = float(values[0]), float(values[1])  # type: ignore[arg-type]
        return seconds, catch_up, float(values[2]) if self.agreement is not None else None  # type: ignore[arg-type]

    def depths_stored(self, store: CostStore) -> tuple[float, ...] | None:
        """Its stored agreement by depth (None: not stored)."""
        value = store.get(self.key.beside("depths"))
        if not isinstance(value, list) or not value or not all(isinstance(v, (int, float)) for v in value):
            return None
        return tuple(float(v) for v in value)

    def store(self, store: CostStore, seconds: float, catch_up: float) -> float:
        """Store what a timing found (its agreement measured now); its cost per target token."""
        seconds = self.per_target_token(seconds)
        if self.agreement is not None:
            store.put(self.key.beside("acceptance"), self.agreement())
        if self.depths is not None:
            store.put(self.key.beside("depths"), self.depths())
        store.put(self.key.beside("catch_up"), catch_up)
        store.put(self.key, seconds)
        return seconds

    def priced(self, target: StepCosts, store: CostStore) -> StepCosts:
        """The target's costs with this drafter's: as measured and stored, or by its share."""
        measured = self.measurements(store)
        if measured is not None:
            seconds, catch_up, acceptance = measured
            return replace(target, draft_per_token=seconds, draft_catch_up=catch_up, draft_acceptance=acceptance,
                           draft_depths=self.depths_stored(store) or ())
        seconds = self.share() * VerifyCurve(target.verify).cost(1)  # a token caught up at a decode's cost
        return replace(target, draft_per_token=seconds, draft_catch_up=seconds)


def model_drafter(key: StoreKey, target: Model, draft: DraftModel, path: Path, translated: bool) -> Drafter:
    """A draft model (`path`, its file): priced by its file size until timed; through text its
    agreement is not measured, and a drafted token is priced per target token (with the
    round trip through both tokenizers), its catch-up per draft token, as Proposer.behind
    counts the draft's own tokens."""
    model = draft.model
    return Drafter(DraftKind.MODEL, key, model.decode, model.rewind, draft.forget, model.bos if model.bos >= 0 else 0,
                   lambda: path.stat().st_size / max(1, target.path.stat().st_size),
                   None if translated else (lambda: greedy_agreement(target, model)),
                   (lambda seconds: cost_per_target_token(target, model, seconds)) if translated else _same)


def nextn_drafter(key: StoreKey, target: Model, nextn: NextnDraft) -> Drafter:
    """The target's NextN layers: the first layer's decode, fed zero hidden states (the time
    does not depend on them), priced by the share of the weights it reads until timed. A
    one-entry decode is a drafting one (a logits row); a longer one a catch-up (none, as
    NextnDraft catches up)."""
    heads, filled = nextn.heads, [0]
    zeros = np.zeros((CATCH_UP_BATCH, heads.n_embd), dtype=np.float32)

    def decode(tokens: list[int]) -> None:
        heads.decode(0, tokens, filled[0], zeros[: len(tokens)], logits=len(tokens) == 1)
        filled[0] += len(tokens)

    def rewind(n_keep: int) -> None:
        heads.rewind(0, n_keep)
        filled[0] = min(filled[0], n_keep)

    return Drafter(DraftKind.MTP, key, decode, rewind, nextn.forget, target.bos if target.bos >= 0 else 0,
                   lambda: mtp_share(target.path), lambda: mtp_agreement(target, nextn),
                   depths=lambda: mtp_depths(target, nextn))


def timed_speedup(drafter: Drafter, costs: StepCosts, target: Model, store: CostStore,
                  engine_for: Callable[[GenerationRequest], Engine]) -> float | None:
    """Time greedy generations of MEASURE_TOKENS from the agreement sample, drafted by the
    drafter alone at the length `costs` favour and plain, in MEASURE_ROUNDS alternating rounds
    (`engine_for`: the session's): the ratio of the median rates, stored beside its key as its
    speed-up (None where the costs favour no length: a draft through text)."""
    best = expected_speedup(costs)
    if best is None:
        return None
    prompt = target.tokenize(AGREEMENT_SAMPLE)[:64]
    requests = (GenerationRequest(max_tokens=MEASURE_TOKENS, draft=drafter.kind, lookup=False, draft_tokens=best[1]),
                GenerationRequest(max_tokens=MEASURE_TOKENS, draft=DraftKind.NONE))
    rates: tuple[list[float], list[float]] = ([], [])
    for _ in range(MEASURE_ROUNDS):
        for request, kept in zip(requests, rates):
            engine = engine_for(request)
            for _event in engine.generate(prompt):
                pass
            kept.append(engine.stats.tokens_per_second)
    ratio = float(np.median(rates[0]) / max(np.median(rates[1]), 1e-9))
    store.put(drafter.key.beside("speedup"), ratio)
    return ratio


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


def mtp_agreement(target: Model, nextn: NextnDraft, sample: str = AGREEMENT_SAMPLE) -> float:
    """The share of the sample's positions where the first NextN layer's greedy choice is the
    trunk's, each reading the sample itself (teacher-forced): entry q (token q, the trunk's
    hidden state at q - 1) against the trunk's row q, both predicting token q + 1. The
    first drafted token's agreement: later ones, drafted from the layer's own states, agree
    less, which the run's record learns. Both caches are left empty."""
    heads = nextn.heads
    tokens = target.tokenize(sample)[: min(target.n_ctx, target.batch_size, heads.n_ctx)]
    nextn.forget()
    target.rewind(0)
    trunk = np.argmax(target.decode(tokens, all_logits=True), axis=1)
    hidden = heads.target_hidden(-1, len(tokens))  # row q: the state entry q reads
    choices = [int(np.argmax(heads.decode(0, [token], q, hidden[q : q + 1])[0])) for q, token in enumerate(tokens[:-1])]
    target.rewind(0)
    nextn.forget()
    return float(np.mean(np.asarray(choices) == trunk[: len(choices)]))


def mtp_depths(target: Model, nextn: NextnDraft, sample: str = AGREEMENT_SAMPLE, most: int = DEPTHS) -> list[float]:
    """The chance that the NextN layers' i-th drafted token is the trunk's greedy choice once
    the ones before it were, for i < `most` (chained layers: at most their number), drafted as
    a run drafts (each layer fed its own states) after every position of the trunk's own
    greedy continuation of the sample, DEPTH_TOKENS long: there each drafted token is checked
    against the token the trunk wrote. A depth never reached takes the one before it. Both
    caches are left empty."""
    most = min(most, nextn.depth or most)
    prompt = target.tokenize(sample)[: max(2, min(target.n_ctx - DEPTH_TOKENS - 1, target.batch_size) // 2)]
    nextn.forget()
    target.rewind(0)
    tokens = list(prompt)
    row = target.decode(tokens)[0]
    for _ in range(DEPTH_TOKENS):  # one token a decode: plain decoding's own choices
        tokens.append(int(np.argmax(row)))
        row = target.decode([tokens[-1]])[0]
    kept, tried = [0] * most, [0] * most
    for last in range(len(prompt) - 1, len(tokens) - 1):
        logits = nextn.row_after(tokens[: last + 1])
        for depth in range(min(most, len(tokens) - 1 - last)):
            if depth:
                logits = nextn.extend(tokens[last + depth])
            tried[depth] += 1
            if int(np.argmax(logits)) != tokens[last + depth + 1]:
                break
            kept[depth] += 1
    target.rewind(0)
    nextn.forget()
    depths: list[float] = []
    for depth in range(most):
        depths.append(kept[depth] / tried[depth] if tried[depth] else depths[-1] if depths else 0.0)
    return depths


def mtp_share(path: Path) -> float:
    """A NextN layer's decode against a plain one, before it is timed: the share of the weights
    it reads (at least MTP_SHARE_FLOOR: its own launches and the logits it hands back)."""
    return max(mtp.nextn_share(path), MTP_SHARE_FLOOR)
