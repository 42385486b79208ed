"""Pure numpy: warp logits into a distribution, draw from it, verify a draft against it.

Verification keeps the output exactly the target's:

- greedy: a draft token is kept while it equals the target's argmax; the target's argmax
  at the first mismatch (or after the last draft token) is the token it writes.
- sampling: the token at each position of the sequence is the keyed draw
  argmax(log p(x) + g(seed, position, x)), a Gumbel-max draw whose noise g depends on the
  seed, the position and the token id only. It is distributed as p, independently at each
  position, whichever batch verifies the position: a draft token is kept when it equals
  that draw, and the draw at the first mismatch is written. So a seed writes the same
  text with any proposer and any draft length. An n-gram token x is kept with
  probability p(x), as under rejection sampling; a draft model that draws with the same
  noise agrees with the target wherever the two distributions do (`benchmarks/coupling.py`
  compares it with rejection sampling).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

_NEGLIGIBLE = 50.0


# The command line's defaults for sampled runs, as llama.cpp's.
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.95
DEFAULT_MIN_P = 0.05


def fresh_seed() -> int:
    """A seed for a run that gives none: 63 bits from the operating system's entropy."""
    return int(np.random.SeedSequence().entropy % (1 << 63))


@dataclass(frozen=True)
class SamplingSettings:
    """How logits become a distribution. temperature == 0 means greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0.0: off
    repeat_penalty: float = 1.0  # 1.0: off
    repeat_last_n: int = 64  # how many of the latest tokens the penalty looks at
    # OpenAI's, over the output so far (not the prompt): a token's logit less frequency_penalty
    # times its count, and presence_penalty once it is there; logit_bias adds to a token's logit.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalises(self) -> bool:
        """Whether a row is changed before it is read (for the tokens before it, or by a bias)."""
        return (self.repeat_penalty != 1.0 and self.repeat_last_n > 0) or bool(self.logit_bias) \
            or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def pure_greedy(self) -> bool:
        """Greedy with no repetition penalty: a row's token is its argmax, whatever came before."""
        return self.greedy and not self.penalises

    def penalise(self, row: np.ndarray, context: Sequence[int], output: Sequence[int] = ()) -> np.ndarray:
        """The row with the penalties applied for the sequence before its position: llama.cpp's
        repetition penalty for the tokens among the last repeat_last_n of `context` (a positive
        logit divided by it, a negative one multiplied), then OpenAI's logit_bias, frequency
        and presence penalties for `output` (the generated part of it). The row itself is untouched."""
        if not self.penalises:
            return row
        out = np.array(row, dtype=np.float32, copy=True)
        recent = np.unique(np.asarray(context[-self.repeat_last_n :] if self.repeat_last_n > 0 else [], dtype=np.int64))
        recent = recent[recent >= 0]  # an image's positions (decode/media.py) are no tokens
        if self.repeat_penalty != 1.0 and recent.size:
            values = out[recent]
            out[recent] = np.where(values > 0, values / self.repeat_penalty, values * self.repeat_penalty)
        if self.logit_bias:
            ids, bias = zip(*self.logit_bias)
            out[np.asarray(ids, dtype=np.int64)] += np.asarray(bias, dtype=np.float32)
        if len(output) and (self.frequency_penalty or self.presence_penalty):
            ids, counts = np.unique(np.asarray(output, dtype=np.int64), return_counts=True)
            out[ids] -= (counts * self.frequency_penalty + self.presence_penalty).astype(np.float32)
        return out

    @classmethod
    def for_temperature(cls, temperature: float) -> SamplingSettings:
        """Greedy at 0, else the command line's default top-k, top-p and min-p."""
        if temperature <= 0.0:
            return cls()
        return cls(temperature, DEFAULT_TOP_K, DEFAULT_TOP_P, DEFAULT_MIN_P)


@dataclass(frozen=True)
class Distribution:
    """A warped distribution stored sparsely: probabilities for the candidate ids only."""

    ids: np.ndarray  # int64, the candidate token ids
    probs: np.ndarray  # float64, same length, sums to 1


def warp(logits: np.ndarray, settings: SamplingSettings) -> Distribution:
    """Temperature, then top-k, top-p and min-p, as one sparse distribution.

    Both the draft and the target go through this same function, so q and p are the
    distributions the two models actually sample from. Nothing vocabulary-sized is sorted:
    each stage narrows the candidates to a top set (closed under ties) before ordering them.
    """
    logits = np.asarray(logits)
    best = float(logits.max())
    # Tokens more than _NEGLIGIBLE temperature-units below the best have probability
    # under e^-50 of the best one's: together less than float64 resolution, so they are
    # never candidates.
    floor = best - _NEGLIGIBLE * settings.temperature
    if settings.top_k > 0:
        ids = _top_k(logits, settings.top_k, best, floor)
    else:
        ids = np.flatnonzero(logits >= floor)
    weights = np.exp((logits[ids].astype(np.float64) - best) / settings.temperature)  # the best: 1
    total = weights.sum()
    if settings.min_p > 0.0:
        # min-p keeps a token whose probability is at least min_p times the best one's,
        # whatever top-p did before it (the best token always survives top-p).
        keep = weights >= settings.min_p
        ids, weights = ids[keep], weights[keep]
    elif settings.top_p < 1.0:
        ids, weights = _top_set(ids, weights, total, settings.top_p)
    if settings.top_p < 1.0:
        # Most likely first (ties broken by id) so the nucleus is the smallest top set. Its
        # mass is measured against every candidate top-k left, not only those kept here.
        order = np.lexsort((ids, -weights))
        ids, weights = ids[order], weights[order]
        cut = int(np.searchsorted(np.cumsum(weights) / total, settings.top_p, side="left")) + 1
        ids, weights = ids[:cut], weights[:cut]
    return Distribution(ids.astype(np.int64, copy=False), weights / weights.sum())


def _top_k(logits: np.ndarray, k: int, best: float, floor: float) -> np.ndarray:
    """Ids of the k largest logits (or of every one above floor, if fewer).

    The k largest all lie at or above the k-th largest, so a window below the best that
    already holds k tokens contains them: it starts narrow and widens only when needed.
    """
    width = 4.0
    while True:
        cut = max(best - width, floor)
        ids = np.flatnonzero(logits >= cut)
        if ids.size >= k or cut <= floor:
            break
        width *= 4.0
    if ids.size > k:
        ids = ids[np.argpartition(logits[ids], ids.size - k)[ids.size - k :]]
    return ids


def _top_set(ids: np.ndarray, weights: np.ndarray, total: float, mass: float) -> tuple[np.ndarray, np.ndarray]:
    """A set of the heaviest candidates (with every candidate tied with its lightest member)
    that holds at least `mass` of `total`, grown fourfold from 256 until it does: it
    contains the nucleus, and only it needs sorting."""
    size = 256
    while size < ids.size:
        lightest = np.partition(weights, weights.size - size)[weights.size - size]
        keep = weights >= lightest
        if weights[keep].sum() >= mass * total:
            return ids[keep], weights[keep]
        size *= 4
    return ids, weights


_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every input bit moves every output bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX1
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX2
    return x ^ (x >> np.uint64(31))


def keyed_uniforms(seed: int, position: int, ids: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1), one per token id, fixed by (seed, position, id) alone."""
    with np.errstate(over="ignore"):
        key = _mix(np.uint64(seed % (1 << 64)) * _GOLDEN + np.uint64(1))
        key = _mix(key ^ (np.uint64(position % (1 << 64)) * _GOLDEN))
        bits = _mix(key ^ (np.asarray(ids, dtype=np.uint64) * _GOLDEN))
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def keyed_choice(dist: Distribution, seed: int, position: int) -> int:
    """The token at `position` for this seed: a Gumbel-max draw from dist, exact in
    distribution, the same whichever batch the position is verified in."""
    if dist.ids.size == 1:
        return int(dist.ids[0])
    gumbel = -np.log(-np.log(keyed_uniforms(seed, position, dist.ids)))
    with np.errstate(divide="ignore"):
        return int(dist.ids[np.argmax(np.log(dist.probs) + gumbel)])


def verify_keyed(drafted: list[int], target_dists: Sequence[Distribution], seed: int,
                 position: int) -> tuple[int, int]:
    """Keep draft tokens while each equals the target's keyed draw at its position (the
    first draft token stands at `position`); the draw at the first mismatch, or after the
    last draft token, is the token the target writes. Rows after a mismatch are never read."""
    for i, token in enumerate(drafted):
        chosen = keyed_choice(target_dists[i], seed, position + i)
        if chosen != token:
            return i, chosen
    n = len(drafted)
    return n, keyed_choice(target_dists[n], seed, position + n)


def top_two_margin(row: np.ndarray) -> float:
    """Gap between the best and second-best logit: how close a greedy choice was to a tie."""
    best_two = np.partition(row, row.size - 2)[-2:]
    return float(best_two[1] - best_two[0])


def verify_greedy(drafted: list[int], logits: Sequence[np.ndarray]) -> tuple[int, int]:
    """Return (number of draft tokens accepted, the token the target writes next).

    logits[i] is the target's row after the prefix plus drafted[:i] (len + 1 rows).
    Rows after the first disagreement are never read: each is a vocabulary-sized scan.
    """
    return verify_greedy_tokens(drafted, _Argmaxes(logits))


def verify_greedy_tokens(drafted: list[int], target_tokens: Sequence[int]) -> tuple[int, int]:
    """verify_greedy from the target's greedy token at each row (target_tokens[i]: the
    argmax of its row after the prefix plus drafted[:i]), read in order and never
    after the first disagreement."""
    for i, token in enumerate(drafted):
        best = int(target_tokens[i])
        if best != token:
            return i, best  # the target disagrees: its own token replaces the draft's
    return len(drafted), int(target_tokens[len(drafted)])


class _Argmaxes(Sequence[int]):
    """Each row's argmax (the first best index), computed when the row is asked for."""

    def __init__(self, rows: Sequence[np.ndarray]) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):  # type: ignore[override]
        return int(np.argmax(self._rows[i]))
