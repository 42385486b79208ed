"""-k: a number, `auto`, or not given (the pair's own default where it sets one, else auto)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specli.commands import options
from specli.commands.cli import app
from specli.decode.request import parse_draft_tokens
from specli.errors import UsageError
from specli.models.resolve import ResolvedModels


def draft_tokens(models: ResolvedModels, given) -> object:
    return options.generation_request(models, {"draft_tokens": given}, max_tokens=1).draft_tokens


def test_not_given_means_the_pairs_default_else_auto():
    pair = ResolvedModels(Path("target.gguf"), draft_tokens=3)
    plain = ResolvedModels(Path("target.gguf"))
    assert draft_tokens(pair, None) == 3
    assert draft_tokens(plain, None) == "auto"
    assert draft_tokens(pair, "auto") == "auto", "-k auto typed out is always auto"
    assert draft_tokens(pair, 5) == 5


def test_k_parses_numbers_and_auto():
    assert parse_draft_tokens("auto") == "auto"
    assert parse_draft_tokens("7") == 7 and parse_draft_tokens(7) == 7
    for wrong in ("0", "-3", "many", "2.5", True, None):
        with pytest.raises(UsageError):
            parse_draft_tokens(wrong)


@pytest.mark.slow  # loads the real model
@pytest.mark.parametrize("given, expected", [([], 3), (["-k", "auto"], "auto"), (["-k", "5"], 5)])
def test_a_pair_with_a_fixed_draft_length_still_runs_auto_when_asked(gemma_path, given, expected):
    """A pair that sets draft_tokens = 3: without -k it drafts at most 3 a step; `-k auto`
    is the adaptive policy, priced by costs (reported in --json)."""
    home = Path(os.environ["SPECLI_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "models.toml").write_text(f'[pairs.some-pair]\ntarget = {{ path = "{gemma_path}" }}\ndraft = "ngram"\n'
                                      "draft_tokens = 3\n")
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n"
    result = CliRunner().invoke(app, ["run", "-m", "some-pair", "--json", "-n", "40", "-c", "512", *given, prompt])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout.splitlines()[-1])
    assert stats["draft_tokens"] == expected
    assert ("costs" in stats) == (expected == "auto")
    if isinstance(expected, int):
        assert len(stats["draft_lengths"]) <= expected + 1, "no step drafted more than -k"
