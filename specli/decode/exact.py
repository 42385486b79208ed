"""Which verify batches give logits bit-identical to one-token decoding, on this build, and where
in the context.

llama.cpp's kernels may take another code path for a batch of several rows than for one
row (CPU weight repacking, GPU kernels chosen by batch size), and round differently; and the
path may change with the depth of the KV cache (on a CPU, a one-token decode whose KV view
holds 512 cells or more splits attention across threads, which a batch of several rows never
does). A verify batch of b rows writes exactly what plain decoding writes only if every row's
logits, and the KV cache entries it leaves, are bit-identical to those of b one-token decodes,
whichever of its rows ask for logits (the rows before forced tokens ask for none).

So the largest such b is measured for spans of the context (from each of SPAN_STARTS to the
next, the last to the context's end), at both ends of each: batches from its first position,
and batches ending at its last. `--exact` caps a verify batch at the size of the span it
starts in and never lets it cross that span's end (`BatchCap`); past the spans measured, one row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

# Text to decode while measuring: ordinary prose, so the batches run the kernels real text runs.
SAMPLE_TEXT = (
    "The printing press changed how knowledge moved through Europe. Before it, a book was copied "
    "by hand, one page at a time, and a library of a few hundred volumes was a rare treasure. "
    "Within fifty years of its invention, presses in more than two hundred cities had printed "
    "millions of books, pamphlets and broadsheets, in Latin and in the languages people spoke. "
)
PREFIX_TOKENS = 16  # the first span's batches follow this many tokens decoded as a prompt is
SPAN_STARTS = (0, 256, 1024)  # where measured spans begin; the context's end closes the last
# Spans are measured in order; none is begun after this long, so the rest stay at one row
# (a large model on a CPU decodes a long context's prefix for minutes).
MEASURE_SECONDS = 60.0
# Off a GPU a verify row costs nearly a plain step, so no draft of 16 tokens or more pays:
# the measurement stops at this many rows there (each size it tries costs decodes of its rows).
CPU_ROWS = 17


class Decoder(Protocol):
    n_ctx: int

    def decode(self, tokens: list[int], *, all_logits: bool = False,
               outputs: Sequence[bool] | None = None) -> np.ndarray: ...
    def rewind(self, n_keep: int) -> None: ...
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]: ...


@dataclass(frozen=True)
class BatchCap:
    """The most rows a verify batch may have, by the position of its first row: `spans` are
    (start, end, rows), ascending and adjoining from 0; a batch starting in [start, end) has at
    most `rows` rows and ends before `end`. Past the last span, one row."""

    spans: tuple[tuple[int, int, int], ...]

    @classmethod
    def anywhere(cls, rows: int) -> BatchCap:
        """`rows` rows at every position (no --exact: the longest draft and [last])."""
        return cls(((0, 1 << 62, rows),))

    def within(self, rows: int) -> BatchCap:
        """These spans, none above `rows` rows."""
        return BatchCap(tuple((start, end, min(most, rows)) for start, end, most in self.spans))

    def at(self, position: int) -> int:
        for start, end, rows in self.spans:
            if start <= position < end:
                return max(1, min(rows, end - position))
        return 1

    @property
    def largest(self) -> int:
        return max((rows for _, _, rows in self.spans), default=1)

    @property
    def measured(self) -> int:
        """Where the spans end: positions past this get one row."""
        return self.spans[-1][1] if self.spans else 0

    def drafted_positions(self) -> int:
        """How many draft tokens the spans allow over their positions: the cap that allows more."""
        return sum((end - start) * (rows - 1) for start, end, rows in self.spans)

    def report(self) -> list[dict[str, int]]:
        """The spans for a JSON report: start and end positions (end excluded) and rows."""
        return [{"start": start, "end": end, "rows": rows} for start, end, rows in self.spans]

    @classmethod
    def from_report(cls, spans: list[dict[str, int]]) -> BatchCap:
        return cls(tuple((span["start"], span["end"], span["rows"]) for span in spans))

    def describe(self) -> str:
        """The spans in words, adjoining spans of one size joined: "3 rows at positions 0-255,
        1 row at 256-4095"."""
        joined: list[list[int]] = []
        for start, end, rows in self.spans:
            if joined and joined[-1][2] == rows:
                joined[-1][1] = end
            else:
                joined.append([start, end, rows])
        parts = [f"{rows} {'row' if rows == 1 else 'rows'} at {start}-{end - 1}" for start, end, rows in joined]
        if parts:
            parts[0] = parts[0].replace(" at ", " at positions ", 1)
        return ", ".join(parts) or "not measured"

    def to_json(self) -> list[list[int]]:
        return [list(span) for span in self.spans]

    @classmethod
    def from_json(cls, value: object) -> BatchCap | None:
        """A stored cap, or None where the value is not one (an earlier format)."""
        if not isinstance(value, list) or not value:
            return None
        spans, position = [], 0
        for span in value:
            if (not isinstance(span, list) or len(span) != 3 or not all(type(v) is int for v in span)
                    or span[0] != position or span[1] <= span[0] or span[2] < 1):
                return None
            spans.append((span[0], span[1], span[2]))
            position = span[1]
        return cls(tuple(spans))


def measure_cap(model: Decoder, largest: int, seconds: float = MEASURE_SECONDS) -> BatchCap:
    """The exact batch sizes of the context's spans (at most `largest` rows): for each span,
    the smaller of the largest exact size from its start and the one up to its end. The model's
    cache is left empty."""
    text = model.tokenize(SAMPLE_TEXT, add_special=True)
    while len(text) < model.n_ctx:
        text += model.tokenize(SAMPLE_TEXT, add_special=False)
    bounds = [start for start in SPAN_STARTS if start < model.n_ctx] + [model.n_ctx]
    spans: list[tuple[int, int, int]] = []
    started = time.perf_counter()
    try:
        for start, end in zip(bounds, bounds[1:]):
            if spans and time.perf_counter() - started > seconds:
                break
            first = max(start, PREFIX_TOKENS)
            most = min(largest, (end - first - 1) // 2)  # two batches and a token fit in the span
            rows = _largest_exact(model, _OneTokenRows(model, text, first), most)
            if rows > 1:  # and batches ending at the span's last position
                rows = _largest_exact(model, _OneTokenRows(model, text, end - 2 * rows - 1), rows, end=end)
            spans.append((start, end, rows))
    finally:
        model.rewind(0)
    return BatchCap(tuple(spans))


class _OneTokenRows:
    """The sample text's logits rows as one-token decodes write them: the text before `first`
    decoded in one batch, as a prompt is, then a token a decode. Extended on demand; the
    cache's entries before `first` are never written again."""

    def __init__(self, model: Decoder, text: list[int], first: int) -> None:
        self.model, self.text = model, text
        self.first, self.stop = first, first
        self.rows: dict[int, np.ndarray] = {}  # by position: the row after decoding text[position] there
        model.rewind(0)
        model.decode(text[:first])

    def cover(self, start: int, stop: int) -> None:
        """Have rows for positions [start, stop): decoded again from the earliest position asked
        for (the cache after it may hold a tested batch's entries), twice as far as before."""
        if self.first <= start and stop <= self.stop:
            return
        begin = min(start, self.first)
        stop = min(max(stop, self.stop + (self.stop - self.first)), self.model.n_ctx)
        self.model.rewind(begin)
        self.rows = {position: np.array(self.model.decode([self.text[position]])[0]) for position in range(begin, stop)}
        self.first, self.stop = begin, stop


def _largest_exact(model: Decoder, reference: _OneTokenRows, most: int, *, end: int | None = None) -> int:
    """The largest b <= `most` whose batches are exact (_exact_at), placed from the reference's
    first position, or (`end`) so that the last decode is at end - 1. Sizes are tried in
    order with every row asking for logits, and the first that differs ends the search; then
    the largest found is checked with fewer rows asking (_failing_count), and cut to a
    count that fails until none does. 1 when 2 already differs."""
    first, best = reference.first, 1

    def position(size: int) -> int:
        return first if end is None else end - 2 * size - 1

    for size in range(2, most + 1):
        if not _exact_at(model, reference, position(size), size):
            break
        best = size
    while best > 1:
        failing = _failing_count(model, reference, position(best), best)
        if not failing:
            break
        best = failing  # a larger batch could have that many rows asking
    return best


def _exact_at(model: Decoder, reference: _OneTokenRows, position: int, size: int) -> bool:
    """Whether two batches of `size` rows from `position`, then one token, give one-token
    decoding's rows bit for bit (the second batch reads the first's cache entries, the token
    both batches')."""
    reference.cover(position, position + 2 * size + 1)
    text = reference.text
    model.rewind(position)
    for start in (position, position + size):
        rows = model.decode(text[start : start + size], all_logits=True)
        if not all(np.array_equal(rows[i], reference.rows[start + i]) for i in range(size)):
            return False
    after = position + 2 * size
    return bool(np.array_equal(model.decode([text[after]])[0], reference.rows[after]))


def _failing_count(model: Decoder, reference: _OneTokenRows, position: int, size: int) -> int:
    """The largest count of rows asking for logits (the last ones: the rows before forced
    tokens ask for none), under `size`, with which a batch of `size` rows from `position`
    does not give one-token decoding's rows; 0 when every count does. Which rows ask changes
    only what follows the last layer's attention (their count picks the head's kernel), never
    the cache entries: a count that fails here fails in any batch with more rows, and one that
    passes covers every smaller batch whose rows are exact."""
    reference.cover(position, position + size)
    text = reference.text
    for outputs in range(size - 1, 0, -1):
        model.rewind(position)
        rows = model.decode(text[position : position + size], outputs=[False] * (size - outputs) + [True] * outputs)
        asked = range(position + size - outputs, position + size)
        if not all(np.array_equal(rows[i], reference.rows[p]) for i, p in enumerate(asked)):
            return outputs
    return 0
