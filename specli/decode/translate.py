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

import math
import time
from typing import Callable, Protocol

from specli.decode.draft_model import DraftModelProposer
from specli.decode.proposers import Proposal

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


class Spelling:
    """A tokenizer's tokens for a stretch of text on its own, `special` pieces included.

    Some SentencePiece tokenizers (Llama 2's, Mistral 7B's) put a space before whatever text
    they are given, so their tokens for "red" spell " red". For them the text is tokenized
    after a newline, which ends a word in every vocabulary, and the tokens that spell that
    newline (with the added space) are dropped; where the newline's tokens would run into the
    text itself, the text is tokenized plainly (its spelling is then checked by the caller)."""

    SENTINEL = "\n"

    def __init__(self, model: Tokenizer, *, parse_special: bool = False) -> None:
        self.model, self.parse_special = model, parse_special
        self.prefix = b""
        if self.spell(self._plain("a")) != b"a":
            self.prefix = self.spell(self._plain(self.SENTINEL))

    def tokens(self, text: str) -> list[int]:
        if not self.prefix:
            return self._plain(text)
        tokens = self._plain(self.SENTINEL + text)
        skip, spelled = 0, 0
        while skip < len(tokens) and spelled < len(self.prefix):
            spelled += len(self.model.piece(tokens[skip], special=True))
            skip += 1
        return tokens[skip:] if spelled == len(self.prefix) else self._plain(text)

    def spell(self, tokens: list[int]) -> bytes:
        return b"".join(self.model.piece(token, special=True) for token in tokens)

    def _plain(self, text: str) -> list[int]:
        return self.model.tokenize(text, add_special=False, parse_special=self.parse_special)


def tokens_per_target_token(target: Tokenizer, draft: Tokenizer) -> float:
    """How many draft tokens spell what one target token spells, on SAMPLE: a smaller
    vocabulary needs more of them."""
    return len(Spelling(draft).tokens(SAMPLE)) / max(len(Spelling(target).tokens(SAMPLE)), 1)


class TranslatedDraft:
    """A draft model with another vocabulary, proposing target tokens through text."""

    name = "draft"
    cheap = False
    prior = None
    translated = True
    depth = None

    def __init__(self, target: Tokenizer, model: DraftModelProposer) -> None:
        if model.keyed:
            raise ValueError("a draft through text drafts its likeliest tokens: its positions are not the target's, "
                             "so there is no keyed noise to share (DraftModelProposer(keyed=False))")
        self.target = target
        self.model = model
        self.draft: Tokenizer = model.draft.model  # type: ignore[assignment]
        # The target's control tokens (a chat template's) reach the text as their own text; a
        # draft that has the same control token reads it as one.
        self._read_spelling = Spelling(self.draft, parse_special=True)
        self._write_spelling = Spelling(target)
        # Draft tokens to ask for per target token wanted (SAMPLE's ratio).
        self._ratio = tokens_per_target_token(target, self.draft)
        self._text = bytearray()  # the committed text: the target's tokens as bytes
        self._target_count = 0  # committed target tokens whose bytes are in _text
        self._tokens: list[int] = []  # the draft's tokens for _text[:_ends[-1]]
        self._ends: list[int] = []  # where each of them ends in _text
        self._settled = 0  # of them, those that spell _text exactly up to their end
        self._lead = [self.draft.bos] if self.draft.add_bos and self.draft.bos >= 0 else []
        self._target_bos = target.bos

    def prepare(self, prompt: list[int]) -> None:
        self._text.clear()
        self._target_count = 0
        self._tokens.clear()
        self._ends.clear()
        self._settled = 0
        sequence = self._read(prompt)
        # Nothing to take in, or more than its context holds (it never drafts for this prompt):
        # its cache is emptied, so nothing of an earlier prompt stays owed.
        self.model.prepare(sequence if sequence and self._fits(sequence) else [])

    def lookup(self, tokens: list[int], most: int) -> Proposal:
        return Proposal()  # every draft token costs a decode

    def behind(self, tokens: list[int]) -> int:
        """The draft's tokens for the text it has not read yet (at SAMPLE's ratio), and those it
        has read but not decoded."""
        unread = round((len(tokens) - self._target_count) * self._ratio)
        return unread + self.model.behind(self._lead + self._tokens)

    def propose(self, tokens: list[int], most: int) -> Proposal:
        sequence = self._read(tokens)
        if most <= 0 or not sequence or complete_utf8(self._text) < len(self._text) or not self._fits(sequence):
            return Proposal()  # nothing to continue yet, or the text ends inside a character
        # Enough draft tokens for most + 1 target tokens: the last is held back.
        wanted = max(1, math.ceil((most + 1) * self._ratio))
        inner = self.model.propose(sequence, wanted)
        drafted = inner.tokens
        ended = next((i for i, token in enumerate(drafted) if self.draft.is_end_of_generation(token)), len(drafted))
        text = b"".join(self.draft.piece(token) for token in drafted[:ended])
        return Proposal(self._target_tokens(text)[:most], proposer="draft", decode_seconds=inner.decode_seconds)

    def _fits(self, sequence: list[int]) -> bool:
        """Whether the draft's context holds its tokens for the text (it may need more of them
        than the target: then, near the end of the target's context, it stops drafting)."""
        return len(sequence) + 1 < self.draft.n_ctx

    def _read(self, tokens: list[int]) -> list[int]:
        """The draft's token sequence for the committed target tokens: the new text is appended
        and the draft's last token and what follows are tokenized again."""
        for token in tokens[self._target_count :]:
            if token != self._target_bos:  # the draft has its own BOS
                self._text += self.target.piece(token, special=True)
        self._target_count = len(tokens)
        # Keep the draft's tokens but its last (and any that do not spell the text), from a
        # character boundary: a byte token may end inside a character, and text cut there
        # reads wrongly.
        keep = max(min(len(self._tokens) - 1, self._settled), 0)
        while keep and self._ends[keep - 1] < len(self._text) and self._text[self._ends[keep - 1]] & 0xC0 == 0x80:
            keep -= 1
        start = self._ends[keep - 1] if keep else 0
        end = complete_utf8(self._text)
        tail = self._read_spelling.tokens(self._text[start:end].decode("utf-8", "replace"))
        del self._tokens[keep:], self._ends[keep:]
        # A token settles when it spells the text exactly, and every one before it did; where
        # the tokenizer changed the text (normalised it, replaced a bad byte) the rest of the
        # tail does not settle and is tokenized again next step.
        position, settled = start, keep
        for token in tail:
            piece = self.draft.piece(token, special=True)
            if settled == len(self._tokens) and self._text[position : position + len(piece)] == piece:
                settled += 1
            position += len(piece)
            self._tokens.append(token)
            self._ends.append(min(position, end))
        self._settled = settled
        return self._lead + self._tokens

    def _target_tokens(self, text: bytes) -> list[int]:
        """The target's tokens for drafted text: those that spell it exactly, but the last."""
        text = text[: complete_utf8(text)]
        if not text:
            return []
        tokens = self._write_spelling.tokens(text.decode("utf-8", "replace"))
        spelled, position = [], 0
        for token in tokens:
            piece = self.target.piece(token, special=True)
            if text[position : position + len(piece)] != piece:
                break
            spelled.append(token)
            position += len(piece)
        return spelled[:-1]


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
