"""MTP drafting: the target's own NextN layers draft, from its hidden states.

`NextnDraft` keeps the MTP caches (`NextnLayers`: specli.llama.mtp.MtpHeads) in step with the committed
sequence, as a DraftModel keeps a draft model's, and is drafted from by `MtpProposer`: the
draft model's proposer (the same keyed draws, constraint and stopping rule) under the name
"mtp", whose drafts are at most as long as the model's chained NextN layers allow.

Each cache's entry q reads (token q, the target's hidden state at q - 1). A proposal after
the committed tokens t[0..n) first brings the cache to t[0..n-1) (only what it lacks is
decoded, from the target's hidden rows, lazily: rejected draft tokens never reach it), then
the entry (t[n-1], the target's state at n - 2) writes the first draft token. Each further
token is read with the state the NextN layer wrote before it: by the same layer (one NextN
layer), or by the next layer over the whole draft so far (chained layers, as llama.cpp does).
Draft entries are speculative and are removed before the next catch-up.
"""

from __future__ import annotations

import time

from typing import TYPE_CHECKING, Protocol

import numpy as np

from specli.decode.draft_model import DraftModelProposer
from specli.decode.proposers import Proposal
from specli.decode.sampling import SamplingSettings
from specli.decode.slots import Part, Slot
from specli.decode.text import common_prefix_length

if TYPE_CHECKING:
    from specli.decode.constraint import Matcher


class NextnLayers(Protocol):
    """What drafting needs of a target's NextN layers (specli.llama.mtp.MtpHeads)."""

    layers: int  # NextN layers in the model
    depth: int | None  # the longest draft (chained layers: one per token); None: any
    n_embd: int
    n_ctx: int

    def target_hidden(self, first: int, count: int) -> np.ndarray: ...
    def release(self, below: int) -> None: ...
    def decode(self, layer: int, tokens: list[int], start: int, hidden: np.ndarray,
               *, logits: bool = True) -> tuple[np.ndarray, np.ndarray] | None: ...
    def rewind(self, layer: int, n_keep: int) -> None: ...
    def close(self) -> None: ...


class NextnSlot:
    """The target's NextN layer (one: chained layers draft in one sequence only) in one of the
    target's slots, as NextnLayers: its entries go into the slots' shared draft decodes
    (decode/slots.py, `SharedSteps.submit(drafter=...)`), one decode a draft position for every
    slot drafting, as llama.cpp's draft-mtp drafts its sequences; its rows are the target's
    for this slot's sequence, up to the slot's n_past."""

    layers, depth = 1, None

    def __init__(self, heads, slot: Slot) -> None:
        self.heads, self.slot = heads, slot  # heads: specli.llama.mtp.MtpHeads, of as many sequences
        slot.steps.lend = False  # its entries read the target's hidden rows, which shared cells do not bring
        self.n_embd, self.n_ctx = heads.n_embd, slot.n_ctx

    def target_hidden(self, first: int, count: int) -> np.ndarray:
        return self.heads.target_hidden(first, count, self.slot.sequence, self.slot.n_past)

    def release(self, below: int) -> None:
        self.heads.release(below, self.slot.sequence, self.slot.n_past)

    def decode(self, layer: int, tokens: list[int], start: int, hidden: np.ndarray,
               *, logits: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
        """As MtpHeads.decode, in the shared steps (a catch-up in pieces of the batch size)."""
        result, size = None, self.heads.batch_size
        for at in range(0, len(tokens), size):
            piece = tokens[at : at + size]
            flags = [False] * len(piece)
            flags[-1] = logits and at + size >= len(tokens)
            result = self.slot.steps.submit(self.slot.sequence, Part(start + at, piece, flags, hidden[at : at + size]),
                                            drafter=self.heads)
        return result

    def rewind(self, layer: int, n_keep: int) -> None:
        self.slot.steps.forget(self.slot.sequence, n_keep, drafter=self.heads)

    def close(self) -> None:
        pass  # the session closes the NextN layers themselves


class NextnDraft:
    """The MTP caches of one loaded target, kept across generations (a chat's turns): the
    committed tokens each context's cache holds, and the draft in progress."""

    on_gpu = False  # its rows come to the host (choice_after is row_after's argmax)

    def __init__(self, heads: NextnLayers) -> None:
        self.heads = heads
        self.n_ctx = heads.n_ctx
        self.depth = heads.depth  # None: any depth
        # Per context: the committed tokens whose entries it holds (entry q: cached[q]).
        self.cached: list[list[int]] = [[] for _ in range(heads.layers if heads.depth else 1)]
        # The draft in progress: its entries' tokens (the last committed one, then the drafted
        # ones) and the states they are read with, and the state the last entry wrote.
        self._committed: list[int] = []
        self._tokens: list[int] = []
        self._states: list[np.ndarray] = []
        self._written = np.zeros(heads.n_embd, dtype=np.float32)
        self.decode_seconds = 0.0  # inside the heads' decodes, all told

    def _decode(self, layer: int, tokens: list[int], start: int, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        started = time.perf_counter()
        out = self.heads.decode(layer, tokens, start, states)
        self.decode_seconds += time.perf_counter() - started
        assert out is not None
        return out

    def _read(self, layer: int, tokens: list[int], start: int, states: np.ndarray) -> None:
        """Entries a cache catches up with: decoded without a logits row (nothing reads it)."""
        started = time.perf_counter()
        self.heads.decode(layer, tokens, start, states, logits=False)
        self.decode_seconds += time.perf_counter() - started

    def forget(self) -> None:
        """Empty every cache (before its decodes are timed, or the target's cache is emptied)."""
        for layer, cached in enumerate(self.cached):
            self.heads.rewind(layer, 0)
            cached.clear()

    def behind(self, tokens: list[int]) -> int:
        """Committed tokens the first layer must read before it can draft after `tokens`."""
        return max(len(tokens) - 1 - common_prefix_length(self.cached[0], tokens), 0)

    def prepare(self, prompt: list[int]) -> None:
        """Bring every cache to the prompt (the target has decoded all of it): now, not where
        the layers first draft, as they read the target's hidden rows of each position, which
        are let go of once every cache has read them."""
        for layer in range(len(self.cached)):
            self._catch_up(layer, prompt)
        self._release()

    def _release(self) -> None:
        """Let the target's hidden rows go below what every cache has read (entry q reads row
        q - 1: the row before each cache's end stays, for its next catch-up)."""
        self.heads.release(min(len(cached) for cached in self.cached) - 1)

    def _catch_up(self, layer: int, tokens: list[int]) -> None:
        """Make `layer`'s cache hold exactly the entries of `tokens`, decoding the ones it lacks."""
        cached = self.cached[layer]
        keep = common_prefix_length(cached, tokens)
        self.heads.rewind(layer, keep)
        del cached[keep:]
        if len(tokens) > keep:
            self._read(layer, tokens[keep:], keep, self.heads.target_hidden(keep - 1, len(tokens) - keep))
            cached.extend(tokens[keep:])

    def row_after(self, tokens: list[int]) -> np.ndarray:
        """The first layer's logits for the token after `tokens`, whose last is not in the
        target's cache yet (the engine's `last`)."""
        last = len(tokens) - 1
        # The draft's first entry is decoded alone, after the catch-up: a one-entry decode's
        # state is its own on every architecture (MtpHeads.decode).
        self._catch_up(0, tokens[:last])
        self._release()
        self._committed, self._tokens = tokens, [tokens[last]]
        self._states = [self.heads.target_hidden(last - 1, 1)[0]]
        logits, self._written = self._decode(0, self._tokens, last, np.stack(self._states))
        self.cached[0].append(tokens[last])  # read with the target's own state: a committed entry
        return logits

    def extend(self, token: int) -> np.ndarray:
        """The logits after one more draft token."""
        self._tokens.append(token)
        self._states.append(self._written)
        start = len(self._committed) - 1  # the position of the draft's first entry
        step = len(self._tokens) - 1  # draft tokens so far
        if self.depth is None:  # the one layer reads its own last state
            logits, self._written = self._decode(0, [token], start + step, self._written[None, :])
            return logits
        # Chained layers: layer `step` reads the whole draft so far, after the committed entries.
        self._catch_up(step, self._committed[:start])
        logits, self._written = self._decode(step, self._tokens, start, np.stack(self._states))
        self.cached[step].append(self._tokens[0])
        return logits

    def close(self) -> None:
        """Free the NextN layers' contexts (before the target they read)."""
        self.heads.close()

    def choice_after(self, tokens: list[int]) -> int:
        return int(np.argmax(self.row_after(tokens)))

    def extend_choice(self, token: int) -> int:
        return int(np.argmax(self.extend(token)))


class MtpProposer(DraftModelProposer):
    """Drafts with the target's NextN layers for one request (DraftModelProposer's rules),
    at most `NextnDraft.depth` tokens a step."""

    name = "mtp"

    def __init__(self, draft: NextnDraft, sampling: SamplingSettings, seed: int = 0, draft_min_p: float = 0.0,
                 *, constraint: Matcher | None = None) -> None:
        super().__init__(draft, sampling, seed, draft_min_p, constraint=constraint)
        self.depth = draft.depth

    def propose(self, tokens: list[int], most: int) -> Proposal:
        return super().propose(tokens, most if self.depth is None else min(most, self.depth))
