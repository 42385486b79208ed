"""A Predicted Output is the client's claim about the answer: where the answer follows it, it
drafts long from its first token on; the text stays the target's own."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specli.commands.cli import app
from specli.decode.request import DraftKind, GenerationRequest
from specli.llama.backend import LoadSettings
from specli.prompt import prompt_tokens
from specli.session import SessionSpec, open_session
from specli.stream import stream

pytestmark = pytest.mark.slow

STORY = "Write a short story about a lighthouse keeper who finds a message in a bottle."


class Quiet:
    def start(self) -> None: ...
    def token(self, event) -> None: ...
    def step(self, record) -> None: ...
    def finish(self, stats) -> None: ...


def test_the_answer_itself_as_the_prediction_drafts_nine_tokens_in_ten_cli(gemma_path, tmp_path):
    """`specli run --prediction FILE` with the answer `--draft none` wrote."""
    prompt = "def fibonacci(n):"
    common = ["run", "--target", str(gemma_path), "-n", "96", "-c", "1024", "--json"]
    plain = CliRunner().invoke(app, [*common, "--draft", "none", prompt])
    assert plain.exit_code == 0, plain.output
    lines = [json.loads(line) for line in plain.stdout.splitlines()]
    text = "".join(line["text"] for line in lines if line["type"] == "token")
    (tmp_path / "answer.txt").write_text(text)
    predicted = CliRunner().invoke(app, [*common, "--prediction", str(tmp_path / "answer.txt"), prompt])
    assert predicted.exit_code == 0, predicted.output
    lines = [json.loads(line) for line in predicted.stdout.splitlines()]
    tokens = [line for line in lines if line["type"] == "token" and line["id"] >= 0]
    assert "".join(line["text"] for line in lines if line["type"] == "token") == text
    drafted = sum(line["source"] == "draft" for line in tokens)
    assert drafted >= 0.9 * len(tokens), (drafted, len(tokens))


def test_the_answer_itself_as_the_prediction_drafts_nine_tokens_in_ten_chat(smollm_path):
    with open_session(SessionSpec(smollm_path, None, LoadSettings(ctx_size=1024))) as session:
        tokens = prompt_tokens(session.target, STORY, chat=True)
        plain = stream(session.engine_for(GenerationRequest(max_tokens=96, draft=DraftKind.NONE)), tokens, Quiet())
        session.clear_cache()
        predicted = stream(session.engine_for(GenerationRequest(max_tokens=96, prediction=plain.text)), tokens, Quiet())
    assert predicted.text == plain.text
    assert predicted.stats.accepted >= 0.9 * predicted.stats.tokens, predicted.stats


def test_a_prediction_file_that_cannot_be_read_is_one_line(tmp_path):
    result = CliRunner().invoke(app, ["run", "--prediction", str(tmp_path / "missing.txt"), "hello"])
    assert result.exit_code != 0
    assert "prediction file not found" in result.stderr
