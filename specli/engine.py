"""The speculative loop. A generator of small events; it never prints.

The prompt is decoded in one batch and its last row writes the first token, as in
llama.cpp's own tools, so plain and speculative runs start from the same token. Then
each step: the proposer drafts up to K tokens; the target decodes [last] + draft in one
batch with logits at every position; verification keeps the longest valid prefix and
the target writes the next token itself (the correction, or a bonus token when every
draft token was kept); rejected positions are removed from the target's KV cache.
With no draft the step is exactly one plain decode, so `--draft none` runs this same loop.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Iterator, Literal, Protocol, Sequence, Union

import numpy as np

from specli.errors import PromptError
from specli.proposers import Proposal, Proposer
from specli.sampling import Distribution, SamplingSettings, verify_greedy, verify_sampled, warp
from specli.text import TextStream

Source = Literal["draft", "target"]


class TargetModel(Protocol):
    """What the engine needs from the target (backend.Model, or a fake in tests)."""

    n_ctx: int
    n_past: int

    def decode(self, tokens: list[int], *, all_logits: bool = False) -> np.ndarray: ...
    def rewind(self, n_keep: int) -> None: ...
    def piece(self, token: int) -> bytes: ...
    def is_end_of_generation(self, token: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class Token:
    """One committed token: its id, the text it released, and who wrote it."""

    id: int
    text: str
    source: Source


@dataclass
class Stats:
    proposer: str = "none"
    prompt_tokens: int = 0
    tokens: int = 0
    steps: int = 0  # target decodes after prefill
    drafted: int = 0
    accepted: int = 0
    prefill_seconds: float = 0.0
    seconds: float = 0.0  # generation time after prefill
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    llama_seconds: float = 0.0  # of `seconds`, time inside llama.cpp's decode (target and draft)
    read_seconds: float = 0.0  # of `seconds`, time reading the target's logits rows to verify
    rows_read: int = 0  # logits rows read to verify (a vocabulary-sized scan each)
    finish_reason: str = ""
    first_token_from_prefill: bool = False  # the prompt's decode wrote the first token
    proposed_at: list[int] = field(default_factory=list)  # steps that drafted a position i
    accepted_at: list[int] = field(default_factory=list)  # steps that kept position i
    accept_lengths: list[int] = field(default_factory=list)  # histogram: steps keeping n tokens

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Tokens per second of generation. The first token, written by the prompt's decode
        (prefill time), is left out, as in llama.cpp's "eval time ... N - 1 runs"."""
        counted = self.tokens - 1 if self.first_token_from_prefill and self.tokens > 0 else self.tokens
        return counted / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Draft tokens kept per step that drafted anything."""
        drafting = sum(self.accept_lengths)
        return self.accepted / drafting if drafting else 0.0

    @property
    def overhead_seconds(self) -> float:
        return max(0.0, self.seconds - self.draft_seconds - self.verify_seconds)

    @property
    def python_overhead_ms_per_step(self) -> float:
        """Everything but llama.cpp's decode calls, per target step, in milliseconds."""
        return 1000 * max(0.0, self.seconds - self.llama_seconds) / self.steps if self.steps else 0.0

    @property
    def loop_overhead_ms_per_step(self) -> float:
        """The Python overhead less the logits reads: what a step costs whatever its length."""
        spent = self.seconds - self.llama_seconds - self.read_seconds
        return 1000 * max(0.0, spent) / self.steps if self.steps else 0.0

    @property
    def read_us_per_row(self) -> float:
        """Microseconds to read one logits row (argmax, or warping when sampling). A row is
        n_vocab floats (1 MiB for a 262k vocabulary): memory bandwidth sets this cost."""
        return 1e6 * self.read_seconds / self.rows_read if self.rows_read else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at)]

    def record_step(self, drafted: int, accepted: int) -> None:
        self.steps += 1
        if drafted == 0:
            return
        self.drafted += drafted
        self.accepted += accepted
        _grow(self.proposed_at, drafted)
        _grow(self.accepted_at, drafted)
        _grow(self.accept_lengths, drafted + 1)
        for i in range(drafted):
            self.proposed_at[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1
        self.accept_lengths[accepted] += 1

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(
            acceptance_rate=self.acceptance_rate,
            tokens_per_second=self.tokens_per_second,
            mean_accepted_length=self.mean_accepted_length,
            overhead_seconds=self.overhead_seconds,
            python_overhead_ms_per_step=self.python_overhead_ms_per_step,
            loop_overhead_ms_per_step=self.loop_overhead_ms_per_step,
            read_us_per_row=self.read_us_per_row,
            acceptance_by_position=self.acceptance_by_position,
        )
        return data


def _grow(counts: list[int], size: int) -> None:
    if len(counts) < size:
        counts.extend([0] * (size - len(counts)))


@dataclass(frozen=True, slots=True)
class Finished:
    reason: str  # "eog" | "length" | "stop" | "context"
    stats: Stats


Event = Union[Token, Finished]


class DraftLength(Protocol):
    """Chooses K for the next step from what the run has measured (see adaptive.py)."""

    max_k: int

    def next(self, key: object = None, available: int | None = None, extent: int = 0) -> int: ...

    def record(
        self,
        drafted: int,
        accepted: int,
        draft_seconds: float,
        verify_seconds: float,
        key: object = None,
        overhead_seconds: float = 0.0,
        extent: int = 0,
    ) -> None: ...


@dataclass
class FixedDraftLength:
    max_k: int

    def next(self, key: object = None, available: int | None = None, extent: int = 0) -> int:
        return self.max_k if available is None else min(self.max_k, available)

    def record(self, *args: object, **kwargs: object) -> None:
        pass


@dataclass(frozen=True)
class GenerationOptions:
    max_tokens: int = 256
    sampling: SamplingSettings = SamplingSettings()
    stop: tuple[str, ...] = ()


def check_prompt_fits(n_tokens: int, n_ctx: int) -> None:
    """The prompt and at least one generated token must fit in the context."""
    if n_tokens >= n_ctx:
        raise PromptError(
            f"the prompt is {n_tokens} tokens but the context holds {n_ctx}",
            "raise --ctx-size or shorten the prompt",
        )


class Engine:
    """Runs one generation. `stats` stays readable if the consumer stops early (Ctrl-C)."""

    def __init__(
        self,
        target: TargetModel,
        proposer: Proposer,
        draft_length: DraftLength,
        options: GenerationOptions,
        rng: np.random.Generator | None = None,
    ) -> None:
        self.target = target
        self.proposer = proposer
        self.draft_length = draft_length
        self.options = options
        self.rng = rng if rng is not None else np.random.default_rng()
        self.stats = Stats(proposer=proposer.name)
        self._last_step: float | None = None  # end of the previous verify decode: overhead runs from here

    def generate(self, prompt: list[int]) -> Iterator[Event]:
        if not prompt:
            raise PromptError("the prompt is empty", "give a prompt as an argument, with -f FILE, or on stdin")
        target, options, stats = self.target, self.options, self.stats
        check_prompt_fits(len(prompt), target.n_ctx)
        stats.prompt_tokens = len(prompt)
        started = time.perf_counter()
        target.rewind(0)
        # The whole prompt in one decode, as llama.cpp's own tools do: its last row writes
        # the first token, so plain and speculative runs share it exactly.
        first = self._choose(target.decode(prompt)[0]) if options.max_tokens > 0 else None
        self.proposer.prepare(prompt)
        stats.prefill_seconds = time.perf_counter() - started

        text = TextStream(options.stop)
        tokens = list(prompt)  # the committed sequence: prompt + output
        llama_before = self._llama_seconds()
        started = time.perf_counter()
        reason = "length"
        try:
            committed: list[int] = [] if first is None else [first]
            sources: list[Source] = ["target"] * len(committed)
            stats.first_token_from_prefill = bool(committed)
            while committed:
                # Emit what the last step committed; committed[-1] is not in the KV cache yet.
                reason = ""
                for token, source in zip(committed, sources):
                    tokens.append(token)
                    if target.is_end_of_generation(token):
                        reason = "eog"
                        break
                    stats.tokens += 1
                    released = text.push(target.piece(token))
                    yield Token(token, released, source)
                    if text.stopped:
                        reason = "stop"
                        break
                if reason:
                    break
                remaining = options.max_tokens - stats.tokens
                room = target.n_ctx - target.n_past - 1  # positions left after committed[-1]
                if remaining <= 0 or room < 0:
                    reason = "length" if remaining <= 0 else "context"
                    break
                committed, sources = self._step(tokens, committed[-1], min(remaining - 1, room))
            tail = text.flush()
            if tail:
                yield Token(-1, tail, "target")  # held-back text with no token of its own
        finally:
            stats.seconds = time.perf_counter() - started
            stats.llama_seconds = self._llama_seconds() - llama_before
        stats.finish_reason = reason
        yield Finished(reason, stats)

    def _choose(self, row: np.ndarray) -> int:
        """The target's own token from one logits row: argmax, or a draw from the warped row."""
        if self.options.sampling.greedy:
            return int(np.argmax(row))
        return warp(row, self.options.sampling).sample(self.rng)

    def _llama_seconds(self) -> float:
        draft_model = getattr(self.proposer, "model", None)
        return getattr(self.target, "decode_seconds", 0.0) + getattr(draft_model, "decode_seconds", 0.0)

    def _propose(self, tokens: list[int], limit: int) -> tuple[Proposal, list[int]]:
        """The proposal and the part of it to verify (at most `limit` tokens)."""
        policy = self.draft_length
        if limit <= 0:
            return Proposal(), []
        if self.proposer.cheap:
            # Proposing is free (n-gram lookup): look first, then decide how much to verify.
            proposal = self.proposer.propose(tokens, min(policy.max_k, limit))
            k = policy.next(proposal.key, len(proposal.tokens), proposal.extent) if proposal.tokens else 0
        else:
            k = policy.next(None, limit)
            proposal = self.proposer.propose(tokens, k) if k > 0 else Proposal()
        return proposal, proposal.tokens[:k]

    def _step(self, tokens: list[int], last: int, limit: int) -> tuple[list[int], list[Source]]:
        """Propose, verify, accept, rewind: one target decode. Returns the committed tokens."""
        target, stats = self.target, self.stats
        t0 = time.perf_counter()
        overhead = 0.0 if self._last_step is None else max(0.0, t0 - self._last_step)
        proposal, draft = self._propose(tokens, limit)
        t1 = time.perf_counter()
        logits = target.decode([last] + draft, all_logits=True)  # row i: after last + draft[:i]
        t2 = time.perf_counter()
        if self.options.sampling.greedy:
            accepted, written = verify_greedy(draft, logits)
        else:
            target_dists = _WarpedRows(logits, self.options.sampling)
            accepted, written = verify_sampled(draft, proposal.dists, target_dists, self.rng)
        t3 = time.perf_counter()
        # Keep `last` and the accepted draft tokens; the written token is the new `last`.
        if accepted < len(draft):
            target.rewind(target.n_past - (len(draft) - accepted))
        stats.draft_seconds += t1 - t0
        stats.verify_seconds += t2 - t1
        stats.read_seconds += t3 - t2
        stats.rows_read += accepted + 1  # rows after the first rejection are never read
        stats.record_step(len(draft), accepted)
        self.draft_length.record(len(draft), accepted, t1 - t0, t2 - t1, proposal.key, overhead, proposal.extent)
        self._last_step = t2
        committed = draft[:accepted] + [written]
        sources: list[Source] = ["draft"] * accepted + ["target"]
        return committed, sources


class _WarpedRows(Sequence[Distribution]):
    """Target distributions warped on demand: rows after a rejection are never touched."""

    def __init__(self, logits: np.ndarray, sampling: SamplingSettings) -> None:
        self._logits = logits
        self._sampling = sampling

    def __len__(self) -> int:
        return self._logits.shape[0]

    def __getitem__(self, i):  # type: ignore[override]
        return warp(self._logits[i], self._sampling)
