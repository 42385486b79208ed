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
