"""`specli run --batch FILE`: a prompt a line (or JSON Lines), N at a time on one batched
engine, JSON Lines out in input order; through real processes on Gemma 3 270M."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from helpers import assert_one_line_error

FAST = ["--no-chat", "-n", "12", "-k", "4", "-c", "512"]
PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time", "1, 2, 3, 4,", "Red, green,"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


class Result:
    def __init__(self, done: subprocess.CompletedProcess) -> None:
        self.code, self.out, self.err = done.returncode, done.stdout, done.stderr

    @property
    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.out.splitlines()]


def batch(gemma_path, path, *args: object, stdin: str | None = None) -> Result:
    command = [sys.executable, "-m", "specli", "run", "--target", str(gemma_path), *FAST, "--batch", str(path),
               *map(str, args)]
    return Result(subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=300,
                                 stdin=None if stdin is not None else subprocess.DEVNULL))


@pytest.mark.slow
def test_a_record_a_line_in_input_order_with_bad_lines_reported_and_the_rest_run(gemma_path, tmp_path):
    lines = [PROMPTS[0], "", json.dumps({"prompt": PROMPTS[1], "n": 5, "seed": 3}), '{"prompt": "x", "sed": 1}',
             PROMPTS[2], json.dumps({"prompt": "Name and age of Ann, who is 31:", "n": 40, "json_schema": SCHEMA}),
             "{not json", PROMPTS[3]]
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(lines) + "\n")
    result = batch(gemma_path, path, "--parallel", 3)
    assert result.code == 1, result.err  # a line failed; the others ran
    records = result.records
    assert [record["line"] for record in records] == [1, 3, 4, 5, 6, 7, 8]  # the blank line 2 skipped
    errors = {record["line"]: record["error"] for record in records if "error" in record}
    assert set(errors) == {4, 7} and "'sed'" in errors[4] and "not JSON" in errors[7]
    assert "specli: line 4: unknown key 'sed'" in result.err and "specli: line 7: not JSON" in result.err
    texts = {record["line"]: record for record in records if "text" in record}
    assert texts[3]["stats"]["tokens"] <= 5 and texts[1]["stats"]["tokens"] == 12
    jsonschema.validate(json.loads(texts[6]["text"]), SCHEMA)
    assert "7 prompts, 3 at a time" in result.err.splitlines()[-1] and "2 failed" in result.err


@pytest.mark.slow
def test_the_same_batch_writes_the_same_text_and_one_at_a_time_writes_runs_text(gemma_path, tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS * 2) + "\n")
    first, second = (batch(gemma_path, path, "--parallel", 4) for _ in range(2))
    assert first.code == second.code == 0, first.err
    assert [r["text"] for r in first.records] == [r["text"] for r in second.records]
    assert sum(r["stats"]["accepted"] for r in first.records) > 0
    path.write_text("\n".join(PROMPTS[:2]) + "\n")
    alone = batch(gemma_path, path, "--parallel", 1)
    for record, prompt in zip(alone.records, PROMPTS):
        run = subprocess.run([sys.executable, "-m", "specli", "run", "-q", "--target", str(gemma_path), *FAST, prompt],
                             capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert record["text"] == run.stdout.removesuffix("\n")


@pytest.mark.slow
def test_stdin_and_a_draft_model_beside_others(gemma_path, smollm_path):
    result = batch(gemma_path, "-", "--draft", smollm_path, "--parallel", 2, stdin="\n".join(PROMPTS[:2]) + "\n")
    assert result.code == 0, result.err
    assert "n-gram lookup" not in result.err  # no falling back: the draft model drafts in both slots
    assert [record["stats"]["proposer"] for record in result.records] == ["draft+ngram", "draft+ngram"]
    assert all(record["stats"]["drafted_by"].get("draft", 0) > 0 for record in result.records)


@pytest.mark.parametrize("args,fragment", [
    (["--batch", "prompts.txt", "a prompt"], "give no prompt"),
    (["--parallel", "2", "a prompt"], "--parallel goes with --batch"),
    (["--batch", "missing.txt"], "missing.txt"),
    (["--batch", "empty.txt"], "no prompt in it"),
])
def test_batch_usage_errors_are_one_line(tmp_path, monkeypatch, args, fragment):
    from typer.testing import CliRunner

    from specli.commands.cli import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.txt").write_text("hello\n")
    (tmp_path / "empty.txt").write_text("\n\n")
    result = CliRunner().invoke(app, ["run", *args])
    assert_one_line_error(result, 2, fragment)
