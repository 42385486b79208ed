"""Sinks for specli.stream on a terminal: colour spans, plain text in a pipe, JSON lines.

stdout carries only the result (text, or JSON lines); the legend, notices and the stats
line go to stderr. Colour is decided once, from --color, NO_COLOR and isatty.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import IO, Callable

from specli.decode.events import Stats, StepRecord, Token
from specli.decode.proposers import NoProposer

DRAFT_COLOUR = "\x1b[32m"  # green: drafted and accepted by the target
TARGET_COLOUR = "\x1b[33m"  # yellow: written by the target itself
RESET = "\x1b[0m"
DIM = "\x1b[2m"


@dataclass(frozen=True)
class Output:
    """How a run shows its result: --color, --json, -q."""

    colour: str = "auto"  # auto | always | never
    json: bool = False
    quiet: bool = False


def use_colour(mode: str, stream: IO[str]) -> bool:
    """--color always|never|auto; auto: a terminal and NO_COLOR unset."""
    if mode == "always":
        return True
    if mode == "never" or os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def notifier(err: IO[str], quiet: bool = False) -> Callable[[str], None]:
    """`specli: message` lines on stderr (none when quiet): what a command says besides its result."""

    def notice(message: str) -> None:
        if not quiet:
            err.write(f"specli: {message}\n")
            err.flush()

    return notice


class TextRenderer:
    """Generated text on stdout, in two colours when `colour`; legend and stats on stderr.

    The text ends with exactly one newline: newlines at the end of the generation are
    held back until more text follows, and one is written at the end.
    """

    def __init__(self, out: IO[str], err: IO[str], *, colour: bool, quiet: bool, legend: bool = True) -> None:
        self.out, self.err = out, err
        self.colour, self.quiet, self.legend = colour, quiet, legend
        self._current = ""  # the colour code in force on stdout
        self._held_newlines = ""
        self._wrote_text = False

    def start(self) -> None:
        if self.colour and self.legend and not self.quiet:
            self.err.write(
                f"{DIM}legend:{RESET} {DRAFT_COLOUR}drafted and accepted{RESET}  "
                f"{TARGET_COLOUR}written by the target{RESET}\n"
            )
            self.err.flush()

    def token(self, event: Token) -> None:
        if not event.text:
            return
        self._wrote_text = True
        body = event.text.rstrip("\n")
        if not body:
            self._held_newlines += event.text
            return
        if self._held_newlines:
            self.out.write(self._held_newlines)
        self._held_newlines = event.text[len(body) :]
        if self.colour:
            code = DRAFT_COLOUR if event.source == "draft" else TARGET_COLOUR
            if code != self._current:
                self.out.write(code)
                self._current = code
        self.out.write(body)

    def step(self, record: StepRecord) -> None:
        self.out.flush()

    def finish(self, stats: Stats) -> None:
        if self._current:
            self.out.write(RESET)
            self._current = ""
        if self._wrote_text:
            self.out.write("\n")
        self.out.flush()
        if not self.quiet and stats.finish_reason != "error":  # an error says its own line
            self.err.write(format_stats(stats) + "\n")
            self.err.flush()


class JsonRenderer:
    """JSON Lines on stdout: one object per committed token, then one stats object that
    also holds `metadata` (the run's settings)."""

    def __init__(self, out: IO[str], metadata: dict | None = None) -> None:
        self.out = out
        self.metadata = metadata or {}

    def start(self) -> None:
        pass

    def token(self, event: Token) -> None:
        record = {"type": "token", "id": event.id, "text": event.text, "source": event.source}
        if event.proposer:
            record["proposer"] = event.proposer
        self.out.write(json.dumps(record, ensure_ascii=False) + "\n")

    def step(self, record: StepRecord) -> None:
        self.out.flush()

    def finish(self, stats: Stats) -> None:
        record = {"type": "stats", **stats.to_dict(), **self.metadata}
        self.out.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.out.flush()


def format_stats(stats: Stats) -> str:
    """One line: throughput, time split, and how well the draft did."""
    # With no step after the prompt's decode (-n 1, or an immediate end), there is no rate.
    rate = f"{stats.tokens_per_second:.1f} tok/s" if stats.steps else "no decode step"
    parts = [
        f"{stats.tokens} tokens, {rate}",
        f"prefill {_prefill(stats)} in {stats.prefill_seconds:.2f}s, decode {stats.seconds:.2f}s",
    ]
    if stats.proposer != NoProposer.name:
        parts.append(
            f"{stats.proposer}{' through text' if stats.translated else ''}: drafted {stats.drafted}, accepted {stats.accepted} "
            f"({100 * stats.acceptance_rate:.1f}%), {stats.mean_accepted_length:.2f} accepted per step"
        )
        if stats.draft_model:
            parts.append(f"draft model {stats.draft_model}")
        if len(stats.drafted_by) > 1:  # lookup in front of a draft model: each one's share
            parts.append(", ".join(f"{name} {stats.accepted_by.get(name, 0)}/{count}"
                                   for name, count in sorted(stats.drafted_by.items())))
    else:
        parts.append("plain decoding")
    if stats.forced:
        parts.append(f"grammar: forced {stats.forced}")
    if stats.finish_reason == "context":
        parts.append("stopped: context full")
    elif stats.finish_reason == "interrupted":
        parts.append("stopped: interrupted")
    return "specli: " + " | ".join(parts)


def _prefill(stats: Stats) -> str:
    if not stats.prompt_cached:
        return f"{stats.prompt_tokens} tokens"
    return f"{stats.prompt_tokens - stats.prompt_cached} new tokens ({stats.prompt_tokens} in all)"
