"""Logprobs under speculation: each written token's log-softmax under the target's raw row
(before temperature, penalties and masks), taken from the verify rows the engine decodes
anyway. On a real model (Gemma 3 270M) they are plain decoding's for the same tokens: bit for
bit under --exact, and within the batch drift the README gives without it; grammar-forced
tokens get theirs too."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import generation

from specli.comparison import load_workloads
from specli.decode.constraint import Constraint
from specli.decode.logprobs import MAX_TOP, token_logprob
from specli.decode.request import DraftKind, GenerationRequest
from specli.decode.sampling import SamplingSettings
from specli.prompt import prompt_tokens

# Plain decoding's logprob against a drafted run's for the same token, on this CPU build over
# 18 prompts (README, "Logprobs"): the chosen token's differ by a median of 0.001 and at most
# 0.27, the alternatives' by a median of 0.05 and at most 1.16. A verify batch rounds its rows
# otherwise than a one-token decode; a row read at the wrong position would be nats away.
DRIFT_CHOSEN, DRIFT_ALTERNATIVE = 0.3, 1.2
MEDIAN_CHOSEN, MEDIAN_ALTERNATIVE = 0.01, 0.1
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                            "city": {"type": "string", "enum": ["Paris", "London", "Rome"]}},
          "required": ["name", "age", "city"]}


# --- the numbers ---------------------------------------------------------------------------


def test_a_tokens_logprob_is_the_log_softmax_of_its_row():
    rng = np.random.default_rng(3)
    row = (rng.standard_normal(5000) * 4).astype(np.float32)
    exact = row.astype(np.float64) - np.log(np.exp(row.astype(np.float64)).sum())
    for token in (0, 17, int(np.argmax(row))):
        assert token_logprob(row, token).logprob == pytest.approx(exact[token], abs=1e-9)
    everything = token_logprob(row, 5, top=row.size)
    assert np.exp([lp for _, lp in everything.top]).sum() == pytest.approx(1.0, abs=1e-9)


def test_the_alternatives_are_the_best_first_ties_by_id():
    row = np.array([1.0, 3.0, 2.0, 3.0, -1.0, 2.0], dtype=np.float32)
    top = token_logprob(row, 4, top=3).top
    assert [token for token, _ in top] == [1, 3, 2], "3.0 twice: the lower id first; then the first of the 2.0s"
    assert top[0][1] == top[1][1] > top[2][1]
    assert token_logprob(row, 4).top == ()
    assert len(token_logprob(row, 0, top=MAX_TOP).top) == row.size, "never more than the vocabulary"


# --- on the real model ---------------------------------------------------------------------


def code_edit(session) -> list[int]:
    workload = next(w for w in load_workloads() if w.name == "code-edit")
    return prompt_tokens(session.target, workload.prompt, chat=workload.chat)


def scored(session, tokens, request: GenerationRequest):
    """(id, logprob, top, proposer) of each token one generation wrote, from an empty cache
    (a prompt decoded whole, as `specli run` decodes it)."""
    session.clear_cache()
    written, _ = generation(session.engine_for(request), tokens)
    assert all(token.logprob is not None for token in written)
    return [(t.id, t.logprob.logprob, t.logprob.top, t.proposer) for t in written]


@pytest.mark.slow
def test_drafted_logprobs_are_plain_decodings_bit_for_bit_under_exact(gemma_exact_session):
    session = gemma_exact_session
    tokens = code_edit(session)
    request = GenerationRequest(max_tokens=60, exact=True, logprobs=3)
    drafted = scored(session, tokens, replace(request, draft=DraftKind.NGRAM, draft_tokens=8))
    plain = scored(session, tokens, replace(request, draft=DraftKind.NONE))
    assert any(proposer == "ngram" for *_, proposer in drafted), "something was drafted and kept"
    assert [row[:3] for row in drafted] == [row[:3] for row in plain]


@pytest.mark.slow
def test_drafted_logprobs_are_plain_decodings_within_the_batch_drift(gemma_session):
    session = gemma_session
    tokens = code_edit(session)
    request = GenerationRequest(max_tokens=60, logprobs=2)
    drafted = scored(session, tokens, replace(request, draft=DraftKind.NGRAM, draft_tokens=8))
    plain = scored(session, tokens, replace(request, draft=DraftKind.NONE))
    assert sum(proposer == "ngram" for *_, proposer in drafted) >= 10
    chosen, alternatives = [], []
    for (token, logprob, top, _), (plain_token, plain_logprob, plain_top, _) in zip(drafted, plain):
        if token != plain_token:
            break  # a near-tie flipped: the texts part here
        chosen.append(abs(logprob - plain_logprob))
        plain_by_id = dict(plain_top)
        alternatives += [abs(value - plain_by_id[i]) for i, value in top if i in plain_by_id]
    same = len(chosen)
    assert max(chosen) <= DRIFT_CHOSEN and np.median(chosen) <= MEDIAN_CHOSEN, chosen
    assert max(alternatives) <= DRIFT_ALTERNATIVE and np.median(alternatives) <= MEDIAN_ALTERNATIVE, alternatives
    assert same >= 30


@pytest.mark.slow
def test_forced_tokens_report_their_logprobs_too(gemma_exact_session):
    """Under a schema the grammar forces tokens; asked for logprobs, their rows ask for logits
    as well, and they are plain decoding's (which forces nothing: one token a step)."""
    session = gemma_exact_session
    tokens = prompt_tokens(session.target, "Ada Lovelace, 36, lives in London.\nAs JSON:\n", chat=False)
    request = GenerationRequest(max_tokens=40, exact=True, logprobs=1,
                                constraint=Constraint.json_schema(SCHEMA, "schema"))
    drafted = scored(session, tokens, replace(request, draft=DraftKind.NGRAM, draft_tokens=4))
    plain = scored(session, tokens, replace(request, draft=DraftKind.NONE))
    assert any(proposer == "grammar" for *_, proposer in drafted)
    assert [row[:3] for row in drafted] == [row[:3] for row in plain]
    assert all(logprob <= 0.0 for _, logprob, _, _ in drafted)


@pytest.mark.slow
def test_logprobs_are_the_models_before_temperature_and_penalties(gemma_session):
    """The first token's row is the prompt's, whatever the sampling: its alternatives are the
    same numbers greedy, sampled hot, and with a penalty and a bias."""
    session = gemma_session
    tokens = code_edit(session)
    greedy = scored(session, tokens, GenerationRequest(max_tokens=1, draft=DraftKind.NONE, logprobs=5))
    biased = SamplingSettings(temperature=1.5, presence_penalty=1.0, logit_bias=((greedy[0][0], -50.0),))
    hot = scored(session, tokens, GenerationRequest(max_tokens=1, draft=DraftKind.NONE, logprobs=5,
                                                    sampling=biased, seed=11))
    assert hot[0][2] == greedy[0][2]
    assert hot[0][0] != greedy[0][0], "the bias moved the choice, not the reported numbers"
    assert hot[0][1] == dict(hot[0][2]).get(hot[0][0], hot[0][1])


@pytest.mark.slow
def test_no_logprobs_unless_asked(gemma_session):
    session = gemma_session
    session.clear_cache()
    written, _ = generation(session.engine_for(GenerationRequest(max_tokens=8)), code_edit(session))
    assert written and all(token.logprob is None for token in written)
