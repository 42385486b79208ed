"""The speculative loop on scripted fake models: greedy output equals plain decoding,
the KV caches stay in sync through rejections, and stops and limits behave."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakeModel, plain_greedy
from helpers import generation

from specli.decode.draft_model import DraftModel, DraftModelProposer
from specli.decode.engine import Engine
from specli.decode.events import Token
from specli.decode.ngram import NGramProposer
from specli.decode.policy import FixedDraftPolicy
from specli.decode.proposers import NoProposer
from specli.decode.request import GenerationRequest
from specli.decode.sampling import SamplingSettings

PROMPTS = [[1, 2, 3], [5], [3, 3, 3, 3, 7, 1, 2, 3, 3, 3]]


def draft_proposer(noise: float, seed: int = 0) -> DraftModelProposer:
    draft = FakeModel(seed=0, noise_seed=seed + 1, noise=noise)
    return DraftModelProposer(DraftModel(draft), SamplingSettings(), seed)


@pytest.mark.parametrize("k", [1, 4, 16])
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("noise", [0.0, 1.0, 4.0])
def test_greedy_with_draft_model_equals_plain_decoding(k, prompt, noise):
    target = FakeModel(seed=0)
    proposer = draft_proposer(noise)
    engine = Engine(target, proposer, FixedDraftPolicy(k), GenerationRequest(max_tokens=60))
    tokens, finished = generation(engine, prompt)
    assert [t.id for t in tokens] == plain_greedy(FakeModel(seed=0), prompt, 60)
    assert finished.reason == "length"
    # The target's cache holds exactly the committed sequence but its last token.
    assert target.kv == prompt + [t.id for t in tokens][:-1]
    # The draft's cache never runs ahead of the committed sequence by more than K tokens.
    committed = prompt + [t.id for t in tokens]
    assert proposer.draft.model.kv[: len(committed)] == committed[: len(proposer.draft.model.kv)]


def test_rejections_happen_and_are_rewound():
    target = FakeModel(seed=0)
    engine = Engine(target, draft_proposer(noise=2.5), FixedDraftPolicy(4), GenerationRequest(max_tokens=80))
    tokens, finished = generation(engine, [1, 2, 3])
    stats = finished.stats
    assert 0 < stats.accepted < stats.drafted, "the noisy draft must be partly rejected"
    # Each step reads its accepted rows and the one that writes the target's token, no more.
    assert stats.rows_read == stats.accepted + stats.steps
    assert 0 < stats.read_seconds < stats.seconds
    assert {t.source for t in tokens} == {"draft", "target"}
    assert max(target.batch_sizes[1:]) == 5  # [last] + 4 draft tokens in one decode
    assert [t.id for t in tokens] == plain_greedy(FakeModel(seed=0), [1, 2, 3], 80)


def test_perfect_draft_is_always_accepted_and_bonus_tokens_are_written():
    target = FakeModel(seed=0)
    engine = Engine(target, draft_proposer(noise=0.0), FixedDraftPolicy(4), GenerationRequest(max_tokens=50))
    tokens, finished = generation(engine, [1, 2])
    assert finished.stats.acceptance_rate == 1.0
    sources = [t.source for t in tokens]
    # The prompt's decode writes the first token; then each step keeps 4 draft tokens
    # and the target writes the fifth.
    assert sources[:11] == ["target"] + ["draft"] * 4 + ["target"] + ["draft"] * 4 + ["target"]
    assert finished.stats.steps == 10 and finished.stats.first_token_from_prefill


@pytest.mark.parametrize("k", [1, 4, 16])
def test_greedy_with_ngram_equals_plain_decoding(k):
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    target = FakeModel(seed=3, order=1)
    engine = Engine(target, NGramProposer(), FixedDraftPolicy(k), GenerationRequest(max_tokens=60))
    tokens, finished = generation(engine, prompt)
    assert [t.id for t in tokens] == plain_greedy(FakeModel(seed=3, order=1), prompt, 60)
    assert finished.stats.drafted > 0


def test_draft_none_is_plain_decoding_one_token_per_step():
    target = FakeModel(seed=0)
    engine = Engine(target, NoProposer(), FixedDraftPolicy(8), GenerationRequest(max_tokens=30))
    tokens, finished = generation(engine, [4, 5])
    assert [t.id for t in tokens] == plain_greedy(FakeModel(seed=0), [4, 5], 30)
    assert set(target.batch_sizes[1:]) == {1}
    assert all(t.source == "target" for t in tokens)
    # The prompt's decode writes the first token, each of the 29 steps one more.
    assert finished.stats.drafted == 0 and finished.stats.steps == 29


def test_end_of_generation_stops_even_inside_an_accepted_draft():
    reference = plain_greedy(FakeModel(seed=0), [1, 2, 3], 40)
    eog = reference[7]
    expected = plain_greedy(FakeModel(seed=0, eog=eog), [1, 2, 3], 40)
    target = FakeModel(seed=0, eog=eog)
    draft = FakeModel(seed=0, eog=eog)
    proposer = DraftModelProposer(DraftModel(draft), SamplingSettings(), 0)
    engine = Engine(target, proposer, FixedDraftPolicy(16), GenerationRequest(max_tokens=40))
    tokens, finished = generation(engine, [1, 2, 3])
    assert [t.id for t in tokens] == expected
    assert finished.reason == "eog"


def test_max_tokens_is_exact_with_long_drafts():
    engine = Engine(FakeModel(), draft_proposer(0.0), FixedDraftPolicy(16), GenerationRequest(max_tokens=7))
    tokens, finished = generation(engine, [1])
    assert len(tokens) == 7 and finished.stats.tokens == 7


def test_context_full_stops_with_partial_output():
    target = FakeModel(n_ctx=20)
    engine = Engine(target, draft_proposer(0.0), FixedDraftPolicy(8), GenerationRequest(max_tokens=100))
    tokens, finished = generation(engine, [1, 2, 3])
    assert finished.reason == "context"
    assert len(tokens) == 20 - 3 + 1  # every position filled, plus the last written token
    assert [t.id for t in tokens] == plain_greedy(FakeModel(), [1, 2, 3], len(tokens))


def test_stop_string_ends_generation_and_is_not_released():
    reference = plain_greedy(FakeModel(seed=0), [1, 2, 3], 40)
    text = "".join(chr(ord("a") + t) for t in reference)
    stop = text[10:13]
    engine = Engine(
        FakeModel(), draft_proposer(1.0), FixedDraftPolicy(4), GenerationRequest(max_tokens=40, stop=(stop,))
    )
    events = list(engine.generate([1, 2, 3]))
    released = "".join(e.text for e in events if isinstance(e, Token))
    assert released == text[: text.find(stop)]
    assert events[-1].reason == "stop"


def test_no_prompt_tokens_and_a_prompt_longer_than_the_context_are_refused():
    from specli.errors import PromptError

    engine = Engine(FakeModel(n_ctx=8), NoProposer(), FixedDraftPolicy(1), GenerationRequest())
    with pytest.raises(ValueError, match="at least one prompt token"):
        list(engine.generate([]))
    with pytest.raises(PromptError, match="context holds 8"):
        list(engine.generate(list(range(8))))


@pytest.mark.parametrize("make_proposer", [NoProposer, NGramProposer, lambda: draft_proposer(1.0)])
def test_a_second_generation_decodes_only_what_its_prompt_adds(make_proposer):
    """A chat's next turn: the target's cache keeps the shared prefix, and the output is
    what plain decoding writes for the whole conversation."""
    target = FakeModel(seed=0)
    engine = Engine(target, make_proposer(), FixedDraftPolicy(4), GenerationRequest(max_tokens=20))
    first, _ = generation(engine, [1, 2, 3])
    conversation = [1, 2, 3] + [t.id for t in first] + [7, 8]
    before = len(target.batch_sizes)
    second, _ = generation(engine, conversation)
    assert [t.id for t in second] == plain_greedy(FakeModel(seed=0), conversation, 20)
    # The first turn's last token never entered the cache: it and the two new ones are decoded.
    assert target.batch_sizes[before] == 3


def plain_greedy_penalised(model: FakeModel, prompt: list[int], max_tokens: int, penalty: float, last_n: int) -> list[int]:
    """Reference: llama.cpp's repetition penalty, one token at a time, written out by hand."""
    context, out = list(prompt), []
    while len(out) < max_tokens:
        logits = model.logits_after(context).astype(np.float64)
        for token in set(context[-last_n:]):
            logits[token] = logits[token] / penalty if logits[token] > 0 else logits[token] * penalty
        token = int(np.argmax(logits))
        context.append(token)
        out.append(token)
    return out


def penalised_draft() -> DraftModelProposer:
    draft = FakeModel(seed=2, order=1, n_vocab=8, noise_seed=1, noise=0.3)
    return DraftModelProposer(DraftModel(draft), SamplingSettings(repeat_penalty=1.8, repeat_last_n=6), 0)


@pytest.mark.parametrize("make_proposer", [NGramProposer, penalised_draft])
@pytest.mark.parametrize("k", [1, 4, 12])
def test_the_repeat_penalty_sees_draft_tokens_kept_earlier_in_the_same_step(make_proposer, k):
    """Each verified row is penalised for the text before its position, draft tokens of the
    same step included: the output is plain decoding's with the penalty."""
    settings = SamplingSettings(repeat_penalty=1.8, repeat_last_n=6)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    engine = Engine(FakeModel(seed=2, order=1, n_vocab=8), make_proposer(), FixedDraftPolicy(k),
                    GenerationRequest(max_tokens=50, sampling=settings))
    tokens, _ = generation(engine, prompt)
    expected = plain_greedy_penalised(FakeModel(seed=2, order=1, n_vocab=8), prompt, 50, 1.8, 6)
    assert [t.id for t in tokens] == expected
    assert expected != plain_greedy(FakeModel(seed=2, order=1, n_vocab=8), prompt, 50), "the penalty changed the text"
    assert engine.stats.accepted > 0


OPENAI_PENALTIES = [
    SamplingSettings(frequency_penalty=1.5),
    SamplingSettings(presence_penalty=2.0),
    SamplingSettings(logit_bias=((3, 4.0), (5, -100.0))),
    SamplingSettings(temperature=0.8, top_k=40, frequency_penalty=1.0, presence_penalty=0.5, logit_bias=((2, 1.5),)),
]


@pytest.mark.parametrize("settings", OPENAI_PENALTIES)
@pytest.mark.parametrize("make_proposer", [NGramProposer, lambda: draft_proposer(0.3)])
def test_openais_penalties_and_bias_keep_drafting_plain_decodings(settings, make_proposer):
    """frequency_penalty, presence_penalty and logit_bias change every verified row for the
    output before it (draft tokens of the same step included): greedy and seeded, drafting
    writes plain decoding's text, which the settings changed."""
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]

    def tokens(proposer, k: int, sampling: SamplingSettings) -> list[int]:
        request = GenerationRequest(max_tokens=50, sampling=sampling, seed=11)
        return [t.id for t in generation(Engine(FakeModel(seed=2, order=1, n_vocab=8), proposer, FixedDraftPolicy(k),
                                                request), prompt)[0]]

    plain = tokens(NoProposer(), 0, settings)
    assert plain != tokens(NoProposer(), 0, SamplingSettings(temperature=settings.temperature, top_k=settings.top_k))
    for k in (1, 4, 12):
        assert tokens(make_proposer(), k, settings) == plain, k
