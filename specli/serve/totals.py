"""What a server's generations did, all told: `/metrics`' counters (serve/utility.py)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields

from specli.decode.events import Stats


@dataclass
class Totals:
    """What the server's generations did, all told (`/metrics`' counters, llama-server's names)."""

    prompt_tokens: int = 0  # decoded: a prompt's tokens the cache did not hold
    prompt_tokens_cached: int = 0
    prompt_seconds: float = 0.0
    tokens_predicted: int = 0
    tokens_predicted_seconds: float = 0.0
    n_tokens_max: int = 0  # the longest prompt and output
    draft_tokens: int = 0
    draft_accepted: int = 0
    drafts: int = 0  # steps that verified a draft
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, stats: Stats) -> None:
        with self._lock:
            self.prompt_tokens += stats.prompt_tokens - stats.prompt_cached
            self.prompt_tokens_cached += stats.prompt_cached
            self.prompt_seconds += stats.prefill_seconds
            self.tokens_predicted += stats.tokens
            self.tokens_predicted_seconds += stats.seconds
            self.n_tokens_max = max(self.n_tokens_max, stats.prompt_tokens + stats.tokens)
            self.draft_tokens += stats.drafted
            self.draft_accepted += stats.accepted
            self.drafts += sum(stats.draft_lengths[1:])

    def read(self) -> dict[str, float]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
