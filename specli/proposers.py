"""Proposers: where draft tokens come from. One small protocol, two implementations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from specli.sampling import Distribution, SamplingSettings, warp


@dataclass
class Proposal:
    """Draft tokens and, for a sampling draft model, the distribution q each was drawn from."""

    tokens: list[int] = field(default_factory=list)
    dists: list[Distribution] | None = None  # None: deterministic (q is a point mass)
    key: object = None  # what kind of proposal this is, for the draft-length policy


class Proposer(Protocol):
    name: str
    cheap: bool  # True: proposing costs next to nothing, so the engine proposes first

    def prepare(self, prompt: list[int]) -> None:
        """Take in the prompt before the first step (counted as prefill time)."""
        ...

    def propose(self, tokens: list[int], max_tokens: int) -> Proposal:
        """Draft up to max_tokens tokens that may follow the committed sequence `tokens`."""
        ...

    def close(self) -> None: ...


class NoProposer:
    """`--draft none`: never drafts, so every step is one plain target decode."""

    name = "none"
    cheap = True

    def prepare(self, prompt: list[int]) -> None:
        pass

    def propose(self, tokens: list[int], max_tokens: int) -> Proposal:
        return Proposal()

    def close(self) -> None:
        pass


class NGramProposer:
    """Prompt lookup: find the latest earlier occurrence of the sequence's last n tokens
    (the longest n first) and propose what followed it.

    A longer match predicts better, so the proposal's key is the matched length and the
    draft-length policy learns how far to trust each. Committed tokens only ever grow, so
    the index is extended incrementally: each n-gram maps to the position right after its
    most recent occurrence.
    """

    name = "ngram"
    cheap = True
    LENGTHS = (12, 8, 6, 4, 3, 2, 1)

    def __init__(self, lengths: tuple[int, ...] = LENGTHS) -> None:
        self.lengths = tuple(sorted(set(lengths), reverse=True))
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.lengths}
        self._indexed = 0  # n-grams ending before this position are in the index
        self.last_match_length = 0

    def prepare(self, prompt: list[int]) -> None:
        self._index = {n: {} for n in self.lengths}
        self._indexed = 0
        self._extend_index(prompt)

    def propose(self, tokens: list[int], max_tokens: int) -> Proposal:
        self._extend_index(tokens)
        self.last_match_length = 0
        if max_tokens <= 0:
            return Proposal()
        end = len(tokens)
        for n in self.lengths:
            if n >= end:
                continue
            start = self._index[n].get(tuple(tokens[end - n :]))
            if start is not None:
                self.last_match_length = n
                return Proposal(_continuation(tokens, start, max_tokens), key=n)
        return Proposal()

    def _extend_index(self, tokens: list[int]) -> None:
        # Index n-grams ending at positions [indexed, len - 1): each has a known next token.
        last_end = len(tokens) - 1
        for end in range(self._indexed, last_end):
            for n in self.lengths:
                if n <= end + 1:
                    self._index[n][tuple(tokens[end + 1 - n : end + 1])] = end + 1
        self._indexed = max(self._indexed, last_end)

    @staticmethod
    def prior(key: object) -> float:
        """Expected acceptance of a proposal from an n-token match, before any is judged:
        0.4 for one token, 0.85 for four, 0.95 for twelve. On Gemma 3 270M's greedy outputs
        for 20 workloads (the shipped ones, benchmarks/heldout.toml, prompts/copy.txt), the
        first drafted token was kept 42-58% of the time after a 1-token match, 48-53% (2),
        65-67% (3), 78-83% (4), 87% (6), 77-87% (8) and 97-99% after 12 or more; the run's
        own record soon replaces these."""
        return 1.0 - 0.6 / key if isinstance(key, int) and key > 0 else 0.6

    def close(self) -> None:
        pass


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
    sequence incrementally (only new tokens are decoded, rejected ones are removed)."""

    name = "draft"
    cheap = False

    def __init__(self, model, sampling: SamplingSettings, rng: np.random.Generator, min_confidence: float = 0.0) -> None:
        self.model = model
        self.sampling = sampling
        self.rng = rng
        self.min_confidence = min_confidence
        self._cached: list[int] = []  # tokens in the draft's KV cache, in order

    def prepare(self, prompt: list[int]) -> None:
        self.model.rewind(0)
        self._cached = []
        if len(prompt) > 1:
            self.model.decode(prompt[:-1])
            self._cached = list(prompt[:-1])

    def propose(self, tokens: list[int], max_tokens: int) -> Proposal:
        keep = _common_prefix_length(self._cached, tokens)
        if keep == len(tokens):
            keep -= 1  # the last token must be decoded again to get its logits
        self.model.rewind(keep)
        del self._cached[keep:]
        max_tokens = min(max_tokens, self.model.n_ctx - len(tokens))  # the draft's own context
        if max_tokens <= 0:
            return Proposal()
        row = self.model.decode(tokens[keep:])[-1]
        self._cached.extend(tokens[keep:])
        drafted: list[int] = []
        dists: list[Distribution] | None = None if self.sampling.greedy else []
        while True:
            if dists is None:
                token = int(np.argmax(row))
                if self.min_confidence > 0.0 and _top_probability(row) < self.min_confidence:
                    break  # the draft is unsure: verifying this token is unlikely to pay
            else:
                dist = warp(row, self.sampling)
                if self.min_confidence > 0.0 and float(dist.probs.max()) < self.min_confidence:
                    break
                token = dist.sample(self.rng)
                dists.append(dist)
            drafted.append(token)
            if len(drafted) == max_tokens:
                break
            row = self.model.decode([token])[0]
            self._cached.append(token)
        return Proposal(drafted, dists)

    def close(self) -> None:
        self.model.close()


def _top_probability(logits: np.ndarray) -> float:
    best = logits.max()
    return float(1.0 / np.exp(logits - best).sum())


def _common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low] holds; a[:high] == b[:high] does not
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low
