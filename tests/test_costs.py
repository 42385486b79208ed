"""Costs a user can trust: a calibration that is stored only where the machine was quiet
enough to measure, a stored curve that is replaced when it is implausible or a run finds it
stale, and the verify times a run measures set beside the prices it paid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from specli.decode.costs import (
    BUSY_SPREAD,
    STALE_STEPS,
    Calibration,
    CostStore,
    calibrate,
    curve_problem,
    judge,
)
from specli.decode.events import Stats, StepRecord
from specli.errors import CalibrationError
from specli.llama.backend import LoadSettings
from specli.session import SessionSpec, open_session

# A CPU curve as measured here (Gemma 3 270M, 2026-11-26): 3 rows cost more than 4.
MEASURED = {1: 0.0135, 2: 0.0253, 3: 0.0433, 4: 0.0333, 5: 0.0517, 8: 0.0451, 9: 0.0648, 16: 0.0813, 17: 0.1036}


# --- the shape a curve can have ---------------------------------------------------------


def test_a_measured_curve_is_plausible_though_not_monotonic():
    assert curve_problem(MEASURED) is None


@pytest.mark.parametrize("size, factor, why", [
    (2, 0.3, "a batch of 2 priced at 0.30x one token"),  # busy first runs stored 0.17-0.58x
    (9, 0.26, "a batch of 9 priced at 0.26x one token"),
    (3, 8.7, "a batch of 3 priced at 8.7x one token"),  # one sample caught by load
])
def test_curves_a_batch_cannot_have_are_named(size, factor, why):
    curve = {**MEASURED, size: MEASURED[1] * factor}
    assert curve_problem(curve) == why


def test_a_longer_batch_far_cheaper_than_a_shorter_one_is_implausible():
    assert curve_problem({**MEASURED, 16: MEASURED[9] * 0.5}) == "a batch of 16 priced at 0.50x a batch of 9"


# --- calibrating ------------------------------------------------------------------------


class Clock:
    """A fake perf_counter that each decode advances by what `cost` says for its size."""

    def __init__(self, cost) -> None:
        self.now, self.cost, self.calls = 0.0, cost, []

    def decode(self, tokens: list[int]) -> None:
        self.calls.append(len(tokens))
        self.now += self.cost(len(tokens), len(self.calls))


def fake_calibration(monkeypatch, cost, sizes=(1, 2, 4, 8)) -> tuple[Calibration, list[int]]:
    clock = Clock(cost)
    monkeypatch.setattr("specli.decode.costs.time.perf_counter", lambda: clock.now)
    return calibrate(clock.decode, lambda n: None, 1, sizes=sizes), clock.calls


def quiet(size: int, call: int) -> float:
    return MEASURED.get(size, 0.005 * size + 0.01)


def test_the_largest_size_warms_up_then_all_are_timed_in_passes_of_alternating_order(monkeypatch):
    outcome, calls = fake_calibration(monkeypatch, quiet)
    assert calls[0] == 8, "the largest once, untimed: its first use grows llama.cpp's buffers for all"
    # Passes forward, backward, forward; a plain step (a token after a token, after a context)
    # after the largest.
    assert calls[1:] == [1, 2, 4, 8, 1, 1] + [8, 1, 1, 4, 2, 1] + [1, 2, 4, 8, 1, 1]
    assert outcome.problem is None and outcome.verify == pytest.approx({size: MEASURED[size] for size in (1, 2, 4, 8)})
    assert outcome.plain == pytest.approx(MEASURED[1]) and outcome.spread == pytest.approx(0.0, abs=1e-9)


def test_each_size_keeps_its_fastest_time_for_load_only_adds_time(monkeypatch):
    slow_first = {3: 3.0, 5: 1.2}  # the first pass's 2 and 8 took longer
    outcome, _ = fake_calibration(monkeypatch, lambda size, call: quiet(size, call) * slow_first.get(call, 1.0))
    assert outcome.verify[2] == pytest.approx(MEASURED[2]) and outcome.verify[8] == pytest.approx(MEASURED[8])


def test_a_busy_machine_gets_two_passes_more_and_then_says_what_was_wrong(monkeypatch):
    def busy(size: int, call: int) -> float:  # each decode slowed down by 0-300%, irregularly
        return quiet(size, call) * (1.0 + 3.0 * ((call * 7919) % 13) / 12)

    outcome, calls = fake_calibration(monkeypatch, busy)
    assert len(calls) == 1 + 5 * 6, "the warm-up, three passes, two passes more"
    assert outcome.problem is not None


def test_passes_that_agree_but_price_one_token_far_from_a_plain_step_are_not_trusted():
    samples = {size: [seconds, seconds] for size, seconds in MEASURED.items()}
    assert judge(samples, [MEASURED[1] / 2.0]).problem == "one token timed at 2.00x a plain step"
    assert judge(samples, [MEASURED[1] * 1.1]).problem is None
    # One token below a plain step (an empty cache against a context) prices plain decoding low,
    # which errs against drafting: allowed down to half.
    assert judge(samples, [MEASURED[1] * 1.6]).problem is None
    assert judge(samples, [MEASURED[1] * 2.5]).problem == "one token timed at 0.40x a plain step"


def test_one_token_costs_the_fastest_of_its_own_times_and_the_plain_steps():
    """Both are one-token decodes, and a plain step is what every draft is weighed against."""
    samples = {size: [seconds, seconds * 1.1] for size, seconds in MEASURED.items()}
    assert judge(samples, [MEASURED[1] * 0.9]).verify[1] == pytest.approx(MEASURED[1] * 0.9)
    assert judge(samples, [MEASURED[1] * 1.1]).verify[1] == pytest.approx(MEASURED[1])


def test_spread_is_how_far_a_sizes_second_fastest_time_lies_over_its_fastest():
    samples = {size: [seconds, seconds * (1 + 2 * BUSY_SPREAD)] for size, seconds in MEASURED.items()}
    outcome = judge(samples, [MEASURED[1]])
    assert outcome.spread == pytest.approx(2 * BUSY_SPREAD)
    assert outcome.problem.startswith("a batch's times varied by")


# --- a run's verify times beside their price ----------------------------------------------


def test_stats_set_a_runs_verify_times_beside_the_prices_it_paid():
    stats = Stats()
    for measured, priced in ((0.02, 0.01), (0.03, 0.01), (0.01, 0.01), (0.05, 0.0)):  # the last: not priced
        stats.record(StepRecord(0, 0, 0.0, measured, 0.0, 0.0, priced_seconds=priced))
    assert stats.priced_steps == 3 and stats.costs_ratio == pytest.approx(2.0)
    data = stats.to_dict()
    assert data["costs_ratio"] == pytest.approx(2.0) and "verify_over_price" not in data
    assert Stats().costs_ratio is None and Stats.combine([stats, stats]).priced_steps == 6


# --- on the real model ------------------------------------------------------------------


def stored_entries(cache) -> dict:
    data = json.loads((cache / "costs.json").read_text())
    return {key: value for key, value in data.items() if isinstance(value, dict)}


@pytest.mark.slow
def test_a_stored_implausible_curve_is_replaced_on_the_next_run(gemma_path, tmp_path, monkeypatch, quiet_calibration):
    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path))
    spec = SessionSpec(gemma_path, None, LoadSettings(ctx_size=512))
    with open_session(spec) as session:
        first = session.pricing.costs()
        key = session.pricing.key
    assert first.source == "first run" and curve_problem(first.verify) is None
    # What a first run on a busy machine stored (a batch of 2 "cheaper" than one token).
    store = CostStore(tmp_path / "costs.json")
    store.put_costs(key, replace(first, verify={**first.verify, 2: first.verify[1] * 0.2}, measured_at=1.0))
    notices: list[str] = []
    with open_session(spec, notices.append) as session:
        again = session.pricing.costs()
    assert again.source == "first run" and curve_problem(again.verify) is None and again.measured_at > 1.0
    assert CostStore(tmp_path / "costs.json").costs(key) == again, "replaced in the store"
    assert len(notices) == 1 and "no longer hold (a batch of 2 priced at 0.20x one token)" in notices[0]


@pytest.mark.slow
def test_a_run_far_from_its_stored_curve_marks_it_stale_and_the_next_run_measures_again(gemma_path, tmp_path,
                                                                                       monkeypatch, quiet_calibration):
    from specli.decode.request import GenerationRequest
    from specli.prompt import prompt_tokens
    from specli.stream import stream

    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path))
    spec = SessionSpec(gemma_path, None, LoadSettings(ctx_size=512))
    with open_session(spec) as session:
        key = session.pricing.key
        measured = session.pricing.costs()
    # A curve of the right shape, priced a third of what this machine takes now.
    CostStore(tmp_path / "costs.json").put_costs(key, replace(measured, verify={size: seconds / 3 for size, seconds
                                                                                  in measured.verify.items()}))
    notices: list[str] = []
    with open_session(spec, notices.append) as session:
        engine = session.engine_for(GenerationRequest(max_tokens=3 * STALE_STEPS))
        outcome = stream(engine, prompt_tokens(session.target, "The history of the printing press", chat=False),
                         _Quiet())
        assert outcome.stats.priced_steps >= STALE_STEPS and outcome.stats.costs_ratio > 1.5
        assert session.pricing.review(outcome.stats)
    assert CostStore(tmp_path / "costs.json").costs(key).stale == pytest.approx(outcome.stats.costs_ratio)
    assert "measured again on the next run" in notices[-1]
    with open_session(spec, notices.append) as session:
        again = session.pricing.costs()
    assert again.stale is None and again.verify[1] == pytest.approx(measured.verify[1], rel=0.5)
    assert "no longer hold" in notices[-1]


class _Quiet:
    def start(self) -> None: ...
    def token(self, event) -> None: ...
    def step(self, record) -> None: ...
    def finish(self, stats) -> None: ...


@pytest.mark.slow
def test_a_calibration_under_load_is_near_a_quiet_one_or_not_stored(gemma_path, tmp_path, monkeypatch):
    """Busy processes on every core (stopped by the test) while the careful calibration runs:
    it either stores a curve within 30% of a quiet one at every size, or stores nothing."""
    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path))
    spec = SessionSpec(gemma_path, None, LoadSettings(ctx_size=512))
    with open_session(spec) as session:
        quiet_curve = session.pricing.calibrate().verify
        key = session.pricing.key
        (tmp_path / "costs.json").unlink()
        busy = [subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 60\nwhile time.time() < end: pass"])
                for _ in range(os.cpu_count() or 2)]
        try:
            time.sleep(0.5)
            try:
                loaded = session.pricing.calibrate().verify
            except CalibrationError as error:
                loaded = None
                assert "too busy" in error.message
        finally:
            for process in busy:
                process.kill()
                process.wait()
    stored = CostStore(tmp_path / "costs.json").costs(key)
    if loaded is None:
        assert stored is None, "nothing stored"
    else:
        assert stored is not None and stored.verify == loaded
        assert all(0.7 <= loaded[size] / quiet_curve[size] <= 1.3 for size in quiet_curve), (loaded, quiet_curve)


def test_the_curve_is_judged_as_it_will_be_stored():
    # One token's samples (12 ms, within range of the plain steps' 10 ms) priced down to 10 ms: a
    # batch of 2 at 36 ms is then 3.6x one token, which the stored curve must not be (a later run
    # would find it implausible and measure again).
    samples = {1: [0.012, 0.012], 2: [0.036, 0.036]}
    assert curve_problem({1: 0.012, 2: 0.036}) is None
    outcome = judge(samples, plain=[0.010, 0.010])
    assert outcome.verify[1] == 0.010
    assert outcome.problem is not None and outcome.problem == curve_problem(outcome.verify)
