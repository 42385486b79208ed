"""Speculative decoding on a real model (Gemma 3 270M) gives the target's own greedy output.

llama.cpp's batched and one-token kernels round slightly differently, so a batched verify
can flip the argmax where the target's two best logits are nearly tied. The requirement:
identical output, or a first divergence only at such a near-tie — measured on the plain
(one-token) path, where the margin is what decides.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_lossless, generated

from specli.comparison import plain_greedy
from specli.decode.draft_model import DraftModel, DraftModelProposer
from specli.decode.engine import Engine
from specli.decode.events import Token
from specli.decode.ngram import NGramProposer
from specli.decode.policy import FixedDraftPolicy
from specli.decode.proposers import NoProposer
from specli.decode.request import GenerationRequest
from specli.decode.sampling import SamplingSettings
from specli.errors import VocabMismatchError
from specli.llama.backend import LoadSettings, Model
from specli.llama.vocab import check_vocab_compatible

pytestmark = pytest.mark.slow  # loads real models

MAX_TOKENS = 40
PROMPTS = [
    "Copy this list exactly: red, green, blue, cyan, magenta, yellow. Copy: red, green,",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The history of the printing press begins",
]


@pytest.fixture(scope="module")
def plain_runs(gemma_model):
    """Per prompt: the one-token-at-a-time greedy output and the top-two margin at each step."""
    runs = {}
    for prompt in PROMPTS:
        tokens = gemma_model.tokenize(prompt)
        runs[prompt] = (tokens, *plain_greedy(gemma_model, tokens, MAX_TOKENS))
    return runs


def speculative(target, proposer, prompt_tokens, k):
    engine = Engine(target, proposer, FixedDraftPolicy(k), GenerationRequest(max_tokens=MAX_TOKENS))
    return generated(engine, prompt_tokens)


@pytest.mark.parametrize("k", [1, 4, 16])
@pytest.mark.parametrize("kind", ["none", "ngram", "self"])
def test_greedy_speculative_output_is_the_targets(gemma_model, gemma_draft_model, plain_runs, kind, k):
    identical = 0
    rejections = 0
    for prompt in PROMPTS:
        tokens, plain, margins = plain_runs[prompt]
        if kind == "none":
            proposer = NoProposer()
        elif kind == "ngram":
            proposer = NGramProposer()
        else:
            proposer = DraftModelProposer(DraftModel(gemma_draft_model), SamplingSettings(), 0)
        output, stats = speculative(gemma_model, proposer, tokens, k)
        assert_lossless(plain, margins, output)
        identical += output == plain
        rejections += stats.drafted - stats.accepted
        if kind == "none":
            # Plain decoding is the reference's own path (whole-prompt decode, then one token
            # at a time), so it must match exactly, near-ties included.
            assert stats.drafted == 0 and output == plain
        elif kind == "self":
            assert stats.drafted > 0
            # The draft model's decodes are timed apart from its loop (Python's share of a step).
            assert 0 < stats.draft_decode_seconds < stats.draft_seconds
    # Which near-ties flip depends on the batch shapes (K, where steps start); every prompt
    # has ties under 0.3 in its first 40 tokens, and at least one must still come out whole.
    assert identical >= 1, "batched kernels may flip near-ties, not every output"
    if kind == "ngram" and k > 1:
        assert rejections > 0, "the n-gram runs must exercise KV rollback"


def test_ngram_rejections_leave_the_kv_cache_consistent(gemma_model, plain_runs):
    """After a run full of rejections, the cache holds exactly the committed tokens."""
    tokens, plain, _ = plain_runs[PROMPTS[2]]
    proposer = NGramProposer()
    engine = Engine(gemma_model, proposer, FixedDraftPolicy(8), GenerationRequest(max_tokens=MAX_TOKENS))
    events = list(engine.generate(tokens))
    out = [e.id for e in events if isinstance(e, Token)]
    stats = events[-1].stats
    assert stats.drafted > stats.accepted
    assert gemma_model.n_past == len(tokens) + len(out) - 1
    # The next plain step from the cache equals a fresh prefill of the same sequence.
    cached_next = int(np.argmax(gemma_model.decode([out[-1]])[-1]))
    gemma_model.rewind(0)
    fresh_next = int(np.argmax(gemma_model.decode(tokens + out)[-1]))
    assert cached_next == fresh_next


def test_logits_rows_follow_each_decode_as_the_buffer_grows(gemma_path):
    """decode() returns a view of llama.cpp's output buffer, reused between decodes: each
    call must still see exactly its own rows, also after the buffer has grown."""
    with Model(gemma_path, LoadSettings(ctx_size=512)) as model:
        tokens = model.tokenize("The quick brown fox jumps over the lazy dog. " * 8)
        model.decode(tokens[:8])
        one = model.decode(tokens[8:9], all_logits=True).copy()
        model.rewind(8)
        three = model.decode(tokens[8:11], all_logits=True).copy()
        assert one.shape == (1, model.n_vocab) and three.shape == (3, model.n_vocab)
        model.rewind(8)
        grown = model.decode(tokens[8:60], all_logits=True).copy()  # more rows than ever before
        assert grown.shape == (52, model.n_vocab) and np.isfinite(grown).all()
        # The same batch gives the same rows, bit for bit, whichever decode came before.
        for batch, expected in ((tokens[8:9], one), (tokens[8:11], three), (tokens[8:60], grown), (tokens[8:9], one)):
            model.rewind(8)
            np.testing.assert_array_equal(model.decode(batch, all_logits=True), expected)


def test_self_draft_accepts_everything_without_repacking(gemma_path, plain_runs):
    """With repacking off, the draft (one-token kernels) and the verify batch agree."""
    settings = LoadSettings(ctx_size=1024, repack=False)
    with Model(gemma_path, settings) as target, Model(gemma_path, settings) as draft:
        tokens, _, _ = plain_runs[PROMPTS[0]]
        proposer = DraftModelProposer(DraftModel(draft), SamplingSettings(), np.random.default_rng(0))
        _, stats = speculative(target, proposer, tokens, 4)
    assert stats.acceptance_rate > 0.9


def test_vocab_mismatch_between_gemma_and_smollm_is_named(gemma_path, smollm_path):
    with Model(gemma_path, LoadSettings(ctx_size=256)) as gemma, Model(smollm_path, LoadSettings(ctx_size=256)) as smol:
        with pytest.raises(VocabMismatchError) as caught:
            check_vocab_compatible(gemma, smol)
    message = caught.value.message
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in message and "gemma-3-270m" in message
    assert "tokenizers" in message and "SPM" in message and "BPE" in message


def test_chat_template_is_applied_for_smollm(smollm_path):
    from specli.prompt import prompt_tokens

    with Model(smollm_path, LoadSettings(ctx_size=256)) as smol:
        assert smol.chat_template() is not None
        chat = prompt_tokens(smol, "Hi", system="Be brief.")
        raw = prompt_tokens(smol, "Hi", chat=False)
        text = b"".join(smol.piece(t, special=True) for t in chat).decode()
        assert smol.piece(chat[0]) == b"" and smol.piece(chat[0], special=True) == b"<|im_start|>"
    assert "<|im_start|>system\nBe brief.<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    assert len(raw) < len(chat)


def test_sampling_on_a_real_model_is_reproducible_with_a_seed(gemma_model, plain_runs):
    tokens, _, _ = plain_runs[PROMPTS[2]]
    settings = SamplingSettings(temperature=0.9, top_k=40, top_p=0.95, min_p=0.05)
    outputs = []
    for _ in range(2):
        engine = Engine(gemma_model, NGramProposer(), FixedDraftPolicy(4), GenerationRequest(24, settings, seed=1234))
        outputs.append([e.id for e in engine.generate(tokens) if isinstance(e, Token)])
    assert outputs[0] == outputs[1]


def test_stored_costs_are_read_only_by_the_same_build(smollm_path, monkeypatch, quiet_calibration):
    """A reinstall with other flags (CUDA, AVX-512) decodes at other speeds: the stored
    verify costs of the old build must not steer the new one."""
    from specli import pricing
    from specli.session import SessionSpec, open_session

    with open_session(SessionSpec(smollm_path, None, LoadSettings(ctx_size=64))) as opened:
        assert opened.pricing.costs(measure=False).source == "prior"
        calibrated = opened.pricing.calibrate()
        assert calibrated.source == "calibrated" and 1 in calibrated.verify and 49 in calibrated.verify
        assert opened.pricing.costs() == calibrated
        monkeypatch.setattr(pricing.keys, "compute_fingerprint", lambda: "another-build")
        assert opened.pricing.costs(measure=False).source == "prior"


def test_calibration_prices_a_draft_model_by_its_own_decode(tmp_path, quiet_calibration):
    """The synthetic prefix pair's files are about the same size (4 and 2 tiny layers over one
    large vocabulary), so the prior prices a draft token like a target decode; calibration
    times the draft itself, as it must over --rpc, where the target's decodes also pay the
    network."""
    from tests.support.synthetic import write_tiny_pair
    from specli.session import SessionSpec, open_session

    target_path, draft_path = write_tiny_pair(tmp_path)
    spec = SessionSpec(target_path, draft_path, LoadSettings(ctx_size=64), LoadSettings(ctx_size=64))
    with open_session(spec) as opened:
        by_size = opened.pricing.costs(measure=False, kind="model").draft_per_token
        assert by_size > 0.9  # the prior: file sizes, in units of a one-token verify
        calibrated = opened.pricing.calibrate()
        stored = opened.pricing.store.get(opened.pricing.drafter("model").key)
        assert isinstance(stored, float) and 0 < stored < 1  # seconds, as timed
        assert calibrated.draft_per_token == stored
