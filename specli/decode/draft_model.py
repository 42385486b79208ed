"""A draft model: a second, smaller model drafts autoregressively.

`DraftModel` is the loaded model and what its KV cache holds; it lives as long as the
session, so across a chat's turns and a server's requests only new tokens are decoded.
`DraftModelProposer` drafts with it for one request, with that request's sampling and seed.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

import numpy as np

from specli.decode.proposers import Proposal
from specli.decode.sampling import SamplingSettings, keyed_choice, warp
from specli.decode.text import common_prefix_length

if TYPE_CHECKING:
    from specli.decode.constraint import Matcher


class DecoderModel(Protocol):
    """What drafting needs of a model (backend.Model, or a fake in tests)."""

    n_ctx: int

    def decode(self, tokens: list[int], *, all_logits: bool = False) -> np.ndarray: ...
    def rewind(self, n_keep: int) -> None: ...
    def close(self) -> None: ...


class Drafter(Protocol):
    """What DraftModelProposer drafts from: a DraftModel, or a target's NextN layers
    (specli.decode.mtp.NextnDraft)."""

    n_ctx: int
    decode_seconds: float  # inside its decodes, all told

    def behind(self, tokens: list[int]) -> int: ...
    def prepare(self, prompt: list[int]) -> None: ...
    def row_after(self, tokens: list[int]) -> np.ndarray: ...
    def extend(self, token: int) -> np.ndarray: ...


class DraftModel:
    """A loaded draft model whose KV cache follows the committed sequence incrementally:
    only new tokens are decoded, rejected ones are removed."""

    def __init__(self, model: DecoderModel) -> None:
        self.model = model
        self.cached: list[int] = []  # tokens in its KV cache, in order
        self.decode_seconds = 0.0  # inside its model's decodes, all told

    def _decode(self, tokens: list[int]) -> np.ndarray:
        started = time.perf_counter()
        rows = self.model.decode(tokens)
        self.decode_seconds += time.perf_counter() - started
        return rows

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    def behind(self, tokens: list[int]) -> int:
        """Tokens it must decode before it can draft after `tokens`."""
        return max(len(tokens) - 1 - common_prefix_length(self.cached, tokens), 0)

    def forget(self) -> None:
        """Empty its cache (before its decode is timed)."""
        self.model.rewind(0)
        self.cached.clear()

    def prepare(self, prompt: list[int]) -> None:
        """Bring its cache to the prompt but its last token, keeping what it already holds of
        it (an earlier turn of a chat)."""
        keep = min(common_prefix_length(self.cached, prompt), max(len(prompt) - 1, 0))
        self.model.rewind(keep)
        del self.cached[keep:]
        if len(prompt) - 1 > keep:
            self._decode(prompt[keep:-1])
            self.cached.extend(prompt[keep:-1])

    def row_after(self, tokens: list[int]) -> np.ndarray:
        """The logits row for the token after `tokens`: its cache rewound to what it shares
        with them, and the rest decoded (the last token at least, for its row)."""
        keep = common_prefix_length(self.cached, tokens)
        if keep == len(tokens):
            keep -= 1
        self.model.rewind(keep)
        del self.cached[keep:]
        row = self._decode(tokens[keep:])[-1]
        self.cached.extend(tokens[keep:])
        return row

    def extend(self, token: int) -> np.ndarray:
        """Decode one more token; the logits row after it."""
        row = self._decode([token])[0]
        self.cached.append(token)
        return row

    def close(self) -> None:
        self.model.close()


class DraftModelProposer:
    """Drafts with a DraftModel for one request.

    When sampling, it draws each token with the same keyed noise the target uses at that
    position (sampling.keyed_choice), so where the two distributions are alike the two
    draws agree. `keyed` False (drafting through text, where its positions are not the
    target's, so the noise cannot be shared): it drafts its likeliest token instead.
    `draft_min_p`: it stops where its likeliest token is less likely than this. `constraint`:
    the request's matcher (at the engine's place when it proposes): each drafted token is
    chosen from the draft's row masked by it, as the target's will be, so every token it
    drafts is one the constraint allows; the matcher is left where it was found."""

    name = "draft"
    cheap = False
    translated = False
    prior = None

    def __init__(self, draft: Drafter, sampling: SamplingSettings, seed: int = 0, draft_min_p: float = 0.0,
                 *, keyed: bool = True, constraint: Matcher | None = None) -> None:
        self.draft = draft
        self.constraint = constraint
        self.sampling = sampling
        self.seed = seed
        self.draft_min_p = draft_min_p
        self.keyed = keyed

    def lookup(self, tokens: list[int], count: int) -> Proposal:
        return Proposal()  # every draft token costs a decode

    def behind(self, tokens: list[int]) -> int:
        return self.draft.behind(tokens)

    def prepare(self, prompt: list[int]) -> None:
        self.draft.prepare(prompt)

    def propose(self, tokens: list[int], count: int) -> Proposal:
        if not tokens:
            return Proposal()  # nothing to continue (drafting through text before any text)
        count = min(count, self.draft.n_ctx - len(tokens))  # the draft's own context
        if count <= 0:
            return Proposal()
        decoded = self.draft.decode_seconds
        row = self.draft.row_after(tokens)
        drafted: list[int] = []
        constraint = self.constraint
        consumed = 0  # drafted tokens the constraint has taken, given back at the end
        try:
            while True:
                if self.sampling.penalises:
                    row = self.sampling.penalise(row, tokens[-self.sampling.repeat_last_n :] + drafted)
                if constraint is not None:
                    if constraint.stopped:
                        break
                    if self.sampling.greedy or not self.keyed:
                        best = int(np.argmax(row))
                        row = row if constraint.allows(best) else constraint.restrict(row)
                    else:
                        row = constraint.restrict(row)
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
                if len(drafted) == count:
                    break
                if constraint is not None:
                    constraint.consume(token)
                    consumed += 1
                row = self.draft.extend(token)
        finally:
            if constraint is not None:
                constraint.rollback(consumed)
        return Proposal(drafted, proposer=self.name, decode_seconds=self.draft.decode_seconds - decoded)


def _top_probability(logits: np.ndarray) -> float:
    best = logits.max()
    return float(1.0 / np.exp(logits - best).sum())
