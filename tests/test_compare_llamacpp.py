"""benchmarks/compare_llamacpp.py: reading both tools' timings, and the ratios it reports."""

from __future__ import annotations

import json

import pytest

from benchmarks.compare_llamacpp import (
    Run,
    RunError,
    Workload,
    paired_ratios,
    parse_args,
    parse_llama_output,
    parse_specli_output,
    tool_commands,
)

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


def commands_for(*argv: str) -> dict[str, list[str]]:
    args = parse_args(["-m", "target.gguf", "-p", "Hello", "--llama-bin", "/bin/llama-speculative-simple",
                       "--specli", "specli", *argv])
    work = Workload(model=args.model, draft=args.draft, prompt="Hello", k=args.draft_tokens, n=16, ngram_n=3,
                    threads=None, ctx_size=512, gpu_layers=args.gpu_layers, mtp=args.mtp)
    return {name: command for name, (_, command) in tool_commands(args, work).items()}


def test_gpu_layers_reach_both_models_in_both_tools():
    commands = commands_for("--draft", "draft.gguf", "--plain", "--gpu-layers", "999")
    spec = commands["llama.cpp"]
    assert spec[spec.index("-ngl") + 1] == "999" and spec[spec.index("-ngld") + 1] == "999"
    plain = commands["llama.cpp plain"]
    assert plain[plain.index("-ngl") + 1] == "999" and "-ngld" not in plain
    for name in ("specli", "specli plain"):
        assert commands[name][commands[name].index("--gpu-layers") + 1] == "999"


def test_without_gpu_layers_each_tool_keeps_its_default():
    commands = commands_for("--ngram", "--plain")
    assert not any(flag in command for command in commands.values() for flag in ("-ngl", "-ngld", "--gpu-layers"))


def test_plain_only_runs_the_two_plain_rows():
    commands = commands_for("--ngram", "--plain-only")
    assert list(commands) == ["llama.cpp plain", "specli plain"]
    assert commands["llama.cpp plain"][0] == "/bin/llama-completion"
    assert commands["specli plain"][commands["specli plain"].index("--draft") + 1] == "none"


def test_mtp_drafts_with_the_target_s_own_layers_in_both_tools():
    commands = commands_for("--mtp", "--plain", "--specli-arg=--no-ngram")
    spec = commands["llama.cpp"]
    assert spec[spec.index("--spec-type") + 1] == "draft-mtp" and spec[spec.index("--spec-draft-n-max") + 1] == "4"
    assert "-md" not in spec
    specli = commands["specli"]
    assert specli[specli.index("--draft") + 1] == "mtp" and "--no-ngram" in specli
    assert commands["specli plain"][commands["specli plain"].index("--draft") + 1] == "none"
