"""A busy machine costs seconds, not minutes, run after run: checks that need no measurement
come first, a fixed draft length measures nothing, and a first run that finds the machine
too busy to measure marks it so, after which later runs draft cautiously without measuring
until the mark's window ends (longer with each busy finding in a row, capped)."""

from __future__ import annotations

import json
import re
import time

import pytest
from typer.testing import CliRunner

from specli import pricing
from specli.commands.cli import app
from specli.decode.costs import BUSY_BACKOFF, BUSY_BACKOFF_MOST, BusyMark, Calibration, CostStore
from specli.llama.backend import LoadSettings
from specli.pricing import Pricing
from specli.session import SessionSpec, open_session

BUSY = "a batch's times varied by 50% from pass to pass"


class FakeTiming:
    """Stands in for pricing's `calibrate`: counts its calls and answers as a quiet machine
    would, or (`problem`) as one too busy to measure."""

    def __init__(self, problem: str | None = None) -> None:
        self.problem = problem
        self.calls = 0

    def __call__(self, decode, rewind, token, sizes, passes=3, threads=None, steady=False) -> Calibration:
        self.calls += 1
        return Calibration({size: 0.01 * (1 + 0.5 * (size - 1)) for size in sizes}, 0.01, 0.0, self.problem)


class NoTiming:
    """Stands in for every timing: a run that should measure nothing fails the test if it does."""

    def __call__(self, *args, **kwargs):
        raise AssertionError("measured")


# --- the mark ------------------------------------------------------------------------


def test_the_window_starts_at_the_back_off_doubles_with_each_finding_in_a_row_and_is_capped():
    windows = [BusyMark(1000.0, count).until - 1000.0 for count in range(1, 8)]
    assert windows[:4] == [BUSY_BACKOFF, 2 * BUSY_BACKOFF, 4 * BUSY_BACKOFF, 8 * BUSY_BACKOFF]
    assert max(windows) == BUSY_BACKOFF_MOST and windows == sorted(windows)
    assert BusyMark(1000.0, 10_000).until == 1000.0 + BUSY_BACKOFF_MOST
    assert 240 <= BUSY_BACKOFF <= 600 and 1800 <= BUSY_BACKOFF_MOST <= 7200, "minutes at first, about an hour at most"


def test_a_mark_is_stored_read_back_and_removed(tmp_path):
    store = CostStore(tmp_path / "costs.json")
    store.put_busy_mark("model|busy", BusyMark(1700000000.5, 3))
    assert CostStore(tmp_path / "costs.json").busy_mark("model|busy") == BusyMark(1700000000.5, 3)
    store.put("broken|busy", {"count": 2})
    assert store.busy_mark("broken|busy") is None and store.busy_mark("missing|busy") is None
    assert store.costs("model|busy") is None, "a mark is no curve"
    store.remove("model|busy")
    assert CostStore(tmp_path / "costs.json").busy_mark("model|busy") is None


# --- pricing, on the real model --------------------------------------------------------


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty specli cache for this test; `stored(cache)` reads what is in it now."""
    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path))
    return tmp_path


def stored(cache) -> CostStore:
    return CostStore(cache / "costs.json")


@pytest.fixture(scope="module")
def gemma_pair(gemma_path):
    """Gemma loaded once; each test prices it with fresh Pricing objects, as fresh runs do."""
    with open_session(SessionSpec(gemma_path, None, LoadSettings(ctx_size=256))) as session:
        yield session


def a_run(session, notices: list[str]) -> Pricing:
    """What a new `specli run` prices its generations with: nothing read yet."""
    return Pricing(session.spec, session.target, notice=notices.append)


@pytest.mark.slow
def test_a_busy_first_run_marks_it_and_later_runs_in_the_window_measure_nothing(gemma_pair, cache, monkeypatch):
    timing = FakeTiming(BUSY)
    monkeypatch.setattr(pricing, "calibrate", timing)
    notices: list[str] = []
    first = a_run(gemma_pair, notices)
    assert first.costs().source == "conservative" and timing.calls == 1
    mark = stored(cache).busy_mark(first.busy_key)
    assert mark is not None and mark.count == 1 and abs(mark.found_at - time.time()) < 60
    assert f"too busy to measure {gemma_pair.target.path.name}'s verify costs ({BUSY})" in notices[-1]
    assert f"without measuring until {time.strftime('%H:%M', time.localtime(mark.until))}" in notices[-1]
    assert stored(cache).costs(first.key) is None, "no curve stored"

    for _ in range(2):
        later = a_run(gemma_pair, notices)
        assert later.costs() == first.costs(), "the same conservative curve, at once"
    assert timing.calls == 1, "not measured again within the window"
    assert re.fullmatch(r"the machine was too busy to measure .*'s verify costs \d+ s ago: drafting cautiously "
                        r"without measuring until \d\d:\d\d \(`specli doctor --calibrate` measures now\)", notices[-1])
    assert len(notices) == 3, "one line a run"


@pytest.mark.slow
def test_after_the_window_a_run_measures_again_and_a_busy_finding_doubles_it(gemma_pair, cache, monkeypatch):
    timing = FakeTiming(BUSY)
    monkeypatch.setattr(pricing, "calibrate", timing)
    key = a_run(gemma_pair, []).busy_key
    stored(cache).put_busy_mark(key, BusyMark(time.time() - BUSY_BACKOFF - 1, 1))  # the window has ended
    assert a_run(gemma_pair, []).costs().source == "conservative" and timing.calls == 1, "measured again"
    mark = stored(cache).busy_mark(key)
    assert mark.count == 2 and mark.until - mark.found_at == 2 * BUSY_BACKOFF
    stored(cache).put_busy_mark(key, BusyMark(time.time() - BUSY_BACKOFF_MOST - 1, 9))
    a_run(gemma_pair, []).costs()
    mark = stored(cache).busy_mark(key)
    assert (mark.count, mark.until - mark.found_at) == (10, BUSY_BACKOFF_MOST), "capped"


@pytest.mark.slow
def test_a_quiet_measurement_after_the_window_is_stored_and_clears_the_mark(gemma_pair, cache, monkeypatch):
    timing = FakeTiming()
    monkeypatch.setattr(pricing, "calibrate", timing)
    key = a_run(gemma_pair, []).busy_key
    stored(cache).put_busy_mark(key, BusyMark(time.time() - 2 * BUSY_BACKOFF - 1, 2))
    run = a_run(gemma_pair, [])
    assert run.costs().source == "first run" and timing.calls == 1
    store = stored(cache)
    assert store.busy_mark(key) is None and store.costs(run.key) == run.costs()


@pytest.mark.slow
def test_explicit_calibrations_ignore_the_mark_and_clear_it(gemma_pair, cache, monkeypatch):
    """`specli bench` and `doctor --calibrate` call Pricing.calibrate: it measures now."""
    timing = FakeTiming()
    monkeypatch.setattr(pricing, "calibrate", timing)
    key = a_run(gemma_pair, []).busy_key
    stored(cache).put_busy_mark(key, BusyMark(time.time(), 3))
    assert a_run(gemma_pair, []).calibrate().source == "calibrated" and timing.calls == 1
    assert stored(cache).busy_mark(key) is None
    assert a_run(gemma_pair, []).costs().source == "calibrated" and timing.calls == 1, "read, not measured"


@pytest.mark.slow
def test_a_stale_curve_in_the_window_says_one_line_and_is_not_measured(gemma_pair, cache, monkeypatch):
    """A stored curve marked stale whose measurement found the machine busy: the next run says
    it is drafting cautiously, not that it measures again."""
    from specli.decode.costs import StepCosts

    timing = FakeTiming(BUSY)
    monkeypatch.setattr(pricing, "calibrate", timing)
    run = a_run(gemma_pair, [])
    stored(cache).put_costs(run.key, StepCosts({1: 0.01, 2: 0.015}, source="first run", measured_at=1.0, stale=2.0))
    stored(cache).put_busy_mark(run.busy_key, BusyMark(time.time(), 1))
    notices: list[str] = []
    assert a_run(gemma_pair, notices).costs().source == "conservative" and timing.calls == 0
    assert len(notices) == 1 and "drafting cautiously without measuring" in notices[0]
    assert stored(cache).costs(run.key).stale == 2.0, "left as it was"


# --- the command ------------------------------------------------------------------------


def specli_run(gemma_path, *args: str):
    return CliRunner().invoke(app, ["run", "--target", str(gemma_path), "--no-chat", "-n", "6", "-c", "256", *args,
                                    "def fibonacci(n):"])


@pytest.mark.slow
def test_a_fixed_draft_length_or_no_draft_measures_nothing(gemma_path, cache, monkeypatch):
    """Nothing stored, so `-k auto` would measure: `-k 3` (with n-grams or a draft model) and
    `--draft none` draft on what is there and time nothing."""
    from specli.decode import costs

    monkeypatch.setattr(pricing, "calibrate", NoTiming())
    monkeypatch.setattr(costs._Timings, "one_pass", NoTiming())
    for args in (["-k", "3"], ["--draft", "none"], ["-k", "3", "--draft", str(gemma_path)]):
        result = specli_run(gemma_path, *args)
        assert result.exit_code == 0, (args, result.output)
        assert "too busy" not in result.stderr
    assert not stored(cache).keys(), "nothing measured, nothing stored"
    timing = FakeTiming()
    monkeypatch.setattr(pricing, "calibrate", timing)
    assert specli_run(gemma_path).exit_code == 0 and timing.calls == 1, "-k auto does measure: the fakes are in place"


@pytest.mark.slow
def test_a_prompt_longer_than_the_context_is_refused_before_anything_is_measured(gemma_path, cache, monkeypatch):
    monkeypatch.setattr(pricing, "calibrate", NoTiming())
    result = CliRunner().invoke(app, ["run", "--target", str(gemma_path), "--no-chat", "-k", "auto", "-c", "32",
                                      "word " * 100])
    assert result.exit_code == 1 and "tokens but the context holds 32" in result.stderr, result.output


@pytest.mark.slow
def test_a_run_in_the_window_says_so_once_and_drafts_without_measuring(gemma_path, cache, monkeypatch):
    timing = FakeTiming(BUSY)
    monkeypatch.setattr(pricing, "calibrate", timing)
    first = specli_run(gemma_path)
    assert first.exit_code == 0 and timing.calls == 1 and "too busy to measure" in first.stderr, first.output
    second = specli_run(gemma_path, "--json")
    assert second.exit_code == 0 and timing.calls == 1, second.output
    assert json.loads(second.stdout.splitlines()[-1])["costs"] == "conservative"
    third = specli_run(gemma_path)
    assert third.exit_code == 0 and timing.calls == 1, third.output
    lines = [line for line in third.stderr.splitlines() if "too busy" in line]
    assert len(lines) == 1 and "drafting cautiously without measuring until" in lines[0]
