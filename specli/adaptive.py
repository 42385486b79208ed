"""`-k auto`: choose each step's draft length from what this run has measured.

A step that drafts k tokens commits E(k) = 1 + a1 + a1·a2 + ... + a1···ak tokens on
average, where ai is the chance that position i is accepted once the positions before
it were, and costs draft(k) + verify(k + 1) + overhead seconds. The policy picks the k
with the most tokens per second; k = 0 is a plain step.

- Acceptance: the proposer states a prior per key, 1 - h (n-gram lookup: by the match's
  length). In a copy in progress the prior follows the copy: position i of the draft
  comes after a match of extent + i tokens (a kept token lengthens it), so a 40-token copy
  is trusted further than a fresh 12-token match. The run scales every hazard h by a ratio
  it measures per key: rejections seen / rejections the priors foresaw, recent steps
  weighted most, and before a key has a record of its own, the same ratio over the run's
  other keys.
- Verify cost by batch size comes from a calibration (timed once per model, settings
  and llama.cpp build, cached on disk) and is refined by every step's timing. Odd and even batch
  sizes are interpolated separately: on CPUs an odd batch can cost more than a longer
  even one, and the policy then drafts one token more.
- When drafting stops paying for a key, the policy probes it again now and then, with
  growing gaps, so a workload that turns copy-heavy is noticed. Probes are paid for out of
  what drafting has saved: none while the run's drafts have lost more than PROBE_BUDGET of
  its time against the plain steps they replaced, so a run with little to copy (a short
  completion from a short prompt) does not keep paying for failed probes.
"""

from __future__ import annotations

import bisect
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

PRIOR_ACCEPTANCE = 0.6  # without a proposer's prior (a draft model): optimistic enough to try
# Pseudo-rejections behind "a key is rejected as often as its priors foresee": a key's own
# record counts against KEY_WEIGHT of the run's, the run's against RUN_WEIGHT of the priors'.
KEY_WEIGHT = 1.0
RUN_WEIGHT = 1.0
DECAY = 0.95  # per step: weight of older observations (an effective window of ~20 steps)
SMOOTHING = 0.15  # running means of timings
PRIOR_COST_SLOPE = 0.3  # verify cost of each extra token relative to one, before measuring
# A probe drafts one token: it tests the first position, the one every longer draft needs,
# and on a CPU a batch of 2 costs ~1.7 plain steps against ~2.4 for a batch of 4.
PROBE_LENGTH = 1
FIRST_PROBE_GAP = 2  # an unseen key is probed the second time it is declined
# (Both chosen by replaying -k auto over 20 recorded workloads, benchmarks/replay.py.)
# Probes stop while drafting's net loss against plain steps exceeds this share of the run's
# time. Replayed over 19 workloads: lowest 0.92x -> 0.95x plain; with each of 19 calibrations,
# mean geometric mean 1.545x -> 1.552x; unchanged where batches are cheap, as on a GPU.
PROBE_BUDGET = 0.02
MAX_DRAFT = 48  # longest draft considered: past ~48 rows a verify costs no less per row here
# Odd and even sizes both, up to MAX_DRAFT + 1: on CPUs, llama.cpp's matrix kernels take
# the rows of a batch in pairs, so an odd batch can cost more than the even one above it
# (measured, Gemma 3 270M, 2 cores: 7 tokens 60 ms, 8 tokens 48 ms).
CALIBRATION_SIZES = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 24, 32, 33, 48, 49)
CALIBRATION_VERSION = 2  # part of the cache key: a change in how costs are measured re-measures them


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


class AdaptiveDraftLength:
    def __init__(
        self,
        max_k: int = MAX_DRAFT,
        verify_cost: VerifyCost | None = None,
        prior: Callable[[object, int], float] | None = None,
    ) -> None:
        self.max_k = max_k
        # The proposer's belief: acceptance of a drafted token under a key, after a copy of
        # that many tokens (0: not a copy). None: PRIOR_ACCEPTANCE everywhere.
        self._prior = prior
        self._hazard_by_context: dict[object, list[float]] = {}  # see _hazard_table
        self._keys: dict[object, _KeyState] = {}
        self._run = _KeyState()  # every key together
        self._verify = verify_cost or VerifyCost()
        self._draft_seconds_per_token: float | None = None
        self._overhead_seconds = 0.0
        self._seconds = 0.0  # the run's steps so far: draft, verify and overhead
        self._drafting_loss = 0.0  # seconds drafting steps cost beyond the plain steps they replaced

    def next(self, key: object = None, available: int | None = None, extent: int = 0) -> int:
        """Draft length for the next step (0: a plain step). extent: Proposal.extent."""
        state = self._state(key)
        limit = self.max_k if available is None else min(self.max_k, available)
        if limit <= 0:
            return 0
        ratio = self._hazard_ratio(state)
        best_k, best_rate = 0, 1.0 / self._step_cost(0)
        expected, chain = 1.0, 1.0
        for k, hazard in enumerate(self._hazards(key, extent, limit), start=1):
            chain *= max(0.0, 1.0 - ratio * hazard)
            expected += chain
            rate = expected / self._step_cost(k)
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0:
            state.idle_steps += 1
            if state.idle_steps >= state.probe_gap:
                # A short probe refreshes the estimate; gaps grow until drafting pays again on
                # its own merits (an accepted probe is not enough: the draft's cost may still
                # exceed what it saves). No probe when even a fully accepted draft would lose,
                # nor while the run's drafting is over its loss budget.
                state.idle_steps = 0
                state.probe_gap = min(max(state.probe_gap * 2, 8), 256)
                if self._could_pay(limit, best_rate) and self._drafting_loss <= PROBE_BUDGET * self._seconds:
                    return min(limit, PROBE_LENGTH)
        else:
            state.probe_gap = min(state.probe_gap, 8)
        return best_k

    def _hazards(self, key: object, extent: int, count: int) -> list[float]:
        """The prior chance that each of `count` drafted positions is rejected once the
        ones before it were kept. In a copy in progress (extent > 0) position i follows a
        match of extent + i tokens; otherwise every position gets the key's prior.

        Lengthening short matches too (a kept token after a 3-token match makes it 4) fits
        the average just as well, but over-drafts where short matches are coincidences:
        replayed over 19 workloads, extract-fields fell from 1.05x to 0.96x plain and qa
        from 1.27x to 1.22x, for the same geometric mean (1.60x; benchmarks/replay.py)."""
        if self._prior is None:
            return [1.0 - PRIOR_ACCEPTANCE] * count
        table = self._hazard_table(key, extent + count)
        if extent <= 0:
            return [table[0]] * count
        return table[extent : extent + count]

    def _hazard_table(self, key: object, size: int) -> list[float]:
        """1 - prior(key, x) for x = 0, 1, ...: worked out once per key and context, not
        twice per step (next and record) for every drafted position."""
        table = self._hazard_by_context.setdefault(key, [])
        prior = self._prior
        assert prior is not None
        while len(table) < size:
            table.append(1.0 - prior(key, len(table)))
        return table

    def _hazard_ratio(self, state: _KeyState) -> float:
        """How many times more often than its priors foresaw this key's drafts are rejected.

        (rejected + KEY_WEIGHT·r) / (foreseen + KEY_WEIGHT), where r is the same ratio over
        the run's other keys, held to 1 by RUN_WEIGHT: a run whose drafts keep failing
        does not trust an unseen key as if nothing had happened, and a run of clean copies
        trusts it a little more. A ratio learnt from a few accepted drafts moves little,
        since their priors foresaw few rejections in the first place.
        """
        run = self._run
        seen = max(0.0, run.rejected - state.rejected)
        foreseen = max(0.0, run.foreseen - state.foreseen)
        run_ratio = (seen + RUN_WEIGHT) / (foreseen + RUN_WEIGHT)
        return (state.rejected + KEY_WEIGHT * run_ratio) / (state.foreseen + KEY_WEIGHT)

    def _could_pay(self, limit: int, plain_rate: float) -> bool:
        """Whether some draft length beats a plain step if every drafted token is accepted."""
        return any((k + 1) / self._step_cost(k) > plain_rate for k in range(1, limit + 1))

    def _state(self, key: object) -> _KeyState:
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _KeyState()
        return state

    def _step_cost(self, k: int) -> float:
        draft = (self._draft_seconds_per_token or 0.0) * k
        return draft + self._verify.cost(k + 1) + self._overhead_seconds

    def record(
        self,
        drafted: int,
        accepted: int,
        draft_seconds: float,
        verify_seconds: float,
        key: object = None,
        overhead_seconds: float = 0.0,
        extent: int = 0,
    ) -> None:
        self._seconds += draft_seconds + verify_seconds + overhead_seconds
        if drafted:
            # The accepted + 1 tokens would have taken as many plain steps: a one-token verify
            # each, and an overhead each beyond the one this step paid too.
            plain = (accepted + 1) * self._verify.cost(1) + accepted * self._overhead_seconds
            self._drafting_loss += draft_seconds + verify_seconds - plain
            hazards = self._hazards(key, extent, min(drafted, accepted + 1))
            state = self._state(key)
            state.observe(hazards, drafted, accepted)
            self._run.observe(hazards, drafted, accepted)
            state.idle_steps = 0
            per_token = draft_seconds / drafted
            prior = self._draft_seconds_per_token
            self._draft_seconds_per_token = per_token if prior is None else prior + SMOOTHING * (per_token - prior)
        self._verify.record(drafted + 1, verify_seconds)
        self._overhead_seconds += SMOOTHING * (overhead_seconds - self._overhead_seconds)


class VerifyCost:
    """Seconds for the target to decode a batch of b tokens.

    Starts from a calibration when one is given, else from a prior slope, and follows
    each step's timing with a running mean. The first sample of a size not calibrated is
    dropped (it pays for building llama.cpp's graph for that size). Sizes with no
    estimate are interpolated between neighbours of the same parity; beyond the largest
    known size the line through the two largest extrapolates, so a long draft gets tried
    and then judged on its measured cost. A batch is never priced above a longer one of
    the same parity: where timing noise says otherwise, the longer one's cost stands.
    """

    def __init__(self, calibrated: dict[int, float] | None = None) -> None:
        self._mean: dict[int, float] = dict(calibrated or {})
        self._count: dict[int, int] = {size: 1 for size in self._mean}
        self._table: list[float] | None = None  # cost by batch size, rebuilt after a change

    def record(self, batch: int, seconds: float) -> None:
        count = self._count.get(batch, 0)
        self._count[batch] = count + 1
        if count == 0:
            return
        mean = self._mean.get(batch)
        self._mean[batch] = seconds if mean is None else mean + SMOOTHING * (seconds - mean)
        self._table = None

    def cost(self, batch: int) -> float:
        table = self._table
        if table is None or batch + 2 >= len(table):
            table = self._table = self._build(max(batch + 3, MAX_DRAFT + 4, len(table or ())))
        return table[batch]

    def _build(self, size: int) -> list[float]:
        known = self._mean
        if not known:
            # Relative units: only ratios matter until something is measured.
            return [0.0] + [1.0 + PRIOR_COST_SLOPE * (b - 1) for b in range(1, size)]
        sizes = sorted(known)
        by_parity = ([s for s in sizes if s % 2 == 0], [s for s in sizes if s % 2 == 1])
        per_token = known[sizes[0]] / (1 + PRIOR_COST_SLOPE * (sizes[0] - 1))
        table = [0.0] + [self._estimate(b, sizes, by_parity[b % 2], per_token) for b in range(1, size)]
        for b in range(size - 3, 0, -1):
            table[b] = min(table[b], table[b + 2])
        return table

    def _estimate(self, batch: int, sizes: list[int], same_parity: list[int], per_token: float) -> float:
        known = self._mean
        if batch in known:
            return known[batch]
        smallest, largest = sizes[0], sizes[-1]
        if batch < smallest:
            return per_token * (1 + PRIOR_COST_SLOPE * (batch - 1))
        if batch > largest:
            # Extend the line through the two largest sizes of the same parity (the cost of
            # one more row in a long batch); with fewer, the prior slope from the largest.
            if len(same_parity) >= 2:
                below, top = same_parity[-2], same_parity[-1]
                slope = (known[top] - known[below]) / (top - below)
                if slope > 0:
                    return known[top] + slope * (batch - top)
            return known[largest] + PRIOR_COST_SLOPE * per_token * (batch - largest)
        # Interpolate between neighbours of the same parity where they bracket the size
        # (odd and even batches can lie on two different lines), else between any.
        for candidates in (same_parity, sizes):
            i = bisect.bisect_left(candidates, batch)
            if 0 < i < len(candidates):
                lower, upper = candidates[i - 1], candidates[i]
                weight = (batch - lower) / (upper - lower)
                return known[lower] + weight * (known[upper] - known[lower])
        raise AssertionError("unreachable: smallest < batch < largest")


def calibrate(decode: Callable[[list[int]], object], rewind: Callable[[int], None], token: int,
              sizes: tuple[int, ...] = CALIBRATION_SIZES, repeats: int = 2) -> dict[int, float]:
    """Time an all-logits decode of each batch size on an empty cache, keeping the fastest
    of `repeats` runs: the machine's cost, not its noise (nor a first run's graph building).

    The repeats go over all sizes in turn, so a burst of noise hits one sample of a few
    sizes rather than every sample of one. A size that still costs more than a longer one
    of the same parity was caught by noise: it is measured again (twice at most).
    """
    costs: dict[int, float] = {}

    def measure(size: int) -> None:
        started = time.perf_counter()
        decode([token] * size)
        costs[size] = min(costs.get(size, float("inf")), time.perf_counter() - started)
        rewind(0)

    for _ in range(repeats):
        for size in sizes:
            measure(size)
    for _ in range(2):
        suspects = [size for size in sizes
                    if any(other > size and other % 2 == size % 2 and costs[other] < costs[size] for other in sizes)]
        for size in suspects:
            measure(size)
    return costs


def cached_calibration(cache_file: Path, key: str, measure: Callable[[], dict[int, float]]) -> dict[int, float]:
    """The calibration stored under `key` in cache_file, measuring and storing it if absent."""
    try:
        stored = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        stored = {}
    if isinstance(stored.get(key), dict):
        try:
            return {int(size): float(seconds) for size, seconds in stored[key].items()}
        except (TypeError, ValueError):
            pass
    costs = measure()
    stored[key] = {str(size): seconds for size, seconds in costs.items()}
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        temporary = cache_file.with_name(cache_file.name + ".tmp")
        temporary.write_text(json.dumps(stored, indent=1, sort_keys=True))
        temporary.replace(cache_file)
    except OSError:
        pass  # a read-only cache only costs a calibration next time
    return costs
