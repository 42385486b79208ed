"""`-k auto`: choose each step's draft length from what this run has measured.

A step that drafts k tokens commits E(k) = 1 + a1 + a1·a2 + ... + a1···ak tokens on
average, where ai is the chance that position i is accepted once positions before it
were, and costs draft(k) + verify(k + 1) + overhead seconds. The policy keeps running
estimates of each and picks the k with the most tokens per second; k = 0 is a plain
step. Acceptance is tracked per context key (for n-gram lookup: the length of the match
that produced the proposal), because a 4-token match predicts far better than a 1-token
one. When drafting stops paying for a key, the policy probes it again now and then, with
exponentially growing gaps, so a workload that turns copy-heavy is noticed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Starting belief for an unseen position: optimistic enough to try drafting at all.
PRIOR_ACCEPTANCE = 0.6
# Weight of the newest observation in the running means.
SMOOTHING = 0.15
# Verify cost of b tokens relative to one, until two batch sizes have been timed.
PRIOR_COST_SLOPE = 0.3


@dataclass
class _KeyState:
    acceptance: list[float] = field(default_factory=list)  # ai for i = 1, 2, ...
    idle_steps: int = 0  # steps since this key last drafted
    probe_gap: int = 8  # idle steps before the next probe


class AdaptiveDraftLength:
    def __init__(self, max_k: int = 16) -> None:
        self.max_k = max_k
        self._keys: dict[object, _KeyState] = {}
        self._verify_seconds: dict[int, float] = {}  # running mean by batch size
        self._draft_seconds_per_token: float | None = None
        self._overhead_seconds = 0.0

    # --- choose ---------------------------------------------------------------

    def next(self, key: object = None, available: int | None = None) -> int:
        """Draft length for the next step (0: a plain step)."""
        state = self._keys.setdefault(key, _KeyState())
        limit = self.max_k if available is None else min(self.max_k, available)
        if limit <= 0:
            return 0
        best_k, best_rate = 0, 1.0 / self._step_cost(0)
        expected, chain = 1.0, 1.0
        for k in range(1, limit + 1):
            chain *= self._acceptance(state, k)
            expected += chain
            rate = expected / self._step_cost(k)
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0:
            state.idle_steps += 1
            if state.idle_steps >= state.probe_gap:
                # Probe: a one-token draft costs little and refreshes a1.
                state.idle_steps = 0
                state.probe_gap = min(state.probe_gap * 2, 256)
                return 1
        return best_k

    def _acceptance(self, state: _KeyState, k: int) -> float:
        if k <= len(state.acceptance):
            return state.acceptance[k - 1]
        return state.acceptance[-1] if state.acceptance else PRIOR_ACCEPTANCE

    def _step_cost(self, k: int) -> float:
        draft = (self._draft_seconds_per_token or 0.0) * k
        return draft + self._verify_cost(k + 1) + self._overhead_seconds

    def _verify_cost(self, batch: int) -> float:
        timed = self._verify_seconds
        if batch in timed:
            return timed[batch]
        if not timed:
            return 1.0 + PRIOR_COST_SLOPE * (batch - 1)  # relative units: only ratios matter yet
        if len(timed) == 1:
            (size, seconds), = timed.items()
            per_extra = PRIOR_COST_SLOPE * seconds / (1 + PRIOR_COST_SLOPE * (size - 1))
            return max(seconds + per_extra * (batch - size), 1e-9)
        # Linear interpolation between the nearest timed sizes (extrapolating at the ends).
        sizes = sorted(timed)
        lower = max((s for s in sizes if s < batch), default=sizes[0])
        upper = min((s for s in sizes if s > batch), default=sizes[-1])
        if lower == upper:
            lower, upper = (sizes[-2], sizes[-1]) if batch > sizes[-1] else (sizes[0], sizes[1])
        slope = (timed[upper] - timed[lower]) / (upper - lower)
        return max(timed[lower] + slope * (batch - lower), 1e-9)

    # --- learn ----------------------------------------------------------------

    def record(
        self,
        drafted: int,
        accepted: int,
        draft_seconds: float,
        verify_seconds: float,
        key: object = None,
        overhead_seconds: float = 0.0,
    ) -> None:
        state = self._keys.setdefault(key, _KeyState())
        for i in range(min(drafted, accepted + 1)):
            # Position i + 1 was tested: every position before it had been accepted.
            if i >= len(state.acceptance):
                state.acceptance.append(self._acceptance(state, i + 1))
            kept = 1.0 if i < accepted else 0.0
            state.acceptance[i] += SMOOTHING * (kept - state.acceptance[i])
        if drafted:
            state.idle_steps = 0
            if accepted > 0:
                state.probe_gap = 8
        batch = drafted + 1
        previous = self._verify_seconds.get(batch)
        self._verify_seconds[batch] = verify_seconds if previous is None else previous + SMOOTHING * (verify_seconds - previous)
        if drafted:
            per_token = draft_seconds / drafted
            prior = self._draft_seconds_per_token
            self._draft_seconds_per_token = per_token if prior is None else prior + SMOOTHING * (per_token - prior)
        self._overhead_seconds += SMOOTHING * (overhead_seconds - self._overhead_seconds)
