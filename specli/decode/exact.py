"""Which verify batch sizes give logits bit-identical to one-token decoding, on this build.

llama.cpp's kernels may take another code path for a batch of several rows than for one
row (CPU weight repacking, GPU kernels chosen by batch size), and round differently. A
verify batch of b rows writes exactly what plain decoding writes only if every row's logits,
and the KV cache entries it leaves, are bit-identical to those of b one-token decodes.
`--exact` caps verify batches at the largest size measured so here.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

# Text to decode while measuring: ordinary prose, so the batches run the kernels real text runs.
SAMPLE_TEXT = (
    "The printing press changed how knowledge moved through Europe. Before it, a book was copied "
    "by hand, one page at a time, and a library of a few hundred volumes was a rare treasure. "
    "Within fifty years of its invention, presses in more than two hundred cities had printed "
    "millions of books, pamphlets and broadsheets, in Latin and in the languages people spoke. "
)
PREFIX_TOKENS = 16  # decoded in one batch first, as a prompt would be


class Decoder(Protocol):
    n_ctx: int

    def decode(self, tokens: list[int], *, all_logits: bool = False) -> np.ndarray: ...
    def rewind(self, n_keep: int) -> None: ...
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]: ...


def exact_batch_size(model: Decoder, largest: int) -> int:
    """The largest b <= `largest` such that verify batches of 2..b rows, decoded one after
    another, each give logits bit-identical to one-token decoding at every position; 1 when a
    batch of 2 already differs. Sizes are tried in order and the first that differs ends the search."""
    needed = PREFIX_TOKENS + 2 * largest
    text = model.tokenize(SAMPLE_TEXT, add_special=True)
    while len(text) < needed:
        text += model.tokenize(SAMPLE_TEXT, add_special=False)
    largest = max(1, min(largest, (model.n_ctx - PREFIX_TOKENS) // 2))
    prefix, rest = text[:PREFIX_TOKENS], text[PREFIX_TOKENS:needed]
    reference: list[np.ndarray] = []  # row i: after one-token decodes of rest[:i + 1]
    try:
        best = 1
        for size in range(2, largest + 1):
            span = 2 * size  # two batches: the second attends to cache entries the first wrote
            if len(reference) < span:  # one-token decodes from the prefix on, twice as many each time
                model.rewind(0)
                model.decode(prefix)
                reference = [np.array(model.decode([token])[0]) for token in rest[:min(len(rest), 2 * span)]]
            model.rewind(0)
            model.decode(prefix)
            for start in range(0, span, size):
                rows = model.decode(rest[start:start + size], all_logits=True)
                if not all(np.array_equal(rows[i], reference[start + i]) for i in range(size)):
                    return best
            best = size
        return best
    finally:
        model.rewind(0)
