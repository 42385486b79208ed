"""Proposers: where draft tokens come from. One small protocol: n-gram lookup, a draft
model, and the two together (lookup in front of the model)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from specli.decode.sampling import SamplingSettings, keyed_choice, warp
from specli.decode.text import common_prefix_length


@dataclass
class Proposal:
    """Draft tokens, and what the draft-length policy needs to know about them."""

    tokens: list[int] = field(default_factory=list)
    key: object = None  # what kind of proposal this is, for the draft-length policy
    # A copy in progress (n-gram lookup: a match of the longest n): how many tokens the match
    # really spans; each drafted token that is kept lengthens it. 0: the key says it all.
    extent: int = 0
    proposer: str = ""  # who drafted it: "ngram" or "draft" (the draft model)
    # N-gram lookup with several earlier occurrences: per drafted token, the (recency-weighted)
    # share of the occurrences still in agreement that continue with it, and how many of them
    # continue with it (they agree with the whole draft up to it). Empty: one occurrence.
    support: tuple[float, ...] = ()
    agreeing: tuple[int, ...] = ()


class Proposer(Protocol):
    name: str
    cheap: bool  # True: proposing costs next to nothing, so `lookup` is all there is
    translated: bool  # True: a draft model of another vocabulary, drafting through text
    # The chance that a drafted token is kept, by proposal key and copy length (see
    # NGramProposer.prior); None: the draft-length policy's own prior.
    prior: Callable[[object, int], float] | None

    def prepare(self, prompt: list[int]) -> None:
        """Take in the prompt before the first step (counted as prefill time)."""
        ...

    def lookup(self, tokens: list[int], draft_tokens: int) -> Proposal:
        """A proposal that costs nothing to make (n-gram lookup), tried first; empty if none."""
        ...

    def propose(self, tokens: list[int], draft_tokens: int) -> Proposal:
        """Draft up to `draft_tokens` tokens that may follow the committed sequence `tokens`."""
        ...

    def behind(self, tokens: list[int]) -> int:
        """How many tokens a draft model must decode before it can propose after `tokens`:
        what was committed since it last drafted (0 for a proposer with no model)."""
        ...

    def close(self) -> None: ...


class NoProposer:
    """`--draft none`: never drafts, so every step is one plain target decode."""

    name = "none"
    cheap = True
    translated = False
    prior = None

    def prepare(self, prompt: list[int]) -> None:
        pass

    def lookup(self, tokens: list[int], draft_tokens: int) -> Proposal:
        return Proposal()

    def propose(self, tokens: list[int], draft_tokens: int) -> Proposal:
        return Proposal()

    def behind(self, tokens: list[int]) -> int:
        return 0

    def close(self) -> None:
        pass


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

    `references` are other token sequences to look in (a Predicted Output, the server's
    memory of recent answers), each a TokenIndex built once: their occurrences of the
    n-gram vote beside the committed text's, the deepest match first wherever it is. They
    are never decoded: only what they propose and the target keeps is written.
    """

    name = "ngram"
    cheap = True
    translated = False
    LENGTHS = (12, 8, 6, 4, 3, 2, 1)

    def __init__(self, lengths: tuple[int, ...] = LENGTHS, references: Sequence[TokenIndex] = ()) -> None:
        self.lengths = tuple(sorted(set(lengths), reverse=True))
        self.references = tuple(references)
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in self.lengths}
        self._indexed = 0  # n-grams ending before this position are in the index
        self.last_match_extent = 0  # how many tokens the last proposal's match really spans

    def prepare(self, prompt: list[int]) -> None:
        self._index = {n: {} for n in self.lengths}
        self._indexed = 0
        self._extend_index(prompt)

    def propose(self, tokens: list[int], draft_tokens: int) -> Proposal:
        self._extend_index(tokens)
        self.last_match_extent = 0
        if draft_tokens <= 0:
            return Proposal()
        end = len(tokens)
        for n in self.lengths:
            if n >= end:
                continue
            tail = tuple(tokens[end - n :])
            # Occurrences in the committed text (latest first), then in each reference.
            found: list[tuple[TokenIndex | None, int]] = [(None, start)
                                                          for start in reversed(self._index[n].get(tail) or [])]
            for reference in self.references:
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
            continuations = [_continuation(tokens, start, draft_tokens) if reference is None
                             else reference.continuation(start, draft_tokens) for reference, start in voters]
            draft, support, agreeing = _vote(continuations)
            if not draft:
                continue
            self.last_match_extent = longest
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
        recorded greedy outputs: benchmarks/README.md, section 4 (`replay.py hazard`)."""
        length = max(int(key), context)  # type: ignore[call-overload]
        return 1.0 - (HAZARD_SCALE * math.exp(-length / HAZARD_LENGTH) + HAZARD_FLOOR)

    def close(self) -> None:
        pass


# A match's rejection hazard: HAZARD_SCALE·exp(-length / HAZARD_LENGTH) + HAZARD_FLOOR
# (NGramProposer.prior). The floor: even a long copy ends somewhere.
HAZARD_SCALE = 0.7
HAZARD_LENGTH = 4.25
HAZARD_FLOOR = 0.0075
EXTENT_LIMIT = 256  # past this the hazard is the floor: no need to look further back
MAX_OCCURRENCES = 8  # the latest occurrences of an n-gram that vote on its continuation
RECENCY = 0.8  # an occurrence's vote against the next later one's (benchmarks/README.md, section 13)


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

    def continuation(self, start: int, count: int) -> list[int]:
        """Up to `count` tokens from `start`, stopping at the end of that text."""
        out = self.tokens[start : start + count]
        return out[: out.index(self.SEPARATOR)] if self.SEPARATOR in out else out


def _continuation(tokens: list[int], start: int, count: int) -> list[int]:
    """tokens[start:start+count], continued periodically past the end of the sequence:
    if the text is repeating with period len - start, the repetition goes on."""
    period = len(tokens) - start
    out = tokens[start : start + count]
    while len(out) < count:
        out.append(out[len(out) - period] if len(out) >= period else tokens[start + len(out)])
    return out


class DraftModelProposer:
    """A second, smaller model drafts autoregressively; its KV cache follows the committed
    sequence incrementally (only new tokens are decoded, rejected ones are removed).

    When sampling, it draws each token with the same keyed noise the target uses at that
    position (sampling.keyed_choice), so where the two distributions are alike the two
    draws agree. `keyed` False (drafting through text, where its positions are not the
    target's, so the noise cannot be shared): it drafts its likeliest token instead."""

    name = "draft"
    cheap = False
    translated = False
    prior = None

    def __init__(self, model, sampling: SamplingSettings, seed: int = 0, draft_min_p: float = 0.0) -> None:
        self.model = model
        self.sampling = sampling
        self.seed = seed
        self.draft_min_p = draft_min_p
        self.keyed = True
        self._cached: list[int] = []  # tokens in the draft's KV cache, in order

    def lookup(self, tokens: list[int], draft_tokens: int) -> Proposal:
        return Proposal()  # every draft token costs a decode

    def behind(self, tokens: list[int]) -> int:
        return max(len(tokens) - 1 - common_prefix_length(self._cached, tokens), 0)

    def forget(self) -> None:
        """Empty the draft's cache (before its decode is timed)."""
        self.model.rewind(0)
        self._cached.clear()

    def prepare(self, prompt: list[int]) -> None:
        """Bring the draft's cache to the prompt but its last token, keeping what it already
        holds of it (an earlier turn of a chat)."""
        keep = min(common_prefix_length(self._cached, prompt), max(len(prompt) - 1, 0))
        self.model.rewind(keep)
        del self._cached[keep:]
        if len(prompt) - 1 > keep:
            self.model.decode(prompt[keep:-1])
            self._cached.extend(prompt[keep:-1])

    def propose(self, tokens: list[int], draft_tokens: int) -> Proposal:
        if not tokens:
            return Proposal()  # nothing to continue (drafting through text before any text)
        keep = common_prefix_length(self._cached, tokens)
        if keep == len(tokens):
            keep -= 1  # the last token must be decoded again to get its logits
        self.model.rewind(keep)
        del self._cached[keep:]
        draft_tokens = min(draft_tokens, self.model.n_ctx - len(tokens))  # the draft's own context
        if draft_tokens <= 0:
            return Proposal()
        row = self.model.decode(tokens[keep:])[-1]
        self._cached.extend(tokens[keep:])
        drafted: list[int] = []
        while True:
            if self.sampling.penalises:
                row = self.sampling.penalise(row, tokens[-self.sampling.repeat_last_n :] + drafted)
            if self.sampling.greedy or not self.keyed:
                token = int(np.argmax(row))
                if self.draft_min_p > 0.0 and _top_probability(row) < self.draft_min_p:
                    break  # the draft is unsure: verifying this token is unlikely to pay
            else:
                dist = warp(row, self.sampling)
                if self.draft_min_p > 0.0 and float(dist.probs.max()) < self.draft_min_p:
                    break
                token = keyed_choice(dist, self.seed, len(tokens) + len(drafted))
            drafted.append(token)
            if len(drafted) == draft_tokens:
                break
            row = self.model.decode([token])[0]
            self._cached.append(token)
        return Proposal(drafted, proposer="draft")

    def close(self) -> None:
        self.model.close()


class LookupThenModel:
    """N-gram lookup in front of a draft model. Each step, lookup proposes first, for free;
    the draft-length policy weighs its match against the draft model's tokens at their
    cost (DraftPolicy.prefers), and where the match is worth more the draft model is
    skipped for that step. Its KV cache catches up with the committed text the next time
    it proposes. A kept token is "draft" whichever of the two drafted it."""

    name = "draft+ngram"
    cheap = False

    def __init__(self, lookup: NGramProposer, model: Proposer) -> None:
        self.ngram, self.model = lookup, model
        self.translated = translates(model)

    prior = staticmethod(NGramProposer.prior)  # lookup's keys; the draft model's (None): the policy's own

    def prepare(self, prompt: list[int]) -> None:
        self.ngram.prepare(prompt)
        self.model.prepare(prompt)

    def lookup(self, tokens: list[int], draft_tokens: int) -> Proposal:
        return self.ngram.propose(tokens, draft_tokens)

    def propose(self, tokens: list[int], draft_tokens: int) -> Proposal:
        return self.model.propose(tokens, draft_tokens)

    def behind(self, tokens: list[int]) -> int:
        return self.model.behind(tokens)

    def close(self) -> None:
        self.model.close()


def model_proposer_of(proposer: Proposer) -> Proposer | None:
    """The part of a proposer that runs a draft model (a DraftModelProposer, or one drafting
    through text), without lookup in front of it; None if it runs none."""
    if isinstance(proposer, LookupThenModel):
        return proposer.model
    return None if proposer.cheap else proposer


def draft_model_of(proposer: Proposer) -> DraftModelProposer | None:
    """The DraftModelProposer behind a proposer, if it has one (lookup in front of it, or
    drafting through text, wrap it)."""
    inner = model_proposer_of(proposer)
    while inner is not None and not isinstance(inner, DraftModelProposer):
        inner = inner.model  # drafting through text: TranslatedDraft.model
    return inner


def translates(proposer: Proposer) -> bool:
    """Whether the proposer drafts through text (a draft model with another vocabulary)."""
    return proposer.translated


def _top_probability(logits: np.ndarray) -> float:
    best = logits.max()
    return float(1.0 / np.exp(logits - best).sum())
