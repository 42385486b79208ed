"""N-gram lookup: a proposer that drafts what followed earlier occurrences of the text's last
tokens, in the text so far and in other token sequences it is given (a Predicted Output, a
server's memory of recent answers)."""

from __future__ import annotations

import math
from typing import Sequence

from specli.decode.proposers import Proposal


class NGramProposer:
    """Prompt lookup: find the earlier occurrences of the sequence's last n tokens (the
    longest n first) and propose what followed them.

    Several occurrences vote (suffix decoding's idea): of the latest MAX_OCCURRENCES, those
    whose match reaches furthest back (a suffix tree's deepest node); at each drafted position
    the continuations still in agreement so far choose the next token by weight, the latest
    occurrence weighing 1, the one before RECENCY, then RECENCY², ...; the winning share is
    the proposal's `support` at that position, and occurrences that disagree drop out. Where
    a prompt repeats a layout with different values (records, tables, tool calls) they agree
    on the layout and split on the values, so the policy drafts up to the fork and no further.
    How many agree is evidence too (`agreeing`): a continuation that four earlier occurrences
    all took is likelier than one seen once. With one occurrence the proposal is what
    followed it, support 1 throughout.

    A longer match predicts better. The proposal's key is the n that matched (the policy
    keeps a record per key). A match of the longest n is a copy in progress, and the
    proposal's extent says how far back the voters' match really goes: often
    far more than 12 tokens, and the longer, the better it predicts. Committed tokens only
    ever grow, so the index is extended incrementally: each n-gram maps to the positions
    right after its latest MAX_OCCURRENCES occurrences.

    `references` are other token sequences to look in (the server's memory of recent
    answers), each a TokenIndex built once: their occurrences of the n-gram vote beside the
    committed text's, the deepest match first wherever it is. A `prediction` (a Predicted
    Output) is where the answer is expected to go, right after the prompt: it is indexed
    behind the prompt's last tokens, so it drafts the answer's opening too, and searched
    before the other references. A proposal it backs (one of its occurrences votes, on a
    match of PREDICTION_MATCH tokens or more) has the key PREDICTED: the client's claim is
    evidence of its own (`prior`), and the policy keeps a record of how it holds apart from
    lookup's. None of them is ever decoded: only what they propose and the target keeps is
    written.
    """

    name = "ngram"
    cheap = True
    translated = False
    depth = None
    LENGTHS = (12, 8, 6, 4, 3, 2, 1)

    def __init__(self, lengths: tuple[int, ...] = LENGTHS, references: Sequence[TokenIndex] = (),
                 prediction: Sequence[int] = ()) -> None:
        self.lengths = tuple(sorted(set(lengths), reverse=True))
        self.references = tuple(references)
        self.prediction = list(prediction)
        self._searched = self.references
        self._predicted: TokenIndex | None = None  # the prediction, behind the prompt's last tokens
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in self.lengths}
        self._indexed = 0  # n-grams ending before this position are in the index
        self.last_match_extent = 0  # how many tokens the last proposal's match really spans

    def prepare(self, prompt: list[int]) -> None:
        self._index = {n: {} for n in self.lengths}
        self._indexed = 0
        self._extend_index(prompt)
        if self.prediction:
            opening = prompt[-self.lengths[0] :]
            self._predicted = TokenIndex(opening + self.prediction, self.lengths)
            self._searched = (self._predicted, *self.references)

    def propose(self, tokens: list[int], most: int) -> Proposal:
        self._extend_index(tokens)
        self.last_match_extent = 0
        if most <= 0:
            return Proposal()
        end = len(tokens)
        for n in self.lengths:
            if n >= end:
                continue
            tail = tuple(tokens[end - n :])
            # Occurrences in the committed text (latest first), then in each reference.
            found: list[tuple[TokenIndex | None, int]] = [(None, start)
                                                          for start in reversed(self._index[n].get(tail) or [])]
            for reference in self._searched:
                # Once the answer has left the prediction, it drafts again only from a match
                # of PREDICTION_MATCH tokens: a shorter one is a coincidence, not the answer
                # coming back to it.
                if reference is self._predicted and n < PREDICTION_MATCH:
                    continue
                found += [(reference, start) for start in reversed(reference.find_all(tail))]
            if not found:
                continue
            # The occurrences whose match reaches furthest back vote (a suffix tree's deepest
            # node), wherever they are: in a copy, the text being copied; in a repeated layout,
            # its rows; in an edit, the prediction past the edited name, where the prompt's
            # original stops matching.
            extents = [_match_extent(tokens if reference is None else reference.tokens, start, tokens, end, n)
                       for reference, start in found]
            longest = max(extents)
            voters = [occurrence for occurrence, extent in zip(found, extents) if extent == longest]
            continuations = [_continuation(tokens, start, most) if reference is None
                             else reference.continuation(start, most) for reference, start in voters]
            draft, support, agreeing = _vote(continuations)
            if not draft:
                continue
            self.last_match_extent = longest
            predicted = self._predicted is not None and any(reference is self._predicted for reference, _ in voters)
            if predicted and longest >= PREDICTION_MATCH:
                return Proposal(draft, key=PREDICTED, extent=longest, proposer="ngram", support=support,
                                agreeing=agreeing)
            extent = longest if n == self.lengths[0] else 0
            return Proposal(draft, key=n, extent=extent, proposer="ngram", support=support, agreeing=agreeing)
        return Proposal()

    lookup = propose

    def behind(self, tokens: list[int]) -> int:
        return 0

    def _extend_index(self, tokens: list[int]) -> None:
        # Index n-grams ending at positions [indexed, len - 1): each has a known next token.
        last_end = len(tokens) - 1
        for end in range(self._indexed, last_end):
            for n in self.lengths:
                if n <= end + 1:
                    _remember(self._index[n], tuple(tokens[end + 1 - n : end + 1]), end + 1)
        self._indexed = max(self._indexed, last_end)

    @staticmethod
    def prior(key: object, context: int = 0) -> float:
        """Expected acceptance of a drafted token after a match of max(key, context) tokens
        (key: the match length n): 1 - (0.7·exp(-x/4.25) + 0.0075), 0.44 for one token,
        0.72 for four, 0.95 for twelve, 0.99 past 25. In a copy in progress the policy
        passes the match's extent plus the drafted tokens before the one judged. Fitted to
        recorded greedy outputs by `benchmarks/replay.py hazard`.

        A Predicted Output (key PREDICTED) is the client's claim about the answer: its match
        counts PREDICTION_EVIDENCE tokens longer, and a long one reaches a lower floor, so it
        drafts long from its first token on while the answer follows it."""
        if key is PREDICTED:
            length = context + PREDICTION_EVIDENCE
            return 1.0 - (HAZARD_SCALE * math.exp(-length / HAZARD_LENGTH) + PREDICTION_FLOOR)
        length = max(int(key), context)  # type: ignore[call-overload]
        return 1.0 - (HAZARD_SCALE * math.exp(-length / HAZARD_LENGTH) + HAZARD_FLOOR)


# A match's rejection hazard: HAZARD_SCALE·exp(-length / HAZARD_LENGTH) + HAZARD_FLOOR
# (NGramProposer.prior). The floor: even a long copy ends somewhere.
HAZARD_SCALE = 0.7
HAZARD_LENGTH = 4.25
HAZARD_FLOOR = 0.0075
# A Predicted Output's match counts this many tokens longer, down to a floor of its own: 0.96
# acceptance one token past an edit, 0.997 once a dozen follow it.
PREDICTION_EVIDENCE = 12
PREDICTION_FLOOR = 0.002
PREDICTION_MATCH = 3  # a shorter match in the prediction is a coincidence as likely as elsewhere


class _Predicted:
    """The key of a proposal that a Predicted Output backs (NGramProposer.prior)."""

    def __repr__(self) -> str:
        return "PREDICTED"


PREDICTED = _Predicted()
EXTENT_LIMIT = 256  # past this the hazard is the floor: no need to look further back
MAX_OCCURRENCES = 8  # the latest occurrences of an n-gram that vote on its continuation
RECENCY = 0.8  # an occurrence's vote against the next later one's (docs/design.md, "The n-gram prior")


def _remember(table: dict[tuple[int, ...], list[int]], gram: tuple[int, ...], position: int) -> None:
    """Note that `gram` is followed by the token at `position`; keep the latest MAX_OCCURRENCES."""
    starts = table.get(gram)
    if starts is None:
        table[gram] = [position]
        return
    starts.append(position)
    if len(starts) > MAX_OCCURRENCES:
        del starts[0]


def _vote(continuations: list[list[int]]) -> tuple[list[int], tuple[float, ...], tuple[int, ...]]:
    """(draft, support, agreeing) from the continuations of several occurrences, latest first.

    Position by position, the occurrences that agreed with every drafted token so far vote
    for the next one, weighted RECENCY**rank (rank 0: the latest); the heaviest token is
    drafted (the later occurrence's on a tie), its share of the vote is its support, and the
    occurrences that voted for it are its agreeing count."""
    if len(continuations) == 1:
        return continuations[0], (), ()
    weights = [RECENCY**rank for rank in range(len(continuations))]
    alive = list(range(len(continuations)))
    draft: list[int] = []
    support: list[float] = []
    agreeing: list[int] = []
    for position in range(max(len(c) for c in continuations)):
        votes: dict[int, float] = {}
        for rank in alive:
            continuation = continuations[rank]
            if position < len(continuation):
                token = continuation[position]
                votes[token] = votes.get(token, 0.0) + weights[rank]
        if not votes:
            break
        token = max(votes, key=votes.__getitem__)  # the first heaviest: the latest occurrence's
        draft.append(token)
        support.append(votes[token] / sum(votes.values()))
        alive = [rank for rank in alive if position < len(continuations[rank]) and continuations[rank][position] == token]
        agreeing.append(len(alive))
    return draft, tuple(support), tuple(agreeing)


def _match_extent(source: Sequence[int], start: int, tokens: list[int], end: int, n: int) -> int:
    """How long the match really is: the largest m (n <= m <= EXTENT_LIMIT) with
    source[start-m:start] == tokens[end-m:end], given that it holds for n."""
    m = n
    while m < EXTENT_LIMIT and start - m > 0 and end - m > 0:
        size = min(16, start - m, end - m, EXTENT_LIMIT - m)  # compare in slices, then token by token
        if source[start - m - size : start - m] == tokens[end - m - size : end - m]:
            m += size
            continue
        while m < min(start, end) and source[start - m - 1] == tokens[end - m - 1]:
            m += 1
        break
    return m


class TokenIndex:
    """A token sequence that n-gram lookup searches besides the committed text: each n-gram
    (of NGramProposer's lengths) maps to the positions right after its latest occurrences.
    `append` adds text at the end, SEPARATOR between texts keeps matches from spanning two."""

    SEPARATOR = -1

    def __init__(self, tokens: Sequence[int] = (), lengths: tuple[int, ...] = NGramProposer.LENGTHS) -> None:
        self.lengths = tuple(sorted(set(lengths), reverse=True))
        self.tokens: list[int] = []
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in self.lengths}
        self.append(tokens)

    def append(self, tokens: Sequence[int]) -> None:
        if self.tokens and tokens:
            self.tokens.append(self.SEPARATOR)
        first = len(self.tokens)
        self.tokens.extend(tokens)
        # An n-gram ending at position `last` is indexed when a token follows it.
        for last in range(max(first - 1, 0), len(self.tokens) - 1):
            for n in self.lengths:
                if n <= last + 1:
                    gram = tuple(self.tokens[last + 1 - n : last + 1])
                    if self.SEPARATOR not in gram:
                        _remember(self._index[n], gram, last + 1)

    def find_all(self, tail: tuple[int, ...]) -> list[int]:
        """Where the latest occurrences of the n-gram `tail` end (oldest first), each followed by a token."""
        table = self._index.get(len(tail))
        return (table.get(tail) or []) if table is not None else []

    def continuation(self, start: int, most: int) -> list[int]:
        """Up to `most` tokens from `start`, stopping at the end of that text."""
        out = self.tokens[start : start + most]
        return out[: out.index(self.SEPARATOR)] if self.SEPARATOR in out else out


def _continuation(tokens: list[int], start: int, most: int) -> list[int]:
    """tokens[start:start+most], continued periodically past the end of the sequence:
    if the text is repeating with period len - start, the repetition goes on."""
    period = len(tokens) - start
    out = tokens[start : start + most]
    while len(out) < most:
        out.append(out[len(out) - period] if len(out) >= period else tokens[start + len(out)])
    return out


