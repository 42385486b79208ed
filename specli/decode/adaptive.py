"""`-k auto`: choose each step's draft length from stored costs and what the run accepted.

A step that drafts k tokens commits E(k) = 1 + a1 + a1·a2 + ... + a1···ak tokens on
average, where ai is the chance that position i is accepted once the positions before
it were, and costs draft(k) + verify(k + 1) + loop seconds. The policy picks the k
with the most tokens per second, if that beats a plain step (k = 0) by MARGIN.

- Costs come from specli.decode.costs (a calibration, an earlier run's steps, or a prior), never
  from times measured during this run: the same command with the same stored costs makes
  the same choices, so it writes the same text.
- Acceptance: the proposer states a prior per key, 1 - h (n-gram lookup: by the match's
  length). In a copy in progress the prior follows the copy: position i of the draft
  comes after a match of extent + i tokens (a kept token lengthens it), so a 40-token copy
  is trusted further than a fresh 12-token match. The run scales every hazard h by a ratio
  it counts per key: rejections seen / rejections the priors foresaw, recent steps
  weighted most, and before a key has a record of its own, the same ratio over the run's
  other keys. These are counts of the run's tokens, so they repeat exactly too. Where
  several earlier occurrences voted on a draft, a token's acceptance is scaled by the share
  of the vote it won (Proposal.support), and its hazard by (2 / (m + 1))**AGREEMENT_POWER
  where m >= 2 occurrences all continued with it (Proposal.agreeing): a line that a list
  has repeated four times is trusted though this key's earlier drafts, on its first
  occurrences, failed.
- What a miss costs bounds how long an n-gram draft may be: it is made only if, rejected
  outright, it keeps drafting's net loss so far (in modelled seconds: what drafting steps
  cost beyond the plain steps they replaced) within RISK_ALLOWANCE plain steps plus
  RISK_SHARE of the run's time. So a run that keeps missing is held to short drafts, a
  copy that keeps being accepted earns the budget for longer chunks, and no run loses
  much more than RISK_SHARE to drafting, whatever the verify curve. On a GPU a miss costs
  next to nothing and the bound never binds.
- Beside other requests in one decode (`batch`: a slot, decode/slots.py), a step's time is
  the whole batch's and so are its tokens: k is chosen for the most tokens a second of the
  batch, (E(k) + the others' expected tokens) / cost(the others' rows + k + 1). A drafted row
  then pays only where its chance of being kept beats what one more row in a batch of that
  size costs at the batch's rate: on a CPU, where every row costs, four requests draft only
  their likeliest tokens; on a GPU, where a batch costs little more than a row, they draft on.
  What the others bring is the last step's (Slot.others), so the choice repeats exactly too.
- When drafting does not pay for a key, the policy probes it now and then, with growing
  gaps, so a workload that turns copy-heavy is noticed. Probes are paid for out of what
  drafting has saved (in modelled seconds): a probe is made only if, rejected outright,
  it leaves drafting's net loss within PROBE_BUDGET of the run's time. So a run's first
  probes wait until the run has time to spare, and a short answer that never copies
  costs nothing.

The figures behind each constant: docs/design.md; `benchmarks/replay.py`
replays the policy offline on recorded runs (tests/test_replay.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from specli.decode.costs import StepCosts, VerifyCurve
from specli.decode.ngram import PREDICTED
from specli.decode.policy import MAX_DRAFT
from specli.decode.shapes import BatchShapes

if TYPE_CHECKING:
    from specli.decode.events import StepRecord
    from specli.decode.proposers import Proposal

# A draft model's acceptance before the run has a record: its measured agreement with the
# target (StepCosts.draft_acceptance), else this, optimistic enough to try.
PRIOR_ACCEPTANCE = 0.6
# Pseudo-rejections behind "a key is rejected as often as its priors foresee": a key's own
# record counts against KEY_WEIGHT of the run's, the run's against RUN_WEIGHT of the priors'.
# A light key weight: a key's own few rejections soon outweigh the run's (a high-confidence
# key that fails where its prior foresaw almost no rejection is quickly distrusted).
KEY_WEIGHT = 0.3
# A draft model whose agreement with the target was measured: that prior is worth a couple of
# rejections of evidence, so one early miss does not stop it drafting for the rest of the run.
MODEL_WEIGHT = 2.0
RUN_WEIGHT = 1.0
# A draft must promise MARGIN more tokens a second than a plain step: a draft that barely
# pays on average gains next to nothing and, rejected, costs a whole verify.
MARGIN = 0.03
DECAY = 0.95  # per step: weight of older observations (an effective window of ~20 steps)
# A probe drafts one token: it tests the first position, the one every longer draft needs.
PROBE_LENGTH = 1
FIRST_PROBE_GAP = 2  # an unseen key is probed the second time it is declined
PROBE_BUDGET = 0.02  # the most drafting may have lost, as a share of the run's time, after a rejected probe
# A draft is made only if, rejected outright, it leaves drafting's net loss within
# RISK_ALLOWANCE plain steps plus RISK_SHARE of the run's time: the most a run can lose. Chosen
# on the development prompts' replay (docs/design.md, "The risk budget") for a
# lowest prompt of 0.97x plain or more on this CPU's curves, -t 1's included.
RISK_ALLOWANCE = 2.0
RISK_SHARE = 0.03
PREDICTION_ALLOWANCE = 20.0  # a 48-token draft rejected outright costs 17 plain steps on this CPU
# How much m agreeing occurrences lower a drafted token's hazard: by (2 / (m + 1))**power, so
# 0.44 for two, 0.16 for four (chosen on the development prompts with `benchmarks/replay.py`).
AGREEMENT_POWER = 2.0


class SharedBatch(Protocol):
    """The decode a request shares with others (a decode/slots.py Slot)."""

    def others(self) -> tuple[int, float]:
        """The other requests' rows in the step, and the tokens they expect from them."""
        ...

    def expect(self, tokens: float) -> None:
        """The tokens this request expects from its next step."""
        ...


@dataclass
class _KeyState:
    rejected: float = 0.0  # decayed: drafts rejected before their end
    foreseen: float = 0.0  # decayed: rejections the priors foresaw at the positions tested
    idle_steps: int = 0  # steps since this key last drafted
    probe_gap: int = FIRST_PROBE_GAP  # idle steps before the next probe

    def observe(self, hazards: list[float], drafted: int, accepted: int) -> None:
        self.rejected *= DECAY
        self.foreseen *= DECAY
        # Positions 0..accepted were tested, each once the ones before it were kept.
        self.foreseen += sum(hazards[: min(drafted, accepted + 1)])
        if accepted < drafted:
            self.rejected += 1.0


class AdaptiveDraftPolicy:
    def __init__(
        self,
        costs: StepCosts,
        prior: Callable[[object, int], float] | None = None,
        max_draft: int = MAX_DRAFT,
        shapes: BatchShapes | None = None,
        batch: SharedBatch | None = None,
    ) -> None:
        self.max_draft = max_draft
        self._batch = batch
        self._others = (0, 0.0)  # the others' rows and expected tokens in the step being chosen
        self.costs = costs
        # The batch each draft length is decoded in (a GPU pads to reusable shapes and pays
        # for a change of shape): the engine's, so the policy prices what the engine decodes.
        self._shapes = shapes if shapes is not None else BatchShapes.any()
        # The proposer's belief: acceptance of a drafted token under a key, after a copy of
        # that many tokens (0: not a copy). None: PRIOR_ACCEPTANCE everywhere.
        self._prior = prior
        self._hazard_by_context: dict[object, list[float]] = {}  # see _hazard_table
        self._keys: dict[object, _KeyState] = {}
        self._run = _KeyState()  # every key together
        self._verify = VerifyCurve(costs.verify)
        self._draft_per_token = costs.draft_per_token
        self._catch_up = costs.draft_catch_up
        self._behind = 0  # the draft model's tokens to catch up with, this step (choose)
        self._model_acceptance = PRIOR_ACCEPTANCE if costs.draft_acceptance is None else costs.draft_acceptance
        self._measured = costs.draft_acceptance is not None
        self._costs = costs  # (a drafter measured by depth: StepCosts.acceptance_at)
        self._loop = costs.loop
        self._seconds = 0.0  # the run's steps so far, as the costs price them
        self._drafting_loss = 0.0  # what drafting steps cost beyond the plain steps they replaced

    def choose(self, key: object, extent: int, most: int, support: Sequence[float] = (),
               behind: int = 0, agreeing: Sequence[int] = ()) -> int:
        """How many draft tokens to verify, `most` at most (0: a plain step). key None: a
        draft model's tokens, priced at its cost per token after catching up with the `behind`
        tokens committed since it last drafted; any other key is n-gram lookup's, free to make,
        with `support` its vote share per token and `agreeing` the occurrences behind each
        (Proposal.support, .agreeing)."""
        self._read_batch()
        self._behind = behind if key is None else 0
        state = self._state(key)
        most = min(self.max_draft, most)
        if key is not None:  # n-gram lookup: a long match can promise far more than it keeps
            most = self._affordable(key, most)
        if most <= 0:
            self._expect(1.0)
            return 0
        k, best_rate = self._best(key, extent, most, support, agreeing)
        self._expect(best_rate * self._step_cost(k, key) - self._others[1])
        if k == 0:
            state.idle_steps += 1
            if state.idle_steps >= state.probe_gap:
                # A short probe refreshes the estimate; gaps grow until drafting pays again on
                # its own merits (an accepted probe is not enough: the draft's cost may still
                # exceed what it saves). No probe when even a fully accepted draft would lose,
                # nor when a rejected one would take drafting over its loss budget.
                state.idle_steps = 0
                state.probe_gap = min(max(state.probe_gap * 2, 8), 256)
                probe = min(most, PROBE_LENGTH)
                if self._could_pay(key, most, best_rate) and self._affords(probe, key):
                    self._expect(1.0 + (1.0 - self._hazards(key, extent, 1, support, agreeing)[0]))
                    return probe
        else:
            state.probe_gap = min(state.probe_gap, 8)
        return k

    def _read_batch(self) -> None:
        """What the other requests in the shared decode brought in its last step (alone: none)."""
        if self._batch is not None:
            self._others = self._batch.others()

    def _expect(self, tokens: float) -> None:
        if self._batch is not None:
            self._batch.expect(tokens)

    def prefers(self, free: Proposal, most: int, behind: int = 0) -> bool:
        """Whether lookup's free proposal promises more tokens a second than the draft model's
        would, each priced as `choose` prices it."""
        self._read_batch()
        most = self._affordable(free.key, min(self.max_draft, len(free.tokens)))
        free_k, free_rate = (self._best(free.key, free.extent, most, free.support, free.agreeing)
                             if most > 0 else (0, 0.0))
        self._behind = behind
        _, model_rate = self._best(None, 0, min(self.max_draft, most))
        self._behind = 0
        return free_k > 0 and free_rate >= model_rate

    def _best(self, key: object, extent: int, most: int, support: Sequence[float] = (),
              agreeing: Sequence[int] = ()) -> tuple[int, float]:
        """The draft length with the most expected tokens a second, and that rate (k = 0: a
        plain step)."""
        ratio = self._hazard_ratio(self._state(key), MODEL_WEIGHT if key is None and self._measured else KEY_WEIGHT)
        others = self._others[1]  # the batch's other tokens (0 alone): its rate is what is maximised
        rates = [(1.0 + others) / self._step_cost(0)]
        expected, chain = 1.0, 1.0
        for k, hazard in enumerate(self._hazards(key, extent, most, support, agreeing), start=1):
            chain *= max(0.0, 1.0 - ratio * hazard)
            expected += chain
            rates.append((expected + others) / self._step_cost(k, key))
        k = max(range(len(rates)), key=rates.__getitem__)
        if rates[k] <= (1.0 + MARGIN) * rates[0]:
            k = 0
        return k, rates[k]

    def _hazards(self, key: object, extent: int, most: int, support: Sequence[float] = (),
                 agreeing: Sequence[int] = ()) -> list[float]:
        """The prior chance that each of the first `most` drafted positions is rejected once the
        ones before it were kept. In a copy in progress (extent > 0) position i follows a
        match of extent + i tokens; otherwise every position gets the key's prior (short
        matches are often coincidences: a kept token does not make them a copy). Where
        several earlier occurrences all continued with a position's token, its hazard is
        lowered (AGREEMENT_POWER); where they split their vote, its acceptance is scaled by
        the share its token won (its support)."""
        if self._prior is None or key is None:  # a draft model's tokens (by depth, where measured so)
            if self._costs.draft_depths:
                return [1.0 - self._costs.acceptance_at(depth) for depth in range(most)]  # type: ignore[operator]
            return [1.0 - self._model_acceptance] * most
        table = self._hazard_table(key, extent + most)
        hazards = [table[0]] * most if extent <= 0 else table[extent : extent + most]
        if agreeing:
            hazards = [h * (2.0 / (m + 1)) ** AGREEMENT_POWER if m >= 2 else h
                       for h, m in zip(hazards, agreeing)] + hazards[len(agreeing) :]
        if support:
            hazards = [1.0 - (1.0 - h) * share for h, share in zip(hazards, support)] + hazards[len(support) :]
        return hazards

    def _hazard_table(self, key: object, size: int) -> list[float]:
        """1 - prior(key, x) for x = 0, 1, ...: worked out once per key and context, not
        twice per step (next and record) for every drafted position."""
        table = self._hazard_by_context.setdefault(key, [])
        prior = self._prior
        assert prior is not None
        while len(table) < size:
            table.append(1.0 - prior(key, len(table)))
        return table

    def _hazard_ratio(self, state: _KeyState, weight: float = KEY_WEIGHT) -> float:
        """How many times more often than its priors foresaw this key's drafts are rejected.

        (rejected + w·r) / (foreseen + w), w the key's weight (KEY_WEIGHT; MODEL_WEIGHT for a
        draft model whose agreement was measured), where r is the same ratio over
        the run's other keys, held to 1 by RUN_WEIGHT: a run whose drafts keep failing
        does not trust an unseen key as if nothing had happened, and a run of clean copies
        trusts it a little more. A ratio learnt from a few accepted drafts moves little,
        since their priors foresaw few rejections in the first place.
        """
        run = self._run
        seen = max(0.0, run.rejected - state.rejected)
        foreseen = max(0.0, run.foreseen - state.foreseen)
        run_ratio = (seen + RUN_WEIGHT) / (foreseen + RUN_WEIGHT)
        return (state.rejected + weight * run_ratio) / (state.foreseen + weight)

    def _affords(self, k: int, key: object) -> bool:
        """Whether a probe of k tokens, rejected outright, keeps drafting's loss so far within
        PROBE_BUDGET of the run's time (its savings count against its losses)."""
        miss = self._step_cost(k, key) - self._step_cost(0)
        return self._drafting_loss + miss <= PROBE_BUDGET * (self._seconds + self._step_cost(k, key))

    def _affordable(self, key: object, most: int) -> int:
        """The longest n-gram draft (up to `most`) that, rejected outright, keeps drafting's
        loss so far within RISK_ALLOWANCE plain steps and RISK_SHARE of the run's time. What
        drafts saved pays for longer ones: a copy that keeps being accepted earns the budget
        for its next, longer chunk, and a run whose drafts fail is held to short ones. (A
        draft model's acceptance is learnt from every step it drafts, and its own decodes
        make even a kept draft cost more than it saves at first: it is not held to this.) A
        Predicted Output is the client's claim about the answer: it may lose PREDICTION_ALLOWANCE
        plain steps, a longest draft rejected at its first token on a CPU, before it earns more."""
        plain = self._step_cost(0)
        allowance = PREDICTION_ALLOWANCE if key is PREDICTED else RISK_ALLOWANCE
        budget = allowance * plain + RISK_SHARE * self._seconds - self._drafting_loss
        k = 0
        while k < most and self._step_cost(k + 1, key) - plain <= budget:
            k += 1
        return k

    def _could_pay(self, key: object, most: int, plain_rate: float) -> bool:
        """Whether some draft length beats a plain step if every drafted token is accepted."""
        return any((k + 1 + self._others[1]) / self._step_cost(k, key) > plain_rate for k in range(1, most + 1))

    def _state(self, key: object) -> _KeyState:
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _KeyState()
        return state

    def _step_cost(self, k: int, key: object = None) -> float:
        """A step of k draft tokens: a draft model's decodes (key None: its catch-up with the
        text committed since it last drafted, then one decode a token), the verify, the loop."""
        rows = self._others[0] + k + 1  # the whole decode's, beside others
        return self._drafting_cost(k, key) + self._shapes.cost(self._verify, rows, self._others[0] + self.max_draft + 1) \
            + self._loop

    def _drafting_cost(self, k: int, key: object) -> float:
        """A draft model's decodes for k tokens: its catch-up, then one decode a token (lookup: free)."""
        return self._catch_up * self._behind + self._draft_per_token * k if key is None and k > 0 else 0.0

    def price(self, drafted: int) -> float:
        """The verify of `drafted` draft tokens, as the costs price it (a prior's are relative: 0)."""
        return self._verify.cost(drafted + 1) if self.costs.source not in ("prior", "conservative") else 0.0

    def record(self, step: StepRecord) -> None:
        """Learn from what the step kept. Its measured times are not used: see the module doc."""
        self._read_batch()  # the step just decoded: the others' rows in it
        drafted, accepted = step.drafted, step.accepted
        # The batch as decoded: padded, perhaps in a new shape.
        verify = self._shapes.paid(self._verify, self._others[0] + step.rows) if step.rows \
            else self._verify.cost(self._others[0] + drafted + 1)
        cost = self._drafting_cost(drafted, step.key) + verify + self._loop
        if step.key is None and not drafted and step.asked:  # decodes that brought no token to verify
            cost += self._catch_up * self._behind + self._draft_per_token * step.asked
        self._seconds += cost
        if not drafted and not step.asked:
            return
        # The accepted + 1 tokens would have taken as many plain steps.
        self._drafting_loss += cost - (accepted + 1) * self._step_cost(0)
        # A draft model asked for tokens that brought none missed at its first.
        drafted = max(drafted, 1)
        hazards = self._hazards(step.key, step.extent, min(drafted, accepted + 1), step.support, step.agreeing)
        state = self._state(step.key)
        state.observe(hazards, drafted, accepted)
        self._run.observe(hazards, drafted, accepted)
        state.idle_steps = 0
