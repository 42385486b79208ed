"""benchmarks/replay.py: the offline replay follows the engine's steps exactly."""

from __future__ import annotations

import dataclasses
import json

import pytest

from benchmarks.replay import (
    RTX_4090_LLAMA_8B_BF16_TOKENS_PER_SECOND,
    Case,
    Costs,
    against_native,
    beside_rows,
    clairvoyant,
    copy_bound,
    load_costs,
    longest_copies,
    paper_costs,
    python_seconds,
    replay,
    report,
)

# A CPU-like curve: 10 ms for one token, 3 ms per extra row.
COSTS = Costs({size: 0.010 + 0.003 * (size - 1) for size in (1, 2, 4, 8, 16, 32, 48, 49)})


def copy_case(max_tokens: int = 60) -> Case:
    """The prompt holds a 30-token passage and the start of its copy; the output finishes it."""
    passage = list(range(100, 130))
    return Case("copy", "grounded", prompt=passage + [7] + passage[:12], output=passage[12:] + [5] * 60,
                max_tokens=max_tokens)


def test_costs_interpolate_and_extend_the_top_of_the_curve():
    assert COSTS(3) == pytest.approx(0.016)
    assert COSTS(50) == pytest.approx(COSTS(48) + 2 * 0.003)
    # A noisy curve whose top falls is extended flat, never below its last point.
    falling = Costs({1: 0.04, 2: 0.4, 4: 0.03})
    assert falling(48) == pytest.approx(0.03)


def test_plain_replay_is_one_decode_per_token():
    result = replay(copy_case(), 0, COSTS, loop_seconds=0.001, row_seconds=0.0)
    assert result.tokens == 59  # the first token comes from the prompt's decode
    assert result.seconds == pytest.approx(59 * 0.011)
    assert all(k == 0 for _, k, _ in result.steps)


def test_fixed_k_keeps_the_copy_and_stops_where_the_text_leaves_it():
    result = replay(copy_case(), 8, COSTS, loop_seconds=0.0, row_seconds=0.0)
    # 17 passage tokens remain after the first: two full drafts of 8 (+1 each) copy them,
    # and the second step's own token is the first after the passage. Nothing earlier
    # ends with it, so a plain step follows; then the repeated token is drafted in full.
    assert result.steps[:3] == [(12, 8, 8), (12, 8, 8), (None, 0, 0)]
    assert result.steps[3] == (1, 8, 8)  # a run of one token, continued periodically
    assert result.tokens == 59
    committed = sum(accepted + 1 for _, _, accepted in result.steps)
    assert committed == 59


def test_ngram_simple_drafts_only_after_a_long_match():
    case = Case("no-repeat", "creative", prompt=[1, 2, 3], output=list(range(10, 40)), max_tokens=30)
    result = replay(case, "ngram-simple", COSTS)
    assert all(k == 0 for _, k, _ in result.steps)
    result = replay(copy_case(), "ngram-simple", COSTS, loop_seconds=0.0, row_seconds=0.0)
    assert result.steps[0] == (12, 48, 17)


def test_auto_replay_beats_plain_on_a_copy_and_is_reproducible():
    plain = replay(copy_case(), 0, COSTS)
    first = replay(copy_case(), "auto", COSTS, noise=0.1, seed=3)
    again = replay(copy_case(), "auto", COSTS, noise=0.1, seed=3)
    assert first == again
    assert first.tokens == plain.tokens
    assert first.tokens_per_second > 1.5 * plain.tokens_per_second


def test_beside_others_a_step_is_priced_with_their_rows_and_drafting_shrinks_where_rows_cost():
    plain = replay(copy_case(), 0, COSTS, loop_seconds=0.0, row_seconds=0.0, beside=3)
    assert plain.seconds == pytest.approx(len(plain.steps) * COSTS(4))
    assert plain.expected == [1.0] * len(plain.steps)  # a plain step expects its one token
    alone = replay(copy_case(), "auto", COSTS, beside=0)
    crowded = replay(copy_case(), "auto", COSTS, beside=7)
    assert crowded.tokens == alone.tokens
    assert len(crowded.expected) == len(crowded.steps) and not alone.expected
    drafted = (lambda run: sum(step[1] for step in run.steps))
    # Every row costs here (3 ms on a 10 ms step): beside 7 others a drafted row is worth less
    # of the batch's rate, so fewer are drafted, and only where the copy is likeliest kept.
    assert 0 < drafted(crowded) < drafted(alone)
    cheap = Costs({size: 0.010 + 0.0001 * (size - 1) for size in (1, 2, 4, 8, 16, 32, 48, 49)})
    assert drafted(replay(copy_case(), "auto", cheap, beside=7)) > drafted(crowded)  # a GPU-like curve drafts on


def test_the_beside_report_compares_the_batch_with_and_without_drafting():
    recording = {"costs": {str(k): v for k, v in COSTS.by_size.items()},
                 "calibration": {str(k): COSTS(k) for k in (1, 2, 4, 8, 16)},
                 "workloads": [dataclasses.asdict(copy_case())]}
    [row] = beside_rows(recording, 3)
    assert row["gain"] > 1.0  # the copy pays beside three others too
    assert 0 < row["kept"] <= row["drafted"] and row["drafting_steps"] > 0
    [short] = beside_rows(recording, 3, max_tokens=20)
    assert short["steps"] < row["steps"]


def test_auto_trusts_a_copy_more_the_longer_it_runs():
    """A 160-token passage to copy on a CPU-like curve: the first draft follows a fresh
    12-token match and is what a miss can cost (adaptive.RISK_ALLOWANCE), later ones a
    match dozens of tokens long, paid for by what the copy saved, and grow accordingly."""
    passage = list(range(100, 260))
    case = Case("long copy", "grounded", prompt=passage + [7] + passage[:12], output=passage[12:] + [5] * 60,
                max_tokens=150)
    cpu = Costs({size: 0.015 + 0.005 * (size - 1) for size in (1, 2, 4, 8, 16, 32, 48, 49)})
    calibration = {size: cpu(size) for size in (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 24, 32, 33, 48, 49)}
    steps = replay(case, "auto", cpu, calibration).steps
    copy = [drafted for _, drafted, accepted in steps if drafted and drafted == accepted]
    assert 0 < copy[0] < copy[1] < copy[2] and copy[2] >= 24
    assert len(steps) <= 8


def test_the_clairvoyant_schedule_bounds_every_policy_and_verifies_only_what_is_kept():
    case = copy_case()
    bound = clairvoyant(case, COSTS, loop_seconds=0.001, row_seconds=0.0)
    assert bound.tokens == 59
    # It never drafts a token that will be rejected: every step keeps all it verified.
    assert all(kept == k for _, k, kept in bound.steps)
    assert sum(kept + 1 for _, _, kept in bound.steps) == 59
    for policy in (0, 2, 8, 16, "auto", "ngram-simple"):
        result = replay(case, policy, COSTS, loop_seconds=0.001, row_seconds=0.0)
        assert bound.seconds <= result.seconds + 1e-12, policy
    # On this curve verifying more rows always pays once they will be kept: the 17 passage
    # tokens left go in one step (a longer draft would only be cut by the text's end).
    assert bound.steps[0] == (12, 17, 17)


def test_longest_copies_find_any_earlier_span_and_let_a_repeat_run_on():
    # Output 1 2 3 9 after prompt 5 1 2 3 4: at position 1 ("2 3 9" follows) "2 3" occurs in
    # the prompt, not "2 3 9"; at position 3 the 9 has occurred nowhere before.
    assert longest_copies([5, 1, 2, 3, 4], [1, 2, 3, 9], 4) == [0, 2, 1, 0, 0]
    # A pattern that repeats copies itself past the end of what precedes it (a period of 2).
    assert longest_copies([7, 8], [7, 8, 7, 8, 7, 8], 6) == [0, 5, 4, 3, 2, 1, 0]
    assert longest_copies([7, 8], [7, 8, 7, 8, 7, 8], 6, longest=2)[1] == 2


def test_the_copy_bound_is_as_fast_as_the_clairvoyant_schedule_at_least_where_lookup_copies():
    case = copy_case()
    bound = copy_bound(case, COSTS, loop_seconds=0.001, row_seconds=0.0)
    same_proposals = clairvoyant(case, COSTS, loop_seconds=0.001, row_seconds=0.0)
    assert bound.tokens == same_proposals.tokens == 59
    assert bound.seconds <= same_proposals.seconds + 1e-12
    assert sum(kept + 1 for _, _, kept in bound.steps) == 59
    # The passage's other 17 tokens in one step, then the repeated 5s, one span at a time.
    assert bound.steps[0] == ("copy", 17, 17)
    # Text that repeats nothing can only be written plainly.
    fresh = Case("fresh", "creative", prompt=[1, 2, 3], output=list(range(10, 40)), max_tokens=30)
    assert all(kept == 0 for _, _, kept in copy_bound(fresh, COSTS).steps)


def test_against_native_cuts_the_recording_to_the_equal_length_and_skips_other_texts():
    case = copy_case(max_tokens=60)
    recording = {"workloads": [dataclasses.asdict(case), dict(dataclasses.asdict(case), name="other")]}
    native_rows = {name: {"tokens_per_second": {"specli plain": 100.0}} for name in ("copy", "other")}
    equal_rows = {
        "copy": {"mode": "ngram-mod", "texts_agree": True, "tokens": {"ngram-mod": 20, "specli": 21},
                 "tokens_per_second": {"ngram-mod": 150.0, "specli": 180.0}},
        "other": {"mode": "ngram-mod", "texts_agree": False, "tokens": {"ngram-mod": 20},
                  "tokens_per_second": {"ngram-mod": 150.0, "specli": 180.0}},
    }
    (row,) = against_native(recording, native_rows, equal_rows, COSTS, {}, loop_seconds=0.001, row_seconds=0.0)
    assert row["name"] == "copy" and row["tokens"] == 20
    assert row["native"] == pytest.approx(1.5) and row["specli"] == pytest.approx(1.8)
    short = dataclasses.replace(case, output=case.output[:20], max_tokens=20)
    plain = replay(short, 0, COSTS, loop_seconds=0.001, row_seconds=0.0).tokens_per_second
    assert row["clairvoyant"] == pytest.approx(clairvoyant(short, COSTS, loop_seconds=0.001, row_seconds=0.0)
                                               .tokens_per_second / plain)
    assert 1.0 < row["auto"] <= row["clairvoyant"] <= row["copy_bound"] + 1e-9
    # A recording that stopped at its budget cannot stand for a longer run.
    equal_rows["copy"]["tokens"]["ngram-mod"] = 61
    with pytest.raises(ValueError):
        against_native(recording, native_rows, equal_rows, COSTS, {})


def test_the_paper_curve_is_the_published_figures_scaled_to_the_decode_time():
    curve = paper_costs(0.005)
    one = 1 / RTX_4090_LLAMA_8B_BF16_TOKENS_PER_SECOND[1]
    for size, rate in RTX_4090_LLAMA_8B_BF16_TOKENS_PER_SECOND.items():
        assert curve[size] == pytest.approx(0.005 * (size / rate) / one)
    # Past the published sizes, a straight line up to the longest verify (48 drafted + 1).
    assert max(curve) == 49
    step = curve[11] - curve[10]
    assert step > 0 and curve[49] - curve[48] == pytest.approx(step)
    assert curve[10] - curve[9] == pytest.approx(step)
    assert paper_costs(0.010)[30] == pytest.approx(2 * curve[30])


def test_costs_come_by_name_or_from_a_file_and_can_be_rescaled(tmp_path):
    named, source = load_costs("gpu-paper", decode_ms=8)
    assert named[1] == pytest.approx(0.008) and "paper model" in source and "8 ms" in source
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"source": "llama-bench on a GPU", "seconds": {"1": 0.004, "2": 0.0042, "4": 0.0045}}))
    curve, source = load_costs(str(path))
    assert curve == {1: 0.004, 2: 0.0042, 4: 0.0045} and source == "llama-bench on a GPU"
    scaled, source = load_costs(str(path), decode_ms=5)
    assert scaled[4] == pytest.approx(0.0045 * 5 / 4) and source.endswith("scaled to a 5 ms one-token decode")
    path.write_text(json.dumps({"1": 0.01, "3": 0.012}))  # a bare mapping
    assert load_costs(str(path))[0] == {1: 0.01, 3: 0.012}
    with pytest.raises(SystemExit):
        load_costs(str(tmp_path / "missing.json"))


def recording_of(case: Case, costs: Costs) -> dict:
    sizes = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 24, 32, 33, 48, 49)
    return {"costs": {str(size): costs(size) for size in sizes}, "calibration": {str(size): costs(size) for size in sizes},
            "workloads": [dataclasses.asdict(case)]}


def test_a_cost_curve_replaces_the_recorded_costs_and_python_time_is_counted():
    case = copy_case()
    recording = recording_of(case, COSTS)  # CPU-like: 3 ms a row on a 10 ms token
    options = dict(seeds=1, noise=0.0, fixed_ks=[2, 8], loop_seconds=0.0003, row_seconds=0.000045)
    [cpu] = report(recording, **options)
    [gpu] = report(recording, curve=paper_costs(0.005), **options)
    # A verify row costs ~0.7% of a token on the paper curve, 30% on the CPU-like one: the
    # same copy is worth more there, and -k auto drafts at least as long.
    assert gpu["auto"] > cpu["auto"] and gpu["max_draft"] >= cpu["max_draft"] >= 12
    assert gpu["drafting_steps"] >= 1 and gpu["steps"] * gpu["tokens_per_step"] == pytest.approx(59)
    # Python's share is the loop per step and a row read per kept token, over the replay's time.
    auto = replay(case, "auto", Costs(paper_costs(0.005)), {size: paper_costs(0.005)[size] for size in
                                                              map(int, recording["calibration"])},
                  loop_seconds=0.0003, row_seconds=0.000045)
    assert gpu["python_seconds"] == pytest.approx(python_seconds(auto, 0.0003, 0.000045))
    assert gpu["python_share"] == pytest.approx(gpu["python_seconds"] / auto.seconds)
    assert gpu["python_seconds"] == pytest.approx(len(auto.steps) * 0.0003 + 0.000045 * 59)
