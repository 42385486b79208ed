"""`specli bench`: plain against speculative decoding on the same prompts, and where a
speculative output leaves plain's, how close to a tie plain's choice was there."""

from __future__ import annotations

import json
import re

import pytest
from fakes import FakeModel
from fakes import plain_greedy as reference_greedy
from typer.testing import CliRunner

from specli.commands.bench import _agreement
from specli.commands.cli import app
from specli.comparison import Measurement, plain_greedy, shared_text_speedup
from specli.decode.events import Stats
from specli.decode.request import parse_draft_tokens_list
from specli.decode.sampling import top_two_margin
from specli.errors import UsageError

COPY_WORKLOAD = '''
[[workload]]
name = "copy"
kind = "grounded"
max_tokens = 24
prompt = """def area(width, height):
    return width * height

The same function again:

def area(width, height):
"""
'''


def test_plain_greedy_gives_the_gaps_plain_decoding_saw_at_each_token():
    prompt = [1, 2, 3]
    reference = FakeModel(seed=4)
    expected_output = reference_greedy(FakeModel(seed=4), prompt, 12)
    expected = [top_two_margin(reference.logits_after(prompt + expected_output[:i])) for i in range(12)]
    model = FakeModel(seed=4)
    output, margins = plain_greedy(model, prompt, 12)
    assert output == expected_output and margins == pytest.approx(expected)
    assert model.n_past == 0  # rewound: the bench's next run starts from an empty cache


def test_the_agreement_column_counts_the_runs_that_left_plain_output():
    measurement = Measurement(stats=[Stats(tokens=78), Stats(tokens=160), Stats(tokens=160)],
                              identical=[True, False, False], first_difference=[77, 77],
                              plain_margins=[5.0] * 77 + [0.12])
    summary = measurement.summary()
    assert summary["runs_differing"] == 2 and summary["identical_to_plain"] is False
    assert summary["tokens"] == {"median": 160.0, "min": 78.0, "max": 160.0}
    assert _agreement(summary) == "2/3 from 77 (tie 0.12)"
    summary["speedup_on_plain_text"] = {"median": 1.91, "min": 1.8, "max": 2.0}
    assert _agreement(summary) == "2/3 from 77 (tie 0.12), 1.91× to there"
    same = Measurement(stats=[Stats(tokens=78)] * 2, identical=[True, True]).summary()
    assert same["runs_differing"] == 0 and _agreement(same) == "yes"
    assert _agreement(Measurement(stats=[Stats(tokens=9)]).summary()) == "–"  # sampled: nothing to compare


def test_a_run_that_leaves_plain_output_is_timed_on_the_text_it_shares():
    plain = [5, 6, 7, 8, 9]
    plain_times = [0.0, 1.0, 2.0, 3.0, 4.0]  # one token a second after the first
    # Four tokens in one step, then past plain's end of text: timed to plain's last token.
    longer, longer_times = plain + [1, 2, 3], [0.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    assert shared_text_speedup(longer, longer_times, plain, plain_times) == (5, 4.0)
    # Leaves plain's text at token 3: timed on tokens 1-2 only, not on its own faster tail.
    other, other_times = [5, 6, 7, 4, 4], [0.0, 1.0, 1.0, 1.5, 1.5]
    assert shared_text_speedup(other, other_times, plain, plain_times) == (3, 2.0)
    assert shared_text_speedup(plain, plain_times, plain, plain_times) == (5, 1.0)
    assert shared_text_speedup([5, 1], [0.0, 0.5], plain, plain_times) == (1, None)  # nothing to time


def test_configs_parse_with_plain_as_the_baseline():
    assert parse_draft_tokens_list("auto,2,8") == ["auto", 2, 8]
    with pytest.raises(UsageError):
        parse_draft_tokens_list("auto,0")


@pytest.mark.slow
def test_bench_measures_every_configuration_on_a_real_model(gemma_path, tmp_path, quiet_calibration):
    workloads = tmp_path / "workloads.toml"
    workloads.write_text(COPY_WORKLOAD)
    result = CliRunner().invoke(
        app, ["bench", "--target", str(gemma_path), "--draft", "ngram", "--prompts", str(workloads),
              "-k", "auto,4", "--runs", "2", "--json"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["llama_cpp"]["llama_cpp_python"] and "CPU :" in report["llama_cpp"]["system_info"]
    (workload,) = report["workloads"]
    assert workload["name"] == "copy" and workload["recommended_k"] == 4
    configs = workload["configs"]
    assert set(configs) == {"plain", "auto", "k=4"}
    plain, auto, fixed = configs["plain"], configs["auto"], configs["k=4"]
    assert plain["speedup"] is None and plain["acceptance_rate"] is None and plain["runs"] == 2
    for measured in (auto, fixed):
        assert measured["runs"] == 2 and measured["speedup"]["min"] <= measured["speedup"]["median"]
        assert sum(measured["time_split"].values()) == pytest.approx(1.0, abs=0.01)
        if measured is auto and not auto["drafted_per_step"]:
            continue  # -k auto may find that no draft pays on this box: then it drafts nothing
        if measured is fixed:
            # Much of the function is copied from the prompt: drafting steps keep several
            # tokens. (-k auto may stop after a probe or two that missed: costs measured afresh
            # on a busy box can say a short draft does not pay.)
            assert measured["mean_accepted_length"] > 1.0, measured
        # The Python time per step splits into the loop's part and the logits rows read.
        # Every step reads one row, and one more per kept draft token (none past a rejection):
        # a -k auto run whose few probes all missed at the first token reads one row a step.
        assert measured["rows_read_per_step"] >= 1
        assert (measured["rows_read_per_step"] > 1) == (measured["acceptance_rate"] > 0)
        assert measured["python_overhead_ms_per_step"] == pytest.approx(
            measured["loop_overhead_ms_per_step"] + measured["rows_read_per_step"] * measured["read_us_per_row"] / 1000)
        # Lossless up to llama.cpp's batch rounding: identical, or leaving plain only at a near-tie.
        # A fixed K gives the same batch shapes every run, and its flips fall under 0.5 logits
        # (as in test_real_models); -k auto's shapes follow the costs this machine measured,
        # and mixed shapes were seen to flip a margin of up to 1.03 (benchmarks/README.md, "Near-ties under batched verification").
        if measured["identical_to_plain"]:
            assert measured["runs_differing"] == 0
        else:
            assert 1 <= measured["runs_differing"] <= 2
            assert measured["plain_margin_at_first_difference"] < (0.5 if measured is fixed else 1.1), measured
        assert measured["tokens"]["min"] >= 1
        # Timed again on the text each run shares with plain: every run shares its opening.
        shared = measured["speedup_on_plain_text"]
        assert shared is not None, measured
        assert 0 < shared["min"] <= shared["median"] <= shared["max"]
        assert 2 <= measured["plain_text_tokens"] <= plain["tokens"]["max"]
    assert len(fixed["acceptance_by_position"]) == 4


@pytest.mark.slow
def test_the_bench_table_in_a_pipe_keeps_every_value_whole(gemma_path, tmp_path, monkeypatch, quiet_calibration):
    """CliRunner's stdout is not a terminal: the table must not be squeezed into 80 columns,
    which cut headers and values short ("speed…", "1.80× (1.79…")."""
    monkeypatch.delenv("COLUMNS")
    workloads = tmp_path / "workloads.toml"
    workloads.write_text(COPY_WORKLOAD)
    result = CliRunner().invoke(app, ["bench", "--target", str(gemma_path), "--draft", "ngram", "--prompts",
                                      str(workloads), "-k", "4", "--runs", "1"])
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    header = next(line for line in result.stdout.splitlines() if "config" in line)
    assert "speedup (min–max)" in header and "py ms/step: loop + reads" in header
    row = next(line for line in result.stdout.splitlines() if "k=4" in line)
    assert re.search(r"\d\.\d\d× \(\d\.\d\d–\d\.\d\d\)", row), row


@pytest.mark.slow
def test_bench_without_a_proposer_is_a_usage_error(gemma_path):
    result = CliRunner().invoke(app, ["bench", "--target", str(gemma_path), "--draft", "none", "--runs", "1"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("specli: error: bench compares against plain decoding")
    assert result.stderr.count("\n") == 1
