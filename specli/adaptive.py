"""`-k auto`: choose each step's draft length from what this run has measured.

A step that drafts k tokens commits E(k) = 1 + a1 + a1·a2 + ... + a1···ak tokens on
average, where ai is the chance that position i is accepted once the positions before
it were, and costs draft(k) + verify(k + 1) + overhead seconds. The policy picks the k
with the most tokens per second; k = 0 is a plain step.

- Acceptance is tracked per context key (for n-gram lookup: the length of the match
  behind the proposal; a 12-token match predicts far better than a 1-token one), with
  recent steps weighted most, starting from the proposer's prior for that key (scaled by
  how often this run's drafts have failed against what their priors foresaw). A position
  seen rarely borrows strength from the key's pooled rate, so one unlucky rejection does
  not rule out long drafts for good.
- Verify cost by batch size comes from a calibration (timed once per model and
  settings, cached on disk) and is refined by every step's timing. Odd and even batch
  sizes are interpolated separately: on CPUs an odd batch can cost more than a longer
  even one, and the policy then drafts one token more.
- When drafting stops paying for a key, the policy probes it again now and then, with
  growing gaps, so a workload that turns copy-heavy is noticed.
"""

from __future__ import annotations

import bisect
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

PRIOR_ACCEPTANCE = 0.6  # belief about an unseen key: optimistic enough to try drafting
PRIOR_WEIGHT = 2.0  # pseudo-observations behind that belief
UNTESTED_WEIGHT = 16.0  # ... and behind it for positions no draft of the key has reached yet
RUN_FAILURES = 1.0  # pseudo-failures behind "this run fails as often as the priors say"
POSITION_SHRINK = 4.0  # pseudo-observations pulling a position towards its key's pooled rate
DECAY = 0.95  # per step: weight of older observations (an effective window of ~20 steps)
SMOOTHING = 0.15  # running means of timings
PRIOR_COST_SLOPE = 0.3  # verify cost of each extra token relative to one, before measuring
# A probe drafts one token: it tests the first position, the one every longer draft needs,
# and on a CPU a batch of 2 costs ~1.7 plain steps against ~2.4 for a batch of 4.
PROBE_LENGTH = 1
FIRST_PROBE_GAP = 2  # an unseen key is probed the second time it is declined
# (Both chosen by replaying -k auto over 20 recorded workloads, benchmarks/replay.py.)
MAX_DRAFT = 48  # longest draft considered: past ~48 rows a verify costs no less per row here
# Odd and even sizes both, up to MAX_DRAFT + 1: on CPUs, llama.cpp's matrix kernels take
# the rows of a batch in pairs, so an odd batch can cost more than the even one above it
# (measured, Gemma 3 270M, 2 cores: 7 tokens 60 ms, 8 tokens 48 ms).
CALIBRATION_SIZES = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 24, 32, 33, 48, 49)
CALIBRATION_VERSION = 2  # part of the cache key: a change in how costs are measured re-measures them


@dataclass
class _KeyState:
    prior: float = PRIOR_ACCEPTANCE
    pooled_kept: float = 0.0
    pooled_tested: float = 0.0
    kept: list[float] = field(default_factory=list)  # by position, decayed counts
    tested: list[float] = field(default_factory=list)
    expected_failures: float = 0.0  # decayed: rejections the tested positions' priors foresaw
    idle_steps: int = 0  # steps since this key last drafted
    probe_gap: int = FIRST_PROBE_GAP  # idle steps before the next probe

    def pooled(self, prior: float) -> float:
        return (self.pooled_kept + PRIOR_WEIGHT * prior) / (self.pooled_tested + PRIOR_WEIGHT)

    def untested(self, prior: float) -> float:
        """Acceptance at a position no draft of this key has reached: the pooled rate, held
        closer to the prior. A copy that was kept 30 tokens long says little about token 60
        (copies end), and the longest drafts lose the most when they fail."""
        return (self.pooled_kept + UNTESTED_WEIGHT * prior) / (self.pooled_tested + UNTESTED_WEIGHT)

    def acceptance(self, position: int, pooled: float, untested: float) -> float:
        if position < len(self.tested):
            return (self.kept[position] + POSITION_SHRINK * pooled) / (self.tested[position] + POSITION_SHRINK)
        return untested

    def observe(self, drafted: int, accepted: int, prior: float | None = None) -> None:
        self.pooled_kept *= DECAY
        self.pooled_tested *= DECAY
        self.expected_failures *= DECAY
        for i in range(len(self.tested)):
            self.kept[i] *= DECAY
            self.tested[i] *= DECAY
        for i in range(min(drafted, accepted + 1)):
            # Position i was tested: every position before it had been accepted.
            if i >= len(self.tested):
                self.kept.append(0.0)
                self.tested.append(0.0)
            kept = 1.0 if i < accepted else 0.0
            self.kept[i] += kept
            self.tested[i] += 1.0
            self.pooled_kept += kept
            self.pooled_tested += 1.0
            self.expected_failures += 1.0 - (prior if prior is not None else self.prior)


class AdaptiveDraftLength:
    def __init__(
        self,
        max_k: int = MAX_DRAFT,
        verify_cost: VerifyCost | None = None,
        prior: Callable[[object], float] | None = None,
    ) -> None:
        self.max_k = max_k
        self._prior = prior  # the proposer's belief about a key it has not seen judged yet
        self._keys: dict[object, _KeyState] = {}
        self._run = _KeyState()  # every key together
        self._verify = verify_cost or VerifyCost()
        self._draft_seconds_per_token: float | None = None
        self._overhead_seconds = 0.0

    def next(self, key: object = None, available: int | None = None) -> int:
        """Draft length for the next step (0: a plain step)."""
        state = self._state(key)
        limit = self.max_k if available is None else min(self.max_k, available)
        if limit <= 0:
            return 0
        prior = self._run_adjusted(state)
        pooled, untested = state.pooled(prior), state.untested(prior)
        best_k, best_rate = 0, 1.0 / self._step_cost(0)
        expected, chain = 1.0, 1.0
        for k in range(1, limit + 1):
            chain *= state.acceptance(k - 1, pooled, untested)
            expected += chain
            rate = expected / self._step_cost(k)
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0:
            state.idle_steps += 1
            if state.idle_steps >= state.probe_gap:
                # A short probe refreshes the estimate; gaps grow until drafting pays again on
                # its own merits (an accepted probe is not enough: the draft's cost may still
                # exceed what it saves). No probe when even a fully accepted draft would lose.
                state.idle_steps = 0
                state.probe_gap = min(max(state.probe_gap * 2, 8), 256)
                if self._could_pay(limit, best_rate):
                    return min(limit, PROBE_LENGTH)
        else:
            state.probe_gap = min(state.probe_gap, 8)
        return best_k

    def _run_adjusted(self, state: _KeyState) -> float:
        """A key's prior, corrected by how the run's other keys have fared against theirs.

        The chance of a rejection is scaled by (rejections seen) / (rejections the priors
        foresaw): in a run where drafts keep failing, an unseen key is not trusted as if
        nothing had happened. The correction works both ways: a long exact copy, rejected
        less often than its key's prior foresaw, makes short matches look better too (after
        summarise's copy, 3- and 5-token drafts on 1- and 2-token matches). Clamping the
        ratio at 1 was replayed (benchmarks/replay.py): +0.5% over 19 workloads, but
        code-edit 2.06x -> 1.87x, so it stays two-sided. The key's own record is left out: it already counts, once, in the key's estimate
        (with a single key, as for a draft model, the prior stays as it is).
        """
        run = self._run
        seen = max(0.0, (run.pooled_tested - run.pooled_kept) - (state.pooled_tested - state.pooled_kept))
        foreseen = max(0.0, run.expected_failures - state.expected_failures)
        ratio = (seen + RUN_FAILURES) / (foreseen + RUN_FAILURES)
        return max(0.0, 1.0 - min(1.0, (1.0 - state.prior) * ratio))

    def _could_pay(self, limit: int, plain_rate: float) -> bool:
        """Whether some draft length beats a plain step if every drafted token is accepted."""
        return any((k + 1) / self._step_cost(k) > plain_rate for k in range(1, limit + 1))

    def _state(self, key: object) -> _KeyState:
        state = self._keys.get(key)
        if state is None:
            prior = self._prior(key) if self._prior is not None else PRIOR_ACCEPTANCE
            state = self._keys[key] = _KeyState(prior=prior)
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
    ) -> None:
        state = self._state(key)
        if drafted:
            state.observe(drafted, accepted)
            self._run.observe(drafted, accepted, state.prior)
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
