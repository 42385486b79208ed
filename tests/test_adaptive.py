"""-k auto: the policy drafts long when drafts are accepted and verifying is cheap, backs off
to plain steps when they are not, probes again later, and learns the cost curve."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fakes import FakeModel, plain_greedy

from specli.adaptive import AdaptiveDraftLength, VerifyCost, cached_calibration, calibrate
from specli.engine import Engine, GenerationOptions, Token
from specli.proposers import DraftModelProposer, NGramProposer
from specli.sampling import SamplingSettings


def flat_cost() -> VerifyCost:
    """A GPU-like curve: a batch of 17 costs barely more than one token."""
    return VerifyCost({size: 0.010 + 0.0001 * size for size in range(1, 18)})


def steep_cost() -> VerifyCost:
    """Every extra token costs as much as the first: speculation can never pay."""
    return VerifyCost({size: 0.010 * size for size in range(1, 18)})


def drive(policy: AdaptiveDraftLength, acceptance: float, steps: int, key=None, seed=0) -> list[int]:
    """Simulate steps where each drafted position is kept with probability `acceptance`
    and each verify takes what the policy's calibrated curve says."""
    rng = np.random.default_rng(seed)
    curve = dict(policy._verify._mean)
    chosen = []
    for _ in range(steps):
        k = policy.next(key, 16)
        chosen.append(k)
        accepted = 0
        while accepted < k and rng.random() < acceptance:
            accepted += 1
        policy.record(k, accepted, 0.0, curve[k + 1], key)
    return chosen


def test_accepted_drafts_and_cheap_verification_lead_to_long_drafts():
    chosen = drive(AdaptiveDraftLength(verify_cost=flat_cost()), acceptance=0.95, steps=40)
    assert min(chosen[10:]) >= 12


def cpu_cost() -> VerifyCost:
    """A CPU-like curve: each extra token in the batch costs 30% of the first."""
    return VerifyCost({size: 0.010 * (1 + 0.3 * (size - 1)) for size in range(1, 18)})


def test_rejected_drafts_lead_to_plain_steps_with_rare_probes():
    chosen = drive(AdaptiveDraftLength(verify_cost=cpu_cost()), acceptance=0.0, steps=200)
    tail = chosen[20:]
    assert tail.count(0) >= 0.9 * len(tail)
    assert 0 < sum(1 for k in tail if k) <= 8, "probes continue, with growing gaps"


def test_probes_are_paid_for_by_what_drafting_saved():
    """Drafts that keep failing: a run whose drafting has so far only lost time skips the
    early probes that a run with savings from a long copy makes, and probes again later
    on, as its budget (a share of the run's time) grows."""

    def trusted_copies(key: object, context: int) -> float:
        return 0.999 if key == "copy" else 0.6  # the copy's clean record leaves the run's trust as it was

    def drafting_steps(savings: bool) -> list[int]:
        policy = AdaptiveDraftLength(verify_cost=cpu_cost(), prior=trusted_copies)
        if savings:
            curve = dict(policy._verify._mean)
            for _ in range(20):  # 17 tokens a step for the price of ~6 plain steps
                policy.record(16, 16, 0.0, curve[17], "copy")
        chosen = drive(policy, acceptance=0.0, steps=400, key="short")
        return [step for step, k in enumerate(chosen) if k]

    losing, saving = drafting_steps(savings=False), drafting_steps(savings=True)
    # Both first draft on the prior (steps 0-2), then learn that the key fails: from then
    # on every draft is a probe.
    probes = range(10, 40)
    assert sum(step in probes for step in losing) < sum(step in probes for step in saving)
    assert sum(step >= 40 for step in losing) >= 2, "probes resume as the run goes on"


def test_steep_verify_cost_means_no_speculation_even_when_accepted():
    policy = AdaptiveDraftLength(verify_cost=steep_cost())
    assert policy.next(None, 16) == 0 or drive(policy, 0.5, 30)[-1] == 0


def test_each_key_learns_its_own_acceptance():
    policy = AdaptiveDraftLength(verify_cost=flat_cost())
    drive(policy, acceptance=0.95, steps=40, key="long match")
    drive(policy, acceptance=0.05, steps=40, key="short match", seed=1)
    assert policy.next("long match", 16) >= 12
    # On this flat curve a token more costs 1% of a step, so even 5% acceptance pays for
    # a token or two, never for a long draft.
    assert policy.next("short match", 16) <= 2


def test_a_workload_that_turns_copy_heavy_is_noticed():
    policy = AdaptiveDraftLength(verify_cost=flat_cost())
    drive(policy, acceptance=0.0, steps=60)
    later = drive(policy, acceptance=0.98, steps=300, seed=2)
    assert max(later[-50:]) >= 12


def test_verify_cost_drops_warm_up_samples_and_interpolates():
    cost = VerifyCost()
    cost.record(4, 1.0)  # first sample of a size: graph building, dropped
    assert cost.cost(4) == 1.0 + 0.3 * 3  # still the prior (relative units)
    cost.record(4, 0.040)
    cost.record(1, 9.0)
    cost.record(1, 0.010)
    assert cost.cost(4) == 0.040 and cost.cost(1) == 0.010
    assert 0.010 < cost.cost(2) < cost.cost(3) < 0.040  # between measured neighbours
    assert cost.cost(8) > 0.040  # beyond: extrapolated upwards


def paired_rows_cost(size: int) -> float:
    """Like llama.cpp's CPU kernels here: rows go in pairs, an odd row costs a lone pass."""
    return 0.010 + 0.004 * size + (0.012 if size % 2 and size > 1 else 0.0)


def test_verify_cost_interpolates_odd_and_even_sizes_on_their_own_lines():
    calibrated = {size: paired_rows_cost(size) for size in (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17)}
    cost = VerifyCost(calibrated)
    for size in (7, 10, 11, 13, 14, 15):
        assert cost.cost(size) == pytest.approx(paired_rows_cost(size))
    assert cost.cost(7) > cost.cost(8)


def test_verify_cost_extends_each_parity_past_the_largest_calibrated_size():
    calibrated = {size: paired_rows_cost(size) for size in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33)}
    cost = VerifyCost(calibrated)
    for size in (48, 49, 64, 97):
        assert cost.cost(size) == pytest.approx(paired_rows_cost(size))


def test_policy_prefers_a_longer_draft_when_its_batch_is_cheaper():
    calibrated = {size: paired_rows_cost(size) for size in range(1, 18)}
    policy = AdaptiveDraftLength(max_k=16, verify_cost=VerifyCost(calibrated))
    chosen = drive(policy, acceptance=0.9, steps=200)
    # k drafted tokens verify as k + 1 rows: an even batch, never an odd one above 1.
    assert all(k == 0 or (k + 1) % 2 == 0 for k in chosen[20:])
    assert max(chosen[20:]) > 1


def test_calibration_is_measured_once_and_cached(tmp_path):
    model = FakeModel(n_ctx=64)
    calls = []

    def measure():
        calls.append(1)
        return calibrate(lambda t: model.decode(t, all_logits=True), model.rewind, 1, sizes=(1, 2, 4))

    cache = tmp_path / "calibration.json"
    first = cached_calibration(cache, "model-a", measure)
    second = cached_calibration(cache, "model-a", measure)
    assert calls == [1] and first == second and set(first) == {1, 2, 4}
    assert model.n_past == 0, "calibration leaves the cache empty"
    assert "model-a" in json.loads(cache.read_text())
    cached_calibration(cache, "model-b", measure)
    assert len(calls) == 2


def test_calibration_measures_again_a_size_that_noise_made_dearer_than_a_longer_one(monkeypatch):
    """Sizes are timed in turn, twice; a size still dearer than a longer one of its parity is
    timed again, so one burst of noise does not price it out of the policy's choices."""
    clock = {"now": 0.0}
    timings = {12: [0.245, 0.240, paired_rows_cost(12)]}  # two noisy samples, then the true cost
    calls = []

    def decode(tokens):
        size = len(tokens)
        calls.append(size)
        clock["now"] += timings[size].pop(0) if timings.get(size) else paired_rows_cost(size)

    monkeypatch.setattr("specli.adaptive.time.perf_counter", lambda: clock["now"])
    costs = calibrate(decode, lambda n: None, 1, sizes=(1, 2, 8, 12, 16))
    assert calls[:10] == [1, 2, 8, 12, 16] * 2  # in turn, not size by size
    assert calls[10:] == [12]
    assert costs[12] == pytest.approx(paired_rows_cost(12))
    assert costs[8] == pytest.approx(paired_rows_cost(8))


def test_auto_policy_keeps_greedy_output_identical():
    target = FakeModel(seed=0)
    draft = FakeModel(seed=0, noise_seed=1, noise=1.0)
    proposer = DraftModelProposer(draft, SamplingSettings(), np.random.default_rng(0))
    engine = Engine(target, proposer, AdaptiveDraftLength(verify_cost=flat_cost()), GenerationOptions(80))
    out = [e.id for e in engine.generate([1, 2, 3]) if isinstance(e, Token)]
    assert out == plain_greedy(FakeModel(seed=0), [1, 2, 3], 80)
    engine = Engine(FakeModel(seed=3, order=1), NGramProposer(), AdaptiveDraftLength(verify_cost=flat_cost()),
                    GenerationOptions(80))
    out = [e.id for e in engine.generate([1, 2, 3, 1, 2]) if isinstance(e, Token)]
    assert out == plain_greedy(FakeModel(seed=3, order=1), [1, 2, 3, 1, 2], 80)


def test_no_probes_when_even_perfect_drafts_cannot_pay():
    """A draft as slow as the target (self-drafting on a CPU): after one lesson, plain steps."""
    policy = AdaptiveDraftLength(verify_cost=cpu_cost())
    chosen = []
    for _ in range(200):
        k = policy.next(None, 16)
        chosen.append(k)
        # Every token is accepted, but drafting costs 12 ms a token against a 10 ms plain step.
        policy.record(k, k, 0.012 * k, cpu_cost().cost(k + 1), None)
    assert sum(1 for k in chosen[10:] if k) == 0
