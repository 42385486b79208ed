"""`specli chat` on real models: turns through the chat template, caches kept between turns."""

from __future__ import annotations

import re

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from specli.commands.cli import app

pytestmark = pytest.mark.slow


def test_a_chat_keeps_its_caches_between_turns_and_leaves_on_bye(smollm_path):
    result = CliRunner().invoke(
        app, ["chat", "--target", str(smollm_path), "-n", "12", "-c", "512", "--system", "Answer briefly."],
        input="What is the capital of France?\nAnd of Italy?\n/bye\nnever read\n",
    )
    assert result.exit_code == 0, result.output
    stats = re.findall(r"specli: \d+ tokens, .*", result.output)
    assert len(stats) == 2, result.output
    assert "new tokens" not in stats[0]
    decoded, total = map(int, re.search(r"prefill (\d+) new tokens \((\d+) in all\)", stats[1]).groups())
    assert decoded < total / 2, "turn 2 decodes its own tokens, not the conversation again"


def test_a_base_model_gets_completion_turns(gemma_path):
    result = CliRunner().invoke(app, ["chat", "--target", str(gemma_path), "-n", "6", "-c", "256"],
                                input="The capital of France is\n")
    assert result.exit_code == 0, result.output
    assert "has no chat template" in result.output
    assert len(re.findall(r"specli: \d+ tokens", result.output)) == 1


def test_json_is_refused_in_a_chat():
    result = CliRunner().invoke(app, ["chat", "--json"])
    assert_one_line_error(result, 2, "--json needs a prompt", "specli run --json")


def test_an_exact_chat_keeps_its_cache_and_writes_plain_decodings_turns(smollm_path):
    """`chat --exact` keeps the target's cache between turns, as plain chat does, and writes
    what `chat --exact --draft none` writes turn by turn: both split the conversation at the
    same points. The conversation passes 256 tokens, where this CPU's exact batch changes."""
    system = "You are a careful assistant. Repeat the user's list exactly when asked. " * 6
    turns = ("List the numbers from one to twelve in words.\nRepeat that list.\n"
             "Repeat it again, then add thirteen.\n/bye\n")
    outputs = []
    for draft in ([], ["--draft", "none"]):
        result = CliRunner().invoke(app, ["chat", "--target", str(smollm_path), "-n", "48", "-c", "1024", "--exact",
                                          "--system", system, *draft], input=turns)
        assert result.exit_code == 0, result.output
        stats = re.findall(r"specli: \d+ tokens, .*", result.output)
        assert len(stats) == 3, result.output
        for line in stats[1:]:
            decoded, total = map(int, re.search(r"prefill (\d+) new tokens \((\d+) in all\)", line).groups())
            assert decoded < total / 2, "a turn decodes its own tokens, not the conversation again"
        outputs.append((result.stdout, stats))
    (drafted, _), (plain, _) = outputs
    assert drafted == plain
