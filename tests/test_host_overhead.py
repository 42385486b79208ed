"""The simulated device (benchmarks/device_sim.py) and the host-overhead harness over it
(benchmarks/host_overhead.py): the fake writes its script and nothing else, prices its decodes
as stated, and specli's real session, engine and proposers write plain decoding's text on it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import host_overhead
from benchmarks.device_sim import FIRST_TOKEN, SimulatedModel, h200_costs, make_script
from benchmarks.host_overhead import Setup, open_session, request_for, run_once
from specli.comparison import Measurement
from specli.decode.request import AUTO
from specli.stream import stream

VOCAB = 600


def small_setup(agreement: float = 0.9, max_tokens: int = 48, gpu_paths: bool = True) -> Setup:
    script = make_script(VOCAB, 64, max_tokens + 64, seed=3, agreement=agreement)
    return Setup(script, h200_costs(), h200_costs(draft=True), max_tokens, gpu_paths=gpu_paths)


# --- the simulated model ---------------------------------------------------------------

def test_the_script_repeats_exactly_and_depends_on_its_seed():
    assert make_script(VOCAB, seed=5) == make_script(VOCAB, seed=5)
    assert make_script(VOCAB, seed=5).tokens != make_script(VOCAB, seed=6).tokens
    script = make_script(VOCAB, seed=5)
    assert all(FIRST_TOKEN <= token < VOCAB - 1 for token in script.tokens)  # never BOS or EOS
    assert all(script.wrong[p] != script.tokens[p] for p in range(len(script.tokens)))


def test_rows_are_vocabulary_rows_in_one_reused_buffer_whose_argmax_is_the_script():
    script = make_script(VOCAB, 32, 32, seed=1)
    model = SimulatedModel(script, h200_costs())
    first = model.decode(script.prompt)
    assert first.shape == (1, VOCAB) and first.dtype == np.float32
    assert int(np.argmax(first[0])) == script.tokens[32]
    rows = model.decode(script.tokens[32:36], all_logits=True)
    assert [int(np.argmax(row)) for row in rows] == list(script.tokens[33:37])
    again = model.decode(script.tokens[36:38], all_logits=True)
    assert [int(np.argmax(row)) for row in again] == list(script.tokens[37:39])
    # llama.cpp's output buffer: a later decode overwrites it (it moves only when it grows).
    assert np.shares_memory(rows, again) and int(np.argmax(rows[0])) == script.tokens[37]
    assert model.n_past == 38


def test_off_the_script_the_model_writes_other_text_until_rewound():
    script = make_script(VOCAB, 32, 32, seed=1)
    model = SimulatedModel(script, h200_costs())
    model.decode(script.prompt)
    wrong = script.wrong[32]
    rows = model.decode([wrong, script.tokens[33]], all_logits=True)
    assert int(np.argmax(rows[1])) != script.tokens[34]  # its cache does not hold the script
    model.rewind(32)
    assert model.decode_argmax([script.tokens[32]]) == [script.tokens[33]]


def test_a_draft_agrees_with_the_target_where_its_script_says():
    script = make_script(VOCAB, 32, 64, seed=2, agreement=0.5)
    draft = SimulatedModel(script, h200_costs(draft=True), draft=True)
    draft.decode(script.prompt[:-1])
    chosen = draft.decode_argmax(script.tokens[31:80], all_rows=True)
    for p, token in zip(range(32, 81), chosen):
        assert token == (script.tokens[p] if script.draft_agrees[p] else script.wrong[p])
    assert 0 < sum(script.draft_agrees[32:81]) < 49


def test_decodes_are_priced_by_the_curve_the_copy_and_the_graphs_as_ggml_cuda_keeps_them():
    costs = h200_costs(copy_gbps=25.0, graphless_ms=0.3, capture_ms=0.5)
    script = make_script(VOCAB, 8, 32, seed=1)
    model = SimulatedModel(script, costs)
    model.decode(script.prompt)  # (8 tokens, 1 row): no graph yet
    row = VOCAB * 4 / 25e9
    assert model.ledger.device_seconds == pytest.approx(costs.decode(8) + row + 0.3e-3)
    assert costs.decode(1) == pytest.approx(6.295e-3) and costs.decode(11) == pytest.approx((9.279 + 9.287) / 2e3)
    # One graph per context: a change of shape runs without it, the same shape again captures
    # it, and only a third decode in a row replays it.
    shapes = [(1, False), (1, False), (1, False), (3, True), (1, False), (3, True)]
    for n, all_logits in shapes:
        model.decode(script.tokens[model.n_past : model.n_past + n], all_logits=all_logits)
    ledger = model.ledger
    assert (ledger.graphless, ledger.captures, ledger.decodes) == (5, 1, 7)
    assert ledger.device_seconds == pytest.approx(costs.decode(8) + 4 * costs.decode(1) + 2 * costs.decode(3)
                                                  + 11 * row + 5 * 0.3e-3 + 0.5e-3)
    assert h200_costs(draft=True, draft_ms=0.45).decode(1) == pytest.approx(0.45e-3)


# --- specli over the simulated device -----------------------------------------------------

@pytest.mark.parametrize("gpu_paths", [True, False])
@pytest.mark.parametrize("proposer", ["ngram", "draft", "draft+ngram"])
@pytest.mark.parametrize("draft_tokens", [1, 4, 8, AUTO])
def test_greedy_drafting_writes_plain_decodings_text(proposer, draft_tokens, gpu_paths):
    setup = small_setup(gpu_paths=gpu_paths)
    plain = run_once(setup, "ngram", 0)
    assert plain.output == setup.script.answer[: setup.max_tokens]  # plain decoding follows the script
    drafted = run_once(setup, proposer, draft_tokens)
    assert drafted.output == plain.output
    assert drafted.drafted > 0 and 0 < drafted.accepted <= drafted.drafted
    assert drafted.steps < plain.steps  # drafts were kept: fewer target decodes


def test_auto_prices_its_steps_with_the_simulated_devices_costs():
    setup = small_setup()
    session = open_session(setup, "draft")
    engine = session.engine_for(request_for("draft", AUTO, setup.max_tokens))
    outcome = stream(engine, setup.script.prompt, _Silent())
    assert outcome.stats.priced_steps > 0  # priced (a prior or a calibration on the fake prices nothing)
    assert session.pricing.costs().verify[1] == pytest.approx(6.295e-3 + VOCAB * 4 / 25e9)


@pytest.mark.parametrize("agreement, kept", [(1.0, "all"), (0.0, "none")])
def test_a_draft_model_is_kept_as_often_as_its_script_agrees(agreement, kept):
    setup = small_setup(agreement=agreement)
    figures = run_once(setup, "draft", 4)
    assert figures.output == setup.script.answer[: setup.max_tokens]
    assert figures.drafted > 0
    assert figures.accepted == (figures.drafted if kept == "all" else 0)


@pytest.mark.parametrize("draft_tokens", [3, 8])
def test_each_step_keeps_the_draft_tokens_its_script_agrees_on(draft_tokens):
    """The draft model's cache follows the committed text through rejections: at each step it
    drafts from the script, so a step keeps exactly the leading positions the script agrees on."""
    setup = small_setup(agreement=0.7)
    engine = open_session(setup, "draft").engine_for(request_for("draft", draft_tokens, setup.max_tokens))
    outcome = stream(engine, setup.script.prompt, _Silent())
    position = setup.script.prompt_length + 1  # the prompt's decode wrote the token at prompt_length
    rejected = 0
    for step in outcome.steps:
        agrees = setup.script.draft_agrees[position : position + step.drafted]
        kept = next((i for i, agree in enumerate(agrees) if not agree), step.drafted)
        assert step.accepted == kept
        rejected += kept < step.drafted
        position += step.accepted + 1
    assert rejected >= 3 and outcome.tokens == setup.script.answer[: setup.max_tokens]


def test_pythons_share_of_a_step_counts_the_draft_loop():
    """Only the draft model's decodes leave Python's share: its loop (a vocabulary row read per
    drafted token) and n-gram lookup stay in it."""
    setup = small_setup()
    engine = open_session(setup, "draft").engine_for(request_for("draft", 8, setup.max_tokens))
    stats = stream(engine, setup.script.prompt, _Silent()).stats
    assert all((step.draft_decode_seconds > 0) == (step.asked > 0) for step in stream_steps(setup, "draft", 8))
    assert 0 < stats.draft_decode_seconds < stats.draft_seconds
    assert stats.overhead_seconds == pytest.approx(stats.seconds - stats.draft_decode_seconds - stats.verify_seconds)
    split = Measurement(stats=[stats]).summary()["time_split"]  # specli bench's
    assert split["draft"] == pytest.approx(stats.draft_decode_seconds / stats.seconds)
    assert sum(split.values()) == pytest.approx(1.0)
    lookup = stream(open_session(setup, "ngram").engine_for(request_for("ngram", 8, setup.max_tokens)),
                    setup.script.prompt, _Silent()).stats
    assert lookup.drafted > 0 and lookup.draft_decode_seconds == 0
    assert lookup.overhead_seconds >= lookup.draft_seconds


def stream_steps(setup: Setup, proposer: str, draft_tokens):
    engine = open_session(setup, proposer).engine_for(request_for(proposer, draft_tokens, setup.max_tokens))
    return stream(engine, setup.script.prompt, _Silent()).steps


def test_the_harness_runs_end_to_end_and_repeats_its_counts(capsys):
    args = ["--json", "--vocab", str(VOCAB), "--tokens", "24", "--prompt-tokens", "48", "--runs", "2",
            "-k", "0,4,auto"]
    assert host_overhead.main(args) == 0
    report = json.loads(capsys.readouterr().out)
    configs = {s["config"]: s for s in report["configs"]}
    assert set(configs) == {"plain", "ngram k=4", "ngram k=auto", "draft k=4", "draft k=auto"}
    for summary in configs.values():
        assert summary["repeats_exactly"] and summary["runs"] == 2 and summary["tokens"] == 23
        assert summary["host_us_per_step"] > 0 and summary["simulated_tokens_per_second"] > 0
    assert configs["plain"]["drafted_per_step"] == 0 and configs["plain"]["tokens_per_step"] == 1
    assert configs["draft k=4"]["drafted_per_step"] > 1
    assert configs["draft k=4"]["draft_us_per_drafted"] > 0
    assert report["goals"]["host_us_per_step_k8"] == 400


def test_the_harness_prints_a_table_with_the_goals(capsys):
    args = ["--vocab", str(VOCAB), "--tokens", "16", "--prompt-tokens", "48", "--runs", "1", "-k", "8",
            "--proposers", "draft"]
    assert host_overhead.main(args) == 0
    out = capsys.readouterr().out
    assert "draft k=8" in out and "goals: host <= 400 us a step at K=8" in out


class _Silent:
    def start(self) -> None: ...
    def token(self, event) -> None: ...
    def step(self, record) -> None: ...
    def finish(self, stats) -> None: ...


def test_on_the_gpu_paths_the_drafts_decodes_keep_one_shape_and_the_verify_batches_few(capsys):
    """The draft's catch-up goes a token a decode, so after its prompt every decode it makes
    has one shape; -k auto's verify batches keep to reusable sizes. The CPU paths change shape
    at most steps."""
    base = ["--json", "--vocab", str(VOCAB), "--tokens", "48", "--prompt-tokens", "48", "--runs", "1",
            "--proposers", "draft", "-k", "4,auto"]
    figures = {}
    for paths in ([], ["--no-gpu-paths"]):
        assert host_overhead.main(base + paths) == 0
        report = json.loads(capsys.readouterr().out)
        figures[bool(paths)] = {s["config"]: s for s in report["configs"]}
    gpu, cpu = figures[False], figures[True]
    # its prompt (decoded where it first drafts, in the window) and the one-token shape after it
    assert gpu["draft k=4"]["graphless_and_captures"]["draft"][0] == 2
    assert cpu["draft k=4"]["graphless_and_captures"]["draft"][0] > 4
    assert gpu["draft k=auto"]["shape_changes_per_step"]["target"] < cpu["draft k=auto"]["shape_changes_per_step"]["target"]
