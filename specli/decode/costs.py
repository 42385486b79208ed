"""What a step costs: the target's verify time by batch size, the draft's time per token and
the loop's time per step.

`-k auto` chooses draft lengths from these and never from times measured during a run, so
the same command drafts, and writes, the same way every time, the first run included. They
come from a calibration (`specli doctor --calibrate`, `specli bench`), or, where none is
stored, from a quick one that a model's first run makes before it drafts (FIRST_RUN_SIZES).

A calibration is only stored where it can be trusted: every size is warmed up, then timed
in passes that alternate their order, and the fastest time of each kept (load only ever adds
time); where the passes disagree, or the curve is not one a batch can have (`curve_problem`),
or one token is priced far from a plain step (PLAIN_RANGE), the machine was too busy: nothing
is stored, the run drafts on `prior_costs(..., conservative=True)`, and it leaves a
`BusyMark`: until the mark's window ends (`BusyMark.until`, longer with each busy finding in
a row), later runs draft on that curve too without measuring, so a machine that stays busy
costs each run nothing rather than a calibration that will not be stored. A stored
calibration clears the mark. A stored curve that a run finds far from its own verify times
is marked stale, and measured again.
"""

from __future__ import annotations

import bisect
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Literal

# prior: nothing measured; conservative: the machine was too busy to measure (not stored).
CostSource = Literal["prior", "conservative", "learned", "first run", "calibrated"]

# Batch sizes a calibration times. Odd and even both: on CPUs llama.cpp's matrix kernels take
# the rows of a batch in pairs, so an odd batch can cost more than the even one above it.
CALIBRATION_SIZES = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 24, 32, 33, 48, 49)
# The quick calibration a model's first run makes, once, when nothing is stored (1.1 s on the
# embedded model here); longer batches follow the line through the largest two of a parity.
FIRST_RUN_SIZES = (1, 2, 3, 4, 8, 9, 16)
# The prior's verify curve relative to one token: 1 + scale·(b - 1)^power. On a CPU every row
# runs the whole output head, so each row adds much. On a GPU the step is from one row to two
# (another kernel), then nearly flat: an 8B-shaped F16 model on an H200 measured 1.34 at 2
# rows, 1.40 at 8, 1.52 at 16, 1.65 at 48 (llama-bench, 2026-11-26); this prior gives 1.34,
# 1.47, 1.54, 1.65 (docs/design.md, "The cost model").
PRIOR_CURVE = {"cpu": (0.7, 0.75), "gpu": (0.34, 0.17)}
# Where the machine was too busy to measure: a curve at or above every one measured (CPU here:
# 2 rows 1.85 plain decodes, 8 rows 5.0, 48 rows 16.8; the H200: 1.34, 1.40, 1.65), so the run
# drafts only what is sure to pay.
CONSERVATIVE_CURVE = {"cpu": (0.85, 0.8), "gpu": (0.45, 0.35)}
PRIOR_LOOP = 0.02  # the loop's time per step, relative to a one-token decode
# On a GPU, a change of the verify batch's shape, relative to a one-token decode, where no
# steady calibration measured it (specli.decode.shapes): a decode without the captured graph
# and the capture after it. A guess between a small model (launch-bound, where it is a large
# share of a step) and an 8B one (where launches hide behind the work).
PRIOR_SHAPE_CHANGE = 0.25

# When a calibration can be trusted (`judge`): each size's second-fastest time within
# BUSY_SPREAD of its fastest (the median over sizes; quiet passes here: 0.04-0.19, with two
# busy processes on the two cores: 0.30-0.66), and one token within PLAIN_RANGE of a plain step.
# Below, the range is wide: a token on an empty cache may cost less than one after a context
# (a tiny model's 0.4 ms decodes measured 0.69-1.0x here), and one token then prices plain
# decoding low, which only makes drafts look dearer. Above, it is narrow: load that slows the
# one-token samples (2x a plain step was seen) would make every draft look cheap.
# Three passes: with two, a quick calibration here priced one token 30% high and 8 rows 40%
# high now and then, which -k auto paid for in drafts that lose.
PASSES = 3  # timed passes over the sizes, after a warm-up one; two more where they disagree
BUSY_SPREAD = 0.25
PLAIN_RANGE = (0.5, 1.25)
# On a CPU, the share of the CPU time its threads asked for that the decodes got: 0.98-1.0 on
# a quiet machine here, 0.6-0.75 beside one busy process, 0.5 beside two. Load that slows every
# size alike leaves the spread and the shape as they were: this is what shows it.
BUSY_CPU_SHARE = 0.85
# A run's verify times against the stored curve (Stats.costs_ratio): outside STALE_RANGE over at
# least STALE_STEPS priced steps, the stored curve is marked stale and measured again.
STALE_RANGE = (0.67, 1.5)
STALE_STEPS = 30
# After a first run found the machine too busy to measure, later runs do not measure for
# BUSY_BACKOFF seconds, doubled with each consecutive busy finding, at most BUSY_BACKOFF_MOST.
BUSY_BACKOFF = 300.0
BUSY_BACKOFF_MOST = 3600.0


@dataclass(frozen=True)
class StepCosts:
    """Seconds (relative units for a prior) for each part of a step."""

    verify: dict[int, float]  # the target's all-logits decode, by batch size
    draft_per_token: float = 0.0  # proposing one draft token
    loop: float = 0.0  # the rest of a step: emitting text, reading logits rows
    source: CostSource = "prior"
    # A draft model's greedy agreement with the target on a sample text (Pricing's
    # calibration), the policy's first guess at its acceptance; None: not measured.
    draft_acceptance: float | None = None
    # Bringing a draft model's cache up to date, per token (one batched decode of what was
    # committed while it did not draft).
    draft_catch_up: float = 0.0
    measured_at: float | None = None  # when the verify curve was measured (Unix time)
    # A run's median verify time over this curve's price, where it was far enough off to
    # measure again (Pricing.review); None: not stale.
    stale: float | None = None
    # On a GPU, what a change of the verify batch's shape costs (a decode without the captured
    # graph, then its capture: specli.decode.shapes); None: not measured.
    shape_change: float | None = None
    # A drafter whose agreement falls with depth (the target's NextN layers, fed their own
    # states): the chance that the draft's i-th token is kept once the ones before it were, by
    # i from 0 (its first is draft_acceptance), the last for any deeper; (): the same at every depth.
    draft_depths: tuple[float, ...] = ()

    def acceptance_at(self, depth: int) -> float | None:
        """The prior chance that the draft's token at `depth` (0: its first) is kept once the
        ones before it were (None: not measured)."""
        if self.draft_depths:
            return self.draft_depths[min(depth, len(self.draft_depths) - 1)]
        return self.draft_acceptance

    @property
    def change(self) -> float:
        """A change of the verify batch's shape (a GPU's): measured, else PRIOR_SHAPE_CHANGE of a token."""
        return self.shape_change if self.shape_change is not None else PRIOR_SHAPE_CHANGE * VerifyCurve(self.verify).cost(1)

    def to_json(self) -> dict:
        data = asdict(self)
        data["verify"] = {str(size): seconds for size, seconds in sorted(self.verify.items())}
        if self.shape_change is None:  # (measured on a GPU only: a CPU's entries keep their fields)
            del data["shape_change"]
        if not self.draft_depths:  # (a drafter's, read beside its own key: never stored here)
            del data["draft_depths"]
        else:
            data["draft_depths"] = list(self.draft_depths)
        return data

    @classmethod
    def from_json(cls, data: dict) -> StepCosts:
        verify = {int(size): float(seconds) for size, seconds in data["verify"].items()}
        if not verify or any(seconds <= 0 for seconds in verify.values()):
            raise ValueError("no verify costs")
        acceptance, measured_at, stale = data.get("draft_acceptance"), data.get("measured_at"), data.get("stale")
        change = data.get("shape_change")
        return cls(verify, float(data.get("draft_per_token", 0.0)), float(data.get("loop", 0.0)),
                   data.get("source", "calibrated"), None if acceptance is None else float(acceptance),
                   float(data.get("draft_catch_up", 0.0)), None if measured_at is None else float(measured_at),
                   None if stale is None else float(stale), None if change is None else float(change))


def prior_costs(gpu: bool, draft_size_ratio: float = 0.0, *, conservative: bool = False) -> StepCosts:
    """Costs before anything is measured, in units of a one-token decode (conservative: where
    the machine was too busy to measure, CONSERVATIVE_CURVE). A draft model is priced by its
    file size against the target's: a decode reads every weight once (its catch-up too, a
    token at a decode's cost, as Pricing prices an unmeasured draft)."""
    scale, power = (CONSERVATIVE_CURVE if conservative else PRIOR_CURVE)["gpu" if gpu else "cpu"]
    verify = {size: 1.0 + scale * (size - 1) ** power for size in CALIBRATION_SIZES}
    source: CostSource = "conservative" if conservative else "prior"
    return StepCosts(verify, draft_size_ratio, PRIOR_LOOP, source, draft_catch_up=draft_size_ratio)


def curve_problem(verify: dict[int, float]) -> str | None:
    """Why a verify curve is not one a batch can have (noise under load made it), or None.

    A batch of b rows costs at least most of one row's decode and at most about b of them;
    and a longer batch costs no less than well over half a shorter one: the CPU kernels take
    rows in fours, so 3 rows may cost more than 4 (3.5 and 2.7 plain decodes here), never
    twice as much."""
    if 1 not in verify:
        return "no one-token cost"
    one = verify[1]
    for size, seconds in sorted(verify.items()):
        ratio = seconds / one
        if size > 1 and ratio < 0.8:
            return f"a batch of {size} priced at {ratio:.2f}x one token"
        if ratio > 1.5 * size:
            return f"a batch of {size} priced at {ratio:.1f}x one token"
        shorter = [other for other in verify if other < size and seconds < 0.6 * verify[other]]
        if shorter:
            return f"a batch of {size} priced at {seconds / verify[shorter[0]]:.2f}x a batch of {shorter[0]}"
    return None


class VerifyCurve:
    """Seconds for the target to decode a batch of b tokens, from costs known at some sizes.

    Sizes in between are interpolated between neighbours of the same parity; beyond the
    largest known size a line through the largest of its parity extends (see _estimate); below the
    smallest, the cost scales down in proportion. A batch is never priced above a longer one
    of the same parity: where measured noise says otherwise, the longer one's cost stands.
    """

    def __init__(self, known: dict[int, float]) -> None:
        if not known:
            raise ValueError("a verify curve needs at least one known cost")
        self._known = dict(known)
        self._table: list[float] = []

    def cost(self, batch: int) -> float:
        if batch + 2 >= len(self._table):
            self._table = self._build(max(batch + 3, max(self._known) + 4))
        return self._table[batch]

    def _build(self, size: int) -> list[float]:
        known = self._known
        sizes = sorted(known)
        by_parity = ([s for s in sizes if s % 2 == 0], [s for s in sizes if s % 2 == 1])
        table = [0.0] + [self._estimate(b, sizes, by_parity[b % 2]) for b in range(1, size)]
        for b in range(size - 3, 0, -1):
            table[b] = min(table[b], table[b + 2])
        return table

    def _estimate(self, batch: int, sizes: list[int], same_parity: list[int]) -> float:
        known = self._known
        if batch in known:
            return known[batch]
        smallest, largest = sizes[0], sizes[-1]
        if batch < smallest:
            return known[smallest] * batch / smallest
        if batch > largest:
            # The cost of one more row in a long batch: the steeper of the lines through the two
            # largest sizes of the same parity and through its smallest (above 1) and largest (noise at
            # one size must not flatten the line, or every long draft would be priced too low),
            # else the same through the sizes of any parity.
            for candidates in (same_parity, sizes):
                if len(candidates) >= 2:
                    # (A one-row decode is no point of the line: its fixed costs are not shared.)
                    first = next(size for size in candidates if size > 1 or size == candidates[-2])
                    below, top = candidates[-2], candidates[-1]
                    slope = max((known[top] - known[below]) / (top - below), (known[top] - known[first]) / (top - first))
                    if slope > 0:
                        return known[top] + slope * (batch - top)
            return known[largest] * batch / largest
        for candidates in (same_parity, sizes):
            i = bisect.bisect_left(candidates, batch)
            if 0 < i < len(candidates):
                lower, upper = candidates[i - 1], candidates[i]
                weight = (batch - lower) / (upper - lower)
                return known[lower] + weight * (known[upper] - known[lower])
        raise AssertionError("unreachable: smallest < batch < largest")


@dataclass(frozen=True)
class Calibration:
    """A calibration's verify curve and whether it can be trusted."""

    verify: dict[int, float]  # seconds by batch size: each size's fastest time
    plain: float | None  # a plain step's fastest time (a token after a context), as timed beside them
    spread: float  # the median over sizes of how far a size's second-fastest time lies over its fastest
    problem: str | None  # why the machine was too busy to measure, or None
    seconds: float = 0.0  # how long the calibration took
    cpu_share: float | None = None  # of the CPU time its threads asked for, the share they got
    shape_change: float | None = None  # a steady calibration's price of a change of shape (GPU)


def calibrate(decode: Callable[[list[int]], object], rewind: Callable[[int], None], token: int,
              sizes: tuple[int, ...] = CALIBRATION_SIZES, passes: int = PASSES, threads: int | None = None, *,
              steady: bool = False, verify_curve: bool = True) -> Calibration:
    """Time an all-logits decode of each batch size on an empty cache.

    The largest size is decoded once untimed first: its first use grows llama.cpp's buffers to
    what every smaller batch needs too (here the first timed use of each smaller size then
    costs what later ones do), and the model's weights are read in. Then `passes` timed
    passes over the sizes, forward and
    backward in turn, so a burst of load hits one sample of a few sizes rather than every
    sample of one; after the largest size, a plain step is timed as a run makes it (a token
    after a token, after a context: the first token after a batch of another size pays for
    the change of shape, which a tiny model's step does not outweigh). Each size keeps its fastest time: load only ever adds time. Where the
    passes disagree or the curve is implausible (`judge`), two passes more are timed and it
    is judged again; its `problem` says why it cannot be trusted, if it still cannot.
    `threads`: the CPU threads a decode runs on (a model on the CPU), whose share of the CPU
    time they asked for is checked too; None where the decodes run elsewhere (a GPU, --rpc).

    `steady` (a GPU, whose backend replays a captured graph only while decodes keep one shape):
    each size is decoded three times in a row and the third, a replay, is its sample, as a run
    that keeps a shape pays; the first (after another size: no graph) and the second (it
    captures) price a change of shape, over the third (`Calibration.shape_change`).

    `verify_curve` False (a drafter's timings: a one-token draft and a catch-up, which may put
    out no logits row and cost less than the one token): the curve is not held to a verify
    curve's shape (`curve_problem`); the load checks stand."""
    started = time.perf_counter()
    timings = _Timings(decode, rewind, token, sizes, steady)
    decode([token] * max(sizes))  # the warm-up
    rewind(0)
    for index in range(passes):
        timings.one_pass(index)
    result = judge(timings.samples, timings.plain, timings.cpu_share(threads), verify_curve)
    if result.problem is not None:
        for index in range(passes, passes + 2):
            timings.one_pass(index)
        result = judge(timings.samples, timings.plain, timings.cpu_share(threads), verify_curve)
    changes = sorted(timings.changes)
    change = max(0.0, changes[len(changes) // 2]) if changes else None
    return replace(result, seconds=time.perf_counter() - started, shape_change=change)


class _Timings:
    """What a calibration's passes time: each size's samples, plain steps, and (steady) the
    price of each change of shape; with the wall and CPU time the decodes took."""

    def __init__(self, decode: Callable[[list[int]], object], rewind: Callable[[int], None], token: int,
                 sizes: tuple[int, ...], steady: bool) -> None:
        self.decode, self.rewind, self.token, self.sizes, self.steady = decode, rewind, token, sizes, steady
        self.samples: dict[int, list[float]] = {size: [] for size in sizes}
        self.changes: list[float] = []
        self.plain: list[float] = []
        self.wall = self.cpu = 0.0

    def timed(self, tokens: list[int]) -> float:
        begun, cpu = time.perf_counter(), time.process_time()
        self.decode(tokens)
        wall = time.perf_counter() - begun
        self.wall += wall
        self.cpu += time.process_time() - cpu
        return wall

    def sample(self, size: int) -> float:
        if not self.steady:
            return self.timed([self.token] * size)
        first = self.timed([self.token] * size)  # after another size: no graph
        self.rewind(0)
        second = self.timed([self.token] * size)  # the same shape again: it captures
        self.rewind(0)
        third = self.timed([self.token] * size)  # a replay, as a run that keeps its shape pays
        self.changes.append(first + second - 2 * third)
        return third

    def one_pass(self, index: int) -> None:
        largest = max(self.sizes)
        for size in self.sizes if index % 2 == 0 else self.sizes[::-1]:
            self.samples[size].append(self.sample(size))
            if size == largest:  # a plain step as a run makes one: a token after a token, after a context
                self.decode([self.token])
                self.plain.append(self.timed([self.token]))
            self.rewind(0)

    def cpu_share(self, threads: int | None) -> float | None:
        return self.cpu / (self.wall * threads) if threads and self.wall > 0 else None


def judge(samples: dict[int, list[float]], plain: list[float], cpu_share: float | None = None,
          verify_curve: bool = True) -> Calibration:
    """The curve from timed samples (each size's fastest), and whether it can be trusted. One
    token's cost is the fastest of its own samples and the plain steps': both are one-token
    decodes, and the price of a plain step is what every draft is weighed against."""
    verify = {size: min(times) for size, times in samples.items()}
    one_token = verify.get(1)
    spreads = sorted((sorted(times)[1] - min(times)) / min(times) for times in samples.values() if len(times) > 1)
    spread = spreads[len(spreads) // 2] if spreads else 0.0
    plain_step = min(plain) if plain else None
    problem = None
    if cpu_share is not None and cpu_share < BUSY_CPU_SHARE:
        problem = f"its threads got {cpu_share:.0%} of the CPU time they asked for"
    if problem is None and spread > BUSY_SPREAD:
        problem = f"a batch's times varied by {spread:.0%} from pass to pass"
    if problem is None and plain_step is not None and one_token is not None:
        ratio = one_token / plain_step
        if not PLAIN_RANGE[0] <= ratio <= PLAIN_RANGE[1]:
            problem = f"one token timed at {ratio:.2f}x a plain step"
    if plain_step is not None and one_token is not None:
        verify[1] = min(one_token, plain_step)
    # The curve as stored, one token at its price: a later run judges that one too.
    problem = problem or (curve_problem(verify) if verify_curve else None)
    return Calibration(verify, plain_step, spread, problem, cpu_share=cpu_share)


@dataclass(frozen=True)
class BusyMark:
    """First runs found the machine too busy to measure: `count` in a row (no stored
    calibration between), the last at `found_at` (Unix time)."""

    found_at: float
    count: int = 1

    @property
    def until(self) -> float:
        """When later runs measure again: BUSY_BACKOFF after the last finding, doubled for
        each earlier one in the row, at most BUSY_BACKOFF_MOST."""
        return self.found_at + min(BUSY_BACKOFF * 2 ** min(self.count - 1, 16), BUSY_BACKOFF_MOST)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> BusyMark:
        count = int(data.get("count", 1))
        if count < 1:
            raise ValueError("no busy finding")
        return cls(float(data["found_at"]), count)


@dataclass
class CostStore:
    """Stored costs and exactness records, one JSON file, written atomically."""

    path: Path
    _data: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            data = {}
        self._data = data if isinstance(data, dict) else {}

    def costs(self, key: str) -> StepCosts | None:
        try:
            return StepCosts.from_json(self._data[key])
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def put_costs(self, key: str, costs: StepCosts) -> None:
        self._data[key] = costs.to_json()
        self._save()

    def busy_mark(self, key: str) -> BusyMark | None:
        try:
            return BusyMark.from_json(self._data[key])
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def put_busy_mark(self, key: str, mark: BusyMark) -> None:
        self._data[key] = mark.to_json()
        self._save()

    def get(self, key: str) -> object:
        return self._data.get(key)

    def keys(self) -> list[str]:
        return sorted(self._data)

    def put(self, key: str, value: object) -> None:
        self._data[key] = value
        self._save()

    def remove(self, key: str) -> None:
        if self._data.pop(key, None) is not None:
            self._save()

    def _save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_name(self.path.name + ".tmp")
            temporary.write_text(json.dumps(self._data, indent=1, sort_keys=True))
            temporary.replace(self.path)
        except OSError:
            pass  # a read-only cache only means the prior next time


def expected_speedup(costs: StepCosts, most: int = 16) -> tuple[float, int] | None:
    """What a draft model should gain over plain decoding, and at which draft length, from its
    costs: each drafted token accepted with its measured greedy agreement at its depth, and
    every step priced by the verify curve, the draft's tokens and the loop. None where its
    agreement is not measured (a draft through text). It leaves out the draft's catch-up decode
    and its per-token proposing, so the gain runs high (0.89x against 0.49x timed on a tiny
    synthetic pair): `specli drafts --measure` uses it only to choose the length it times."""
    if costs.draft_acceptance is None or not costs.verify:
        return None
    curve = VerifyCurve(costs.verify)
    plain = curve.cost(1) + costs.loop
    best: tuple[float, int] | None = None
    reach = [1.0]  # the chance that the draft's first i tokens are all kept
    for depth in range(most):
        reach.append(reach[-1] * min(max(costs.acceptance_at(depth) or 0.0, 0.0), 0.999))
    for k in range(1, most + 1):
        tokens = sum(reach[: k + 1])  # the kept drafts of a step, and the target's own
        seconds = k * costs.draft_per_token + curve.cost(k + 1) + costs.loop
        gain = tokens * plain / seconds
        if best is None or gain > best[0]:
            best = (gain, k)
    return best
