"""Propose: what one step's verify batch holds. The tokens the constraint forces from
here (drafted first, "grammar", needing no verification), then the proposer's draft cut to
what the draft-length policy chooses (a free lookup first, a draft model where lookup's match
is worth less at its cost), then padding rows to a reusable batch shape (decode/shapes.py).
Never more rows than the cap (--exact's measured sizes) or the context allow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from specli.decode.constraint import Matcher
from specli.decode.exact import BatchCap
from specli.decode.policy import DraftPolicy
from specli.decode.proposers import Proposal, Proposer
from specli.decode.shapes import BatchShapes


class Positions(Protocol):
    """What the batch reads of the target: where its next row goes, and the context's size."""

    n_past: int
    n_ctx: int


@dataclass
class VerifyBatch:
    """One step's batch: row i follows last + (forced + draft)[:i]; padding rows after them
    repeat the last token and are never read. `asked`: tokens the draft model was asked for."""

    last: int
    forced: list[int]
    draft: list[int]
    padding: int
    proposal: Proposal
    asked: int

    @property
    def tokens(self) -> list[int]:
        batch = [self.last] + self.forced + self.draft
        return batch + [batch[-1]] * self.padding


class Batcher:
    """Builds each step's VerifyBatch for one request. `forces`: forced tokens are drafted
    (only where something drafts: --draft none writes one token a step)."""

    def __init__(self, target: Positions, proposer: Proposer, policy: DraftPolicy, cap: BatchCap,
                 shapes: BatchShapes, matcher: Matcher | None, *, forces: bool) -> None:
        self.target, self.proposer, self.policy, self.cap, self.shapes = target, proposer, policy, cap, shapes
        self.matcher, self.forces = matcher, forces

    def next(self, tokens: list[int], last: int, room: int) -> VerifyBatch:
        """The batch after `tokens` (which end with `last`, consumed by the matcher), with at
        most `room` tokens after `last`: what the output budget and the context leave."""
        room = min(room, self.cap.at(self.target.n_past) - 1)  # the batch's first row is at n_past
        forced = self._forced_run(room)
        proposal, draft, asked = self._propose(tokens + forced if forced else tokens, room - len(forced))
        draft, padding = self._pad(proposal, forced, draft)
        return VerifyBatch(last, forced, draft, padding, proposal, asked)

    def _forced_run(self, most: int) -> list[int]:
        """The tokens the constraint forces from here, at most `most`, consumed: certain,
        whatever the target's logits."""
        forced: list[int] = []
        matcher = self.matcher
        while self.forces and len(forced) < most and matcher is not None:
            token = matcher.forced()
            if token is None:
                break
            matcher.consume(token)
            forced.append(token)
        return forced

    def _propose(self, tokens: list[int], room: int) -> tuple[Proposal, list[int], int]:
        """The proposal, the part of it to verify (at most `room` tokens: what the output
        budget, the context and the batch leave), and how many tokens the draft model was
        asked for."""
        policy = self.policy
        most = min(room, policy.max_draft)
        if most <= 0:
            return Proposal(), [], 0
        # A free proposal (n-gram lookup) first; then, where it is not worth as much as a draft
        # model's tokens at their cost, the draft model, asked for as many as the policy chooses.
        proposal = self._allowed(self.proposer.lookup(tokens, most))
        behind = 0 if self.proposer.cheap else self.proposer.behind(tokens)
        # The model drafts at most its depth (chained NextN layers); lookup's match is not held to it.
        depth = self.proposer.depth
        most = most if depth is None else min(most, depth)
        if self.proposer.cheap or (proposal.tokens and policy.prefers(proposal, most, behind)):
            k = policy.choose(proposal.key, proposal.extent, len(proposal.tokens), proposal.support,
                              agreeing=proposal.agreeing) if proposal.tokens else 0
            return proposal, proposal.tokens[:k], 0
        k = policy.choose(None, 0, most, behind=behind)
        proposal = self._allowed(self.proposer.propose(tokens, k)) if k > 0 else Proposal()
        return proposal, proposal.tokens[:k], k

    def _allowed(self, proposal: Proposal) -> Proposal:
        """The proposal cut where the constraint forbids a token: that one and the rest are
        never verified (lookup's, before the policy prices them; a draft model's through text)."""
        if self.matcher is not None and proposal.tokens:
            proposal.tokens = proposal.tokens[: self.matcher.valid_prefix(proposal.tokens)]
        return proposal

    def _pad(self, proposal: Proposal, forced: list[int], draft: list[int]) -> tuple[list[int], int]:
        """The draft to verify and the padding rows after it, for the batch size BatchShapes
        chooses: where the proposal has tokens past the chosen ones they fill the rows first
        (verified like the rest, at no extra cost), the rest is padding. Never past the
        largest batch (--exact) or the context."""
        needed = 1 + len(forced) + len(draft)
        most = min(self.cap.at(self.target.n_past), self.target.n_ctx - self.target.n_past)
        rows = self.shapes.rows(needed, most)
        if rows <= needed:
            return draft, 0
        more = proposal.tokens[len(draft) : len(draft) + rows - needed] if draft else []
        draft = draft + more
        return draft, rows - needed - len(more)
