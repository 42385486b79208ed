"""A recurrent or hybrid target's state as llama.cpp sizes it (specli.llama.backend), on the
tiny Qwen3.5 of tests/support/synthetic_mtp.py (three gated-delta-net layers, one attention):

- snapshots of the state as many as the run drafts, none for plain decoding, which change no
  logits, so plain and drafted runs still compute alike;
- the caches' memory as llama.cpp allocated it (`run --json`, `doctor -m`);
- state checkpoints on the host (chat, serve), from which a later prompt decodes on instead of
  decoding the conversation again, restored to the very state a replay of the same batches has.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import generation
from typer.testing import CliRunner

from tests.support.synthetic_mtp import REASONING_TEMPLATE
from specli.commands.cli import app
from specli.decode.request import DraftKind, GenerationRequest
from specli.llama.backend import CHECKPOINT_TAIL, STATE_CHECKPOINTS, LoadSettings, Model
from specli.prompt import chat_tokens
from specli.session import SessionSpec, open_session

pytestmark = pytest.mark.slow  # loads models

PROMPT = "The quick brown fox jumps over the lazy dog. Then"
SMALL = ("--no-chat", "-c", "256", "-t", "1", "--temp", "0", "-n", "32")
QUESTIONS = ("Tell me about the fox and the dog, and what the fox did after it jumped over the dog.",
             "And then?", "Why did it do that?")


def load(path, snapshots: int = 0, checkpoints: int = 0) -> Model:
    model = Model(path, LoadSettings(ctx_size=1024, batch_size=64, threads=1, recurrent_snapshots=snapshots))
    model.keep_checkpoints(checkpoints)
    return model


def decodes(model: Model, prompt: list[int]) -> list[np.ndarray]:
    """A prompt, ten greedy steps, a batch of five rows with every row out, and a rewind of three."""
    rows = [np.array(model.decode(prompt))]
    for _ in range(10):
        rows.append(np.array(model.decode([int(np.argmax(rows[-1][-1]))])))
    rows.append(np.array(model.decode([5, 6, 7, 8, 9], all_logits=True)))
    model.rewind(model.n_past - 3)
    rows.append(np.array(model.decode([1, 2], all_logits=True)))
    return rows


def test_snapshots_of_the_state_change_no_logits(mtp_files):
    """The snapshots plain decoding goes without and a drafted run keeps (llama.cpp's n_rs_seq)
    change what llama.cpp stores, not what it computes: every row is the same, bit for bit.
    This is what lets the snapshots follow the draft kind and greedy drafted still equal plain."""
    plain = load(mtp_files["hybrid"])
    try:
        prompt = plain.tokenize(" ".join(f"The fox jumps over dog number {i}." for i in range(12)))
        assert len(prompt) > 64, "a prompt of more than one batch"
        assert plain.max_rewind == 0
        expected = decodes(plain, prompt)[:-1]  # (its rewind decodes the kept tokens again)
    finally:
        plain.close()
    for snapshots in (3, 8):
        model = load(mtp_files["hybrid"], snapshots)
        try:
            assert model.max_rewind == snapshots
            rows = decodes(model, prompt)
            assert all(np.array_equal(a, b) for a, b in zip(expected, rows)), snapshots
        finally:
            model.close()


def run_json(target, *args: object) -> tuple[list[int], dict]:
    result = CliRunner().invoke(app, ["run", "--target", str(target), *SMALL, "--json", *map(str, args), PROMPT])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return [r["id"] for r in records if r["type"] == "token"], records[-1]


def test_a_run_keeps_as_many_snapshots_as_it_drafts_and_says_what_they_take(mtp_files):
    """Plain decoding keeps none (as llama.cpp decodes plainly), -k N keeps N, -k auto its kind's
    longest (3 for MTP, llama.cpp's --spec-draft-n-max); --json gives the recurrent state's size
    as llama.cpp allocated it, larger with each snapshot, and every run writes plain's text."""
    hybrid = mtp_files["hybrid"]
    plain, stats = run_json(hybrid, "--draft", "none")
    memory = {"none": stats["memory"]}
    for name, args in {"ngram -k 3": ("--draft", "ngram", "-k", "3"), "mtp": ("--draft", "mtp", "--no-ngram"),
                       "ngram": ("--draft", "ngram"), "mtp -k 5": ("--draft", "mtp", "--no-ngram", "-k", "5")}.items():
        tokens, stats = run_json(hybrid, *args)
        assert tokens == plain, name
        memory[name] = stats["memory"]
        if name == "mtp -k 5":  # (-k auto prices the tiny file's NextN decode too dear to draft)
            assert stats["accepted"] > 0, f"{name}: drafts were kept, not skipped"
    snapshots = {name: m["recurrent_snapshots"] for name, m in memory.items()}
    assert snapshots == {"none": 0, "ngram -k 3": 3, "mtp": 3, "ngram": 8, "mtp -k 5": 5}
    sizes = [memory[name]["recurrent_bytes"] for name in ("none", "mtp", "mtp -k 5", "ngram")]
    assert 0 < sizes[0] < sizes[1] < sizes[2] < sizes[3], sizes
    assert all(m["kv_cache_bytes"] == memory["none"]["kv_cache_bytes"] > 0 for m in memory.values())


def test_doctor_names_the_caches_of_the_options_given(mtp_files):
    result = CliRunner().invoke(app, ["doctor", "--target", str(mtp_files["hybrid"]), "--draft", "none", "--json"])
    model = json.loads(result.stdout)["model"]
    assert model["memory"]["recurrent_snapshots"] == 0 and model["memory"]["recurrent_bytes"] > 0
    assert model["rewind_problem"] is None, "no snapshots where nothing drafts is no problem"
    result = CliRunner().invoke(app, ["doctor", "--target", str(mtp_files["hybrid"]), "--draft", "mtp"])
    line = next(line for line in result.stdout.splitlines() if line.startswith("caches"))
    assert "recurrent state" in line and "3 snapshots a sequence" in line, line
    # as serve --parallel 4 sizes them: four sequences' KV cells and states
    result = CliRunner().invoke(app, ["doctor", "--target", str(mtp_files["hybrid"]), "--draft", "none", "--json",
                                      "--parallel", "4"])
    four = json.loads(result.stdout)["model"]
    assert four["sequences"] == 4
    assert four["memory"]["recurrent_bytes"] == pytest.approx(4 * model["memory"]["recurrent_bytes"], abs=4)
    assert four["memory"]["kv_cache_bytes"] > model["memory"]["kv_cache_bytes"]
    result = CliRunner().invoke(app, ["doctor", "--target", str(mtp_files["hybrid"]), "--draft", "mtp", "-np", "4"])
    line = next(line for line in result.stdout.splitlines() if line.startswith("caches"))
    assert "for 4 sequences (3 snapshots a sequence" in line, line


def test_a_checkpoint_restores_the_state_a_replay_of_the_same_batches_has(mtp_files):
    """A prompt is decoded up to CHECKPOINT_TAIL tokens before its end, its state kept, then the
    rest. A rewind past the snapshots back to where the next prompt parts from the cache
    restores that state and decodes only the tokens between: the rows that follow are those of
    a fresh model fed the same batches, bit for bit, and differ from those that follow a state
    one token off, so a wrong state shows."""
    model = load(mtp_files["hybrid"], checkpoints=STATE_CHECKPOINTS)
    try:
        prompt = model.tokenize("The quick brown fox jumps over the lazy dog. " * 6)
        model.decode(prompt)
        assert model.checkpoint_positions() == [len(prompt) - CHECKPOINT_TAIL]
        for token in (5, 6, 7):
            model.decode([token])
        keep = len(prompt) - 2
        decoded: list[tuple[int, int]] = []
        model.on_decode = lambda first, n: decoded.append((first, n))
        model.rewind(keep)
        assert model.n_past == keep and decoded == [(len(prompt) - CHECKPOINT_TAIL, 2)]
        assert model.checkpoint_positions() == [len(prompt) - CHECKPOINT_TAIL]
        restored = np.array(model.decode([7, 8, 9], all_logits=True))
        model.rewind(10)  # before the checkpoint: it is gone, and the rewind decodes from the start
        assert model.checkpoint_positions() == [10 - CHECKPOINT_TAIL] and model.n_past == 10
    finally:
        model.close()
    fresh = load(mtp_files["hybrid"])
    try:
        fresh.decode(prompt[: len(prompt) - CHECKPOINT_TAIL])
        fresh.decode(prompt[len(prompt) - CHECKPOINT_TAIL : keep])
        replayed = np.array(fresh.decode([7, 8, 9], all_logits=True))
        fresh.rewind(0)  # the same batches from a state one token off (another token before the checkpoint)
        at = len(prompt) - CHECKPOINT_TAIL
        fresh.decode(prompt[: at - 1] + [(prompt[at - 1] + 1) % fresh.n_vocab])
        fresh.decode(prompt[at:keep])
        other = np.array(fresh.decode([7, 8, 9], all_logits=True))
    finally:
        fresh.close()
    assert np.array_equal(restored, replayed)
    assert not np.array_equal(restored, other), "the comparison tells states apart"


def chat(target, checkpoints: int, turns: int = 3, exact: bool = False) -> list[tuple[int, int, int]]:
    """A conversation of `turns` questions through REASONING_TEMPLATE, each answered greedily on one
    session: per turn (prompt tokens, what the cache held of it, positions the target decoded)."""
    load_settings = LoadSettings(ctx_size=2048, batch_size=512, threads=1, recurrent_snapshots=0)
    spec = SessionSpec(target, None, load_settings, load_settings, chat_template=REASONING_TEMPLATE,
                       checkpoints=checkpoints)
    with open_session(spec) as session:
        engine = session.engine_for(GenerationRequest(max_tokens=24, draft=DraftKind.NONE, exact=exact))
        messages: list[dict[str, str]] = []
        turns_seen = []
        for question in QUESTIONS[:turns]:
            messages.append({"role": "user", "content": question})
            prompt = chat_tokens(session.target, messages)
            decoded = []
            session.target.on_decode = lambda first, n: decoded.append(n)
            tokens, finished = generation(engine, prompt)
            messages.append({"role": "assistant", "content": "".join(token.text for token in tokens)})
            # the prompt's positions decoded: all but the generation steps' (one token each)
            turns_seen.append((len(prompt), finished.stats.prompt_cached, sum(decoded) - (len(tokens) - 1)))
    return turns_seen


def test_a_hybrid_chat_decodes_each_turn_from_a_checkpoint_not_from_the_start(mtp_files):
    """Each turn's prompt parts from the cache at the last answer's "<think>\\n": without
    checkpoints the rewind there decodes the whole conversation again every turn; with them,
    each turn decodes from the checkpoint before the last prompt's end, so only what is new."""
    without = chat(mtp_files["hybrid"], 0)
    with_them = chat(mtp_files["hybrid"], STATE_CHECKPOINTS)
    assert [p for p, _, _ in without] == [p for p, _, _ in with_them]
    first, *later = with_them
    assert first[2] == first[0], "the first turn decodes its whole prompt"
    for before, (prompt, cached, decoded), (_, _, decoded_before) in zip(with_them, later, without[1:]):
        assert cached >= before[0] - CHECKPOINT_TAIL, "the cache holds the conversation up to the last answer"
        assert decoded_before == prompt, "without checkpoints the whole conversation is decoded again"
        # from the checkpoint CHECKPOINT_TAIL tokens before the last prompt's end: what is new
        assert prompt - cached <= decoded <= prompt - cached + CHECKPOINT_TAIL, (prompt, cached, decoded)
    # An exact conversation decodes each prompt in one piece, as `specli run --exact` does: no checkpoints.
    exact = chat(mtp_files["hybrid"], STATE_CHECKPOINTS, exact=True)
    assert all(decoded == prompt for prompt, _, decoded in exact), exact


def test_the_caches_line_names_its_sequences():
    from specli.diagnostics import caches_line

    assert caches_line({"kv_cache_bytes": 75_500_000}, 4) == "KV 75.5 MB for 4 sequences"
    assert caches_line({"kv_cache_bytes": 75_500_000}) == "KV 75.5 MB"
