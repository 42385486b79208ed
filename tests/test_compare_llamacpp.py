"""benchmarks/compare_llamacpp.py: reading both tools' timings, and the ratios it reports."""

from __future__ import annotations

import json

import pytest

from benchmarks.compare_llamacpp import Run, RunError, paired_ratios, parse_llama_output, parse_specli_output

# The lines llama.cpp 0.3.36's tools print (spacing as they print it).
SPECULATIVE_LOG = """
main: n_threads = 2
encoded    7 tokens in    0.101 seconds, speed:   69.214 t/s
decoded  128 tokens in    1.250 seconds, speed:  102.400 t/s
n_draft   = 48
n_predict = 128
n_drafted = 96
n_accept  = 90
"""
COMPLETION_LOG = """
llama_perf_sampler_print:    sampling time =      40.10 ms /   134 runs   (    0.30 ms per token,  3341.65 tokens per second)
llama_perf_context_print:        load time =     250.00 ms
llama_perf_context_print: prompt eval time =     100.00 ms /     7 tokens (   14.29 ms per token,    70.00 tokens per second)
llama_perf_context_print:        eval time =    1905.00 ms /   127 runs   (   15.00 ms per token,    66.67 tokens per second)
"""


def test_speculative_timing_and_acceptance_come_from_the_decoded_line():
    run = parse_llama_output(SPECULATIVE_LOG, "llama.cpp")
    assert (run.tokens, run.seconds, run.tokens_per_second) == (128, 1.25, 102.4)
    assert run.acceptance_rate == pytest.approx(90 / 96)
    assert run.threads == 2


def test_plain_timing_is_the_eval_line_not_the_sampler_or_prompt():
    run = parse_llama_output(COMPLETION_LOG, "llama.cpp plain")
    assert (run.tokens, run.seconds, run.tokens_per_second) == (127, 1.905, 66.67)
    assert run.acceptance_rate is None


def test_a_log_without_timing_is_an_error():
    with pytest.raises(RunError, match="no 'decoded"):
        parse_llama_output("main: error: failed to load model\n", "llama.cpp")


def test_specli_timing_is_its_last_json_line():
    lines = [json.dumps({"type": "token", "id": 5, "text": "Hi", "source": "target"}),
             json.dumps({"type": "stats", "tokens": 40, "seconds": 0.5, "tokens_per_second": 78.0,
                         "acceptance_rate": 0.5, "drafted": 10})]
    run = parse_specli_output("\n".join(lines) + "\n")
    assert run.tokens == 40 and run.tokens_per_second == 78.0 and run.acceptance_rate == 0.5


def run(tool: str, speed: float) -> Run:
    return Run(tool, 100, 100 / speed, speed)


def test_same_round_ratios_pair_the_runs_of_each_round():
    # The box runs at half speed in round 2 for both tools: that round's ratio is still 1.1.
    runs = {"specli": [run("specli", 110), run("specli", 55), run("specli", 120)],
            "llama.cpp": [run("llama.cpp", 100), run("llama.cpp", 50), run("llama.cpp", 150)]}
    paired = paired_ratios(runs, "specli", "llama.cpp")
    assert paired["rounds"] == pytest.approx([1.1, 1.1, 0.8])
    assert (paired["median"], paired["min"], paired["max"]) == pytest.approx((1.1, 0.8, 1.1))


def test_same_round_ratios_need_both_tools():
    assert paired_ratios({"specli": [run("specli", 100)]}, "specli", "llama.cpp") is None
