"""The stats line: a rate only when something was decoded after the prompt."""

from __future__ import annotations

from specli.decode.events import Stats
from specli.render import format_stats


def test_a_run_whose_only_token_came_from_the_prompt_has_no_rate():
    stats = Stats(proposer="ngram", prompt_tokens=2, tokens=1, steps=0, first_token_from_prefill=True)
    assert format_stats(stats).startswith("specli: 1 tokens, no decode step | prefill 2 tokens")


def test_the_rate_leaves_out_the_token_the_prompt_wrote():
    stats = Stats(proposer="none", tokens=11, steps=10, seconds=0.5, first_token_from_prefill=True)
    line = format_stats(stats)
    assert line.startswith("specli: 11 tokens, 20.0 tok/s |") and line.endswith("plain decoding")
