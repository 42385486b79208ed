"""Property tests: the verifier and the n-gram proposer on random token streams and
random distributions. Whatever hypothesis draws, the results stay within the rules."""

from __future__ import annotations

import numpy as np
from helpers import RecordingRows, prob
from hypothesis import given, settings
from hypothesis import strategies as st

from specli.decode.ngram import EXTENT_LIMIT, MAX_OCCURRENCES, RECENCY, NGramProposer
from specli.decode.sampling import Distribution, keyed_choice, verify_greedy, verify_keyed

VOCAB = 6
PROPERTY_SETTINGS = settings(max_examples=300, deadline=None)

tokens = st.integers(min_value=0, max_value=VOCAB - 1)
weights = st.lists(st.integers(min_value=0, max_value=9), min_size=VOCAB, max_size=VOCAB).filter(any)


def distribution(raw: list[int]) -> Distribution:
    probs = np.asarray(raw, dtype=np.float64)
    ids = np.flatnonzero(probs)
    return Distribution(ids, probs[ids] / probs[ids].sum())


# --- greedy verification -------------------------------------------------------


def reference_greedy(draft: list[int], argmax: list[int]) -> tuple[int, int]:
    accepted = 0
    while accepted < len(draft) and draft[accepted] == argmax[accepted]:
        accepted += 1
    return accepted, argmax[accepted]


@st.composite
def greedy_cases(draw):
    draft = draw(st.lists(tokens, max_size=10))
    # Small integer logits: ties happen, and argmax takes the first best, as llama.cpp's would.
    rows = draw(st.lists(st.lists(st.integers(-3, 3), min_size=VOCAB, max_size=VOCAB), min_size=len(draft) + 1,
                         max_size=len(draft) + 1))
    if draft and draw(st.booleans()):  # make agreement likely: copy the target's choices into the draft
        draft = [int(np.argmax(row)) for row in rows[: len(draft)]]
        if draw(st.booleans()):
            draft[draw(st.integers(0, len(draft) - 1))] = draw(tokens)
    return draft, np.asarray(rows, dtype=np.float32)


@PROPERTY_SETTINGS
@given(greedy_cases())
def test_greedy_verification_matches_a_reference_loop(case):
    draft, logits = case
    rows = RecordingRows(logits)
    accepted, written = verify_greedy(draft, rows)
    assert (accepted, written) == reference_greedy(draft, [int(np.argmax(row)) for row in logits])
    assert 0 <= accepted <= len(draft)
    assert set(rows.read) <= set(range(accepted + 1)), "no row after the first disagreement is read"


# --- keyed sampling ---------------------------------------------------------


@st.composite
def keyed_cases(draw):
    k = draw(st.integers(min_value=0, max_value=6))
    targets = [distribution(draw(weights)) for _ in range(k + 1)]
    drafted = [draw(tokens) for _ in range(k)]
    return drafted, targets, draw(st.integers(min_value=0, max_value=2**63)), draw(st.integers(0, 10_000))


@PROPERTY_SETTINGS
@given(keyed_cases())
def test_keyed_verification_writes_the_targets_own_draws(case):
    """Whatever the draft proposed, the committed tokens are the target's keyed draws at
    their positions: the accepted prefix equals them, and so does the written token."""
    drafted, targets, seed, position = case
    accepted, written = verify_keyed(drafted, targets, seed, position)
    own = [keyed_choice(p, seed, position + i) for i, p in enumerate(targets)]
    assert drafted[:accepted] == own[:accepted]
    assert written == own[accepted]
    assert accepted == len(drafted) or drafted[accepted] != own[accepted]
    assert prob(targets[accepted], written) > 0, "the written token is in the target's support"


# --- n-gram proposer ----------------------------------------------------------


def reference_ngram(sequence: list[int], max_tokens: int, max_n: int, min_n: int) -> list[int]:
    """From scratch: the earlier occurrences of the longest suffix n-gram (the latest
    MAX_OCCURRENCES), and of them those whose match reaches furthest back, each with what
    followed it, continued periodically past the end of the sequence; position by position
    the occurrences that agree so far vote, the latest weighing 1 and each older one RECENCY
    times the next, ties to the later one."""
    length = len(sequence)
    if max_tokens <= 0:
        return []
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = sequence[length - n :]
        starts = [start for start in range(length - 1, n - 1, -1) if sequence[start - n : start] == suffix]
        if not starts:
            continue
        starts = starts[:MAX_OCCURRENCES]  # latest first

        def extent(start: int) -> int:
            m = n
            while m < min(start, EXTENT_LIMIT) and sequence[start - m - 1] == sequence[length - m - 1]:
                m += 1
            return m

        longest = max(extent(start) for start in starts)
        continuations = []
        for start in (start for start in starts if extent(start) == longest):
            extended = list(sequence)
            while len(extended) < start + max_tokens:
                extended.append(extended[len(extended) - (length - start)])
            continuations.append(extended[start : start + max_tokens])
        alive = list(range(len(continuations)))
        draft = []
        for position in range(max_tokens):
            weight: dict[int, float] = {}
            for rank in alive:
                token = continuations[rank][position]
                weight[token] = weight.get(token, 0.0) + RECENCY**rank
            best = max(weight.values())
            token = next(continuations[rank][position] for rank in alive if weight[continuations[rank][position]] == best)
            draft.append(token)
            alive = [rank for rank in alive if continuations[rank][position] == token]
        return draft
    return []


streams = st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=60)
orders = st.integers(min_value=1, max_value=4).flatmap(lambda high: st.tuples(st.just(high), st.integers(1, high)))


@PROPERTY_SETTINGS
@given(streams, orders, st.integers(min_value=0, max_value=10))
def test_ngram_proposals_continue_an_earlier_occurrence(sequence, order, max_tokens):
    max_n, min_n = order
    proposer = NGramProposer(lengths=tuple(range(min_n, max_n + 1)))
    proposer.prepare(sequence)
    proposal = proposer.propose(sequence, max_tokens).tokens
    assert len(proposal) <= max_tokens
    assert proposal == reference_ngram(sequence, max_tokens, max_n, min_n)
    if proposal:
        n = proposer.propose(sequence, max_tokens).key
        assert min_n <= n <= max_n
        suffix = sequence[len(sequence) - n :]
        assert any(sequence[s - n : s] == suffix for s in range(n, len(sequence))), "the n-gram occurred before"


copied_streams = st.tuples(streams, st.integers(min_value=0, max_value=60), streams).map(
    lambda parts: parts[0] + parts[2] + parts[0][: parts[1]]  # a passage, other text, part of a copy
)


@PROPERTY_SETTINGS
@given(copied_streams, orders)
def test_ngram_extent_is_how_far_back_the_match_really_goes(sequence, order):
    max_n, min_n = order
    proposer = NGramProposer(lengths=tuple(range(min_n, max_n + 1)))
    proposer.prepare(sequence)
    proposal = proposer.propose(sequence, 1)
    if proposal.tokens:
        n, length = proposal.key, len(sequence)
        # The furthest any of the latest MAX_OCCURRENCES occurrences matches back (the voters').
        starts = [s for s in range(length - 1, n - 1, -1) if sequence[s - n : s] == sequence[length - n :]]
        extent = 0
        for start in starts[:MAX_OCCURRENCES]:
            m = n
            while m < start and sequence[start - m - 1] == sequence[length - m - 1]:
                m += 1
            extent = max(extent, m)
        assert any(sequence[s] == proposal.tokens[0] for s in starts[:MAX_OCCURRENCES]), "an occurrence's next token"
        assert proposer.last_match_extent == extent
        # Only a match of the longest n is a copy in progress, whose extent the policy uses.
        assert proposal.extent == (extent if n == max_n else 0)


@PROPERTY_SETTINGS
@given(streams, orders, st.integers(min_value=1, max_value=8), st.integers(min_value=1, max_value=60))
def test_ngram_index_grown_step_by_step_answers_like_a_fresh_one(sequence, order, max_tokens, prompt_length):
    """The engine prepares the prompt once, then proposes on ever longer sequences."""
    max_n, min_n = order
    prompt_length = min(prompt_length, len(sequence))
    incremental = NGramProposer(lengths=tuple(range(min_n, max_n + 1)))
    incremental.prepare(sequence[:prompt_length])
    for end in range(prompt_length, len(sequence) + 1):
        fresh = NGramProposer(lengths=tuple(range(min_n, max_n + 1)))
        fresh.prepare(sequence[:end])
        grown = incremental.propose(sequence[:end], max_tokens)
        assert grown.tokens == fresh.propose(sequence[:end], max_tokens).tokens
        assert grown.key == fresh.propose(sequence[:end], max_tokens).key
        assert grown.extent == fresh.propose(sequence[:end], max_tokens).extent
