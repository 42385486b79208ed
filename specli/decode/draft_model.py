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
    def decode_greedy(self, tokens: list[int]) -> int:
        """The last row's argmax, taken on the device (only where DraftModel.on_gpu)."""
        ...

    def rewind(self, n_keep: int) -> None: ...
    def close(self) -> None: ...


class Drafter(Protocol):
    """What DraftModelProposer drafts from: a DraftModel, or a target's NextN layers
    (specli.decode.mtp.NextnDraft)."""

    n_ctx: int
    decode_seconds: float  # inside its decodes, all told
    on_gpu: bool  # its greedy choices can be taken on the device (choice_after, extend_choice)

    def behind(self, tokens: list[int]) -> int: ...
    def prepare(self, prompt: list[int]) -> None: ...
    def row_after(self, tokens: list[int]) -> np.ndarray: ...
    def extend(self, token: int) -> np.ndarray: ...
    def choice_after(self, tokens: list[int]) -> int: ...
    def extend_choice(self, token: int) -> int: ...


# On a GPU, a catch-up this short is decoded a token at a time (DraftModel._chunks).
ONE_AT_A_TIME = 2


class DraftModel:
    """A loaded draft model whose KV cache follows the committed sequence incrementally:
    only new tokens are decoded, rejected ones are removed.

    `through_text`: its vocabulary fails llama.cpp's rule, so its proposals are re-tokenized
    for the target (decode/translate.py). `on_gpu`: it runs on a GPU, where a decode of a new shape runs without the captured graph
    (specli.decode.shapes): its catch-up with the committed text is decoded a token at a
    time, the shape every drafting decode has, and a greedy draft's choices can be taken on
    the device (choice_after, extend_choice), so no row of logits crosses to the host."""

    def __init__(self, model: DecoderModel, *, on_gpu: bool = False, through_text: bool = False) -> None:
        self.model = model
        self.on_gpu = on_gpu
        self.through_text = through_text  # its vocabulary is not the target's: it drafts through text
        self.cached: list[int] = []  # tokens in its KV cache, in order
        # The prompt's tokens after `cached`, to decode where it first drafts (prepare).
        self.owed: list[int] = []
        self.decode_seconds = 0.0  # inside its model's decodes, all told

    def _decode(self, tokens: list[int]) -> np.ndarray:
        """The logits row after the last of `tokens` (as a one-row array)."""
        started = time.perf_counter()
        rows = None
        for chunk in self._chunks(tokens):
            rows = self.model.decode(chunk)
        self.decode_seconds += time.perf_counter() - started
        assert rows is not None
        return rows[-1:]

    def _choose(self, tokens: list[int]) -> int:
        """The device's greedy choice after the last of `tokens`."""
        started = time.perf_counter()
        choice = -1
        for chunk in self._chunks(tokens):
            choice = self.model.decode_greedy(chunk)
        self.decode_seconds += time.perf_counter() - started
        return choice

    def _chunks(self, tokens: list[int]) -> list[list[int]]:
        """The decodes that bring `tokens` in: on a GPU a short catch-up (a step's usual one or
        two tokens) goes a token a decode, keeping the drafting decodes' shape; anything longer
        (a prompt, a chat's new turn) in one batch, where one change of shape costs less."""
        if self.on_gpu and len(tokens) <= ONE_AT_A_TIME:
            return [[token] for token in tokens]
        return [tokens]

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    def behind(self, tokens: list[int]) -> int:
        """Tokens it must decode before it can draft after `tokens`, beyond the prompt it owes
        (prepare): the committed ones since it last drafted."""
        return max(len(tokens) - 1 - common_prefix_length(self.cached + self.owed if self.owed else self.cached, tokens), 0)

    def forget(self) -> None:
        """Empty its cache (before its decode is timed)."""
        self.model.rewind(0)
        self.cached.clear()
        self.owed.clear()

    def prepare(self, prompt: list[int]) -> None:
        """Keep what its cache holds of the prompt (an earlier turn of a chat) and owe the rest
        but the prompt's last token: decoded where it first drafts, in the one decode this made
        when it decoded the prompt up front, so its drafts are those, and a generation that
        never drafts with it (a draft that does not pay) never pays for the prompt. The
        draft-length policy prices its steps as it did then (`behind` leaves the prompt out)."""
        keep = min(common_prefix_length(self.cached, prompt), max(len(prompt) - 1, 0))
        self.model.rewind(keep)
        del self.cached[keep:]
        self.owed = prompt[keep:-1]

    def _settle(self) -> None:
        """Decode the prompt it owes (before anything after it)."""
        if self.owed:
            owed, self.owed = self.owed, []
            self._decode(owed)
            self.cached.extend(owed)

    def row_after(self, tokens: list[int]) -> np.ndarray:
        """The logits row for the token after `tokens`: its cache rewound to what it shares
        with them, and the rest decoded (the last token at least, for its row)."""
        return self._decode(self._rewind_to(tokens))[-1]

    def choice_after(self, tokens: list[int]) -> int:
        """row_after's argmax, taken on the device (on_gpu only)."""
        return self._choose(self._rewind_to(tokens))

    def _rewind_to(self, tokens: list[int]) -> list[int]:
        """Rewind its cache to what it shares with `tokens` (all but the last, at most), and
        take the rest as cached: the tokens to decode now."""
        self._settle()
        keep = common_prefix_length(self.cached, tokens)
        if keep == len(tokens):
            keep -= 1
        self.model.rewind(keep)
        del self.cached[keep:]
        self.cached.extend(tokens[keep:])
        return tokens[keep:]

    def extend(self, token: int) -> np.ndarray:
        """Decode one more token; the logits row after it (after row_after: nothing owed)."""
        assert not self.owed, "extend after row_after, which decodes what is owed"
        self.cached.append(token)
        return self._decode([token])[0]

    def extend_choice(self, token: int) -> int:
        """extend's argmax, taken on the device (on_gpu only)."""
        assert not self.owed, "extend_choice after choice_after, which decodes what is owed"
        self.cached.append(token)
        return self._choose([token])

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
    depth: int | None = None  # any length (a drafter with a most: MtpProposer)

    def __init__(self, draft: Drafter, sampling: SamplingSettings, seed: int = 0, draft_min_p: float = 0.0,
                 *, keyed: bool = True, constraint: Matcher | None = None) -> None:
        self.draft = draft
        self.constraint = constraint
        self.sampling = sampling
        self.seed = seed
        self.draft_min_p = draft_min_p
        self.keyed = keyed

    def lookup(self, tokens: list[int], most: int) -> Proposal:
        return Proposal()  # every draft token costs a decode

    def _greedy_on_device(self) -> bool:
        """Whether each drafted token is the row's argmax and nothing else reads the row (no
        penalty, constraint or min-p): then the device chooses it (DraftModel.on_gpu)."""
        sampling = self.sampling
        return (self.draft.on_gpu and (sampling.greedy or not self.keyed) and not sampling.penalises
                and self.constraint is None and self.draft_min_p <= 0.0)

    def _draft_on_device(self, tokens: list[int], most: int) -> list[int]:
        drafted = [self.draft.choice_after(tokens)]
        while len(drafted) < most:
            drafted.append(self.draft.extend_choice(drafted[-1]))
        return drafted

    def behind(self, tokens: list[int]) -> int:
        return self.draft.behind(tokens)

    def prepare(self, prompt: list[int]) -> None:
        self.draft.prepare(prompt)

    def propose(self, tokens: list[int], most: int) -> Proposal:
        if not tokens:
            return Proposal()  # nothing to continue (drafting through text before any text)
        most = min(most, self.draft.n_ctx - len(tokens))  # the draft's own context
        if most <= 0:
            return Proposal()
        decoded = self.draft.decode_seconds
        if self._greedy_on_device():
            return Proposal(self._draft_on_device(tokens, most), proposer=self.name,
                            decode_seconds=self.draft.decode_seconds - decoded)
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
                if len(drafted) == most:
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
