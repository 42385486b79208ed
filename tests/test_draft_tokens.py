"""-k: a number, `auto`, or not given (the pair's own default where it sets one, else auto)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specli.commands import options
from specli.models import resolve
from specli.commands.app import app
from specli.models.resolve import ResolvedModels


def test_not_given_means_the_pairs_default_else_auto():
    pair = ResolvedModels("target.gguf", "ngram", draft_tokens=3)
    plain = ResolvedModels("target.gguf", "ngram")
    assert options.draft_tokens_for(None, pair) == 3
    assert options.draft_tokens_for(None, plain) == "auto"
    assert options.draft_tokens_for("auto", pair) == "auto", "-k auto typed out is always auto"
    assert options.draft_tokens_for(5, pair) == 5


def test_k_parses_numbers_and_auto():
    assert options.parse_draft_tokens(None) is None
    assert options.parse_draft_tokens("auto") == "auto"
    assert options.parse_draft_tokens("7") == 7


@pytest.mark.slow  # loads the real model
@pytest.mark.parametrize("given, expected", [([], 3), (["-k", "auto"], "auto"), (["-k", "5"], 5)])
def test_a_pair_with_a_fixed_draft_length_still_runs_auto_when_asked(gemma_path, monkeypatch, given, expected):
    """A pair that sets draft_tokens = 3: without -k it drafts at most 3 a step; `-k auto`
    is the adaptive policy, priced by costs (reported in --json)."""
    monkeypatch.setattr(resolve, "resolve_models", lambda pair, target, draft: ResolvedModels(gemma_path, "ngram", 3))
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n"
    result = CliRunner().invoke(app, ["run", "-m", "some-pair", "--json", "-n", "40", "-c", "512", *given, prompt])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout.splitlines()[-1])
    assert stats["draft_tokens"] == expected
    assert ("costs" in stats) == (expected == "auto")
    if isinstance(expected, int):
        assert len(stats["draft_lengths"]) <= expected + 1, "no step drafted more than -k"
