"""The speculative loop. A generator of small events; it never prints.

The prompt (what the cache does not already hold of it) is decoded in one batch and its
last row writes the first token, as in llama.cpp's own tools, so plain and speculative runs
start from the same token; the same prompt again reuses that row. Then
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
from specli.decode.proposers import Proposal, Proposer, translates
from specli.decode.sampling import (Distribution, SamplingSettings, keyed_choice, verify_greedy, verify_greedy_tokens,
                             verify_keyed, warp)
from specli.decode.text import TextStream, common_prefix_length

Source = Literal["draft", "target"]


class TargetModel(Protocol):
    """What the engine needs from the target (backend.Model, or a fake in tests)."""

    n_ctx: int
    n_past: int

    def decode(self, tokens: list[int], *, all_logits: bool = False) -> np.ndarray: ...
    def decode_argmax(self, tokens: list[int], *, all_rows: bool = False) -> Sequence[int]:
        """As decode, but each row's argmax (ties: the first best), chosen where the logits
        are; only with GenerationOptions.verify_on_device."""
        ...

    def rewind(self, n_keep: int) -> None: ...
    def piece(self, token: int) -> bytes: ...
    def is_end_of_generation(self, token: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class Token:
    """One committed token: its id, the text it released, and who wrote it (a drafted token
    also names its proposer: "ngram" or "draft", the draft model)."""

    id: int
    text: str
    source: Source
    proposer: str = ""


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One target decode after the prompt's: what was drafted and kept, and where its time went.

    Stats, the draft-length policy and `specli bench` all read these; nothing else is timed.
    """

    drafted: int
    accepted: int
    draft_seconds: float  # proposing (n-gram lookup, or the draft model's decodes)
    verify_seconds: float  # the target's batched decode of [last] + draft
    read_seconds: float  # reading rows to accept (a vocabulary-sized scan each, or a device's few candidates)
    loop_seconds: float  # since the previous step's read: emitting text, rendering, bookkeeping
    key: object = None  # the proposal's key (n-gram lookup: the match length)
    extent: int = 0  # the proposal's extent (a copy in progress: how far back the match goes)
    proposer: str = ""  # who drafted: "ngram" or "draft" ("" for a plain step)
    support: tuple[float, ...] = ()  # the proposal's vote share per drafted token (Proposal.support)
    agreeing: tuple[int, ...] = ()  # the occurrences in agreement per drafted token (Proposal.agreeing)
    # The draft model's tokens the policy asked for (0: lookup's or a plain step). Through text
    # it may bring none (its text ended inside a character), though its decodes were paid.
    asked: int = 0

    @property
    def rows_read(self) -> int:
        """Rows after the first rejection are never read."""
        return self.accepted + 1


@dataclass
class Stats:
    """Counts, summed times and the draft/accept histograms of one run (or several, combined).
    Every other figure is derived below, once."""

    proposer: str = "none"
    translated: bool = False  # a draft model with another vocabulary, drafting through text
    prompt_tokens: int = 0
    prompt_cached: int = 0  # of the prompt's tokens, those the target's cache already held (a chat's earlier turns)
    tokens: int = 0
    steps: int = 0  # target decodes after the prompt's
    drafted: int = 0
    accepted: int = 0
    rows_read: int = 0
    prefill_seconds: float = 0.0
    seconds: float = 0.0  # generation time after the prompt's decode
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    read_seconds: float = 0.0
    finish_reason: str = ""
    first_token_from_prefill: bool = False  # the prompt's decode wrote the first token
    draft_lengths: list[int] = field(default_factory=list)  # [n]: steps that drafted n tokens
    accept_lengths: list[int] = field(default_factory=list)  # [n]: steps that kept n draft tokens
    drafted_by: dict[str, int] = field(default_factory=dict)  # by proposer ("ngram", "draft")
    accepted_by: dict[str, int] = field(default_factory=dict)

    def record(self, step: StepRecord) -> None:
        self.steps += 1
        self.drafted += step.drafted
        self.accepted += step.accepted
        self.rows_read += step.rows_read
        self.draft_seconds += step.draft_seconds
        self.verify_seconds += step.verify_seconds
        self.read_seconds += step.read_seconds
        if step.drafted:
            _count(self.draft_lengths, step.drafted)
            _count(self.accept_lengths, step.accepted)
            self.drafted_by[step.proposer] = self.drafted_by.get(step.proposer, 0) + step.drafted
            self.accepted_by[step.proposer] = self.accepted_by.get(step.proposer, 0) + step.accepted

    @classmethod
    def combine(cls, runs: Sequence[Stats]) -> Stats:
        """Several runs' stats as one: counts, times and histograms added up (its
        tokens_per_second counts every token; take each run's own for a rate)."""
        total = cls(proposer=runs[0].proposer if runs else "none", translated=bool(runs) and runs[0].translated)
        for run in runs:
            for name in ("prompt_tokens", "prompt_cached", "tokens", "steps", "drafted", "accepted", "rows_read",
                         "prefill_seconds", "seconds", "draft_seconds", "verify_seconds", "read_seconds"):
                setattr(total, name, getattr(total, name) + getattr(run, name))
            for name in ("draft_lengths", "accept_lengths"):
                mine, theirs = getattr(total, name), getattr(run, name)
                _grow(mine, len(theirs))
                for n, count in enumerate(theirs):
                    mine[n] += count
            for name in ("drafted_by", "accepted_by"):
                mine, theirs = getattr(total, name), getattr(run, name)
                for proposer, count in theirs.items():
                    mine[proposer] = mine.get(proposer, 0) + count
        return total

    @property
    def generated_after_first(self) -> int:
        """Tokens written by decode steps: the first token, written by the prompt's decode
        (prefill time), is left out, as in llama.cpp's "eval time ... N - 1 runs"."""
        return self.tokens - 1 if self.first_token_from_prefill and self.tokens > 0 else self.tokens

    @property
    def tokens_per_second(self) -> float:
        return self.generated_after_first / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Draft tokens kept per step that drafted anything."""
        drafting = sum(self.draft_lengths)
        return self.accepted / drafting if drafting else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """Of the steps that drafted position i, the share that kept it."""
        drafted = _at_least(self.draft_lengths)
        kept = _at_least(self.accept_lengths)
        return [(kept[i] if i < len(kept) else 0) / drafted[i] for i in range(len(drafted)) if drafted[i]]

    @property
    def overhead_seconds(self) -> float:
        """Time outside proposing and the target's decodes: the loop, and the logits reads."""
        return max(0.0, self.seconds - self.draft_seconds - self.verify_seconds)

    @property
    def python_overhead_ms_per_step(self) -> float:
        return 1000 * self.overhead_seconds / self.steps if self.steps else 0.0

    @property
    def loop_overhead_ms_per_step(self) -> float:
        """The overhead less the logits reads: what a step costs whatever its length."""
        return 1000 * max(0.0, self.overhead_seconds - self.read_seconds) / self.steps if self.steps else 0.0

    @property
    def read_us_per_row(self) -> float:
        """Microseconds to read one logits row (argmax, or warping when sampling): a row is
        n_vocab floats, so memory bandwidth sets this cost."""
        return 1e6 * self.read_seconds / self.rows_read if self.rows_read else 0.0

    def to_dict(self) -> dict:
        data = asdict(self)
        for name in ("tokens_per_second", "acceptance_rate", "mean_accepted_length", "acceptance_by_position",
                     "overhead_seconds", "python_overhead_ms_per_step", "loop_overhead_ms_per_step",
                     "read_us_per_row"):
            data[name] = getattr(self, name)
        return data


def _grow(counts: list[int], size: int) -> None:
    if len(counts) < size:
        counts.extend([0] * (size - len(counts)))


def _count(histogram: list[int], value: int) -> None:
    _grow(histogram, value + 1)
    histogram[value] += 1


def _at_least(histogram: list[int]) -> list[int]:
    """[i]: how many entries are above i, for i < the largest value."""
    out, above = [], sum(histogram)
    for count in histogram[:-1]:
        above -= count
        out.append(above)
    return out


@dataclass(frozen=True, slots=True)
class Finished:
    reason: str  # "eog" | "length" | "stop" | "context"
    stats: Stats


Event = Union[Token, StepRecord, Finished]


DraftTokens = Union[int, Literal["auto"]]  # -k: a fixed number of draft tokens per step, or auto


class DraftPolicy(Protocol):
    """Chooses how many draft tokens each step verifies (-k N: FixedDraftPolicy; -k auto:
    adaptive.AdaptiveDraftPolicy)."""

    draft_tokens: int  # the most a step drafts

    def choose(self, key: object, extent: int, available: int, support: Sequence[float] = (),
               behind: int = 0, agreeing: Sequence[int] = ()) -> int:
        """How many of the `available` draft tokens to verify (0: a plain step).
        key, extent, support and agreeing: the proposal's (Proposal.key, ...); key None: a
        draft model's tokens, which cost a decode each, after the `behind` tokens it must
        decode first to catch up with the committed text (Proposer.behind)."""
        ...

    def prefers(self, free: Proposal, available: int, behind: int = 0) -> bool:
        """Whether a free proposal (n-gram lookup) is worth more than up to `available` tokens
        of the draft model (`behind` the committed text by that many tokens)."""
        ...

    def record(self, step: StepRecord) -> None: ...


@dataclass
class FixedDraftPolicy:
    draft_tokens: int

    def choose(self, key: object, extent: int, available: int, support: Sequence[float] = (),
               behind: int = 0, agreeing: Sequence[int] = ()) -> int:
        return min(self.draft_tokens, available)

    def prefers(self, free: Proposal, available: int, behind: int = 0) -> bool:
        return free.extent > 0  # a copy in progress (a match of lookup's longest n)

    def record(self, step: StepRecord) -> None:
        pass


@dataclass(frozen=True)
class GenerationOptions:
    max_tokens: int = 256
    sampling: SamplingSettings = SamplingSettings()
    stop: tuple[str, ...] = ()
    # Keep what the target's KV cache holds of the prompt (an earlier turn). False decodes the
    # whole prompt as a fresh run does: batches of other sizes round differently, so only
    # that is bit for bit what a fresh run writes (--exact requests to the server).
    reuse_cache: bool = True
    # Greedy runs without a repetition penalty: llama.cpp takes each row's argmax on the device
    # that computed the logits (backend sampling), and the host reads a few candidates per
    # row instead of a vocabulary row. The same tokens either way; other runs ignore it.
    verify_on_device: bool = False


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
        policy: DraftPolicy,
        options: GenerationOptions,
        seed: int = 0,
    ) -> None:
        self.target = target
        self.proposer = proposer
        self.policy = policy
        self.options = options
        self.seed = seed  # sampling: the token at each position is keyed by (seed, position)
        self.stats = Stats(proposer=proposer.name, translated=translates(proposer))
        self._step_ended: float | None = None  # when the previous step's logits were read
        self._on_device = False  # this generation verifies with the target's decode_argmax
        self._cached: list[int] = []  # the tokens whose entries the target's KV cache holds
        # The last prompt, whether it was verified on the device, and its last row's logits
        # (or, on the device, its argmax): see _generate.
        self._prompt_row: tuple = (None, False, None)

    def generate(self, prompt: list[int]) -> Iterator[Event]:
        """Token events as text is committed, a StepRecord after each step's tokens, then
        Finished. The prompt is checked against the context now, before any event."""
        if not prompt:
            raise ValueError("generate needs at least one prompt token")
        check_prompt_fits(len(prompt), self.target.n_ctx)
        self.stats = Stats(proposer=self.proposer.name, translated=translates(self.proposer))
        # A penalised row depends on the tokens before it, which the device does not see.
        self._on_device = self.options.verify_on_device and self.options.sampling.pure_greedy
        return self._generate(prompt)

    def _generate(self, prompt: list[int]) -> Iterator[Event]:
        target, options, stats = self.target, self.options, self.stats
        stats.prompt_tokens = len(prompt)
        started = time.perf_counter()
        # What the cache already holds of the prompt (an earlier turn of a chat) stays; the
        # prompt's last token is decoded again for its logits row, unless the same prompt came
        # last time: then its row is the one kept from then (a one-row decode rounds otherwise,
        # and a near-tie could flip: the same request sent again writes the same text).
        cached = common_prefix_length(self._cached, prompt) if options.reuse_cache else 0
        last_prompt, last_on_device, last_row = self._prompt_row
        again = (options.max_tokens > 0 and cached == len(prompt) and last_prompt == prompt
                 and last_on_device == self._on_device)
        keep = len(prompt) if again else min(cached, len(prompt) - 1)
        target.rewind(keep)
        stats.prompt_cached = keep
        self._cached = []
        self._step_ended = None
        # The rest of the prompt in one decode, as llama.cpp's own tools do: its last row
        # writes the first token, so plain and speculative runs share it exactly.
        if options.max_tokens <= 0:
            row = None
        elif again:
            row = last_row
        elif self._on_device:
            row = int(target.decode_argmax(prompt[keep:])[0])
        else:
            row = np.array(target.decode(prompt[keep:])[0])  # a copy: kept for the same prompt again
        if row is None:
            first = None
        elif self._on_device:
            first = row
        else:
            first = self._choose(options.sampling.penalise(row, prompt), len(prompt))
        self._prompt_row = (list(prompt), self._on_device, row) if row is not None else (None, False, None)
        self.proposer.prepare(prompt)
        stats.prefill_seconds = time.perf_counter() - started

        text = TextStream(options.stop)
        tokens = list(prompt)  # the committed sequence: prompt + output
        started = time.perf_counter()
        reason = "length"
        step: StepRecord | None = None
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
                    yield Token(token, released, source, step.proposer if source == "draft" and step else "")
                    if text.stopped:
                        reason = "stop"
                        break
                if step is not None:
                    yield step
                if reason:
                    break
                remaining = options.max_tokens - stats.tokens
                room = target.n_ctx - target.n_past - 1  # positions left after committed[-1]
                if remaining <= 0 or room < 0:
                    reason = "length" if remaining <= 0 else "context"
                    break
                committed, sources, step = self._step(tokens, committed[-1], min(remaining - 1, room))
            tail = text.flush()
            if tail:
                yield Token(-1, tail, "target")  # held-back text with no token of its own
        finally:
            stats.seconds = time.perf_counter() - started
            self._cached = tokens[: target.n_past]
        stats.finish_reason = reason
        yield Finished(reason, stats)

    def _choose(self, row: np.ndarray, position: int) -> int:
        """The target's own token at `position` from its logits row: argmax, or the keyed
        draw from the warped row."""
        if self.options.sampling.greedy:
            return int(np.argmax(row))
        return keyed_choice(warp(row, self.options.sampling), self.seed, position)

    def _propose(self, tokens: list[int], room: int) -> tuple[Proposal, list[int], int]:
        """The proposal, the part of it to verify (at most `room` tokens: what the output
        budget and the context leave), and how many tokens the draft model was asked for."""
        policy = self.policy
        available = min(room, policy.draft_tokens)
        if available <= 0:
            return Proposal(), [], 0
        # A free proposal (n-gram lookup) first; then, where it is not worth as much as a draft
        # model's tokens at their cost, the draft model, asked for as many as the policy chooses.
        proposal = self.proposer.lookup(tokens, available)
        behind = 0 if self.proposer.cheap else self.proposer.behind(tokens)
        if self.proposer.cheap or (proposal.tokens and policy.prefers(proposal, available, behind)):
            k = policy.choose(proposal.key, proposal.extent, len(proposal.tokens), proposal.support,
                              agreeing=proposal.agreeing) if proposal.tokens else 0
            return proposal, proposal.tokens[:k], 0
        k = policy.choose(None, 0, available, behind=behind)
        proposal = self.proposer.propose(tokens, k) if k > 0 else Proposal()
        return proposal, proposal.tokens[:k], k

    def _step(self, tokens: list[int], last: int, room: int) -> tuple[list[int], list[Source], StepRecord]:
        """Propose, verify, accept, rewind: one target decode. Returns the committed tokens."""
        target = self.target
        t0 = time.perf_counter()
        proposal, draft, asked = self._propose(tokens, room)
        t1 = time.perf_counter()
        batch = [last] + draft  # row i: after last + draft[:i]
        rows = target.decode_argmax(batch, all_rows=True) if self._on_device else target.decode(batch, all_logits=True)
        t2 = time.perf_counter()
        accepted, written = self._verify(rows, tokens, draft)
        t3 = time.perf_counter()
        # Keep `last` and the accepted draft tokens; the written token is the new `last`.
        if accepted < len(draft):
            target.rewind(target.n_past - (len(draft) - accepted))
        loop = 0.0 if self._step_ended is None else max(0.0, t0 - self._step_ended)
        self._step_ended = t3
        step = StepRecord(len(draft), accepted, t1 - t0, t2 - t1, t3 - t2, loop, proposal.key, proposal.extent,
                          proposal.proposer if draft else "", proposal.support[: len(draft)],
                          proposal.agreeing[: len(draft)], asked)
        self.stats.record(step)
        self.policy.record(step)
        committed = draft[:accepted] + [written]
        sources: list[Source] = ["draft"] * accepted + ["target"]
        return committed, sources, step

    def _verify(self, rows: Sequence, tokens: list[int], draft: list[int]) -> tuple[int, int]:
        """(accepted, written) from the verify batch's rows: the device's argmax of each, or
        logits rows (penalised for the text before them, warped when sampling)."""
        if self._on_device:
            return verify_greedy_tokens(draft, rows)
        logits = _Rows(rows, self.options.sampling, tokens, draft)
        if self.options.sampling.greedy:
            return verify_greedy(draft, logits)
        return verify_keyed(draft, _WarpedRows(logits, self.options.sampling), self.seed, len(tokens))


class _Rows(Sequence[np.ndarray]):
    """A verify batch's logits rows, row i with the repetition penalty for the text before
    its position (the committed tokens, then draft[:i], kept if row i is read at all).
    Rows after a rejection are never touched."""

    def __init__(self, logits: np.ndarray, sampling: SamplingSettings, tokens: list[int], draft: list[int]) -> None:
        self._logits, self._sampling, self._tokens, self._draft = logits, sampling, tokens, draft

    def __len__(self) -> int:
        return self._logits.shape[0]

    def __getitem__(self, i):  # type: ignore[override]
        if not self._sampling.penalises:
            return self._logits[i]
        context = self._tokens[-self._sampling.repeat_last_n :] + self._draft[:i]
        return self._sampling.penalise(self._logits[i], context)


class _WarpedRows(Sequence[Distribution]):
    """Target distributions warped on demand: rows after a rejection are never touched."""

    def __init__(self, rows: Sequence[np.ndarray], sampling: SamplingSettings) -> None:
        self._rows = rows
        self._sampling = sampling

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):  # type: ignore[override]
        return warp(self._rows[i], self._sampling)
