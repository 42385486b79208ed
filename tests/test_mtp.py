"""MTP drafting: a target's own NextN layers draft from its hidden states (specli.llama.mtp,
specli.decode.mtp), on tiny MiMo-2 models written here (tests/support/synthetic_mtp.py).

Their weights make the next token predictable and the NextN layers predict it most of the
time, so drafts are kept where the binding is right and rejected where it is not. With
`head_scale` 0 a NextN layer adds nothing, and its logits have a closed form that pins down
what it reads: which token, and whose hidden state.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import generation

from tests.support.synthetic_mtp import TINY_MTP, head_logits, output_logits, write_mtp_model
from specli.decode.engine import Engine
from specli.decode.mtp import MtpProposer, NextnDraft
from specli.decode.policy import FixedDraftPolicy
from specli.decode.proposers import NoProposer
from specli.decode.request import GenerationRequest
from specli.decode.sampling import SamplingSettings
from specli.errors import MtpUnavailableError
from specli.llama import mtp
from specli.llama.backend import LoadSettings

pytestmark = pytest.mark.slow  # loads models

PROMPT = "The quick brown fox jumps over the lazy dog. Then"
MAX_TOKENS = 48


def load(path, snapshots: int = 0):
    settings = LoadSettings(ctx_size=512, batch_size=64, threads=1, recurrent_snapshots=snapshots)
    target = mtp.load_target(path, settings)
    return target, mtp.MtpHeads(target)


@pytest.fixture(scope="module", params=["one", "chained"])
def loaded(request, mtp_files):
    target, heads = load(mtp_files[request.param])
    yield target, heads
    heads.close()
    target.close()


def generate(target, proposer, k: int, prompt: list[int], request: GenerationRequest | None = None):
    engine = Engine(target, proposer, FixedDraftPolicy(k), request or GenerationRequest(max_tokens=MAX_TOKENS))
    tokens, finished = generation(engine, prompt)
    return tokens, finished.stats


# --- the build and the file ------------------------------------------------------------------


def test_this_build_has_the_mtp_api_and_the_files_declare_their_layers(mtp_files, smollm_path):
    assert mtp.unsupported_reason() is None and mtp.supports_mtp()
    assert mtp.nextn_layers(mtp_files["one"]) == 1
    assert mtp.nextn_layers(mtp_files["chained"]) == 3
    assert mtp.nextn_layers(smollm_path) == 0


def test_a_target_without_nextn_layers_is_refused_in_one_line(smollm_path):
    with pytest.raises(MtpUnavailableError) as raised:
        mtp.load_target(smollm_path)
    assert raised.value.exit_code == 2
    assert "no NextN (MTP) layers" in raised.value.message and "\n" not in str(raised.value)


def test_a_target_whose_nextn_layers_are_in_another_file_is_refused_in_one_line(tmp_path):
    path = write_mtp_model(tmp_path / "trunk-only.gguf", TINY_MTP, trunk_only=True)
    assert mtp.nextn_layers(path) == 0
    with pytest.raises(MtpUnavailableError, match="declares 1 NextN .MTP. layers but holds none of their tensors") \
            as raised:
        mtp.load_target(path)
    assert "mtp-*.gguf" in raised.value.hint


def test_a_trunk_with_its_mtp_file_beside_it_drafts_as_the_whole_file(tmp_path):
    """llama.cpp's converter writes the NextN layers as their own mtp-*.gguf: found beside the
    trunk, loaded MTP-only, its contexts reading the trunk's; the same weights as the whole file
    (one seed), so the same draft row."""
    trunk = write_mtp_model(tmp_path / "split" / "model.gguf", TINY_MTP, trunk_only=True)
    sidecar = write_mtp_model(tmp_path / "split" / "mtp-model.gguf", TINY_MTP, sidecar=True)
    whole = write_mtp_model(tmp_path / "whole" / "model.gguf", TINY_MTP)
    assert mtp.sidecar_for(trunk) == sidecar and mtp.nextn_layers(trunk) == 1 and mtp.sidecar_for(whole) is None
    rows = []
    for path in (trunk, whole):
        target, heads = load(path)
        try:
            draft = NextnDraft(heads)
            tokens = target.tokenize(PROMPT)
            target.decode(tokens[:-1])
            draft.prepare(tokens[:-1])
            rows.append(np.array(draft.row_after(tokens)))
            prompt = target.tokenize(PROMPT * 3)
            plain, _ = generate(target, NoProposer(), 0, prompt)
            drafted, stats = generate(target, MtpProposer(NextnDraft(heads), SamplingSettings()), 2, prompt)
            assert [t.id for t in drafted] == [t.id for t in plain] and stats.accepted > 0
        finally:
            heads.close()
            target.close()
    np.testing.assert_allclose(rows[0], rows[1], rtol=1e-4, atol=1e-4)


def test_a_build_without_the_api_is_refused_naming_what_it_lacks(mtp_files, monkeypatch):
    monkeypatch.delattr(mtp.llama, "llama_model_n_layer_nextn")
    assert "llama_model_n_layer_nextn" in mtp.unsupported_reason()
    assert not mtp.supports_mtp()
    with pytest.raises(MtpUnavailableError) as raised:
        mtp.load_target(mtp_files["one"])
    assert raised.value.exit_code == 2 and "llama_model_n_layer_nextn" in raised.value.message


# --- what the NextN layers read ----------------------------------------------------------------


def test_the_hidden_rows_kept_are_the_targets_own_at_each_position(mtp_files):
    """The output head over each kept row gives the target's logits at that position: the
    rows are the trunk's hidden states, by position, through chunked decodes and a rewind."""
    target, heads = load(mtp_files["closed"])
    try:
        tokens = target.tokenize(PROMPT * 8)
        assert len(tokens) > target.batch_size  # the prompt's decode takes two llama_decodes
        target.decode(tokens[:-8])
        target.rewind(len(tokens) - 12)
        rows = np.array(target.decode(tokens[-12:], all_logits=True))
        expected = output_logits(mtp_files["closed"], heads.target_hidden(len(tokens) - 12, 12))
        np.testing.assert_allclose(rows, expected, rtol=1e-3, atol=1e-3)
        first = output_logits(mtp_files["closed"], heads.target_hidden(0, 1))
        target.rewind(0)
        np.testing.assert_allclose(np.array(target.decode(tokens[:1])), first, rtol=1e-3, atol=1e-3)
    finally:
        heads.close()
        target.close()


def test_a_draft_reads_the_last_token_with_the_targets_state_before_it(mtp_files):
    target, heads = load(mtp_files["closed"])
    try:
        draft = NextnDraft(heads)
        tokens = target.tokenize(PROMPT)
        target.decode(tokens[:-1])
        draft.prepare(tokens[:-1])
        logits = draft.row_after(tokens)
        expected = head_logits(mtp_files["closed"], tokens[-1], heads.target_hidden(len(tokens) - 2, 1)[0])
        np.testing.assert_allclose(logits, expected, rtol=1e-3, atol=1e-3)
        assert int(np.argmax(logits)) == int(np.argmax(expected))
    finally:
        heads.close()
        target.close()


def test_a_catch_up_asks_for_no_logits_row_and_a_draft_for_one(mtp_files, monkeypatch):
    """As llama.cpp's own catch-up: the entries a cache catches up with put out no row (no
    output head run), the draft's own entries one each."""
    import llama_cpp

    target, heads = load(mtp_files["chained"])
    flags: list[bool] = []
    original = llama_cpp.llama_batch_ext_set_output_logits
    monkeypatch.setattr(llama_cpp, "llama_batch_ext_set_output_logits",
                        lambda batch, index, output: (flags.append(bool(output)), original(batch, index, output))[1])
    try:
        draft = NextnDraft(heads)
        tokens = target.tokenize(PROMPT)
        target.decode(tokens[:-1])
        draft.prepare(tokens[:-1])  # a catch-up of every layer with the prompt
        assert len(flags) == 3 * (len(tokens) - 1) and not any(flags)
        flags.clear()
        draft.row_after(tokens)  # the first layer: the last token's entry, with a row
        assert flags == [True]
        flags.clear()
        draft.extend(1)  # the second layer (caught up at prepare): the draft's two entries, a row after them
        assert flags == [False, True]
    finally:
        heads.close()
        target.close()


def test_the_hidden_rows_read_by_every_cache_are_let_go_and_greedy_stays_plain(mtp_files):
    target, heads = load(mtp_files["one"])
    try:
        prompt = target.tokenize(PROMPT * 12)
        plain, _ = generate(target, NoProposer(), 0, prompt)
        tokens, stats = generate(target, MtpProposer(NextnDraft(heads), SamplingSettings()), 3, prompt)
        assert [t.id for t in tokens] == [t.id for t in plain] and stats.accepted > 0
        # Rows below what the cache has read are gone: far fewer kept than the target holds.
        assert heads.low > 0 and heads.rows_kept < target.n_past
        assert not heads.target_hidden(0, 2).any()  # released rows read as zeros
    finally:
        heads.close()
        target.close()


class _WrongState:
    """The NextN layers fed a wrong state: the target's one position earlier, or zeros."""

    def __init__(self, heads, shift: int | None) -> None:
        self._heads, self._shift = heads, shift

    def __getattr__(self, name):
        return getattr(self._heads, name)

    def target_hidden(self, first: int, count: int) -> np.ndarray:
        if self._shift is None:
            return np.zeros((count, self._heads.n_embd), dtype=np.float32)
        return self._heads.target_hidden(first + self._shift, count)


def test_a_head_that_needs_the_right_state_keeps_drafts_only_when_fed_it(mtp_files):
    """The wiring model's head predicts from the state alone (MtpSpec.wiring): fed the target's
    state at the position before each entry it drafts what the target writes; fed the state one
    position earlier, or zeros, it loses (nearly) every draft. Greedy output is plain either way."""
    target, heads = load(mtp_files["wiring"])
    try:
        prompt = target.tokenize(PROMPT)
        plain, _ = generate(target, NoProposer(), 0, prompt)
        kept = {}
        for name, fed in {"right": heads, "earlier": _WrongState(heads, -1), "zeros": _WrongState(heads, None)}.items():
            target.rewind(0)
            tokens, stats = generate(target, MtpProposer(NextnDraft(fed), SamplingSettings()), 1, prompt)
            assert [t.id for t in tokens] == [t.id for t in plain], name
            kept[name] = stats.accepted / max(1, stats.drafted)
        assert kept["right"] > 0.6 and kept["earlier"] < 0.1 and kept["zeros"] < 0.1, kept
    finally:
        heads.close()
        target.close()


def test_catch_up_entries_and_the_second_depth_read_what_a_fresh_decode_of_the_same_pairs_reads(mtp_files):
    """After a drafted generation (catch-ups a few entries at a time, rejected drafts removed),
    the next draft's first and second rows are those of a fresh MTP context fed, in one batch,
    every committed token with the target's state at the position before it, then the first
    draft token with the state that batch wrote. Feeding the catch-up entries a state one
    position earlier, or zeros, or the second entry zeros, moves the rows far more than
    rounding does: the catch-up entries and the state at depth 2 are pinned, not just the last entry."""
    target, heads = load(mtp_files["wiring"])
    fresh, fresh_heads = load(mtp_files["wiring"])
    try:
        draft = NextnDraft(heads)
        prompt = target.tokenize(PROMPT)
        tokens, stats = generate(target, MtpProposer(draft, SamplingSettings()), 3, prompt)
        assert 0 < stats.accepted < stats.drafted
        committed = prompt + [t.id for t in tokens]
        first = np.array(draft.row_after(committed))
        token = int(np.argmax(first))
        second = np.array(draft.extend(token))
        fresh.decode(committed[:-1])
        states = fresh_heads.target_hidden(-1, len(committed))  # entry q reads row q - 1

        def reference(catch_up: np.ndarray, depth_two: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
            fresh_heads.rewind(0, 0)
            logits, written = fresh_heads.decode(0, committed, 0, np.vstack([catch_up[:-1], states[-1:]]))
            logits = np.array(logits)
            row, _ = fresh_heads.decode(0, [token], len(committed), (written if depth_two is None else depth_two)[None, :])
            return logits, np.array(row)

        expected = reference(states)
        np.testing.assert_allclose(first, expected[0], atol=1e-4)
        np.testing.assert_allclose(second, expected[1], atol=1e-4)
        earlier = np.vstack([np.zeros_like(states[:1]), states[:-1]])
        for name, wrong in {"catch-up one earlier": reference(earlier), "catch-up zeros": reference(np.zeros_like(states)),
                            "depth 2 zeros": reference(states, np.zeros(states.shape[1], dtype=np.float32))}.items():
            moved = max(np.abs(wrong[0] - expected[0]).max(), np.abs(wrong[1] - expected[1]).max())
            assert moved > 1e-2, (name, moved)
    finally:
        for model in (heads, target, fresh_heads, fresh):
            model.close()


# --- drafting through the engine ----------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_with_mtp_drafts_equals_plain_decoding_and_keeps_drafts(loaded, k):
    target, heads = loaded
    prompt = target.tokenize(PROMPT)
    plain, _ = generate(target, NoProposer(), 0, prompt)
    proposer = MtpProposer(NextnDraft(heads), SamplingSettings())
    tokens, stats = generate(target, proposer, k, prompt)
    assert [t.id for t in tokens] == [t.id for t in plain]
    assert stats.proposer == "mtp" and set(stats.drafted_by) == {"mtp"}
    assert stats.drafted >= (stats.steps - 1) * k * 0.9  # every step drafts k (the last may have less room)
    assert stats.acceptance_rate > 0.6, "the NextN layers predict the trunk's choice most of the time"
    assert stats.accepted < stats.drafted, "the trunk sometimes writes another token: drafts are rejected"
    assert {t.proposer for t in tokens if t.source == "draft"} == {"mtp"}


def test_drafts_stop_at_the_number_of_chained_layers(mtp_files):
    target, heads = load(mtp_files["chained"])
    try:
        assert heads.depth == 3
        _, stats = generate(target, MtpProposer(NextnDraft(heads), SamplingSettings()), 8, target.tokenize(PROMPT))
        assert max(n for n, count in enumerate(stats.draft_lengths) if count) == 3
    finally:
        heads.close()
        target.close()


def test_a_conversation_continued_keeps_greedy_equal_to_plain(loaded):
    """The second turn's prompt extends the first's text: the caches keep what they share
    with it and read the rest from the target's kept hidden states."""
    target, heads = loaded
    draft = NextnDraft(heads)
    first = target.tokenize(PROMPT)
    request = GenerationRequest(max_tokens=24)
    reply, _ = generate(target, MtpProposer(draft, SamplingSettings()), 3, first, request)
    second = first + [t.id for t in reply][:-3] + target.tokenize(" And so", add_special=False)
    tokens, stats = generate(target, MtpProposer(draft, SamplingSettings()), 3, second, request)
    plain, _ = generate(target, NoProposer(), 0, second, request)
    assert [t.id for t in tokens] == [t.id for t in plain]
    assert stats.accepted > 0


def test_seeded_sampling_with_mtp_drafts_writes_plain_sampling_s_tokens(loaded):
    target, heads = loaded
    prompt = target.tokenize(PROMPT)
    settings = SamplingSettings(temperature=0.8, top_k=40)
    request = GenerationRequest(max_tokens=32, sampling=settings, seed=7)
    plain, _ = generate(target, NoProposer(), 0, prompt, request)
    tokens, stats = generate(target, MtpProposer(NextnDraft(heads), settings, seed=7), 3, prompt, request)
    assert [t.id for t in tokens] == [t.id for t in plain]
    assert stats.accepted > 0


# --- a hybrid target (Qwen3.5: gated delta net layers beside attention layers) ---------------------


def test_a_hybrid_target_without_state_snapshots_decodes_again_to_rewind(mtp_files):
    """A recurrent layer's state holds every token it read: without snapshots llama.cpp cannot
    take the last tokens back, so a rewind empties the cache and decodes the kept tokens again
    (greedy still equals plain), and the target says why drafting on it does not pay."""
    target, heads = load(mtp_files["hybrid"])
    try:
        assert target.recurrent and target.max_rewind == 0
        assert "without snapshots" in target.rewind_problem
        prompt = target.tokenize(PROMPT)
        plain, _ = generate(target, NoProposer(), 0, prompt)
        tokens, stats = generate(target, MtpProposer(NextnDraft(heads), SamplingSettings()), 2, prompt)
        assert [t.id for t in tokens] == [t.id for t in plain]
        assert stats.accepted < stats.drafted, "a draft was rejected, and taken back by decoding again"
    finally:
        heads.close()
        target.close()


@pytest.mark.parametrize("k", [1, 3])
def test_with_snapshots_a_hybrid_target_removes_rejected_drafts_and_greedy_equals_plain(mtp_files, k):
    target, heads = load(mtp_files["hybrid"], snapshots=3)
    try:
        prompt = target.tokenize(PROMPT)
        plain, _ = generate(target, NoProposer(), 0, prompt)
        tokens, stats = generate(target, MtpProposer(NextnDraft(heads), SamplingSettings()), k, prompt)
        assert [t.id for t in tokens] == [t.id for t in plain]
        assert 0 < stats.accepted < stats.drafted, "some drafts were rejected, and their states removed"
    finally:
        heads.close()
        target.close()
