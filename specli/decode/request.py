"""A generation as asked for: what `run`, `chat`, `bench` and `serve` hand to
`Session.engine_for`, the one place that turns it into an engine.

The request says what to write (sampling, seed, stop strings, the token limit, a constraint
such as a JSON schema) and how to
draft it (which proposer, how many draft tokens a step, --exact, a Predicted Output). It
holds no model: the session holds the loaded models, and what they cost.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Union

from specli.decode.constraint import Constraint
from specli.decode.sampling import SamplingSettings, fresh_seed
from specli.errors import UsageError


class DraftKind:
    """The built-in draft kinds' names. A request names its draft kind by a string; each
    kind's record (what it loads, how its proposer is built and priced, its help) is in
    specli/drafts.py, which is where kinds are told apart. NONE is plain decoding."""

    NONE = "none"
    NGRAM = "ngram"
    MODEL = "model"
    MTP = "mtp"


# Draft tokens per step: N, or "auto" (the adaptive policy chooses each step's).
DraftTokens = Union[int, Literal["auto"]]
AUTO: DraftTokens = "auto"


def parse_draft_tokens(value: str | int) -> DraftTokens:
    """-k N|auto, bench's -k list and a request's draft_tokens: a whole number of at least 1,
    or "auto". UsageError says why not."""
    if value == AUTO:
        return AUTO
    number = value
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            number = None
    if not isinstance(number, int) or isinstance(number, bool):
        raise UsageError(f"{value!r} is not a whole number or 'auto'")
    if number < 1:
        raise UsageError(f"must be at least 1, or 'auto' (draft 'none' for plain decoding), not {number}")
    return number


def parse_draft_tokens_list(text: str) -> list[DraftTokens]:
    """bench -k auto,2,8: draft lengths to compare, each as -k takes one (repeats dropped)."""
    values = [parse_draft_tokens(part.strip()) for part in text.split(",") if part.strip()]
    if not values:
        raise UsageError("give at least one value, e.g. auto,4,8")
    return list(dict.fromkeys(values))


@dataclass(frozen=True)
class GenerationRequest:
    max_tokens: int = 256
    sampling: SamplingSettings = SamplingSettings()
    stop: tuple[str, ...] = ()
    seed: int | None = None  # keys every sampled token by its position; None: a fresh one (`seeded`)
    draft: str = DraftKind.NGRAM  # the draft kind, by name (specli/drafts.py)
    draft_tokens: DraftTokens = AUTO
    # A draft model or MTP: n-gram lookup in front of it (--no-ngram: off; a prediction turns it on).
    lookup: bool = True
    draft_min_p: float = 0.0  # a draft model (MTP too) stops drafting under this probability
    # Write exactly what `--draft none --exact` writes: each verify batch capped at the size
    # measured to give one-token logits bit for bit where it starts in the context. (What the
    # target's cache holds of the prompt is kept, as without it: plain and drafted runs split a
    # prompt at the same point. `run`, bench and a served exact request start from an empty one.)
    exact: bool = False
    prediction: str | None = None  # a Predicted Output: text the answer is expected to repeat
    # A JSON schema or a grammar that every token must meet (None: free text).
    constraint: Constraint | None = None
    # Each written token's log-probability under the target, with this many alternatives
    # (decode/logprobs.py; None: none asked for).
    logprobs: int | None = None

    def seeded(self) -> GenerationRequest:
        """This request with its seed drawn now where it gives none: the one place a fresh
        seed is drawn."""
        return self if self.seed is not None else replace(self, seed=fresh_seed())

    @property
    def drafts(self) -> bool:
        return self.draft != DraftKind.NONE
