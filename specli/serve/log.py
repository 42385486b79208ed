"""The server's log: one line per request on its stderr."""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from specli.decode.events import Stats


@dataclass(frozen=True)
class RequestLog:
    """Where one request's line goes, and what it starts with: method and path."""

    out: IO[str]
    method: str
    path: str

    def line(self, status: int, stats: Stats | None = None, note: str = "", waited: float | None = None) -> None:
        """method, path, status; then tokens, tok/s and acceptance where it generated, and its
        wait for a turn, prefill and decode times; then `note`."""
        parts = [f"specli: {self.method} {self.path} {status}"]
        if stats is not None:
            parts.append(f"{stats.tokens} tokens, {stats.tokens_per_second:.1f} tok/s")
            if stats.drafted:
                parts.append(f"accepted {stats.accepted}/{stats.drafted} ({100 * stats.acceptance_rate:.0f}%)")
            parts.append((f"waited {waited:.2f} s, " if waited is not None else "")
                         + f"prefill {stats.prefill_seconds:.2f} s, decode {stats.seconds:.2f} s")
        if note:
            parts.append(" ".join(note.split()))  # one line, whatever the message held
        self.out.write(" | ".join(parts) + "\n")
        self.out.flush()
