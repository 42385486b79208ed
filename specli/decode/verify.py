"""Verify: the target's own token at each position of a verify batch, from its logits row,
and how much of the draft those choices keep.

Greedy: the row's argmax (or the device's, `on_device`); sampled: a draw keyed by the
request's seed and the position, from the row penalised for the text before it and warped
(decode/sampling.py); under a constraint, from the row masked by the constraint's state
after the draft tokens before it, each kept one consumed. Rows after a rejection are never
read. Pure numpy: llama.cpp is never called here.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from specli.decode.constraint import Matcher
from specli.decode.sampling import (
    Distribution,
    SamplingSettings,
    keyed_choice,
    verify_greedy,
    verify_greedy_tokens,
    verify_keyed,
    warp,
)


class Verifier:
    """The target's choices for one request: `write` one token from a row, `verify` a draft
    against a batch's rows. `is_end`: whether a token ends the generation (the constraint
    does not consume it)."""

    def __init__(self, sampling: SamplingSettings, seed: int, matcher: Matcher | None,
                 is_end: Callable[[int], bool], *, on_device: bool = False) -> None:
        self.sampling, self.seed, self.matcher = sampling, seed, matcher
        self.is_end = is_end
        self.on_device = on_device  # the rows are the device's argmax of each, not logits

    def choose(self, row: np.ndarray, position: int) -> int:
        """The target's own token at `position` from its logits row: argmax, or the keyed
        draw from the warped row; under a constraint, from the row masked by it."""
        matcher = self.matcher
        if self.sampling.greedy:
            best = int(np.argmax(row))
            if matcher is None or matcher.allows(best):
                return best  # the first best of all tokens, so of the allowed ones too
            return int(np.argmax(matcher.restrict(row)))
        if matcher is not None:
            row = matcher.restrict(row)
        return keyed_choice(warp(row, self.sampling), self.seed, position)

    def write(self, row: np.ndarray, position: int) -> int:
        """The target's token at `position`, which the constraint (if any) then consumes."""
        token = self.choose(row, position)
        if self.matcher is not None and not self.is_end(token):
            self.matcher.consume(token)
        return token

    def verify(self, rows: Sequence, tokens: list[int], draft: list[int], prompt_tokens: int) -> tuple[int, int]:
        """(accepted, written) from the verify batch's rows after `tokens` (the committed
        text, its first `prompt_tokens` the prompt): the device's argmax of each, or logits
        rows (penalised for the text before them, warped when sampling)."""
        if self.on_device:
            return verify_greedy_tokens(draft, rows)
        logits = _Rows(rows, self.sampling, tokens, draft, prompt_tokens)
        if self.matcher is not None:
            return self._verify_constrained(logits, len(tokens), draft)
        if self.sampling.greedy:
            return verify_greedy(draft, logits)
        return verify_keyed(draft, _WarpedRows(logits, self.sampling), self.seed, len(tokens))

    def _verify_constrained(self, rows: Sequence[np.ndarray], position: int, draft: list[int]) -> tuple[int, int]:
        """verify_greedy or verify_keyed with row i masked by the constraint after
        draft[:i]: the matcher consumes each kept draft token, then the written one. Rows
        after a rejection are never read."""
        for i in range(len(draft) + 1):
            chosen = self.write(rows[i], position + i)
            if i == len(draft) or chosen != draft[i]:
                return i, chosen
        raise AssertionError("unreachable")


class _Rows(Sequence[np.ndarray]):
    """A verify batch's logits rows, row i with the penalties for the text before its position
    (the committed tokens, then draft[:i], kept if row i is read at all; the output is that
    text from `prompt_tokens` on). Rows after a rejection are never touched."""

    def __init__(self, logits: np.ndarray, sampling: SamplingSettings, tokens: list[int], draft: list[int],
                 prompt_tokens: int) -> None:
        self._logits, self._sampling, self._tokens, self._draft = logits, sampling, tokens, draft
        self._prompt_tokens = prompt_tokens

    def __len__(self) -> int:
        return self._logits.shape[0]

    def __getitem__(self, i):  # type: ignore[override]
        if not self._sampling.penalises:
            return self._logits[i]
        context = self._tokens[-self._sampling.repeat_last_n :] + self._draft[:i]
        output = self._tokens[self._prompt_tokens :] + self._draft[:i]
        return self._sampling.penalise(self._logits[i], context, output)


class _WarpedRows(Sequence[Distribution]):
    """Target distributions warped on demand: rows after a rejection are never touched."""

    def __init__(self, rows: Sequence[np.ndarray], sampling: SamplingSettings) -> None:
        self._rows = rows
        self._sampling = sampling

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):  # type: ignore[override]
        return warp(self._rows[i], self._sampling)
