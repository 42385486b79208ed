"""Drafting across vocabularies: a draft model whose tokens mean nothing to the target drafts
through text.

- The draft reads the committed text (the target's tokens as bytes), re-tokenized with its
  own tokenizer incrementally: each step only the text after its second-to-last token is
  tokenized again (its last token may merge with what follows), so its KV cache is rewound
  only to where its own token sequence changed (DraftModelProposer keeps the common prefix).
- Its proposed tokens are turned back into text and tokenized with the target's tokenizer;
  the target verifies those tokens as any draft's. A token is kept only when it equals the
  target's own choice, so greedy and seeded output stay the target's, whatever the draft.
- Boundaries: the last target token of the drafted text is not proposed (more text could
  still extend it); only target tokens that spell the drafted text exactly are proposed;
  while the committed text ends inside a UTF-8 character (a byte token of a split emoji),
  the draft abstains, as it cannot continue half a character in text.

Both models are reached through a small protocol (tokenize, piece, bos), so this module
needs no llama.cpp of its own: `backend.Model` is one.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

from specli.proposers import DraftModelProposer, Proposal

# Text to price translating with (cost_per_target_token): prose, digits, code, accents, CJK.
SAMPLE = ("The quick brown fox jumps over the lazy dog; 1234567890 and 3.14159. "
          "def main(argv):\n    return 0  # café, naïve, 東京\n") * 4


class Tokenizer(Protocol):
    bos: int
    add_bos: bool
    n_ctx: int

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]: ...

    def piece(self, token: int, special: bool = False) -> bytes: ...

    def is_end_of_generation(self, token: int) -> bool: ...


def complete_utf8(data: bytes | bytearray) -> int:
    """The length of the longest prefix of `data` that does not end inside a UTF-8 character
    (a lone continuation or invalid byte counts as complete: it can never be completed)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for its lead byte
        need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
        return len(data) - back if back < need else len(data)
    return len(data)


class TranslatedDraft:
    """A draft model with another vocabulary, proposing target tokens through text."""

    name = "draft"
    cheap = False
    prior = None
    translated = True

    def __init__(self, target: Tokenizer, model: DraftModelProposer) -> None:
        self.target = target
        self.model = model
        self.draft: Tokenizer = model.model
        self._text = bytearray()  # the committed text: the target's tokens as bytes
        self._target_count = 0  # committed target tokens whose bytes are in _text
        self._tokens: list[int] = []  # the draft's tokens for _text[:_ends[-1]]
        self._ends: list[int] = []  # where each of them ends in _text
        self._settled = 0  # of them, those whose ends are known (the tokenizer kept the text as it was)
        self._lead = [self.draft.bos] if self.draft.add_bos and self.draft.bos >= 0 else []

    def prepare(self, prompt: list[int]) -> None:
        self._text.clear()
        self._target_count = 0
        self._tokens.clear()
        self._ends.clear()
        self._settled = 0
        sequence = self._read(prompt)
        if self._fits(sequence):
            self.model.prepare(sequence)

    def lookup(self, tokens: list[int], draft_tokens: int) -> Proposal:
        return Proposal()  # every draft token costs a decode

    def propose(self, tokens: list[int], draft_tokens: int) -> Proposal:
        sequence = self._read(tokens)
        if draft_tokens <= 0 or complete_utf8(self._text) < len(self._text) or not self._fits(sequence):
            return Proposal()  # the text ends inside a character: no draft can continue half of it
        # One draft token more than asked: the last target token of the text is held back.
        drafted = self.model.propose(sequence, draft_tokens + 1).tokens
        ended = next((i for i, token in enumerate(drafted) if self.draft.is_end_of_generation(token)), len(drafted))
        text = b"".join(self.draft.piece(token) for token in drafted[:ended])
        return Proposal(self._target_tokens(text)[:draft_tokens], proposer="draft")

    def _fits(self, sequence: list[int]) -> bool:
        """Whether the draft's context holds its tokens for the text (it may need more of them
        than the target: then, near the end of the target's context, it stops drafting)."""
        return len(sequence) + 1 < self.draft.n_ctx

    def _read(self, tokens: list[int]) -> list[int]:
        """The draft's token sequence for the committed target tokens: the new text is appended
        and the draft's last token and what follows are tokenized again."""
        for token in tokens[self._target_count :]:
            if token != self.target.bos:  # the draft has its own BOS
                self._text += self.target.piece(token, special=True)
        self._target_count = len(tokens)
        # Keep the draft's tokens but its last (and any it could not place), from a character
        # boundary: a byte token may end inside a character, and text cut there reads wrongly.
        keep = max(min(len(self._tokens) - 1, self._settled), 0)
        while keep and self._ends[keep - 1] < len(self._text) and self._text[self._ends[keep - 1]] & 0xC0 == 0x80:
            keep -= 1
        start = self._ends[keep - 1] if keep else 0
        end = complete_utf8(self._text)
        tail = self.draft.tokenize(self._text[start:end].decode("utf-8", "replace"), add_special=False)
        del self._tokens[keep:], self._ends[keep:]
        position = start
        for token in tail:
            position += len(self.draft.piece(token, special=True))
            self._tokens.append(token)
            self._ends.append(min(position, end))
        # Where the tokenizer changed the text (normalised it) its tokens' ends are not known:
        # none of the tail counts as settled, and it is all tokenized again next step.
        self._settled = len(self._tokens) if position == end else keep
        return self._lead + self._tokens

    def _target_tokens(self, text: bytes) -> list[int]:
        """The target's tokens for drafted text: those that spell it exactly, but the last."""
        text = text[: complete_utf8(text)]
        if not text:
            return []
        tokens = self.target.tokenize(text.decode("utf-8", "replace"), add_special=False)
        spelled, position = [], 0
        for token in tokens:
            piece = self.target.piece(token, special=True)
            if text[position : position + len(piece)] != piece:
                break
            spelled.append(token)
            position += len(piece)
        return spelled[:-1]

    def close(self) -> None:
        self.model.close()


def cost_per_target_token(target: Tokenizer, draft: Tokenizer, decode_seconds: float,
                          clock: Callable[[], float] = time.perf_counter) -> float:
    """What one drafted target token costs through text: the draft's decodes for it (its
    vocabulary may spell the same text in more tokens, or fewer: their ratio on SAMPLE) and a
    round trip through both tokenizers (SAMPLE through the draft's tokenizer and pieces and the
    target's tokenizer and pieces, the fastest of 3), per target token."""
    best = float("inf")
    for _ in range(3):
        started = clock()
        tokens = draft.tokenize(SAMPLE, add_special=False)
        text = b"".join(draft.piece(token) for token in tokens)
        spelled = target.tokenize(text.decode("utf-8", "replace"), add_special=False)
        for token in spelled:
            target.piece(token)
        best = min(best, clock() - started)
    per_target_token = len(tokens) / max(len(spelled), 1)
    return decode_seconds * per_target_token + best / max(len(spelled), 1)
