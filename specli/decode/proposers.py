"""Proposers: where draft tokens come from. One small protocol, and its implementations: none
(plain decoding, here), n-gram lookup (`ngram`), a draft model (`draft_model`), one with
another vocabulary drafting through text (`translate`), the target's own NextN layers (`mtp`),
and lookup in front of a model (here). `Session.engine_for` chooses and builds them from a
request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol


@dataclass
class Proposal:
    """Draft tokens, and what the draft-length policy needs to know about them."""

    tokens: list[int] = field(default_factory=list)
    key: object = None  # what kind of proposal this is, for the draft-length policy
    # A copy in progress (n-gram lookup: a match of the longest n): how many tokens the match
    # really spans; each drafted token that is kept lengthens it. 0: the key says it all.
    extent: int = 0
    proposer: str = ""  # who drafted it: "ngram", "draft" (the draft model) or "mtp" (the NextN layers)
    # N-gram lookup with several earlier occurrences: per drafted token, the (recency-weighted)
    # share of the occurrences still in agreement that continue with it, and how many of them
    # continue with it (they agree with the whole draft up to it). Empty: one occurrence.
    support: tuple[float, ...] = ()
    agreeing: tuple[int, ...] = ()
    # Seconds inside the draft model's decodes while it was made (0: lookup's). The rest of
    # proposing is the host's own work: lookup, the draft loop's row reads and bookkeeping.
    decode_seconds: float = 0.0


class Proposer(Protocol):
    name: str
    cheap: bool  # True: proposing costs next to nothing, so `lookup` is all there is
    translated: bool  # True: a draft model of another vocabulary, drafting through text
    # The chance that a drafted token is kept, by proposal key and copy length (see
    # NGramProposer.prior); None: the draft-length policy's own prior.
    prior: Callable[[object, int], float] | None
    depth: int | None  # the most tokens `propose` drafts a step (chained NextN layers); None: any

    def prepare(self, prompt: list[int]) -> None:
        """Take in the prompt before the first step (counted as prefill time). A draft model
        decodes it where it first drafts (DraftModel.prepare), so a generation that never
        drafts with it never pays for it."""
        ...

    def lookup(self, tokens: list[int], most: int) -> Proposal:
        """Up to `most` tokens that cost nothing to make (n-gram lookup), tried first; empty if none."""
        ...

    def propose(self, tokens: list[int], most: int) -> Proposal:
        """Draft up to `most` tokens that may follow the committed sequence `tokens`."""
        ...

    def behind(self, tokens: list[int]) -> int:
        """How many tokens a draft model must decode before it can propose after `tokens`:
        what was committed since it last drafted (0 for a proposer with no model)."""
        ...



class NoProposer:
    """`--draft none`: never drafts, so every step is one plain target decode."""

    name = "none"
    cheap = True
    translated = False
    prior = None
    depth = None

    def prepare(self, prompt: list[int]) -> None:
        pass

    def lookup(self, tokens: list[int], most: int) -> Proposal:
        return Proposal()

    def propose(self, tokens: list[int], most: int) -> Proposal:
        return Proposal()

    def behind(self, tokens: list[int]) -> int:
        return 0


class LookupThenModel:
    """N-gram lookup in front of a model that drafts (a draft model, or the target's NextN
    layers). Each step, lookup proposes first, for free; the draft-length policy weighs its
    match against the model's tokens at their cost (DraftPolicy.prefers), and where the
    match is worth more the model is skipped for that step. Its KV cache catches up with
    the committed text the next time it proposes. A kept token is "draft" whichever of the
    two drafted it; each proposal names its proposer."""

    cheap = False

    def __init__(self, lookup: Proposer, model: Proposer) -> None:
        self.ngram, self.model = lookup, model
        self.name = f"{model.name}+ngram"  # "draft+ngram", "mtp+ngram"
        self.translated = model.translated
        self.prior = lookup.prior  # lookup's keys; the model's (None): the policy's own
        self.depth = model.depth  # the model's; lookup's matches are as long as they are

    def prepare(self, prompt: list[int]) -> None:
        self.ngram.prepare(prompt)
        self.model.prepare(prompt)

    def lookup(self, tokens: list[int], most: int) -> Proposal:
        return self.ngram.propose(tokens, most)

    def propose(self, tokens: list[int], most: int) -> Proposal:
        return self.model.propose(tokens, most)

    def behind(self, tokens: list[int]) -> int:
        return self.model.behind(tokens)
