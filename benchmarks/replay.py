"""Replay `-k auto` offline against recorded greedy outputs: draft-length policies compared
exactly, without timing noise.

On a small CPU box `specli bench` moves by ±15% between rounds, more than most changes to
the draft-length policy gain or lose. But greedy n-gram speculation is deterministic once
the target's plain output is known: which draft tokens a step keeps depends only on the
text. So this script records, once per model, each workload's plain greedy output and the
target's verify cost for every batch size (at a realistic context length), and then
replays a policy: specli's own engine runs against a target that writes the recorded
text (`RecordedTarget`), so the real `NGramProposer` and `AdaptiveDraftPolicy` choose each
draft and the recorded text decides how much of it is kept; each step costs the recorded
verify time plus Python's share. Optional noise (lognormal, per step, several seeds) varies
those costs; `-k auto` does not see them, so it moves the timing only.

    python benchmarks/replay.py record -m gemma.gguf -o benchmarks/out/replay.json \\
        --prompts specli/workloads.toml --prompts benchmarks/heldout.toml
    python benchmarks/replay.py replay benchmarks/out/replay.json --seeds 12
    python benchmarks/replay.py hazard benchmarks/out/replay.json   # the data behind the n-gram prior
    python benchmarks/replay.py native replay-200.json --rows native-rows.jsonl --equal equal-rows.jsonl
    python benchmarks/replay.py beside benchmarks/out/replay.json --others 1,3,7 --max-tokens 64 \
        --prompts specli/workloads.toml --prompts benchmarks/heldout.toml

For each workload the report gives the speedup over plain decoding of `-k auto`, of an
ngram-simple-like policy (llama.cpp's defaults: draft 48 tokens after a 12-token match,
otherwise a plain step), of the best fixed K and of a clairvoyant policy (the same
proposals, each verified to exactly the length that will be kept: a bound no real policy
reaches), of a copy bound (at every position, the earlier span that continues the text
furthest, verified to its kept length: a bound on any drafter that copies from the text,
llama.cpp's n-gram modes included), and the geometric mean over workloads.

What it leaves out: greedy near-ties that a batched verify resolves differently from
plain decoding (the replay follows plain's text), the first use of a batch size in a
process (llama.cpp grows its buffers then: +4 ms at 8 rows, +37 ms at 48 here), and
draft models (their proposals depend on the draft's own logits).

`--costs` replaces the recorded verify costs (and the calibration `-k auto` starts from)
with another curve: a named one (`gpu-paper`: published llama.cpp CUDA figures for an 8B
model, scaled to a 5 ms one-token decode; see `paper_costs`) or a JSON file of seconds by
batch size, such as the one benchmarks/gpu/run.sh measures with llama-bench:

    python benchmarks/replay.py replay benchmarks/out/replay.json --costs gpu-paper
    python benchmarks/replay.py replay benchmarks/out/replay.json --costs costs.json --decode-ms 5

The report then also gives the draft lengths `-k auto` chose and Python's share of its
time (the loop's `--loop-ms` per step plus `--row-us` per logits row read).

`beside` replays `-k auto` as a slot of `serve --parallel` (decode/slots.py) beside N other
requests that each write a token a step: every step is priced with their rows, and it reports
the batch's tokens a second over the same batch without drafting, the drafted rows a step, and
the share of drafted rows kept against the share the policy foresaw (whether its acceptance
estimates hold where a row must clear the higher bar of a shared batch). It leaves out what a
shared batch costs beyond the one-sequence curve (attention over every sequence's cells) and
each slot's Python time.

`native` sets llama.cpp's best n-gram mode per prompt (compare_llamacpp.py's `--native-modes`
and `--equal-length` rows) beside specli measured, `-k auto` replayed, and both bounds, over
the same number of tokens (a recording made with `record --max-tokens` long enough).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: benchmarks/ is a package

from benchmarks.native_table import load_rows, prompt_set  # noqa: E402
from specli.decode.adaptive import MAX_DRAFT, AdaptiveDraftPolicy  # noqa: E402
from specli.decode.costs import CALIBRATION_SIZES, StepCosts  # noqa: E402
from specli.decode.engine import Engine  # noqa: E402
from specli.decode.events import Finished, StepRecord  # noqa: E402
from specli.decode.ngram import NGramProposer  # noqa: E402
from specli.decode.policy import FixedDraftPolicy  # noqa: E402
from specli.decode.request import DraftKind, GenerationRequest  # noqa: E402

LOOP_SECONDS = 0.0003  # Python's share of a step, measured by `specli bench` (0.15-0.5 ms)
ROW_SECONDS = 0.000045  # reading one verified logits row (262k vocabulary, 2-core CPU)
LLAMA_N, LLAMA_M = 12, 48  # llama.cpp ngram-simple defaults: match length, draft length

# The paper model's verify costs until a GPU measures them: llama-bench's pp512 tokens per
# second at microbatch sizes 1 to 9 for "llama 8B BF16" on an RTX 4090, FlashAttention on,
# in the merged branch's column (cuda-mmf-2) of https://github.com/ggml-org/llama.cpp/pull/15131
# ("CUDA: GEMM for FP32/FP16/BF16 and ne11 <= 16"). A microbatch of b tokens takes b / (t/s).
RTX_4090_LLAMA_8B_BF16_TOKENS_PER_SECOND = {
    1: 65.20, 2: 124.32, 3: 185.23, 4: 246.37, 5: 304.10, 6: 363.19, 7: 420.78, 8: 485.16, 9: 529.01,
}
PAPER_DECODE_SECONDS = 0.005


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    prompt: list[int]
    output: list[int]  # plain greedy output; shorter than max_tokens if generation ended
    max_tokens: int


@dataclass(frozen=True)
class Replayed:
    tokens: int  # generated tokens after the first (the prompt's decode writes that one)
    seconds: float
    steps: list[tuple[object, int, int]]  # (proposal key, drafted, accepted) per step
    expected: list[float] = dataclasses.field(default_factory=list)  # beside others: the tokens -k auto expected a step

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class Costs:
    """Seconds per target decode by batch size; past the largest recorded size, the
    cost of one more row at the top of the curve (never less than nothing: a noisy curve
    whose top falls must not make long batches cheaper than short ones)."""

    def __init__(self, by_size: dict[int, float]) -> None:
        self.by_size = dict(by_size)
        top = max(self.by_size)
        below = max((s for s in self.by_size if s < top and s % 2 == top % 2), default=None)
        self._slope = max(0.0, (self.by_size[top] - self.by_size[below]) / (top - below)) if below else 0.0
        self._top = top

    def __call__(self, batch: int) -> float:
        if batch in self.by_size:
            return self.by_size[batch]
        if batch > self._top:
            return self.by_size[self._top] + self._slope * (batch - self._top)
        lower = max(s for s in self.by_size if s < batch)
        upper = min(s for s in self.by_size if s > batch)
        return self.by_size[lower] + (batch - lower) * (self.by_size[upper] - self.by_size[lower]) / (upper - lower)


def paper_costs(decode_seconds: float = PAPER_DECODE_SECONDS, largest: int = MAX_DRAFT + 1) -> dict[int, float]:
    """Seconds per decode of 1 to `largest` tokens on the paper model's curve, scaled so one
    token takes `decode_seconds`. Past the 9 published sizes each extra token adds the
    least-squares slope of the published points from 2 tokens up (the step from 1 to 2
    tokens is a change of kernel, not a trend)."""
    published = {b: b / rate for b, rate in RTX_4090_LLAMA_8B_BF16_TOKENS_PER_SECOND.items()}
    sizes = [b for b in published if b >= 2]
    mean_size = statistics.fmean(sizes)
    mean_seconds = statistics.fmean(published[b] for b in sizes)
    slope = (sum((b - mean_size) * (published[b] - mean_seconds) for b in sizes)
             / sum((b - mean_size) ** 2 for b in sizes))
    top = max(published)
    scale = decode_seconds / published[1]
    curve = {b: seconds * scale for b, seconds in published.items()}
    curve.update({b: (published[top] + slope * (b - top)) * scale for b in range(top + 1, largest + 1)})
    return curve


COST_CURVES = {"gpu-paper": (paper_costs, "paper model: llama 8B BF16 on an RTX 4090, llama.cpp PR #15131, "
                                          "scaled to a {decode_ms:g} ms one-token decode")}


def load_costs(spec: str, decode_ms: float | None = None) -> tuple[dict[int, float], str]:
    """A verify-cost curve by name (COST_CURVES) or from a JSON file ({"seconds": {"1": ...}}
    or a bare {"1": ...}), and its source. `decode_ms` rescales it so one token takes that long
    (a named curve's default: PAPER_DECODE_SECONDS)."""
    if spec in COST_CURVES:
        build, source = COST_CURVES[spec]
        decode_seconds = PAPER_DECODE_SECONDS if decode_ms is None else decode_ms / 1e3
        return build(decode_seconds), source.format(decode_ms=decode_seconds * 1e3)
    path = Path(spec)
    if not path.is_file():
        raise SystemExit(f"error: --costs {spec!r} is neither a named curve ({', '.join(COST_CURVES)}) nor a file")
    data = json.loads(path.read_text())
    seconds = data.get("seconds", data)
    curve = {int(size): float(value) for size, value in seconds.items()}
    source = data.get("source", str(path))
    if decode_ms is not None:
        if 1 not in curve:
            raise SystemExit(f"error: --decode-ms rescales to one token's cost, and {path} has none")
        scale = decode_ms / 1e3 / curve[1]
        curve = {size: value * scale for size, value in curve.items()}
        source += f", scaled to a {decode_ms:g} ms one-token decode"
    return curve, source


def python_seconds(result: Replayed, loop_seconds: float, row_seconds: float) -> float:
    """The Python part of a replay's time: the loop's share of every step plus each logits row read."""
    return sum(loop_seconds + row_seconds * (accepted + 1) for _, _, accepted in result.steps)


class RecordedTarget:
    """A target whose choice after every position is the recorded text's next token, so the
    engine's own loop (specli.decode.engine) replays a generation: its logits rows are one-hot over
    a compact vocabulary of the tokens the recording holds, plus one end-of-generation token
    where the recorded output ended before its budget. A row after a rejected draft token is
    never read, so rows by position in the recording are all the engine needs."""

    def __init__(self, case: Case) -> None:
        ids = sorted(set(case.prompt) | set(case.output))
        self.compact = {token: index for index, token in enumerate(ids)}
        self.eog = len(ids)
        ended = len(case.output) < case.max_tokens
        self.sequence = [self.compact[t] for t in case.prompt + case.output] + ([self.eog] if ended else [])
        self.n_ctx = len(self.sequence) + case.max_tokens + 2
        self.n_past = 0
        self._eye = np.eye(self.eog + 1, dtype=np.float32)

    def decode(self, tokens: list[int], *, all_logits: bool = False) -> np.ndarray:
        positions = range(self.n_past, self.n_past + len(tokens))
        self.n_past += len(tokens)
        after = [self.sequence[p + 1] if p + 1 < len(self.sequence) else self.eog for p in positions]
        return self._eye[after if all_logits else after[-1:]]

    def rewind(self, n_keep: int) -> None:
        self.n_past = min(self.n_past, n_keep)

    def piece(self, token: int) -> bytes:
        return b""

    def is_end_of_generation(self, token: int) -> bool:
        return token == self.eog


class Beside:
    """Other requests in every step of a shared decode (decode/slots.py), each writing one token
    of its own a step (a plain step): what a slot's policy reads of them, and what it expects."""

    def __init__(self, others: int) -> None:
        self.rows = others
        self.expected = 1.0  # the policy's last expectation of its own step's tokens

    def others(self) -> tuple[int, float]:
        return self.rows, float(self.rows)

    def expect(self, tokens: float) -> None:
        self.expected = tokens


def replay(case: Case, policy: str | int, costs: Costs, calibration: dict[int, float] | None = None, *,
           noise: float = 0.0, seed: int | None = None, loop_seconds: float = LOOP_SECONDS,
           row_seconds: float = ROW_SECONDS, beside: int = 0) -> Replayed:
    """One generation run by the engine itself against the recorded text, each step priced
    at the recorded verify cost (times lognormal noise, if any), Python's loop and the rows read.

    policy: "auto" (`-k auto` with n-gram lookup, priced with `calibration`), "ngram-simple"
    (a draft of LLAMA_M after an LLAMA_N-token match), or a fixed K (n-gram lookup, every length).
    beside: other requests in every step's decode (Beside), their rows priced in the step;
    the steps then record what `-k auto` expected of each besides what it drafted and kept."""
    if not case.output:
        return Replayed(0, 0.0, [])
    target = RecordedTarget(case)
    proposer = NGramProposer((LLAMA_N,)) if policy == "ngram-simple" else NGramProposer()
    batch = Beside(beside) if beside else None
    if policy == "auto":
        calibrated = StepCosts(calibration or {size: costs(size) for size in CALIBRATION_SIZES}, 0.0, loop_seconds)
        draft_length = AdaptiveDraftPolicy(calibrated, prior=proposer.prior, batch=batch)
    else:
        draft_length = FixedDraftPolicy(LLAMA_M if policy == "ngram-simple" else int(policy))
    # The one engine built outside Session.engine_for: its target is a recording, not a loaded
    # model, and its policy is the one under test.
    engine = Engine(target, proposer, draft_length, GenerationRequest(max_tokens=case.max_tokens))
    rng = random.Random(seed)
    seconds, steps, expected = 0.0, [], []
    finished = None
    for event in engine.generate([target.compact[t] for t in case.prompt]):
        if isinstance(event, StepRecord):
            verify = costs(beside + event.drafted + 1) * (rng.lognormvariate(0.0, noise) if noise > 0 else 1.0)
            seconds += verify + loop_seconds + row_seconds * event.rows_read
            steps.append((event.key if event.drafted else None, event.drafted, event.accepted))
            if batch is not None:
                expected.append(batch.expected)
                batch.expected = 1.0
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    return Replayed(finished.stats.generated_after_first, seconds, steps, expected)


def clairvoyant(case: Case, costs: Costs, *, loop_seconds: float = LOOP_SECONDS,
                row_seconds: float = ROW_SECONDS) -> Replayed:
    """The fastest any draft-length policy could be with the same n-gram proposals and
    costs: one that knows the text in advance. Each step it picks how much of the proposal
    to verify (k), knowing how much would be kept; a shortest-time schedule over positions
    (dynamic programming: the proposal at a position depends only on the text before it).
    Not reachable (no policy can see the future); it bounds what a better policy could gain."""
    output = case.output
    end = min(case.max_tokens, len(output))
    if end < 1:
        return Replayed(0, 0.0, [])
    proposer = NGramProposer()
    proposer.prepare(case.prompt)
    best = [math.inf] * (end + 1)  # best[t]: least seconds to have produced t tokens
    choice: list[tuple[int, object, int, int] | None] = [None] * (end + 1)  # (from, key, k, kept)
    best[1] = 0.0
    for t in range(1, end):
        limit = case.max_tokens - t - 1
        proposal = proposer.propose(case.prompt + output[:t], min(MAX_DRAFT, limit)) if limit > 0 else None
        if best[t] == math.inf:
            continue
        draft = proposal.tokens if proposal else []
        match = 0
        while match < len(draft) and t + match < len(output) and draft[match] == output[t + match]:
            match += 1
        for k in range(len(draft) + 1):
            kept = min(k, match)
            after = min(t + kept + 1, end)
            seconds = best[t] + costs(k + 1) + loop_seconds + row_seconds * (kept + 1)
            if seconds < best[after]:
                best[after], choice[after] = seconds, (t, proposal.key if k else None, k, kept)
    steps = []
    t = end
    while t > 1:
        start, key, k, kept = choice[t]
        steps.append((key, k, kept))
        t = start
    return Replayed(end - 1, best[end], steps[::-1])


def longest_copies(prompt: list[int], output: list[int], end: int, longest: int = MAX_DRAFT) -> list[int]:
    """For each position t of the output, how many of the tokens from t on appear in a row
    somewhere in what precedes them (prompt and output[:t]), the copy allowed to run on into
    the tokens it writes (a repeating pattern copies itself). At most `longest`."""
    lengths = [0] * (end + 1)
    for t in range(1, end):
        context = prompt + output[:t]
        want = output[t:min(end, t + longest)]
        best = 0
        for start in range(len(context)):
            n = 0
            while n < len(want):
                source = start + n
                token = context[source] if source < len(context) else want[source - len(context)]
                if token != want[n]:
                    break
                n += 1
            best = max(best, n)
            if best == len(want):
                break
        lengths[t] = best
    return lengths


def copy_bound(case: Case, costs: Costs, *, loop_seconds: float = LOOP_SECONDS,
               row_seconds: float = ROW_SECONDS) -> Replayed:
    """The fastest any drafter that copies from the text could be: at every position it
    knows which earlier span (of the prompt or the output so far) continues the text
    furthest, and how much of it to verify. It bounds every n-gram lookup, specli's and
    llama.cpp's modes alike (each drafts a copy of some earlier span; ngram-mod's chains of
    one-token continuations can splice several, which this does not count), whatever its
    keys, votes and draft-length policy. Same schedule as `clairvoyant`."""
    output = case.output
    end = min(case.max_tokens, len(output))
    if end < 1:
        return Replayed(0, 0.0, [])
    reach = longest_copies(case.prompt, output, end)
    best = [math.inf] * (end + 1)
    choice: list[tuple[int, int] | None] = [None] * (end + 1)  # (from, kept)
    best[1] = 0.0
    for t in range(1, end):
        if best[t] == math.inf:
            continue
        for kept in range(min(reach[t], case.max_tokens - t - 1) + 1):
            after = min(t + kept + 1, end)
            seconds = best[t] + costs(kept + 1) + loop_seconds + row_seconds * (kept + 1)
            if seconds < best[after]:
                best[after], choice[after] = seconds, (t, kept)
    steps = []
    t = end
    while t > 1:
        start, kept = choice[t]
        steps.append(("copy" if kept else None, kept, kept))
        t = start
    return Replayed(end - 1, best[end], steps[::-1])


# --- record -------------------------------------------------------------------------

def record(model: Path, prompt_files: list[Path | None], repeats: int, max_tokens: int | None = None) -> dict:
    from specli.comparison import load_workloads
    from specli.decode.events import Token
    from specli.prompt import prompt_tokens
    from specli.session import SessionSpec, open_session

    cases = []
    with open_session(SessionSpec(model)) as session:
        target = session.target
        for prompt_file in prompt_files:
            for workload in load_workloads(prompt_file):
                prompt = prompt_tokens(target, workload.prompt, chat=workload.chat)
                budget = max_tokens or workload.max_tokens
                engine = session.engine_for(GenerationRequest(max_tokens=budget, draft=DraftKind.NONE))
                output = [e.id for e in engine.generate(prompt) if isinstance(e, Token) and e.id >= 0]
                cases.append(dict(name=workload.name, kind=workload.kind, prompt=prompt, output=output,
                                  max_tokens=budget))
                print(f"recorded {workload.name}: {len(prompt)} + {len(output)} tokens", file=sys.stderr)
        calibration = session.pricing.calibrate().verify
        # In situ: after a context as long as a typical prompt, in the engine's order of
        # calls (decode, then rewind), each size `repeats` times, the median kept.
        filler = [t for case in cases for t in case["prompt"] + case["output"]]
        context = int(statistics.median(len(case["prompt"]) for case in cases)) + 32
        while filler and len(filler) < context + MAX_DRAFT + 1:
            filler += filler  # a small recording: its tokens again, so every batch size gets a full batch
        samples: dict[int, list[float]] = {size: [] for size in range(1, MAX_DRAFT + 2)}
        target.rewind(0)
        target.decode(filler[:context])
        for _ in range(repeats):
            for size in samples:
                started = time.perf_counter()
                target.decode(filler[context : context + size], all_logits=True)
                samples[size].append(time.perf_counter() - started)
                target.rewind(context)
    return dict(model=str(model), context=context, calibration={str(k): v for k, v in calibration.items()},
                costs={str(size): statistics.median(v) for size, v in samples.items()}, workloads=cases)


# --- hazard -------------------------------------------------------------------------

HAZARD_BINS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 96)


def hazard_samples(recording: dict) -> list[tuple[int, int, bool]]:
    """(match length, draft position, rejected) for every drafted token an n-gram proposal
    tests when drafting MAX_DRAFT at each step of each recorded output, up to its first
    rejection: position i follows a match of the proposal's true length plus i."""
    samples = []
    for data in recording["workloads"]:
        case = Case(**data)
        proposer = NGramProposer()
        proposer.prepare(case.prompt)
        for t in range(1, len(case.output)):
            proposal = proposer.propose(case.prompt + case.output[:t], MAX_DRAFT)
            for i, token in enumerate(proposal.tokens[: len(case.output) - t]):
                rejected = token != case.output[t + i]
                samples.append((proposer.last_match_extent + i, i, rejected))
                if rejected:
                    break
    return samples


def fit_hazard(samples: list[tuple[int, int, bool]]) -> tuple[float, float, float]:
    """Maximum-likelihood (scale, length, floor) of h(x) = scale·exp(-x/length) + floor, on a grid."""
    import numpy as np

    x = np.array([min(s[0], 256) for s in samples], dtype=float)
    y = np.array([s[2] for s in samples], dtype=float)
    best, best_ll = (0.0, 1.0, 0.0), -math.inf
    for scale in np.arange(0.4, 1.001, 0.05):
        for length in np.arange(2.0, 10.001, 0.25):
            for floor in (0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.03):
                h = np.clip(scale * np.exp(-x / length) + floor, 1e-9, 1 - 1e-9)
                ll = float((y * np.log(h) + (1 - y) * np.log(1 - h)).sum())
                if ll > best_ll:
                    best, best_ll = (round(float(scale), 3), round(float(length), 3), floor), ll
    return best


def hazard_report(recording: dict) -> None:
    samples = hazard_samples(recording)
    print(f"{'context':>9} {'first drafted token':>22} {'later drafted tokens':>22} {'h(x)':>7}")
    for i, low in enumerate(HAZARD_BINS):
        high = HAZARD_BINS[i + 1] if i + 1 < len(HAZARD_BINS) else math.inf
        cells = []
        for first in (True, False):
            picked = [s[2] for s in samples if low <= s[0] < high and (s[1] == 0) == first]
            cells.append(f"{statistics.fmean(picked):6.3f} of {len(picked):6d}" if picked else f"{'-':>16}")
        label = f"{low}-{high - 1}" if high != math.inf and high - 1 > low else (f"{low}+" if high == math.inf else str(low))
        print(f"{label:>9} {cells[0]:>22} {cells[1]:>22} {1 - NGramProposer.prior(0, low):7.3f}")
    scale, length, floor = fit_hazard(samples)
    print("rejected fraction by context length x; h(x) = 1 - NGramProposer.prior(0, x) at the bin's low end")
    print(f"maximum-likelihood fit: h(x) = {scale}·exp(-x/{length}) + {floor} ({len(samples)} drafted tokens)")


# --- report -------------------------------------------------------------------------

def report(recording: dict, seeds: int, noise: float, fixed_ks: list[int], loop_seconds: float,
           row_seconds: float, curve: dict[int, float] | None = None) -> list[dict]:
    """One row per workload. `curve` replaces the recorded verify costs, and the calibration
    `-k auto` starts from is then read off the same curve, at the recording's sizes."""
    calibration = {int(k): v for k, v in recording["calibration"].items()}
    if curve is None:
        costs = Costs({int(k): v for k, v in recording["costs"].items()})
    else:
        costs = Costs(curve)
        calibration = {size: costs(size) for size in calibration}
    rows = []
    for data in recording["workloads"]:
        case = Case(**data)
        if len(case.output) < 2:
            continue
        options = dict(loop_seconds=loop_seconds, row_seconds=row_seconds)
        plain = replay(case, 0, costs, **options).tokens_per_second

        def speedup(policy: str | int) -> float:
            if policy != "auto" or seeds <= 1 or noise <= 0:
                return replay(case, policy, costs, calibration, **options).tokens_per_second / plain
            runs = [replay(case, policy, costs, calibration, noise=noise, seed=seed, **options).tokens_per_second
                    for seed in range(seeds)]
            return statistics.geometric_mean(runs) / plain

        best_k, best = max(((k, speedup(k)) for k in fixed_ks), key=lambda pair: pair[1])
        bound = clairvoyant(case, costs, **options).tokens_per_second / plain
        copying = copy_bound(case, costs, **options).tokens_per_second / plain
        # What -k auto does, on the noiseless replay: its draft lengths and Python's share.
        auto = replay(case, "auto", costs, calibration, **options)
        drafts = [drafted for _, drafted, _ in auto.steps if drafted]
        kept = sum(accepted for _, _, accepted in auto.steps)
        rows.append(dict(name=case.name, kind=case.kind, auto=speedup("auto"), ngram_simple=speedup("ngram-simple"),
                         best_k=best_k, best_fixed=best, clairvoyant=bound, copy_bound=copying,
                         steps=len(auto.steps), drafting_steps=len(drafts),
                         mean_draft=statistics.fmean(drafts) if drafts else 0.0,
                         median_draft=statistics.median(drafts) if drafts else 0,
                         max_draft=max(drafts, default=0),
                         acceptance=kept / sum(drafts) if drafts else None,
                         tokens_per_step=auto.tokens / len(auto.steps) if auto.steps else 0.0,
                         auto_seconds=auto.seconds,
                         python_seconds=python_seconds(auto, loop_seconds, row_seconds),
                         python_share=python_seconds(auto, loop_seconds, row_seconds) / auto.seconds
                         if auto.seconds else 0.0))
    return rows


# --- beside -------------------------------------------------------------------------

def beside_rows(recording: dict, others: int, loop_seconds: float = LOOP_SECONDS,
                row_seconds: float = ROW_SECONDS, max_tokens: int | None = None) -> list[dict]:
    """Per workload, `-k auto` in a shared decode beside `others` requests that each write a
    token a step: the batch's tokens a second over the same batch's with no drafting, and what
    -k auto expected its drafting steps to keep against what they kept."""
    costs = Costs({int(k): v for k, v in recording["costs"].items()})
    calibration = {int(k): v for k, v in recording["calibration"].items()}
    rows = []
    for data in recording["workloads"]:
        case = Case(**data)
        if max_tokens is not None:  # as a benchmark's requests are capped (parallel_bench.py's --max-tokens)
            case = dataclasses.replace(case, output=case.output[:max_tokens], max_tokens=min(case.max_tokens, max_tokens))
        if len(case.output) < 2:
            continue
        options = dict(loop_seconds=loop_seconds, row_seconds=row_seconds, beside=others)
        runs = {policy: replay(case, policy, costs, calibration, **options) for policy in (0, "auto")}
        rate = {policy: (run.tokens + others * len(run.steps)) / run.seconds for policy, run in runs.items()}
        auto = runs["auto"]
        expected = auto.expected or [None] * len(auto.steps)  # alone (others 0): no expectations recorded
        drafting = [(step, hope) for step, hope in zip(auto.steps, expected) if step[1]]
        rows.append(dict(name=case.name, gain=rate["auto"] / rate[0],
                         drafted=sum(step[1] for step, _ in drafting), kept=sum(step[2] for step, _ in drafting),
                         foreseen=sum(hope - 1.0 for _, hope in drafting) if auto.expected else None,
                         steps=len(auto.steps), drafting_steps=len(drafting)))
    return rows


def beside_report(recording: dict, besides: list[int], sets: list[tuple[str, set[str]]], loop_seconds: float,
                  row_seconds: float, max_tokens: int | None = None) -> None:
    print(f"{'prompts':12} {'others':>6} {'batch gain: geomean':>20} {'lowest':>7} {'rows drafted a step':>20} "
          f"{'kept':>6} {'foreseen kept':>14}")
    for others in besides:
        rows = beside_rows(recording, others, loop_seconds, row_seconds, max_tokens)
        for label, names in sets:
            chosen = [row for row in rows if row["name"] in names]
            if not chosen:
                continue
            gains = [row["gain"] for row in chosen]
            drafted = sum(row["drafted"] for row in chosen)
            share = (lambda value: f"{value / drafted:.0%}" if drafted and value is not None else "-")
            print(f"{label:12} {others:6} {statistics.geometric_mean(gains):19.3f}x {min(gains):6.2f}x "
                  f"{drafted / sum(row['steps'] for row in chosen):20.2f} {share(sum(row['kept'] for row in chosen)):>6} "
                  f"{share(None if others == 0 else sum(row['foreseen'] for row in chosen)):>14}")


# --- native -------------------------------------------------------------------------

def against_native(recording: dict, native_rows: dict[str, dict], equal_rows: dict[str, dict], costs: Costs,
                   calibration: dict[int, float], loop_seconds: float = LOOP_SECONDS,
                   row_seconds: float = ROW_SECONDS) -> list[dict]:
    """Per prompt where llama.cpp's best n-gram mode and specli wrote the same text
    (compare_llamacpp.py --equal-length): how fast that mode ran, and how fast specli did and
    at best could, each over specli's plain decoding, all over the same number of tokens.
    The measured side: the mode's and specli's tokens a second from the equal-length rows,
    over specli plain's from the --native-modes rows (plain decoding's rate hardly depends on
    the length). The replayed side, over the recorded output cut to that length: `-k auto`,
    the clairvoyant schedule over specli's proposals and the copy bound. The recording must
    reach the longest of those lengths (record --max-tokens)."""
    cases = {data["name"]: Case(**data) for data in recording["workloads"]}
    rows = []
    for name, equal in equal_rows.items():
        if not equal.get("texts_agree") or name not in cases or name not in native_rows:
            continue
        mode = equal["mode"]
        tokens = int(equal["tokens"][mode])
        whole = cases[name]
        if tokens > whole.max_tokens and len(whole.output) >= whole.max_tokens:  # stopped at its budget, not an end
            raise ValueError(f"{name}: the recording holds {len(whole.output)} tokens, the equal-length run {tokens}")
        case = dataclasses.replace(whole, output=whole.output[:tokens], max_tokens=tokens)
        options = dict(loop_seconds=loop_seconds, row_seconds=row_seconds)
        plain = replay(case, 0, costs, **options).tokens_per_second
        specli_plain = native_rows[name]["tokens_per_second"]["specli plain"]
        rows.append(dict(
            name=name, kind=whole.kind, mode=mode, tokens=tokens,
            native=equal["tokens_per_second"][mode] / specli_plain,
            specli=equal["tokens_per_second"]["specli"] / specli_plain,
            auto=replay(case, "auto", costs, calibration, **options).tokens_per_second / plain,
            clairvoyant=clairvoyant(case, costs, **options).tokens_per_second / plain,
            copy_bound=copy_bound(case, costs, **options).tokens_per_second / plain,
        ))
    return rows


def native_report(rows: list[dict], sets: list[tuple[str, set[str]]]) -> None:
    def geomean(values: list[float]) -> float:
        return math.exp(statistics.fmean(math.log(v) for v in values))

    print(f"{'prompt':26} {'mode':22} {'tokens':>6} | over specli plain: {'native':>6} {'specli':>6} | "
          f"replayed: {'auto':>5} {'clairv.':>7} {'copy':>5} | over native: {'specli':>6} {'clairv.':>7} {'copy':>5}")
    for label, names in sets:
        part = [row for row in rows if row["name"] in names]
        if not part:
            continue
        for row in part:
            print(f"{row['name']:26} {row['mode']:22} {row['tokens']:6d} | {'':19} {row['native']:6.2f} "
                  f"{row['specli']:6.2f} | {'':9} {row['auto']:5.2f} {row['clairvoyant']:7.2f} {row['copy_bound']:5.2f} | "
                  f"{'':13} {row['specli'] / row['native']:6.2f} {row['clairvoyant'] / row['native']:7.2f} "
                  f"{row['copy_bound'] / row['native']:5.2f}")
        print(f"== {label}, {len(part)} prompts, geometric means over native: measured specli "
              f"{geomean([r['specli'] / r['native'] for r in part]):.3f}, replayed -k auto "
              f"{geomean([r['auto'] / r['native'] for r in part]):.3f}, clairvoyant "
              f"{geomean([r['clairvoyant'] / r['native'] for r in part]):.3f}, copy bound "
              f"{geomean([r['copy_bound'] / r['native'] for r in part]):.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="record plain greedy outputs and the verify-cost curve")
    rec.add_argument("-m", "--model", type=Path, required=True)
    rec.add_argument("--prompts", type=Path, action="append", help="workloads TOML (repeatable; default: the shipped ones)")
    rec.add_argument("--repeats", type=int, default=3, help="timings per batch size (median kept)")
    rec.add_argument("--max-tokens", type=int, help="each workload's token budget instead of its own")
    rec.add_argument("-o", "--output", type=Path, required=True)
    rep = commands.add_parser("replay", help="replay the policies against a recording")
    rep.add_argument("recording", type=Path)
    rep.add_argument("--seeds", type=int, default=12, help="noisy replays of -k auto per workload")
    rep.add_argument("--noise", type=float, default=0.06, help="lognormal sigma of each step's verify time")
    rep.add_argument("-k", default="2,4,8,16", help="fixed Ks to compare")
    rep.add_argument("--loop-ms", type=float, default=LOOP_SECONDS * 1e3)
    rep.add_argument("--row-us", type=float, default=ROW_SECONDS * 1e6)
    rep.add_argument("--costs", help=f"verify costs to replay on instead of the recorded ones: "
                                     f"{', '.join(COST_CURVES)}, or a JSON file of seconds by batch size")
    rep.add_argument("--decode-ms", type=float, help="rescale --costs so one token's decode takes this long "
                                                     f"(default for a named curve: {PAPER_DECODE_SECONDS * 1e3:g})")
    rep.add_argument("--json", action="store_true")
    haz = commands.add_parser("hazard", help="how often a drafted n-gram token is rejected, by context length, "
                                             "and the fit behind NGramProposer.prior")
    haz.add_argument("recording", type=Path)
    bes = commands.add_parser("beside", help="-k auto in a shared decode beside other requests' rows: the batch's "
                                             "gain, and the kept share it foresaw against what was kept")
    bes.add_argument("recording", type=Path)
    bes.add_argument("--others", default="1,3,7", help="other requests in the decode, each writing a token a step")
    bes.add_argument("--prompts", type=Path, action="append", default=[],
                     help="a prompt set (TOML) to report apart (repeatable; default: all together)")
    bes.add_argument("--max-tokens", type=int, help="each workload's output cut to this many tokens")
    bes.add_argument("--loop-ms", type=float, default=LOOP_SECONDS * 1e3)
    bes.add_argument("--row-us", type=float, default=ROW_SECONDS * 1e6)
    nat = commands.add_parser("native", help="llama.cpp's best n-gram mode against specli measured, replayed, "
                                             "and its bounds, over the same tokens")
    nat.add_argument("recording", type=Path)
    nat.add_argument("--rows", type=Path, required=True, help="compare_llamacpp.py --native-modes --rows FILE")
    nat.add_argument("--equal", type=Path, required=True, help="compare_llamacpp.py --equal-length's rows")
    nat.add_argument("--prompts", type=Path, action="append", default=[],
                     help="a prompt set (TOML) to report apart (repeatable; default: all together)")
    nat.add_argument("--costs", help="verify costs to replay on (as for replay; default: the recorded ones)")
    args = parser.parse_args(argv)

    if args.command == "record":
        recording = record(args.model, args.prompts or [None], args.repeats, args.max_tokens)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        temporary = args.output.with_name(args.output.name + ".tmp")
        temporary.write_text(json.dumps(recording))
        temporary.replace(args.output)
        print(args.output)
        return 0

    recording = json.loads(args.recording.read_text())
    if args.command == "hazard":
        hazard_report(recording)
        return 0
    if args.command == "beside":
        sets = [(path.stem, {name for name, _ in prompt_set(path)}) for path in args.prompts] \
            or [("all", {data["name"] for data in recording["workloads"]})]
        beside_report(recording, [int(n) for n in args.others.split(",")], sets, args.loop_ms / 1e3, args.row_us / 1e6,
                      args.max_tokens)
        return 0
    if args.command == "native":
        # As `replay` does: the recorded calibration (what `specli run` read from its stored
        # costs), or one read off another curve at the same sizes.
        if args.costs:
            costs = Costs(load_costs(args.costs)[0])
            calibration = {int(size): costs(int(size)) for size in recording["calibration"]}
        else:
            costs = Costs({int(k): v for k, v in recording["costs"].items()})
            calibration = {int(k): v for k, v in recording["calibration"].items()}
        try:
            rows = against_native(recording, load_rows(args.rows), load_rows(args.equal), costs, calibration)
        except ValueError as error:
            print(f"replay.py: {error} (record with --max-tokens)", file=sys.stderr)
            return 2
        sets = [(path.stem, {name for name, _ in prompt_set(path)}) for path in args.prompts] \
            or [("all", {row["name"] for row in rows})]
        native_report(rows, sets)
        return 0
    curve, source = (None, "recorded") if args.costs is None else load_costs(args.costs, args.decode_ms)
    loop, row_seconds = args.loop_ms / 1e3, args.row_us / 1e6
    rows = report(recording, args.seeds, args.noise, [int(k) for k in args.k.split(",")], loop, row_seconds, curve)
    geomean = math.exp(statistics.fmean(math.log(row["auto"]) for row in rows)) if rows else 0.0
    bound = math.exp(statistics.fmean(math.log(row["clairvoyant"]) for row in rows)) if rows else 0.0
    copying = math.exp(statistics.fmean(math.log(row["copy_bound"]) for row in rows)) if rows else 0.0
    one_token = (Costs(curve) if curve else Costs({int(k): v for k, v in recording["costs"].items()}))(1)
    shares = dict(
        python_share=sum(r["python_seconds"] for r in rows) / sum(r["auto_seconds"] for r in rows) if rows else 0.0,
        plain_python_share=(loop + row_seconds) / (one_token + loop + row_seconds),
    )
    if args.json:
        print(json.dumps(dict(workloads=rows, auto_geomean=geomean, clairvoyant_geomean=bound, copy_bound_geomean=copying,
                              costs_source=source,
                              decode_ms=one_token * 1e3, loop_ms=args.loop_ms, row_us=args.row_us, **shares)))
        return 0
    print(f"verify costs: {source}; one token {one_token * 1e3:.2f} ms; Python {args.loop_ms:g} ms a step "
          f"+ {args.row_us:g} us a row read")
    print(f"{'workload':16} {'kind':9} {'auto':>6} {'ngram-simple':>12} {'auto/ngs':>8} {'best fixed K':>13} "
          f"{'clairvoyant':>11} {'copy bound':>10} {'auto drafts: mean/max (of steps)':>33} {'py share':>8}")
    for row in rows:
        drafts = f"{row['mean_draft']:.1f}/{row['max_draft']} ({row['drafting_steps']}/{row['steps']})"
        print(f"{row['name']:16} {row['kind']:9} {row['auto']:5.2f}x {row['ngram_simple']:11.2f}x "
              f"{row['auto'] / row['ngram_simple']:8.2f} {'K=' + str(row['best_k']) + ':':>7}{row['best_fixed']:5.2f}x "
              f"{row['clairvoyant']:10.2f}x {row['copy_bound']:9.2f}x {drafts:>33} {row['python_share']:8.1%}")
    print(f"geometric mean of auto: {geomean:.3f}x plain; lowest {min(r['auto'] for r in rows):.2f}x; "
          f"clairvoyant bound {bound:.3f}x; copy bound {copying:.3f}x")
    print(f"Python's share of auto's time: {shares['python_share']:.1%} (plain decoding: "
          f"{shares['plain_python_share']:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
