"""Assertions and doubles shared by several test modules."""

from __future__ import annotations

import numpy as np


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
