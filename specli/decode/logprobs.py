"""Pure numpy: a token's log-probability under the target, as OpenAI reports it.

The log-softmax of the target's raw logits row (before temperature, penalties, a bias and a
constraint's mask: the model's own distribution), for the token written at that row and the
row's most likely alternatives. Rows come from the decodes the engine makes anyway: the
prompt's last row, and each verify batch's rows up to the written token (forced tokens' rows
too, when logprobs are asked for). So they are plain decoding's numbers for the same tokens,
up to the batch drift of a verify decode (and bit for bit under --exact).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP = 20  # the most alternatives a token reports (OpenAI's limit for top_logprobs)


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A written token's log-probability, and the `top` most likely tokens of its row as
    (token id, log-probability), most likely first (ties: the lower id first)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(row: np.ndarray, token: int, top: int = 0) -> TokenLogprob:
    """The log-softmax of `row` at `token`, with the row's `top` best (0..MAX_TOP)."""
    logits = np.asarray(row, dtype=np.float64)
    best = float(logits.max())
    normaliser = best + float(np.log(np.exp(logits - best).sum()))
    alternatives: tuple[tuple[int, float], ...] = ()
    if top > 0:
        n = min(top, logits.size)
        nth = np.partition(logits, logits.size - n)[logits.size - n]  # the n-th largest
        ids = np.flatnonzero(logits >= nth)  # the n best, with any tied at the n-th
        ids = ids[np.lexsort((ids, -logits[ids]))][:n]
        alternatives = tuple((int(i), float(logits[i]) - normaliser) for i in ids)
    return TokenLogprob(float(logits[token]) - normaliser, alternatives)
