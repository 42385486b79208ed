"""Assertions, doubles and runners shared by several test modules."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from specli.decode.events import Finished, Stats, Token

TEMPLATES = Path(__file__).parent / "data" / "templates"
HERMES = TEMPLATES / "smollm2-hermes-tools.jinja"
CODE = "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n    return 2 * (width + height)\n"


def dense(distribution, n_vocab: int) -> np.ndarray:
    """A sparse sampling.Distribution as a full probability vector."""
    out = np.zeros(n_vocab, dtype=np.float64)
    out[distribution.ids] = distribution.probs
    return out


def prob(distribution, token: int) -> float:
    """One token's probability under a sparse sampling.Distribution (0 outside its support)."""
    hit = np.flatnonzero(distribution.ids == token)
    return float(distribution.probs[hit[0]]) if hit.size else 0.0


class RecordingRows:
    """Logits rows that remember which rows were read, in order (turning the whole array
    into a numpy array reads every row)."""

    def __init__(self, logits: np.ndarray) -> None:
        self.logits = logits
        self.read: list[int] = []

    def __getitem__(self, i: int) -> np.ndarray:
        self.read.append(i)
        return self.logits[i]

    def __len__(self) -> int:
        return len(self.logits)

    def __array__(self, *args, **kwargs) -> np.ndarray:
        self.read.extend(range(len(self.logits)))
        return self.logits


def assert_one_line_error(result, *fragments: int | str) -> None:
    """The CLI failed as the scripting contract says: an exit code (1, or the int given before
    the fragments), nothing on stdout, and one line on stderr, "specli: error: ...", that
    holds each fragment and no traceback.

    `result` is Typer's CliRunner result, or any object with `code`, `out` and `err`.
    """
    code = 1
    if fragments and isinstance(fragments[0], int):
        code, fragments = fragments[0], fragments[1:]
    if hasattr(result, "exit_code"):  # CliRunner's
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        exit_code, out, err = result.exit_code, result.stdout, result.stderr
    else:
        exit_code, out, err = result.code, result.out, result.err
    assert exit_code == code, err
    assert out == ""
    assert "Traceback" not in err
    assert err.startswith("specli: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err


# --- generating ------------------------------------------------------------------------


def generation(engine, prompt: list[int]) -> tuple[list[Token], Finished]:
    """One generation's committed tokens (held-back text, which has no id, left out) and the
    Finished event that ends it."""
    *events, finished = engine.generate(prompt)
    assert isinstance(finished, Finished), finished
    return [e for e in events if isinstance(e, Token) and e.id >= 0], finished


def generated(engine, prompt: list[int]) -> tuple[list[int], Stats]:
    """The token ids one generation wrote, and its stats."""
    tokens, finished = generation(engine, prompt)
    return [token.id for token in tokens], finished.stats


def traced(session, tokens: list[int], request) -> tuple[list[int], str, list[str], str, Stats]:
    """(token ids, text, per-token proposer or source, finish reason, stats) of the generation
    `session.engine_for(request)` writes after `tokens`; the text includes held-back text."""
    ids, text, who = [], "", []
    for event in session.engine_for(request).generate(tokens):
        if isinstance(event, Token):
            if event.id >= 0:
                ids.append(event.id)
                who.append(event.proposer or event.source)
            text += event.text
        elif isinstance(event, Finished):
            return ids, text, who, event.reason, event.stats
    raise AssertionError("no Finished event")


def assert_lossless(plain: list[int], margins: list[float], output: list[int]) -> None:
    """`output` is `plain`, or departs from it only where the target's two best tokens were
    within NEAR_TIE of each other (a verify batch rounds otherwise than a one-token decode)."""
    if output == plain:
        return
    first = next(i for i, (a, b) in enumerate(zip(plain, output)) if a != b) if output[: len(plain)] != plain else len(plain)
    assert first < len(margins) and margins[first] < NEAR_TIE, (
        f"diverged at token {first} where the target's margin was {margins[first]:.3f}: not a near-tie"
    )


def plain_with_margins(model, tokens: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    """One token at a time on a one-sequence model, greedy: the tokens and, at each, the margin
    between the target's two best logits (assert_lossless's reference)."""
    model.rewind(0)
    row = np.array(model.decode(tokens)[0])
    out, margins = [], []
    for _ in range(max_tokens):
        top = np.sort(row)[-2:]
        token = int(np.argmax(row))
        out.append(token)
        margins.append(float(top[1] - top[0]))
        if model.is_end_of_generation(token):
            break
        row = np.array(model.decode([token])[0])
    model.rewind(0)
    return out, margins


def assert_lossless_text(model, plain: list[int], margins: list[float], text: str) -> None:
    """As assert_lossless, for a served answer's text: it is the plain tokens' text, or departs
    from it only at a token whose margin was a near-tie."""
    for i in range(len(plain)):
        if not text.startswith(b"".join(map(model.piece, plain[: i + 1])).decode("utf-8", "replace")):
            assert margins[i] < NEAR_TIE, f"diverged at token {i} where the margin was {margins[i]:.3f}"
            return


# Logits. With the real-model tests' prompts and fixed Ks (the same batch shapes every run) every
# flip falls under this bound; elsewhere a batch was measured to lower a margin by up to 0.89
# (benchmarks/batch_margins.py), so other prompts could need a looser one.
NEAR_TIE = 0.5


# --- processes -------------------------------------------------------------------------


class Server:
    def __init__(self, process: subprocess.Popen, url: str, log: list[str]) -> None:
        self.process, self.url, self.log = process, url, log

    def client(self, api_key: str = "none", **kwargs):
        from openai import OpenAI

        return OpenAI(base_url=self.url, api_key=api_key, max_retries=0, timeout=120, **kwargs)


@contextmanager
def serving(*args: object, env: dict | None = None):
    """A `specli serve` process on a free port of 127.0.0.1, until the block ends."""
    command = [sys.executable, "-m", "specli", "serve", "--port", "0", "-c", "1024", *map(str, args)]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, **(env or {})})
    log: list[str] = []
    url = None
    deadline = time.monotonic() + 300  # a load at start: calibration shares the CPU
    while url is None and time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        log.append(line)
        found = re.search(r"serving .* at (http://\S+/v1)", line)
        url = found.group(1) if found else None
    if url is None:
        process.kill()
        raise AssertionError("the server did not start: " + "".join(log) + process.stderr.read())
    reader = threading.Thread(target=lambda: log.extend(iter(process.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        yield Server(process, url, log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def specli_run(*args: object) -> str:
    """`specli run -q` in a child process; its stdout (the run must succeed)."""
    result = subprocess.run([sys.executable, "-m", "specli", "run", "-q", "-c", "1024", *map(str, args)],
                            capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    return result.stdout


# Four short prompts for generations side by side (a slot each): tests/test_recurrent_slots.py,
# tests/test_mtp_slots.py.
SIDE_BY_SIDE = ["The quick brown fox jumps over the lazy dog. Then",
                "List three colours: red, green, blue. List three colours again: red,",
                "1, 2, 3, 4, 5, 6, 7, 8,",
                "Once upon a time there was a"]
