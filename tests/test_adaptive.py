"""-k auto: the policy drafts long when drafts are accepted and verifying is cheap, backs off
to plain steps when they are not, probes again later; it chooses from stored costs and
the run's tokens only, never from times measured during the run."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakeModel, plain_greedy

from specli.decode.adaptive import AdaptiveDraftPolicy
from specli.decode.costs import CostStore, StepCosts, VerifyCurve, calibrate, prior_costs
from specli.decode.draft_model import DraftModel, DraftModelProposer
from specli.decode.engine import Engine
from specli.decode.events import StepRecord, Token
from specli.decode.ngram import NGramProposer
from specli.decode.request import GenerationRequest
from specli.decode.sampling import SamplingSettings


def costs(curve, draft_per_token: float = 0.0) -> StepCosts:
    return StepCosts({size: curve(size) for size in range(1, 18)}, draft_per_token, 0.0, "calibrated")


def flat_cost() -> StepCosts:
    """A GPU-like curve: a batch of 17 costs barely more than one token."""
    return costs(lambda size: 0.010 + 0.0001 * size)


def steep_cost() -> StepCosts:
    """Every extra token costs as much as the first: speculation can never pay."""
    return costs(lambda size: 0.010 * size)


def cpu_cost(draft_per_token: float = 0.0) -> StepCosts:
    """A CPU-like curve: each extra token in the batch costs 30% of the first."""
    return costs(lambda size: 0.010 * (1 + 0.3 * (size - 1)), draft_per_token)


def step(drafted: int, accepted: int, key: object = None, seconds: float = 0.0) -> StepRecord:
    return StepRecord(drafted, accepted, seconds, seconds, 0.0, 0.0, key)


def drive(policy: AdaptiveDraftPolicy, acceptance: float, steps: int, key=None, seed=0) -> list[int]:
    """Simulate steps where each drafted position is kept with probability `acceptance`."""
    rng = np.random.default_rng(seed)
    chosen = []
    for _ in range(steps):
        k = policy.choose(key, 0, 16)
        chosen.append(k)
        accepted = 0
        while accepted < k and rng.random() < acceptance:
            accepted += 1
        policy.record(step(k, accepted, key))
    return chosen


def test_accepted_drafts_and_cheap_verification_lead_to_long_drafts():
    chosen = drive(AdaptiveDraftPolicy(flat_cost()), acceptance=0.95, steps=40)
    assert min(chosen[10:]) >= 12


def test_a_run_whose_long_drafts_fail_is_held_to_drafts_it_can_afford_to_lose():
    """Drafts whose prior promised almost nothing but acceptance, rejected at once: each is
    no longer than the budget allows (RISK_ALLOWANCE plain steps plus RISK_SHARE of the run,
    less what drafting has lost), so the run's loss to drafting stays within it."""
    from specli.decode.adaptive import RISK_ALLOWANCE, RISK_SHARE

    policy = AdaptiveDraftPolicy(cpu_cost(), prior=lambda key, context: 0.995, max_draft=16)
    plain, spent, lost, drafted = 0.010, 0.0, 0.0, []
    for _ in range(200):
        k = policy.choose(12, 40, 16)
        miss = 0.010 * 0.3 * k  # the verify of k + 1 rows, less the plain step it replaces
        assert lost + miss <= RISK_ALLOWANCE * plain + RISK_SHARE * spent + 1e-12, k
        policy.record(step(k, 0, key=12))
        spent, lost = spent + plain + miss, lost + miss
        drafted.append(k)
    assert max(drafted) < 16 and sum(drafted) > 0
    assert lost <= RISK_ALLOWANCE * plain + RISK_SHARE * spent


def test_a_copy_that_keeps_being_accepted_earns_longer_drafts_on_a_cpu():
    policy = AdaptiveDraftPolicy(cpu_cost(), prior=lambda key, context: 0.995, max_draft=16)
    chosen = []
    for _ in range(30):
        k = policy.choose(12, 40, 16)
        chosen.append(k)
        policy.record(step(k, k, key=12))
    assert 0 < chosen[0] < 16, "the first chunk of a copy is what a miss can cost"
    assert chosen[-1] == 16 and chosen == sorted(chosen), "each accepted chunk pays for a longer one"


def test_the_budget_binds_lookups_drafts_not_a_draft_models():
    """After n-gram drafts that all failed, the run's budget caps lookup's next draft below
    what its rate would choose; a draft model's length is its rate's alone (its acceptance is
    learnt from every step it drafts)."""
    lookup = AdaptiveDraftPolicy(cpu_cost(), prior=lambda key, context: 0.995, max_draft=16)
    for _ in range(3):
        lookup.record(step(8, 0, key=12))  # three 8-token copies rejected at once
    assert lookup.choose(12, 40, 16) < lookup._best(12, 40, 16)[0]
    model = AdaptiveDraftPolicy(cpu_cost(draft_per_token=0.001), max_draft=16)
    for _ in range(4):
        model.record(step(4, 4, key=None))  # kept
    for _ in range(4):
        model.record(step(8, 0, key=None))  # then rejected: the run has lost more than the budget
    assert model._affordable(None, 16) == 0 < model._best(None, 0, 16)[0] == model.choose(None, 0, 16)


def test_one_early_miss_does_not_stop_a_draft_model_whose_agreement_was_measured():
    """A first draft rejected outright: with the agreement measured (0.93, worth MODEL_WEIGHT
    rejections of evidence), the next step still drafts."""
    from dataclasses import replace

    measured = AdaptiveDraftPolicy(replace(cpu_cost(draft_per_token=0.001), draft_acceptance=0.93), max_draft=16)
    k = measured.choose(None, 0, 16)
    assert k > 1
    measured.record(step(k, 0, key=None))
    assert measured.choose(None, 0, 16) > 0


def test_a_drafter_whose_agreement_falls_with_depth_drafts_shorter():
    """The NextN layers fed their own states: agreement measured by depth prices each depth
    with its own, so the first choice is shorter than with the first depth's at every depth,
    and the expected speed-up's length follows."""
    from dataclasses import replace

    from specli.decode.costs import expected_speedup

    flat = replace(flat_cost(), draft_per_token=0.001, draft_acceptance=0.9)
    falling = replace(flat, draft_depths=(0.9, 0.6, 0.4, 0.3))
    assert falling.acceptance_at(0) == 0.9 and falling.acceptance_at(9) == 0.3
    long, short = (AdaptiveDraftPolicy(c, max_draft=16).choose(None, 0, 16) for c in (flat, falling))
    assert 0 < short < long
    assert expected_speedup(falling)[1] < expected_speedup(flat)[1]
    assert falling.to_json()["draft_depths"] == [0.9, 0.6, 0.4, 0.3] and "draft_depths" not in flat.to_json()


def test_a_draft_model_that_brings_nothing_when_asked_is_asked_less():
    """Through text, a draft model's decodes may bring no target token (its text ends inside
    a character): a miss at the first token, and decodes paid for nothing."""
    policy = AdaptiveDraftPolicy(cpu_cost(draft_per_token=0.001), max_draft=16)
    asked = []
    for _ in range(60):
        k = policy.choose(None, 0, 16)
        asked.append(k)
        policy.record(StepRecord(0, 0, 0.0, 0.0, 0.0, 0.0, None, asked=k))
    assert asked[0] > 0
    assert asked[20:].count(0) >= 0.9 * 40, asked


def test_a_continuation_that_several_occurrences_agree_on_is_trusted_after_this_keys_misses():
    """A list that repeats a line: this key's first drafts, on lines seen once, failed, and
    the same key proposing a line that four earlier lines all continued with is drafted (the
    one occurrence that was seen once still is not)."""
    policy = AdaptiveDraftPolicy(cpu_cost(), prior=NGramProposer.prior, max_draft=16)
    for _ in range(3):
        policy.record(step(3, 0, key=6))
    for _ in range(70):
        policy.record(step(0, 0))  # plain steps: the run's risk budget grows again
    assert policy.choose(6, 0, 7) == 0
    assert policy.choose(6, 0, 7, support=(1.0,) * 7, agreeing=(4,) * 7) == 5


def test_on_a_gpu_curve_a_miss_costs_too_little_to_bind():
    policy = AdaptiveDraftPolicy(flat_cost(), prior=lambda key, context: 0.995, max_draft=16)
    assert policy.choose(12, 40, 16) == 16


def test_rejected_drafts_lead_to_plain_steps_with_rare_probes():
    chosen = drive(AdaptiveDraftPolicy(cpu_cost()), acceptance=0.0, steps=200)
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
        policy = AdaptiveDraftPolicy(cpu_cost(), prior=trusted_copies)
        if savings:
            for _ in range(20):  # 17 tokens a step for the price of ~6 plain steps
                policy.record(step(16, 16, "copy"))
        chosen = drive(policy, acceptance=0.0, steps=400, key="short")
        return [index for index, k in enumerate(chosen) if k]

    losing, saving = drafting_steps(savings=False), drafting_steps(savings=True)
    # Both first draft on the prior, then learn that the key fails: from then on every
    # draft is a probe.
    probes = range(10, 40)
    assert sum(index in probes for index in losing) < sum(index in probes for index in saving)
    assert sum(index >= 40 for index in losing) >= 2, "probes resume as the run goes on"


def test_a_first_probe_waits_until_the_run_can_afford_to_lose_it():
    """A short answer that never copies costs nothing: a probe is made only once a rejected
    one would leave drafting's loss within PROBE_BUDGET of the run's time, so the dearer a
    miss, the later the first probe."""
    from specli.decode.adaptive import FIRST_PROBE_GAP, PROBE_BUDGET

    def first_probe(extra: float) -> int:
        curve = costs(lambda size: 0.010 * (1 + extra * (size - 1)))
        policy = AdaptiveDraftPolicy(curve, prior=lambda key, context: 0.3)  # drafting never pays on its merits
        chosen = drive(policy, acceptance=0.0, steps=300, key="short")
        first = chosen.index(1)
        miss = curve.verify[2] - curve.verify[1]
        assert miss <= PROBE_BUDGET * (first * curve.verify[1] + curve.verify[2]), "affordable when made"
        return first

    cheap, dear = first_probe(0.3), first_probe(0.9)
    assert FIRST_PROBE_GAP < cheap < dear


def test_a_draft_that_barely_pays_is_not_made():
    """Drafting must beat a plain step by MARGIN: a near-even bet gains little and a miss
    costs a whole verify."""
    from specli.decode.adaptive import MARGIN

    costs = cpu_cost()  # verify(2) = 1.3 plain steps
    even = 1.3 - 1.0  # an acceptance at which one drafted token pays exactly its cost
    assert AdaptiveDraftPolicy(costs, prior=lambda key, context: even + 0.5 * MARGIN).choose("key", 0, 1) == 0
    assert AdaptiveDraftPolicy(costs, prior=lambda key, context: even + 3 * MARGIN).choose("key", 0, 1) == 1


def test_steep_verify_cost_means_no_speculation_even_when_accepted():
    assert AdaptiveDraftPolicy(steep_cost()).choose(None, 0, 16) == 0
    assert drive(AdaptiveDraftPolicy(steep_cost()), 0.5, 30)[-1] == 0


def test_each_key_learns_its_own_acceptance():
    policy = AdaptiveDraftPolicy(flat_cost())
    drive(policy, acceptance=0.95, steps=40, key="long match")
    drive(policy, acceptance=0.05, steps=40, key="short match", seed=1)
    assert policy.choose("long match", 0, 16) >= 12
    # On this flat curve a token more costs 1% of a step, so even 5% acceptance pays for
    # a token or two, never for a long draft.
    assert policy.choose("short match", 0, 16) <= 2


def test_a_workload_that_turns_copy_heavy_is_noticed():
    policy = AdaptiveDraftPolicy(flat_cost())
    drive(policy, acceptance=0.0, steps=60)
    later = drive(policy, acceptance=0.98, steps=300, seed=2)
    assert max(later[-50:]) >= 12


def test_measured_times_do_not_move_the_choices():
    """Two runs whose steps kept the same tokens but took other times choose alike."""
    policies = [AdaptiveDraftPolicy(cpu_cost()) for _ in range(2)]
    rng = np.random.default_rng(4)
    for _ in range(100):
        ks = [policy.choose("key", 0, 16) for policy in policies]
        assert ks[0] == ks[1]
        accepted = int(rng.integers(0, ks[0] + 1))
        policies[0].record(step(ks[0], accepted, "key", seconds=0.001))
        policies[1].record(step(ks[1], accepted, "key", seconds=float(rng.uniform(0.01, 5.0))))


def paired_rows_cost(size: int) -> float:
    """Like llama.cpp's CPU kernels here: rows go in pairs, an odd row costs a lone pass."""
    return 0.010 + 0.004 * size + (0.012 if size % 2 and size > 1 else 0.0)


def test_verify_curve_interpolates_odd_and_even_sizes_on_their_own_lines():
    curve = VerifyCurve({size: paired_rows_cost(size) for size in (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17)})
    for size in (7, 10, 11, 13, 14, 15):
        assert curve.cost(size) == pytest.approx(paired_rows_cost(size))
    assert curve.cost(7) > curve.cost(8)


def test_verify_curve_extends_each_parity_past_the_largest_known_size():
    curve = VerifyCurve({size: paired_rows_cost(size) for size in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33)})
    for size in (48, 49, 64, 97):
        assert curve.cost(size) == pytest.approx(paired_rows_cost(size))


def test_noise_at_one_size_does_not_price_long_drafts_low():
    """A quick calibration up to 16 rows in which noise raised 8 rows by 40% (as a first run here
    stored): the line past 16 is the steeper one, not the flattened one through 8 and 16."""
    measured = {1: 0.0137, 2: 0.0253, 3: 0.0408, 4: 0.034, 8: 0.0451 * 1.4, 9: 0.066, 16: 0.0865}
    curve = VerifyCurve(measured)
    per_row = (measured[16] - measured[2]) / 14
    assert curve.cost(48) == pytest.approx(measured[16] + 32 * per_row)
    assert curve.cost(49) == pytest.approx(measured[9] + 40 * (measured[9] - measured[3]) / 6)


def test_policy_prefers_a_longer_draft_when_its_batch_is_cheaper():
    policy = AdaptiveDraftPolicy(costs(paired_rows_cost), max_draft=16)
    chosen = drive(policy, acceptance=0.9, steps=200)
    # k drafted tokens verify as k + 1 rows: an even batch, never an odd one above 1.
    assert all(k == 0 or (k + 1) % 2 == 0 for k in chosen[20:])
    assert max(chosen[20:]) > 1


def test_calibration_leaves_the_cache_empty_and_costs_are_stored(tmp_path):
    model = FakeModel(n_ctx=64)
    measured = calibrate(lambda t: model.decode(t, all_logits=True), model.rewind, 1, sizes=(1, 2, 4)).verify
    assert set(measured) == {1, 2, 4} and model.n_past == 0
    store = CostStore(tmp_path / "costs.json")
    store.put_costs("model-a", StepCosts(measured, 0.0, 0.001, "calibrated"))
    again = CostStore(tmp_path / "costs.json").costs("model-a")
    assert again is not None and again.verify == measured and again.source == "calibrated"
    assert CostStore(tmp_path / "costs.json").costs("model-b") is None


def test_a_damaged_store_reads_as_empty(tmp_path):
    (tmp_path / "costs.json").write_text("{not json")
    assert CostStore(tmp_path / "costs.json").costs("model-a") is None
    (tmp_path / "costs.json").write_text('{"model-a": {"verify": {"1": -1}}}')
    assert CostStore(tmp_path / "costs.json").costs("model-a") is None


def test_the_prior_prices_a_gpu_batch_as_nearly_flat_and_a_cpu_batch_as_dear():
    cpu, gpu = VerifyCurve(prior_costs(False).verify), VerifyCurve(prior_costs(True).verify)
    assert 1.5 < cpu.cost(2) < 2.0 and 3.0 < cpu.cost(8) < 5.0
    # The H200's measured curve: 1.34 at 2 rows, 1.40 at 8, 1.65 at 48.
    assert 1.25 < gpu.cost(2) < 1.45 and 1.3 < gpu.cost(8) < 1.6 and 1.5 < gpu.cost(48) < 1.8
    busy = VerifyCurve(prior_costs(True, conservative=True).verify)
    assert all(busy.cost(size) >= gpu.cost(size) for size in (2, 4, 8, 16, 32, 48))


def test_auto_policy_keeps_greedy_output_identical():
    target = FakeModel(seed=0)
    draft = FakeModel(seed=0, noise_seed=1, noise=1.0)
    proposer = DraftModelProposer(DraftModel(draft), SamplingSettings(), 0)
    engine = Engine(target, proposer, AdaptiveDraftPolicy(flat_cost()), GenerationRequest(80))
    out = [e.id for e in engine.generate([1, 2, 3]) if isinstance(e, Token)]
    assert out == plain_greedy(FakeModel(seed=0), [1, 2, 3], 80)
    engine = Engine(FakeModel(seed=3, order=1), NGramProposer(), AdaptiveDraftPolicy(flat_cost(), NGramProposer.prior),
                    GenerationRequest(80))
    out = [e.id for e in engine.generate([1, 2, 3, 1, 2]) if isinstance(e, Token)]
    assert out == plain_greedy(FakeModel(seed=3, order=1), [1, 2, 3, 1, 2], 80)


def test_no_probes_when_even_perfect_drafts_cannot_pay():
    """A draft as slow as the target (self-drafting on a CPU): plain steps only."""
    policy = AdaptiveDraftPolicy(cpu_cost(draft_per_token=0.012))
    chosen = []
    for _ in range(200):
        k = policy.choose(None, 0, 16)
        chosen.append(k)
        policy.record(step(k, k))  # every token would be accepted; drafting costs 12 ms a token
    assert sum(chosen) == 0


class Company:
    """The other requests in a shared decode, as a slot reports them (decode/slots.py)."""

    def __init__(self, rows: int, tokens: float) -> None:
        self.rows, self.tokens = rows, tokens
        self.expected: list[float] = []

    def others(self) -> tuple[int, float]:
        return self.rows, self.tokens

    def expect(self, tokens: float) -> None:
        self.expected.append(tokens)


@pytest.mark.parametrize("acceptance", [0.7, 0.8])
def test_beside_others_on_a_cpu_a_request_drafts_only_its_likeliest_tokens(acceptance):
    """A row's chance of being kept must beat one more row at the whole batch's rate. Beside
    three requests that each bring a token from their one row, a CPU's per-row cost leaves a
    request fewer drafted rows than alone (its likeliest only, or none); a GPU's flat curve
    leaves it most of its draft."""
    prior = lambda key, extent: acceptance  # noqa: E731
    plain_others = Company(rows=3, tokens=3.0)
    cpu_alone = AdaptiveDraftPolicy(cpu_cost(), prior=prior).choose("k", 0, 16)
    cpu_beside = AdaptiveDraftPolicy(cpu_cost(), prior=prior, batch=plain_others).choose("k", 0, 16)
    assert 0 <= cpu_beside < cpu_alone
    # It tells the others what it expects from its rows: 1 + a + a^2 + ... for k drafted.
    assert plain_others.expected[-1] == pytest.approx(sum(acceptance ** i for i in range(cpu_beside + 1)))
    gpu_alone = AdaptiveDraftPolicy(flat_cost(), prior=prior).choose("k", 0, 16)
    gpu_beside = AdaptiveDraftPolicy(flat_cost(), prior=prior, batch=Company(rows=3, tokens=3.0)).choose("k", 0, 16)
    assert gpu_beside >= gpu_alone / 2 > cpu_alone
    # Others whose rows bring little (drafts that fail) leave the rows to it: it drafts as alone.
    wasteful = AdaptiveDraftPolicy(cpu_cost(), prior=prior, batch=Company(rows=9, tokens=4.5)).choose("k", 0, 16)
    assert wasteful >= cpu_alone


def test_a_request_alone_in_a_shared_decode_chooses_as_a_lone_run_does():
    prior = lambda key, extent: 0.7  # noqa: E731
    for curve in (cpu_cost(), flat_cost()):
        alone = AdaptiveDraftPolicy(curve, prior=prior)
        shared = AdaptiveDraftPolicy(curve, prior=prior, batch=Company(rows=0, tokens=0.0))
        assert [alone.choose("k", e, 16) for e in range(8)] == [shared.choose("k", e, 16) for e in range(8)]
