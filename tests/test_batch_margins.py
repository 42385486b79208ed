"""benchmarks/batch_margins.py on the real model: the measuring stick itself."""

from __future__ import annotations

import math

import pytest

from benchmarks.batch_margins import batched_margins, measure
from specli.comparison import plain_greedy

pytestmark = pytest.mark.slow  # loads real models


def test_one_token_chunks_are_plain_decoding_exactly(gemma_model):
    prompt = gemma_model.tokenize("Copy: alpha beta gamma delta. Copy: alpha beta")
    shift = measure(gemma_model, "copy", prompt, 12, batches=(1,))
    assert shift.tokens == 12
    assert shift.largest_drop == 0.0 and shift.flipped == 0


def test_batched_margins_line_up_with_plain_tokens(gemma_model):
    prompt = gemma_model.tokenize("Copy: alpha beta gamma delta. Copy: alpha beta")
    output, plain = plain_greedy(gemma_model, prompt, 12)
    for batch, offset in ((4, 0), (4, 2), (8, 0)):
        margins = batched_margins(gemma_model, prompt, output, batch, offset)
        assert len(margins) == len(output) and math.isnan(margins[0])
        # Plain's token is still the winner in a batch wherever plain was far from a tie.
        for j in range(1, len(output)):
            if plain[j] > 2.0:
                assert margins[j] > 0, (batch, offset, j)
