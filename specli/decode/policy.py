"""The draft-length policy: how many of a proposal's tokens each step verifies. `-k N` is
FixedDraftPolicy; `-k auto` is adaptive.AdaptiveDraftPolicy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    from specli.decode.events import StepRecord
    from specli.decode.proposers import Proposal

MAX_DRAFT = 48  # the longest draft any step verifies (-k N is held to it too)


class DraftPolicy(Protocol):
    """Chooses how many draft tokens each step verifies (-k N: FixedDraftPolicy; -k auto:
    adaptive.AdaptiveDraftPolicy)."""

    max_draft: int  # the longest draft a step may verify (-k N: N; -k auto: what --exact allows)

    def choose(self, key: object, extent: int, most: int, support: Sequence[float] = (),
               behind: int = 0, agreeing: Sequence[int] = ()) -> int:
        """How many draft tokens to verify, `most` at most (0: a plain step).
        key, extent, support and agreeing: the proposal's (Proposal.key, ...); key None: a
        draft model's tokens, which cost a decode each, after the `behind` tokens it must
        decode first to catch up with the committed text (Proposer.behind)."""
        ...

    def prefers(self, free: Proposal, most: int, behind: int = 0) -> bool:
        """Whether a free proposal (n-gram lookup) is worth more than up to `most` tokens
        of the draft model (`behind` the committed text by that many tokens)."""
        ...

    def price(self, drafted: int) -> float:
        """The seconds the policy priced the verify of `drafted` draft tokens at (0: it prices
        nothing). Set beside the measured time, it shows whether the stored costs still hold."""
        ...

    def record(self, step: StepRecord) -> None: ...


@dataclass
class FixedDraftPolicy:
    """-k N: every step verifies as many of the proposal's tokens as it has, up to N (0: plain)."""

    max_draft: int

    def choose(self, key: object, extent: int, most: int, support: Sequence[float] = (),
               behind: int = 0, agreeing: Sequence[int] = ()) -> int:
        return min(self.max_draft, most)

    def prefers(self, free: Proposal, most: int, behind: int = 0) -> bool:
        return free.extent > 0  # a copy in progress (a match of lookup's longest n)

    def price(self, drafted: int) -> float:
        return 0.0

    def record(self, step: StepRecord) -> None:
        pass


