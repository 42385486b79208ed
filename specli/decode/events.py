"""What a generation yields: a Token as text is committed, a StepRecord after each step, and
Finished with the run's Stats. Stats, the draft-length policy and `specli bench` read the
same records; nothing else is timed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal, Sequence, Union

from specli.decode.logprobs import TokenLogprob

Source = Literal["draft", "target"]
@dataclass(frozen=True, slots=True)
class Token:
    """One committed token: its id, the text it released, and who wrote it (a drafted token
    also names its proposer: "ngram", "draft" (the draft model) or "grammar" (forced by the
    constraint)); `logprob`: its log-probability under the target, where the request asks
    for logprobs."""

    id: int
    text: str
    source: Source
    proposer: str = ""
    logprob: TokenLogprob | None = None


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One target decode after the prompt's: what was drafted and kept, and where its time went.

    Stats, the draft-length policy and `specli bench` all read these; nothing else is timed.
    """

    drafted: int
    accepted: int
    draft_seconds: float  # proposing (n-gram lookup, or the draft model's decodes and its loop)
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
    # What the draft-length policy priced the verify at (DraftPolicy.price; 0: not priced, -k N).
    priced_seconds: float = 0.0
    # Tokens the constraint forced ahead of the draft ("grammar"): certain, never verified,
    # so not counted in `drafted` or `accepted`.
    forced: int = 0
    # Of draft_seconds, the draft model's decodes (Proposal.decode_seconds); the rest is the host's.
    draft_decode_seconds: float = 0.0
    # Tokens in the verify decode: [last], forced, drafted, and rows padding it to a reusable
    # shape (BatchShapes); 0: as many as that without padding (a record made elsewhere).
    rows: int = 0

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
    draft_model: str = ""  # the draft model's file name, where one drafts
    prompt_tokens: int = 0
    prompt_cached: int = 0  # of the prompt's tokens, those the target's cache already held (a chat's earlier turns)
    tokens: int = 0
    steps: int = 0  # target decodes after the prompt's
    drafted: int = 0
    accepted: int = 0
    forced: int = 0  # tokens the constraint forced (proposer "grammar"), apart from drafted
    rows_read: int = 0
    prefill_seconds: float = 0.0  # the prompt's decode (its images' embeddings too), less encode_seconds
    images: int = 0  # images in the prompt
    encode_seconds: float = 0.0  # encoding the prompt's images (the projector), apart from prefill_seconds
    seconds: float = 0.0  # generation time after the prompt's decode
    draft_seconds: float = 0.0
    draft_decode_seconds: float = 0.0  # of draft_seconds, the draft model's decodes
    verify_seconds: float = 0.0
    read_seconds: float = 0.0
    finish_reason: str = ""
    first_token_from_prefill: bool = False  # the prompt's decode wrote the first token
    draft_lengths: list[int] = field(default_factory=list)  # [n]: steps that drafted n tokens
    accept_lengths: list[int] = field(default_factory=list)  # [n]: steps that kept n draft tokens
    drafted_by: dict[str, int] = field(default_factory=dict)  # by proposer ("ngram", "draft")
    accepted_by: dict[str, int] = field(default_factory=dict)
    # Each priced step's verify time over its price: how far the stored costs are from this run's.
    verify_over_price: list[float] = field(default_factory=list, repr=False)
    # Steps whose verify batch had another size than the step's before (a GPU runs those without
    # its captured graph: specli.decode.shapes).
    batch_changes: int = 0
    last_rows: int = field(default=0, repr=False)
    # What the CUDA backend logged of its graphs during the run (reused, captured, reset), where
    # a GPU build ran it; None elsewhere.
    cuda_graphs: dict[str, int] | None = None

    def record(self, step: StepRecord) -> None:
        self.steps += 1
        self.drafted += step.drafted
        self.accepted += step.accepted
        self.forced += step.forced
        self.rows_read += step.rows_read
        self.draft_seconds += step.draft_seconds
        self.draft_decode_seconds += step.draft_decode_seconds
        self.verify_seconds += step.verify_seconds
        self.read_seconds += step.read_seconds
        if step.priced_seconds > 0:
            self.verify_over_price.append(step.verify_seconds / step.priced_seconds)
        rows = step.rows or step.drafted + step.forced + 1
        self.batch_changes += bool(self.last_rows) and rows != self.last_rows
        self.last_rows = rows
        if step.drafted:
            _count(self.draft_lengths, step.drafted)
            _count(self.accept_lengths, step.accepted)
            self.drafted_by[step.proposer] = self.drafted_by.get(step.proposer, 0) + step.drafted
            self.accepted_by[step.proposer] = self.accepted_by.get(step.proposer, 0) + step.accepted

    @classmethod
    def combine(cls, runs: Sequence[Stats]) -> Stats:
        """Several runs' stats as one: counts, times and histograms added up (its
        tokens_per_second counts every token; take each run's own for a rate)."""
        total = cls(proposer=runs[0].proposer if runs else "none", translated=bool(runs) and runs[0].translated,
                    draft_model=runs[0].draft_model if runs else "")
        for run in runs:
            for name in ("prompt_tokens", "prompt_cached", "tokens", "steps", "drafted", "accepted", "forced", "rows_read",
                         "prefill_seconds", "images", "encode_seconds", "seconds", "draft_seconds",
                         "draft_decode_seconds", "verify_seconds", "read_seconds", "batch_changes"):
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
            total.verify_over_price.extend(run.verify_over_price)
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
    def priced_steps(self) -> int:
        return len(self.verify_over_price)

    @property
    def costs_ratio(self) -> float | None:
        """The median step's verify time over what the stored costs priced it at (None: no step
        was priced): near 1 where the costs hold on this machine, now."""
        ratios = sorted(self.verify_over_price)
        return ratios[len(ratios) // 2] if ratios else None

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
        """Time outside the models' decodes (Python's share): the loop, the logits reads, and
        proposing's own work (n-gram lookup, the draft model's loop around its decodes)."""
        return max(0.0, self.seconds - self.draft_decode_seconds - self.verify_seconds)

    @property
    def python_overhead_ms_per_step(self) -> float:
        return 1000 * self.overhead_seconds / self.steps if self.steps else 0.0

    @property
    def loop_overhead_ms_per_step(self) -> float:
        """The overhead less the target's logits reads (the draft loop's stay in)."""
        return 1000 * max(0.0, self.overhead_seconds - self.read_seconds) / self.steps if self.steps else 0.0

    @property
    def read_us_per_row(self) -> float:
        """Microseconds to read one logits row (argmax, or warping when sampling): a row is
        n_vocab floats, so memory bandwidth sets this cost."""
        return 1e6 * self.read_seconds / self.rows_read if self.rows_read else 0.0

    def to_dict(self) -> dict:
        data = asdict(self)
        del data["verify_over_price"], data["last_rows"]
        if self.cuda_graphs is None:
            del data["cuda_graphs"]
        for name in ("tokens_per_second", "acceptance_rate", "mean_accepted_length", "acceptance_by_position",
                     "overhead_seconds", "python_overhead_ms_per_step", "loop_overhead_ms_per_step",
                     "read_us_per_row", "costs_ratio", "priced_steps"):
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
