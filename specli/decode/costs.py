"""What a step costs: the target's verify time by batch size, the draft's time per token and
the loop's time per step.

`-k auto` chooses draft lengths from these and never from times measured during a run, so
the same command drafts, and writes, the same way every time, the first run included. They
come from a calibration (`specli doctor --calibrate`, `specli bench`), or, where none is
stored, from a quick one that a model's first run makes before it drafts (FIRST_RUN_SIZES),
stored once and changed only by a full calibration. ("learned" costs, which earlier versions
stored from a model's first run, are still read.)
"""

from __future__ import annotations

import bisect
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Literal

CostSource = Literal["prior", "learned", "first run", "calibrated"]

# Batch sizes a calibration times. Odd and even both: on CPUs llama.cpp's matrix kernels take
# the rows of a batch in pairs, so an odd batch can cost more than the even one above it.
CALIBRATION_SIZES = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 24, 32, 33, 48, 49)
# The quick calibration a model's first run makes, once, when nothing is stored: a few tenths
# of a second on the embedded model; longer batches follow the line through the largest two.
FIRST_RUN_SIZES = (1, 2, 3, 4, 5, 8, 9, 16, 17)
# The prior's verify curve relative to one token: 1 + scale·(b - 1)^power. On a CPU every row
# runs the whole output head, so each row adds much; on a GPU a batch of a few rows costs
# little more than one (benchmarks/README.md, "Costs behind the code").
PRIOR_CURVE = {"cpu": (0.7, 0.75), "gpu": (0.02, 1.0)}
PRIOR_LOOP = 0.02  # the loop's time per step, relative to a one-token decode


@dataclass(frozen=True)
class StepCosts:
    """Seconds (relative units for a prior) for each part of a step."""

    verify: dict[int, float]  # the target's all-logits decode, by batch size
    draft_per_token: float = 0.0  # proposing one draft token
    loop: float = 0.0  # the rest of a step: emitting text, reading logits rows
    source: CostSource = "prior"
    # A draft model's greedy agreement with the target on a sample text (Session's
    # calibration), the policy's first guess at its acceptance; None: not measured.
    draft_acceptance: float | None = None
    # Bringing a draft model's cache up to date, per token (one batched decode of what was
    # committed while it did not draft).
    draft_catch_up: float = 0.0

    def to_json(self) -> dict:
        data = asdict(self)
        data["verify"] = {str(size): seconds for size, seconds in sorted(self.verify.items())}
        return data

    @classmethod
    def from_json(cls, data: dict) -> StepCosts:
        verify = {int(size): float(seconds) for size, seconds in data["verify"].items()}
        if not verify or any(seconds <= 0 for seconds in verify.values()):
            raise ValueError("no verify costs")
        acceptance = data.get("draft_acceptance")
        return cls(verify, float(data.get("draft_per_token", 0.0)), float(data.get("loop", 0.0)),
                   data.get("source", "calibrated"), None if acceptance is None else float(acceptance),
                   float(data.get("draft_catch_up", 0.0)))


def prior_costs(gpu: bool, draft_size_ratio: float = 0.0) -> StepCosts:
    """Costs before anything is measured, in units of a one-token decode. A draft model is
    priced by its file size against the target's: a decode reads every weight once (its
    catch-up too, a token at a decode's cost, as Session prices an unmeasured draft)."""
    scale, power = PRIOR_CURVE["gpu" if gpu else "cpu"]
    verify = {size: 1.0 + scale * (size - 1) ** power for size in CALIBRATION_SIZES}
    return StepCosts(verify, draft_size_ratio, PRIOR_LOOP, "prior", draft_catch_up=draft_size_ratio)


class VerifyCurve:
    """Seconds for the target to decode a batch of b tokens, from costs known at some sizes.

    Sizes in between are interpolated between neighbours of the same parity; beyond the
    largest known size the line through the two largest of its parity extends; below the
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
            # The line through the two largest sizes of the same parity (the cost of one more
            # row in a long batch), else through the two largest of any.
            for candidates in (same_parity, sizes):
                if len(candidates) >= 2:
                    below, top = candidates[-2], candidates[-1]
                    slope = (known[top] - known[below]) / (top - below)
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


def calibrate(decode: Callable[[list[int]], object], rewind: Callable[[int], None], token: int,
              sizes: tuple[int, ...] = CALIBRATION_SIZES, repeats: int = 2) -> dict[int, float]:
    """Time an all-logits decode of each batch size on an empty cache, keeping the fastest
    of `repeats` runs: the machine's cost, not its noise (nor a first run's graph building).

    One untimed decode of the largest size comes first: llama.cpp grows its compute buffers
    the first time a process decodes a batch that large, and the model's weights are read in
    then, so no size is timed with that one-off cost (it would price every longer draft too
    high). The repeats go over all sizes in turn, so a burst of noise hits one sample of a few
    sizes rather than every sample of one. A size that still costs more than a longer one
    of the same parity was caught by noise: it is measured again (twice at most).
    """
    costs: dict[int, float] = {}
    decode([token] * max(sizes))
    rewind(0)

    def measure(size: int) -> None:
        started = time.perf_counter()
        decode([token] * size)
        costs[size] = min(costs.get(size, float("inf")), time.perf_counter() - started)
        rewind(0)

    for _ in range(repeats):
        for size in sizes:
            measure(size)
    for _ in range(2):
        suspects = [size for size in sizes
                    if any(other > size and other % 2 == size % 2 and costs[other] < costs[size] for other in sizes)]
        for size in suspects:
            measure(size)
    return costs


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

    def get(self, key: str) -> object:
        return self._data.get(key)

    def put(self, key: str, value: object) -> None:
        self._data[key] = value
        self._save()

    def _save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_name(self.path.name + ".tmp")
            temporary.write_text(json.dumps(self._data, indent=1, sort_keys=True))
            temporary.replace(self.path)
        except OSError:
            pass  # a read-only cache only means the prior next time
