"""The scripting contract, through real processes: pipes, stdin, a terminal, `head`, Ctrl-C.

Every run uses Gemma 3 270M greedily with a fixed draft length, so runs with the same
prompt and -n produce the same text and can be compared with each other.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
import time

import pytest
from helpers import assert_one_line_error

PROMPT = "The capital of France is"
FAST = ["--no-chat", "-n", "8", "-k", "4", "--ctx-size", "512"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
STATS_KEYS = {
    "type", "tokens", "seconds", "tokens_per_second", "prefill_seconds", "drafted", "accepted",
    "acceptance_rate", "mean_accepted_length", "acceptance_by_position", "proposer", "draft_tokens",
    "temperature", "seed", "target", "draft", "lossless",
}


def specli_command(*args: object) -> list[str]:
    return [sys.executable, "-m", "specli", *map(str, args)]


def child_env(**changes: str | None) -> dict[str, str]:
    env = dict(os.environ)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def default_sigint() -> None:
    """A child started from a background job inherits SIGINT ignored, and Python then never
    installs its KeyboardInterrupt handler: restore the default before exec."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_specli(*args: object, stdin: str | bytes | None = None, env: dict | None = None, timeout: float = 300):
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return subprocess.run(
        specli_command(*args), input=data, capture_output=True, env=env or child_env(), timeout=timeout,
        stdin=None if data is not None else subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def plain_run(gemma_path):
    """The reference: the prompt as an argument, stdout a pipe."""
    result = run_specli("run", "--target", gemma_path, *FAST, PROMPT, env=child_env(NO_COLOR=None))
    assert result.returncode == 0, result.stderr.decode()
    return result


@pytest.mark.slow
def test_a_pipe_gets_only_the_text_ending_in_one_newline(plain_run):
    out, err = plain_run.stdout.decode(), plain_run.stderr.decode()
    assert out.strip(), "some text was generated"
    assert "\x1b" not in out, "no colour in a pipe, NO_COLOR or not"
    assert out.endswith("\n") and not out.endswith("\n\n")
    assert "legend" not in out + err and "specli:" not in out
    assert re.fullmatch(r"specli: 8 tokens, .*\n", err), "the stats line, alone, on stderr"


@pytest.mark.slow
def test_json_lines_carry_every_token_then_the_stats(gemma_path, plain_run):
    result = run_specli("run", "--target", gemma_path, *FAST, "--json", PROMPT)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr == b""
    records = [json.loads(line) for line in result.stdout.decode().splitlines()]
    tokens, stats = records[:-1], records[-1]
    for r in tokens:  # a drafted token also names its proposer
        assert r["type"] == "token" and set(r) == {"type", "id", "text", "source"} | ({"proposer"} if r["source"] == "draft" else set())
        assert r.get("proposer", "ngram") == "ngram"
    assert {r["source"] for r in tokens} <= {"draft", "target"}
    assert STATS_KEYS <= set(stats) and stats["type"] == "stats"
    assert stats["tokens"] == 8 and stats["lossless"] is True and stats["proposer"] == "ngram"
    assert stats["draft_tokens"] == 4 and stats["temperature"] == 0.0
    assert stats["target"] == gemma_path.name and stats["draft"] == "ngram"
    assert stats["accepted"] == sum(r["source"] == "draft" for r in tokens)
    text = "".join(r["text"] for r in tokens)
    assert text.rstrip("\n") + "\n" == plain_run.stdout.decode()


@pytest.mark.slow
def test_color_always_colours_a_pipe_and_quiet_silences_stderr(gemma_path, plain_run):
    result = run_specli("run", "--target", gemma_path, *FAST, "--color", "always", "-q", PROMPT)
    assert result.returncode == 0
    out = result.stdout.decode()
    assert ANSI.search(out)
    assert ANSI.sub("", out) == plain_run.stdout.decode()
    assert result.stderr == b"", "-q: no legend, no stats"


@pytest.mark.slow
def test_a_terminal_gets_colours_and_the_legend(gemma_path):
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        specli_command("run", "--target", gemma_path, *FAST, PROMPT),
        stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, env=child_env(NO_COLOR=None, TERM="xterm"),
    )
    os.close(terminal)
    output = _read_until_exit(controller, process, timeout=300)
    assert process.returncode == 0, output
    assert "legend:" in output
    assert "\x1b[32m" in output or "\x1b[33m" in output
    assert "specli: 8 tokens" in output


def _read_until_exit(controller: int, process: subprocess.Popen, timeout: float) -> str:
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.5)
            if ready:
                try:
                    data = os.read(controller, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif process.poll() is not None:
                break
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(controller)
    return b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["dash", "no-argument", "file"])
def test_the_prompt_comes_from_stdin_or_a_file(gemma_path, plain_run, tmp_path, how):
    if how == "file":
        prompt_file = tmp_path / "prompt.txt"
        prompt_file.write_text(PROMPT, encoding="utf-8")
        result = run_specli("run", "--target", gemma_path, *FAST, "-f", prompt_file)
    else:
        extra = ["-"] if how == "dash" else []
        result = run_specli("run", "--target", gemma_path, *FAST, *extra, stdin=PROMPT)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == plain_run.stdout


@pytest.mark.slow
def test_head_closing_the_pipe_ends_the_run_quietly(gemma_path):
    command = shlex.join(specli_command("run", "--target", gemma_path, "--no-chat", "-n", "200", "-k", "4",
                                        "--ctx-size", "512", "Write a long story about a dragon."))
    script = f'{command} | head -c 50; echo "specli exited ${{PIPESTATUS[0]}}" >&2'
    started = time.monotonic()
    result = subprocess.run(["bash", "-c", script], capture_output=True, stdin=subprocess.DEVNULL, timeout=300)
    err = result.stderr.decode()
    assert len(result.stdout) == 50
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err
    assert "specli exited 0" in err
    assert time.monotonic() - started < 240, "it stops when the reader goes, not after 200 tokens"


@pytest.mark.slow
def test_ctrl_c_flushes_the_text_prints_stats_and_exits_130(gemma_path):
    process = subprocess.Popen(
        specli_command("run", "--target", gemma_path, "--no-chat", "-n", "400", "-k", "4", "--ctx-size", "1024",
                       "Write a long story about a dragon."),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint,
    )
    try:
        first = os.read(process.stdout.fileno(), 1)  # the first step has been written and flushed
        process.send_signal(signal.SIGINT)
        rest, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    out, err = (first + rest).decode(), err.decode()
    assert process.returncode == 130, err
    assert first and out.endswith("\n")
    assert "Traceback" not in err
    assert re.fullmatch(r"specli: \d+ tokens, .* \| stopped: interrupted\n", err)


# --- bad input: one line, a non-zero exit, no traceback ----------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, code, needle",
    [
        (["run", "--target", "no/such/model.gguf", "hi"], 1, "model file not found"),
        (["run", "--target", ".", "hi"], 1, "directory"),
        (["run", "-m", "no-such-pair", "hi"], 1, "unknown pair 'no-such-pair'"),
        (["run", "-k", "0", "hi"], 2, "at least 1"),
        (["run", "--top-p", "2", "hi"], 2, "--top-p"),
    ],
)
def test_bad_input_through_a_real_process(args, code, needle):
    result = run_specli(*args, timeout=120)
    err = result.stderr.decode()
    assert result.returncode == code, err
    assert needle in err and "Traceback" not in err
    assert result.stdout == b""
    if code == 1:
        assert err.count("\n") == 1 and err.startswith("specli: error: ")


@pytest.mark.slow
def test_debug_mode_shows_the_traceback():
    result = run_specli("run", "--target", "no/such/model.gguf", "hi", env=child_env(SPECLI_DEBUG="1"), timeout=120)
    assert result.returncode != 0
    assert "Traceback" in result.stderr.decode() and "ModelFileError" in result.stderr.decode()


# --- the same rules in-process, through Typer's runner ------------------------

from typer.testing import CliRunner  # noqa: E402

from specli.commands.cli import app  # noqa: E402


def invoke(*args: object, stdin: str | bytes | None = None):
    return CliRunner().invoke(app, [str(arg) for arg in args], input=stdin)


@pytest.mark.parametrize(
    "option, value, needle",
    [
        ("-k", "0", "at least 1"),
        ("-k", "-3", "at least 1"),
        ("-k", "many", "'many' is not a whole number or 'auto'"),
        ("--draft-tokens", "0", "'-k' / '--draft-tokens'"),
        ("--temp", "-1", "--temp"),
        ("--temp", "warm", "--temp"),
        ("--top-p", "2", "--top-p"),
        ("--top-p", "-0.1", "--top-p"),
        ("--min-p", "1.5", "--min-p"),
        ("--top-k", "-1", "--top-k"),
        ("-n", "-5", "--max-tokens"),
        ("-n", "0", "--max-tokens"),
        ("-n", "lots", "--max-tokens"),
        ("--ctx-size", "8", "--ctx-size"),
        ("--threads", "0", "--threads"),
        ("--seed", "-1", "--seed"),
        ("--gpu-layers", "-2", "--gpu-layers"),
        ("--color", "purple", "--color"),
    ],
)
def test_invalid_values_are_usage_errors(option, value, needle):
    result = invoke("run", "--target", "unused.gguf", option, value, "hi")
    assert result.exit_code == 2, result.output
    assert needle in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_model_paths_that_are_not_models(tmp_path):
    (tmp_path / "text.gguf").write_text("hello")
    (tmp_path / "empty.gguf").write_bytes(b"")
    assert_one_line_error(invoke("run", "--target", tmp_path / "missing.gguf", "hi"), 1, "model file not found")
    assert_one_line_error(invoke("run", "--target", tmp_path, "hi"), 1, "is a directory")
    assert_one_line_error(invoke("run", "--target", tmp_path / "text.gguf", "hi"), 1, "not a GGUF file")
    assert_one_line_error(invoke("run", "--target", tmp_path / "empty.gguf", "hi"), 1, "not a GGUF file")


@pytest.mark.slow
def test_a_truncated_model_names_the_tensor_that_is_cut(gemma_path, tmp_path):
    cut = tmp_path / "cut.gguf"
    with gemma_path.open("rb") as source:
        cut.write_bytes(source.read(20_000_000))
    assert_one_line_error(invoke("run", "--target", cut, "hi"), 1, "is truncated: tensor", "but the file has 20000000 bytes")


def test_unknown_pair_suggests_close_names():
    assert_one_line_error(invoke("run", "-m", "gemma-3-270", "hi"), 1, "unknown pair 'gemma-3-270'", "did you mean")


@pytest.mark.parametrize("prompt", ["", "  \n"])
def test_an_empty_prompt_is_refused_before_loading(prompt):
    assert_one_line_error(invoke("run", "--target", "never-loaded.gguf", prompt), 1, "the prompt is empty")
    assert_one_line_error(invoke("run", "--target", "never-loaded.gguf", stdin=prompt), 1, "the prompt is empty")


def test_prompt_problems(tmp_path):
    assert_one_line_error(invoke("run", "-f", tmp_path / "nope.txt"), 1, "prompt file not found")
    assert_one_line_error(invoke("run", "-f", tmp_path), 1, "is a directory", "give the path of a file in it")
    assert_one_line_error(invoke("run", "-f", tmp_path / "nope.txt", "hi"), 1, "not both")
    assert_one_line_error(invoke("run", "-", stdin=b"caf\xe9 au lait"), 1, "not UTF-8", "0xe9 at offset 3")
    # An argument that is not UTF-8 reaches Python as surrogate escapes.
    assert_one_line_error(invoke("run", "caf\udce9"), 1, "the prompt is not UTF-8", "0xe9 at offset 3")
    (tmp_path / "latin1.txt").write_bytes(b"\xff\xfe")
    assert_one_line_error(invoke("run", "-f", tmp_path / "latin1.txt"), 1, "not UTF-8", "0xff at offset 0")


@pytest.mark.slow
def test_prompt_longer_than_the_context(gemma_path):
    result = invoke("run", "--target", gemma_path, "--no-chat", "-k", "4", "--ctx-size", "32", "word " * 100)
    assert_one_line_error(result, 1, "tokens but the context holds 32", "raise --ctx-size")
    assert int(re.search(r"the prompt is (\d+) tokens", result.stderr).group(1)) > 100


@pytest.mark.slow
def test_system_message_for_a_chat_model(smollm_path):
    result = invoke("run", "--target", smollm_path, "--system", "Answer in one word.", "-n", "4", "-k", "4",
                    "--ctx-size", "128", "--json", "What colour is the sky?")
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout.splitlines()[-1])
    assert stats["type"] == "stats" and stats["prompt_tokens"] > 20, "the chat template and system turn were applied"


@pytest.mark.slow
def test_system_needs_a_chat_template(gemma_path):
    result = invoke("run", "--target", gemma_path, "--no-chat", "--system", "Be brief.", "-k", "4", "--ctx-size", "64", "hi")
    assert_one_line_error(result, 1, "--system needs a chat template")


@pytest.mark.slow
def test_a_draft_with_another_vocabulary_drafts_through_text_and_says_what_differs(gemma_path, smollm_path):
    result = invoke("run", "--target", gemma_path, "--draft", smollm_path, "--no-chat", "-n", "4", "-k", "4",
                    "--ctx-size", "64", "hi")
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if "drafting through text" in line]
    assert len(notes) == 1, result.stderr
    assert "use different tokenizers (BPE vs SPM)" in notes[0] and smollm_path.name in notes[0] and gemma_path.name in notes[0]


@pytest.mark.slow
def test_gpu_request_on_a_cpu_build_warns_and_runs(gemma_path):
    from specli.llama.backend import supports_gpu_offload

    if supports_gpu_offload():
        pytest.skip("this llama-cpp-python build has GPU support")
    result = invoke("run", "--target", gemma_path, "--gpu-layers", "99", "--no-chat", "-n", "2", "-k", "4",
                    "--ctx-size", "64", "-q", PROMPT)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip()
    assert result.stderr.count("\n") == 1
    assert "no GPU support; running on the CPU" in result.stderr and "-DGGML_CUDA=on" in result.stderr
    assert "-DGGML_METAL=on" in result.stderr


def test_doctor_reports_as_json_and_as_a_table():
    result = invoke("doctor", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    backend = report["backend"]
    assert backend["llama_cpp_python"] and backend["ggml_version"] and backend["system_info"]
    assert isinstance(backend["gpu_offload"], bool)
    assert any(device["kind"] == "cpu" for device in backend["devices"])
    assert "-DGGML_CUDA=on" in report["gpu_install"]["cuda"] and "-DGGML_METAL=on" in report["gpu_install"]["metal"]
    assert report["storage"]["free_bytes"] > 0 and report["storage"]["hub_cache"]
    assert report["registry"]["valid"] is True
    assert {pair["name"] for pair in report["registry"]["pairs"]} >= {"gemma-3-270m"}
    assert report["problems"] == []
    table = invoke("doctor")
    assert table.exit_code == 0
    for label in ("llama-cpp-python", "GPU offload", "device", "model cache", "registry", "gemma-3-270m"):
        assert label in table.stdout


def test_doctor_reports_a_broken_registry(monkeypatch, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "models.toml").write_text("[pairs.broken]\ntarget = 3\n")
    monkeypatch.setenv("SPECLI_HOME", str(home))
    result = invoke("doctor", "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["registry"]["valid"] is False and "models.toml" in report["registry"]["error"]
    assert report["problems"] and report["problems"][0].startswith("registry: ")


@pytest.mark.parametrize(
    "texts, expected",
    [
        (["Paris", ".", "\n", "\n"], "Paris.\n"),  # the model's trailing newlines fold into one
        (["a\n\n", "b"], "a\n\nb\n"),  # newlines inside the text are kept
        (["\n", "x"], "\nx\n"),
        (["\n\n"], "\n"),
        ([], ""),  # nothing generated: nothing printed
    ],
)
def test_text_ends_with_exactly_one_newline(texts, expected):
    import io

    from specli.decode.events import Stats, Token
    from specli.render import TextRenderer

    out, err = io.StringIO(), io.StringIO()
    renderer = TextRenderer(out, err, colour=False, quiet=True)
    renderer.start()
    for text in texts:
        renderer.token(Token(1, text, "target"))
    renderer.finish(Stats())
    assert out.getvalue() == expected and err.getvalue() == ""
