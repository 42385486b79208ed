"""The command line around the engine: help that fits, llama.cpp's spellings, small kindnesses."""

from __future__ import annotations

import io
import re

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from specli.commands.cli import app
from specli.prompt import read_prompt

COMMANDS = ["run", "chat", "bench", "pull", "list", "rm", "drafts", "doctor", "serve"]


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_the_terminal_and_shows_no_type_placeholders(command, width):
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": str(width), "NO_COLOR": "1"},
                                terminal_width=width)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line) <= width for line in lines)
    for placeholder in ("<bool>", "list[str]", "<str>", "{PAIR", "<int", "<float"):
        assert placeholder not in result.output, placeholder
    if command in ("run", "chat"):
        assert len(lines) <= (82 if width == 80 else 65), "room for the descriptions"
        for panel in ("Model", "Drafting", "Sampling", "Output", "Hardware"):
            assert re.search(rf"─ {panel} ─", result.output), panel
    if command == "bench":
        assert "[[workload]]" in result.output, "Rich markup does not eat the table name"


@pytest.mark.parametrize("alias", [["-ngl", "10"], ["-ngld", "3"], ["-md", "ngram"], ["--draft-max", "4"],
                                   ["--repeat-penalty", "1.1"], ["-s", "3"], ["-c", "256"], ["-t", "1"],
                                   ["-n", "5"], ["--temp", "0.7"], ["--n-predict", "5"]])
def test_llama_cpp_spellings_are_options(alias, tmp_path):
    """Each parses as an option: the run gets as far as loading the (missing) model."""
    missing = tmp_path / "missing.gguf"
    result = CliRunner().invoke(app, ["run", *alias, "--target", str(missing), "hello"])
    assert result.exit_code == 1, result.output
    assert "model file not found" in result.output


def test_a_prompt_from_stdin_loses_one_trailing_newline():
    assert read_prompt(None, None, io.StringIO("Name a colour\n")) == "Name a colour"
    assert read_prompt("-", None, io.StringIO("two\n\n")) == "two\n"
    assert read_prompt(None, None, io.StringIO("none")) == "none"


def test_a_misspelt_proposer_suggests_the_right_one():
    result = CliRunner().invoke(app, ["run", "--draft", "ngrm", "hello"])
    assert result.exit_code == 2
    assert "did you mean --draft ngram" in result.output


@pytest.mark.slow  # a subprocess
def test_an_unknown_option_suggests_the_nearest(tmp_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "specli", "run", "--tmep", "1", "hi"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--temp" in result.stderr


def test_bench_refuses_a_zero_draft_length_as_run_does():
    for command in (["run", "-k", "0", "hi"], ["bench", "-k", "auto,0"]):
        result = CliRunner().invoke(app, command)
        assert_one_line_error(result, 2, "'-k' / '--draft-tokens'", "must be at least 1", "not 0")
