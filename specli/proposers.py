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
    (longest n first) and propose what followed it.

    Committed tokens only ever grow, so the n-gram index is extended incrementally: each
    n-gram maps to the position right after its most recent occurrence.
    """

    name = "ngram"
    cheap = True

    def __init__(self, max_n: int = 4, min_n: int = 1) -> None:
        self.max_n = max_n
        self.min_n = min_n
        self._index: list[dict[tuple[int, ...], int]] = [dict() for _ in range(max_n + 1)]
        self._indexed = 0  # n-grams ending before this position are in the index
        self.last_match_length = 0

    def prepare(self, prompt: list[int]) -> None:
        self._index = [dict() for _ in range(self.max_n + 1)]
        self._indexed = 0
        self._extend_index(prompt)

    def propose(self, tokens: list[int], max_tokens: int) -> Proposal:
        self._extend_index(tokens)
        self.last_match_length = 0
        if max_tokens <= 0:
            return Proposal()
        end = len(tokens)
        for n in range(min(self.max_n, end - 1), self.min_n - 1, -1):
            start = self._index[n].get(tuple(tokens[end - n :]))
            if start is not None:
                self.last_match_length = n
                return Proposal(_continuation(tokens, start, max_tokens), key=n)
        return Proposal()

    def _extend_index(self, tokens: list[int]) -> None:
        # Index n-grams ending at positions [indexed, len - 1): each has a known next token.
        last_end = len(tokens) - 1
        for end in range(self._indexed, last_end):
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                self._index[n][tuple(tokens[end + 1 - n : end + 1])] = end + 1
        self._indexed = max(self._indexed, last_end)

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
        room = self.model.n_ctx - keep - (len(tokens) - keep)
        max_tokens = min(max_tokens, room)
        if max_tokens <= 0:
            return Proposal()
        row = self.model.decode(tokens[keep:])[-1]
        self._cached.extend(tokens[keep:])
        drafted: list[int] = []
        dists: list[Distribution] | None = None if self.sampling.greedy else []
        while True:
            if dists is None:
                token = int(np.argmax(row))
                if self.min_confidence > 0.0 and drafted and _top_probability(row) < self.min_confidence:
                    break  # the draft is unsure: verifying this token is unlikely to pay
            else:
                dist = warp(row, self.sampling)
                if self.min_confidence > 0.0 and drafted and float(dist.probs.max()) < self.min_confidence:
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
