"""What a loaded pair's steps cost, measured on this machine and kept between runs.

`Pricing` gives `-k auto` the costs a session's generations are priced with: the stored ones,
or a quick calibration on a model's first run, or a full one on demand (`specli bench`,
`doctor --calibrate`); and after a generation it marks a stored curve stale where the run's
verify steps were far from its price. It also measures a draft model, and the target's NextN
layers as one: its cost per token, its catch-up, its greedy agreement with the target, and
(`drafts --measure`) its speed-up.

A fixed draft length measures nothing (measure=False). Where a first run finds the machine
too busy to measure, it leaves a BusyMark under `busy_key`: until the mark's window ends,
later runs draft on the conservative curve without timing anything. The explicit
calibrations ignore the mark, and a stored calibration clears it.

Everything is stored in one CostStore, keyed by the model file, its load settings, the
llama.cpp build and its devices (`settings_key`), so no other machine's or build's timings
steer a run. The cost maths itself (curves, timing, judging a calibration) is
specli/decode/costs.py; this module times the models the session loaded (exact_caps
alone loads the target, once per repacking setting, before the session does).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from specli.config import cache_dir
from specli.decode.adaptive import MAX_DRAFT
from specli.decode.costs import (
    CALIBRATION_SIZES,
    FIRST_RUN_SIZES,
    PASSES,
    PRIOR_LOOP,
    STALE_RANGE,
    STALE_STEPS,
    BusyMark,
    Calibration,
    CostSource,
    CostStore,
    StepCosts,
    VerifyCurve,
    calibrate,
    curve_problem,
    expected_speedup,
    prior_costs,
)
from specli.decode.draft_model import DraftModel
from specli.decode.engine import Engine
from specli.decode.events import Stats
from specli.decode.exact import CPU_ROWS, BatchCap, measure_cap
from specli.decode.mtp import NextnDraft
from specli.decode.request import DraftKind, GenerationRequest
from specli.decode.translate import cost_per_target_token
from specli.errors import CalibrationError
from specli.llama import mtp
from specli.llama.backend import LoadSettings, Model, library_versions, supports_gpu_offload
from specli.llama.devices import compute_fingerprint

CATCH_UP_BATCH = 16  # a draft model's catch-up is priced per token of a batch this long
MTP_SUFFIX = "|mtp"  # the NextN layers' measurements: their target's key, then this
BUSY_SUFFIX = "|busy"  # a first run found the machine too busy to measure (BusyMark): the target's key, then this
MTP_SHARE_FLOOR = 0.02  # a NextN layer's decode is never priced below this share of a plain one
MEASURE_TOKENS = 96  # a timed generation of `specli drafts --measure`
MEASURE_ROUNDS = 3

# A sample for a draft model's agreement with its target: prose, a list, code, numbers.
AGREEMENT_SAMPLE = (
    "The museum opens at nine and closes at five, except on Mondays, when it stays closed all day. "
    "Visitors can buy tickets at the door or online; children under twelve go in for free.\n\n"
    "Shopping list:\n- two loaves of bread\n- a dozen eggs\n- milk\n- three apples\n\n"
    "def average(values):\n    \"\"\"Return the mean of a list of numbers.\"\"\"\n"
    "    return sum(values) / len(values)\n\n"
    "In 2024 the town had 12,400 residents, up from 11,900 in 2020."
)


class LoadedFiles(Protocol):
    """What pricing reads of a session's spec: the model files, and how they were loaded."""

    @property
    def target(self) -> Path: ...
    @property
    def draft_model(self) -> Path | None: ...
    @property
    def target_load(self) -> LoadSettings: ...
    @property
    def draft_load(self) -> LoadSettings: ...
    @property
    def verbose(self) -> bool: ...


class Pricing:
    """The costs of a loaded target, and of its draft model or its NextN layers where they
    draft. The costs a session's generations are priced with are fixed once read (`costs`);
    what a run's steps take never prices them, so a model's first run drafts as every later
    one does."""

    def __init__(self, spec: LoadedFiles, target: Model, draft: DraftModel | None = None, *,
                 translated: bool = False, notice: Callable[[str], None] | None = None,
                 nextn: NextnDraft | None = None) -> None:
        self.spec = spec
        self.target = target
        self.draft = draft
        self.nextn = nextn  # the target's NextN layers, where MTP drafting was asked for
        self.translated = translated  # the draft drafts through text: its agreement is not measured
        self._notice = notice  # hears of a calibration the machine was too busy for, or of stale costs
        self._store: CostStore | None = None
        # The costs generations are priced with, once read: with the draft model's, and with the NextN layers'.
        self._costs: StepCosts | None = None
        self._mtp_costs: StepCosts | None = None

    @property
    def store(self) -> CostStore:
        if self._store is None:
            self._store = cost_store()
        return self._store

    @property
    def key(self) -> str:
        """The target's stored costs' key (read anew: the build and devices are part of it)."""
        return settings_key(self.target.path, self.spec.target_load, build_key())

    @property
    def draft_key(self) -> str:
        """Where the draft model's measurements are stored, beside its target's key."""
        assert self.spec.draft_model is not None
        return draft_key(self.key, self.spec.draft_model, self.spec.draft_load)

    @property
    def mtp_key(self) -> str:
        """Where the NextN layers' measurements are stored, beside their target's key."""
        return self.key + MTP_SUFFIX

    @property
    def busy_key(self) -> str:
        """Where a first run's busy finding is stored (BusyMark), beside the target's key."""
        return self.key + BUSY_SUFFIX

    def costs(self, *, measure: bool = True, mtp: bool = False, keep: bool = False) -> StepCosts:
        """The costs -k auto prices this session's generations with, fixed once read: the
        stored ones; where none can be used (none stored, or the stored curve is implausible
        or stale), a quick calibration made now and stored (measure=False: the prior instead);
        where the machine is too busy to measure, or a recent run found it so (a BusyMark
        within its window: nothing is timed), a conservative curve for this session only,
        and nothing stored. With a draft model (`mtp`: the target's NextN layers), its stored
        cost per token; where none is stored, its decode timed now and stored (measure=False:
        priced by the share of the weights a drafted token reads). `keep`: what measure=False
        reads is fixed as this session's costs too (a server that measures nothing)."""
        kept = self._mtp_costs if mtp else self._costs
        if (measure or keep) and kept is not None:
            return kept
        target = self._stored_costs(say=measure and self._busy_mark() is None)
        if target is None and not measure:
            costs = self._prior(mtp=mtp)
        else:
            if target is None:
                target = self._first_run_costs(mtp)
            costs = self._with_mtp(target, measure) if mtp else self._with_draft(target, measure)
        if (measure or keep) and mtp:
            self._mtp_costs = costs
        elif measure or keep:
            self._costs = costs
        return costs

    def calibrate(self, sizes: tuple[int, ...] = CALIBRATION_SIZES, passes: int = PASSES + 1) -> StepCosts:
        """Time the target's verify batches, and a draft model's one-token decode, now and store
        them (`specli bench`, `doctor --calibrate`; a first run's quick one: see costs). Raises
        CalibrationError, storing nothing, where the machine is too busy to measure."""
        outcome = self._time_target(sizes, passes)
        if outcome.problem is not None:
            raise CalibrationError(f"the machine is too busy to measure {self.target.path.name}'s verify costs "
                                   f"({outcome.problem}); nothing was stored", "measure again when it is quieter")
        self._store_target(outcome, "calibrated")
        if self.draft is not None:
            self.calibrate_draft()
        if self.nextn is not None:
            self.calibrate_mtp()
        self._costs = self._mtp_costs = None
        return self.costs()

    def review(self, stats: Stats) -> bool:
        """After a generation: where its verify steps took consistently more or less than the
        stored curve priced them at (Stats.costs_ratio outside STALE_RANGE over at least
        STALE_STEPS steps), mark the stored curve stale, so the next run measures it again, and
        say so. This generation's choices are made already, and so are this session's: only
        the next run's costs change."""
        ratio, costs = stats.costs_ratio, self._costs if self._costs is not None else self._mtp_costs
        if ratio is None or stats.priced_steps < STALE_STEPS or costs is None or costs.source in ("prior", "conservative"):
            return False
        if STALE_RANGE[0] <= ratio <= STALE_RANGE[1]:
            return False
        stored = self.store.costs(self.key)
        if stored is None or stored.stale is not None:
            return False
        self.store.put_costs(self.key, replace(stored, stale=ratio))
        if self._notice is not None:
            self._notice(f"this run's verify steps took {ratio:.2f}x what the stored costs priced them at: "
                         "they will be measured again on the next run")
        return True

    def calibrate_draft(self) -> float:
        """Time the draft model's one-token decode and store it as its cost per drafted token
        (where the machine is too busy, nothing: 0.0).
        Its own time, where it runs: its file size against the target's says nothing when the
        target's decodes cross a network (--rpc). Through text, a drafted token is priced per
        target token, with the round trip through both tokenizers; its catch-up stays per draft
        token, as Proposer.behind counts the draft's own tokens."""
        assert self.draft is not None
        self.draft.forget()
        draft = self.draft.model
        token = draft.bos if draft.bos >= 0 else 0  # its own vocabulary's, where it differs
        timed = calibrate(lambda tokens: draft.decode(tokens), draft.rewind, token, (1, CATCH_UP_BATCH), passes=4)
        if timed.problem is not None:  # too busy: priced by its file size this time, measured again next
            return 0.0
        seconds, catch_up = timed.verify[1], timed.verify[CATCH_UP_BATCH] / CATCH_UP_BATCH
        if self.translated:
            seconds = cost_per_target_token(self.target, draft, seconds)
        else:  # the same tokens mean the same to both: how often their greedy choices agree
            self.store.put(self.draft_key + "|acceptance", greedy_agreement(self.target, draft))
        self.store.put(self.draft_key + "|catch_up", catch_up)
        self.store.put(self.draft_key, seconds)
        return seconds

    def calibrate_mtp(self) -> float:
        """Time the first NextN layer's one-entry decode and a catch-up's, and measure its
        greedy agreement with the trunk (`mtp_agreement`), as `calibrate_draft` does a draft
        model's; store them (where the machine is too busy, nothing: 0.0). Both caches are
        left empty."""
        assert self.nextn is not None
        heads, filled = self.nextn.heads, [0]
        zeros = np.zeros((CATCH_UP_BATCH, heads.n_embd), dtype=np.float32)

        def decode(tokens: list[int]) -> None:
            heads.decode(0, tokens, filled[0], zeros[: len(tokens)])
            filled[0] += len(tokens)

        def rewind(n_keep: int) -> None:
            heads.rewind(0, n_keep)
            filled[0] = min(filled[0], n_keep)

        self.nextn.forget()
        token = self.target.bos if self.target.bos >= 0 else 0
        timed = calibrate(decode, rewind, token, (1, CATCH_UP_BATCH), passes=4)
        self.nextn.forget()
        if timed.problem is not None:
            return 0.0
        seconds, catch_up = timed.verify[1], timed.verify[CATCH_UP_BATCH] / CATCH_UP_BATCH
        self.store.put(self.mtp_key + "|acceptance", mtp_agreement(self.target, self.nextn))
        self.store.put(self.mtp_key + "|catch_up", catch_up)
        self.store.put(self.mtp_key, seconds)
        return seconds

    def measure_speedup(self, engine_for: Callable[[GenerationRequest], Engine], *, mtp: bool = False) -> float | None:
        """Measure (or read) the costs and the draft's agreement as a first run with this draft
        (`mtp`: the target's NextN layers) does, then time greedy generations of MEASURE_TOKENS
        from a sample text, drafted by it alone at the length its costs favour and plain, in
        MEASURE_ROUNDS alternating rounds (`engine_for`: the session's): the ratio of the
        median rates is stored as its measured speed-up (None where the costs favour no
        length: a draft through text)."""
        best = expected_speedup(self.costs(mtp=mtp))
        if best is None or (self.nextn if mtp else self.draft) is None:
            return None
        prompt = self.target.tokenize(AGREEMENT_SAMPLE)[:64]
        requests = (GenerationRequest(max_tokens=MEASURE_TOKENS, draft=DraftKind.MTP if mtp else DraftKind.MODEL,
                                      lookup=False, draft_tokens=best[1]),
                    GenerationRequest(max_tokens=MEASURE_TOKENS, draft=DraftKind.NONE))
        rates: tuple[list[float], list[float]] = ([], [])
        for _ in range(MEASURE_ROUNDS):
            for request, kept in zip(requests, rates):
                engine = engine_for(request)
                for _event in engine.generate(prompt):
                    pass
                kept.append(engine.stats.tokens_per_second)
        ratio = float(np.median(rates[0]) / max(np.median(rates[1]), 1e-9))
        self.store.put((self.mtp_key if mtp else self.draft_key) + "|speedup", ratio)
        return ratio

    def _stored_costs(self, *, say: bool) -> StepCosts | None:
        """The target's stored costs, unless they are implausible or marked stale (`say`: a
        line says they will be measured again)."""
        stored = self.store.costs(self.key)
        if stored is None or stored.source in ("prior", "conservative"):
            return None
        problem = curve_problem(stored.verify)
        if problem is None and stored.stale is None:
            return stored
        if say and self._notice is not None:
            why = problem or f"a run's verify steps took {stored.stale:.2f}x their price"
            self._notice(f"the stored verify costs of {self.target.path.name} no longer hold ({why}): measuring them again")
        return None

    def _first_run_costs(self, mtp: bool = False) -> StepCosts:
        """A quick calibration, stored; or the conservative curve: at once where a recent run
        found the machine too busy (its mark's window), else where this calibration finds it
        so, marking it (one more busy finding in a row)."""
        name, mark = self.target.path.name, self._busy_mark()
        if mark is not None:
            self._say(f"the machine was too busy to measure {name}'s verify costs {_ago(time.time() - mark.found_at)}: "
                      f"drafting cautiously without measuring until {_clock(mark.until)} "
                      "(`specli doctor --calibrate` measures now)")
            return self._prior(conservative=True, mtp=mtp)
        outcome = self._time_target(FIRST_RUN_SIZES, PASSES)
        if outcome.problem is not None:
            earlier = self.store.busy_mark(self.busy_key)  # one whose window has ended: the row goes on
            mark = BusyMark(time.time(), 1 if earlier is None else earlier.count + 1)
            self.store.put_busy_mark(self.busy_key, mark)
            self._say(f"the machine is too busy to measure {name}'s verify costs ({outcome.problem}): "
                      f"drafting cautiously without measuring until {_clock(mark.until)}")
            return self._prior(conservative=True, mtp=mtp)
        return self._store_target(outcome, "first run")

    def _busy_mark(self) -> BusyMark | None:
        """The target's busy mark while its window lasts (None: none, or it has ended)."""
        mark = self.store.busy_mark(self.busy_key)
        return mark if mark is not None and time.time() < mark.until else None

    def _say(self, line: str) -> None:
        if self._notice is not None:
            self._notice(line)

    def _with_mtp(self, target: StepCosts, measure: bool) -> StepCosts:
        """The target's costs with its NextN layers' (measured, or priced by the share of the
        weights a drafted token reads)."""
        if self.nextn is None or target.source in ("prior", "conservative"):  # relative units: priced so already
            return target
        measured = self._mtp_measurements()
        if measured is None and measure:
            self.calibrate_mtp()
            measured = self._mtp_measurements()
        if measured is not None:
            seconds, catch_up, acceptance = measured
            return replace(target, draft_per_token=seconds, draft_catch_up=catch_up, draft_acceptance=acceptance)
        seconds = mtp_share(self.target.path) * VerifyCurve(target.verify).cost(1)
        return replace(target, draft_per_token=seconds, draft_catch_up=seconds)

    def _mtp_measurements(self) -> tuple[float, float, float] | None:
        """The NextN layers' stored cost per token, catch-up cost per token and agreement, or
        None if they are not all stored."""
        values = [self.store.get(self.mtp_key + suffix) for suffix in ("", "|catch_up", "|acceptance")]
        if not all(isinstance(value, (int, float)) for value in values):
            return None
        seconds, catch_up, acceptance = (float(value) for value in values)  # type: ignore[arg-type]
        return seconds, catch_up, acceptance

    def _with_draft(self, target: StepCosts, measure: bool) -> StepCosts:
        """The target's costs with the draft model's (measured, or priced by its file size)."""
        if self.draft is None:
            return target
        if target.source in ("prior", "conservative"):  # relative units: the draft by its size too
            return target
        measured = self._draft_measurements()
        if measured is None and measure:
            self.calibrate_draft()  # the target's costs are stored, this draft's not yet
            measured = self._draft_measurements()
        if measured is not None:
            seconds, catch_up, acceptance = measured
            return replace(target, draft_per_token=seconds, draft_catch_up=catch_up, draft_acceptance=acceptance)
        # Not measured: priced by its file size, catching up a token at a decode's cost.
        seconds = self._draft_size_ratio() * VerifyCurve(target.verify).cost(1)
        return replace(target, draft_per_token=seconds, draft_catch_up=seconds)

    def _draft_measurements(self) -> tuple[float, float, float | None] | None:
        """The draft model's stored cost per token, catch-up cost per token and agreement
        (None through text), or None if they are not all stored."""
        store, key = self.store, self.draft_key
        seconds, catch_up, acceptance = store.get(key), store.get(key + "|catch_up"), store.get(key + "|acceptance")
        if not all(isinstance(value, (int, float)) for value in (seconds, catch_up)):
            return None
        if not isinstance(acceptance, (int, float)):
            if not self.translated:
                return None
            acceptance = None
        return float(seconds), float(catch_up), None if acceptance is None else float(acceptance)

    def _prior(self, *, conservative: bool = False, mtp: bool = False) -> StepCosts:
        gpu = supports_gpu_offload() and self.spec.target_load.gpu_layers != 0
        share = mtp_share(self.target.path) if mtp and self.nextn is not None else self._draft_size_ratio()
        return prior_costs(gpu, share, conservative=conservative)

    def _time_target(self, sizes: tuple[int, ...], passes: int) -> Calibration:
        target = self.target
        sizes = tuple(size for size in sizes if size < min(target.n_ctx, target.batch_size))
        target.rewind(0)
        token = target.bos if target.bos >= 0 else 0
        load = self.spec.target_load
        on_cpu = not load.rpc and (load.gpu_layers == 0 or not supports_gpu_offload())
        threads = min(load.threads or os.cpu_count() or 1, usable_cpus()) if on_cpu else None
        return calibrate(lambda tokens: target.decode(tokens, all_logits=True), target.rewind, token, sizes, passes,
                         threads, steady=target.on_gpu)

    def _store_target(self, outcome: Calibration, source: CostSource) -> StepCosts:
        stored = self.store.costs(self.key)
        verify = outcome.verify
        loop = stored.loop if stored is not None and stored.source != "prior" else PRIOR_LOOP * verify[1]
        costs = StepCosts(verify, 0.0, loop, source, measured_at=time.time(), shape_change=outcome.shape_change)
        self.store.put_costs(self.key, costs)
        self.store.remove(self.busy_key)  # measured: the machine is not too busy now
        return costs

    def _draft_size_ratio(self) -> float:
        draft = self.spec.draft_model
        if draft is None or self.draft is None:
            return 0.0
        return draft.stat().st_size / max(1, self.target.path.stat().st_size)


def _ago(seconds: float) -> str:
    """How long ago, in the unit a person reads it in."""
    return f"{max(0, round(seconds))} s ago" if seconds < 60 else f"{round(seconds / 60)} min ago"


def _clock(moment: float) -> str:
    """A Unix time as the local time of day."""
    return time.strftime("%H:%M", time.localtime(moment))


def greedy_agreement(target: Model, draft: Model, sample: str = AGREEMENT_SAMPLE) -> float:
    """The share of the sample's positions where the draft's greedy next token is the target's,
    each reading the sample itself (teacher-forced): one batched decode of each model, both
    caches left empty. A draft's acceptance on a model's own output is usually higher: this is
    a first guess that the run's record corrects."""
    tokens = target.tokenize(sample)[: min(target.n_ctx, draft.n_ctx, target.batch_size, draft.batch_size)]
    choices = []
    for model in (target, draft):
        model.rewind(0)
        choices.append(np.argmax(model.decode(tokens, all_logits=True), axis=1))
        model.rewind(0)
    return float(np.mean(choices[0] == choices[1]))


def mtp_agreement(target: Model, nextn: NextnDraft, sample: str = AGREEMENT_SAMPLE) -> float:
    """The share of the sample's positions where the first NextN layer's greedy choice is the
    trunk's, each reading the sample itself (teacher-forced): entry q (token q, the trunk's
    hidden state at q - 1) against the trunk's row q, both predicting token q + 1. The
    first drafted token's agreement: later ones, drafted from the layer's own states, agree
    less, which the run's record learns. Both caches are left empty."""
    heads = nextn.heads
    tokens = target.tokenize(sample)[: min(target.n_ctx, target.batch_size, heads.n_ctx)]
    nextn.forget()
    target.rewind(0)
    trunk = np.argmax(target.decode(tokens, all_logits=True), axis=1)
    hidden = heads.target_hidden(-1, len(tokens))  # row q: the state entry q reads
    choices = [int(np.argmax(heads.decode(0, [token], q, hidden[q : q + 1])[0])) for q, token in enumerate(tokens[:-1])]
    target.rewind(0)
    nextn.forget()
    return float(np.mean(np.asarray(choices) == trunk[: len(choices)]))


def mtp_share(path: Path) -> float:
    """A NextN layer's decode against a plain one, before it is timed: the share of the weights
    it reads (at least MTP_SHARE_FLOOR: its own launches and the logits it hands back)."""
    return max(mtp.nextn_share(path), MTP_SHARE_FLOOR)


def stored_speedup(target: Path, draft: Path | None, load: LoadSettings) -> float | None:
    """The draft's speed-up that `specli drafts --measure` timed and stored (None: not
    measured); `draft` None: the target's NextN layers' (MTP drafting)."""
    try:
        key = settings_key(target, load, build_key())
        key = (key + MTP_SUFFIX if draft is None else draft_key(key, draft, load)) + "|speedup"
    except OSError:
        return None
    value = cost_store().get(key)
    return float(value) if isinstance(value, (int, float)) else None


def exact_caps(spec: LoadedFiles, notice: Callable[[str], None] | None = None, *, measure: bool = True,
               again: bool = False, repacks: tuple[bool, ...] = (True, False)) -> dict[bool, BatchCap]:
    """The exact verify batch sizes along the context (BatchCap) with repacking on (True) and
    off (False) (or only those in `repacks`), measured once per model, settings and build and
    stored with the costs. measure=False: only what is stored; again=True: measured anew."""
    store = cost_store()
    caps: dict[bool, BatchCap] = {}
    for repack in repacks:
        load = replace(spec.target_load, repack=repack)
        key = exact_key(spec.target, load, build_key())
        stored = BatchCap.from_json(store.get(key))
        if stored is not None and not again:
            caps[repack] = stored
            continue
        if not measure:
            continue
        if notice is not None:
            notice(f"finding which verify batches are exact with repacking {'on' if repack else 'off'}, "
                   "at several depths of the context (once per model and settings)")
        with Model(spec.target, load, verbose=spec.verbose) as model:
            largest = MAX_DRAFT + 1 if model.on_gpu else CPU_ROWS
            caps[repack] = measure_cap(model, min(largest, model.batch_size))
        store.put(key, caps[repack].to_json())
    return caps


def usable_cpus() -> int:
    """The CPUs this process may run on at once: its affinity, and a cgroup's CPU quota (a
    container's `--cpus`) where one is set."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cpus


# --- where costs are stored ---------------------------------------------------------

COSTS_VERSION = 4  # part of every key: a change in how costs are measured measures again
# Part of exact_key: a change in how exact batch sizes are measured or stored measures them
# again (2: a BatchCap of spans of the context, rows with and without logits).
EXACT_VERSION = 2


def cost_store() -> CostStore:
    """The one file that holds stored costs, exact batch sizes and draft measurements."""
    return CostStore(cache_dir() / "costs.json")


def build_key() -> str:
    """The llama.cpp build and the devices it sees, as stored costs are keyed by them."""
    return f"{library_versions()['llama_cpp_python']}|{compute_fingerprint()}"


def settings_key(path: Path, load: LoadSettings, build: str) -> str:
    """Stored costs and exactness hold for this model file, its settings, this llama.cpp build
    and devices (`build`: build_key()), and the RPC servers it runs on."""
    info = path.stat()
    parts = (path.resolve(), info.st_size, info.st_mtime_ns, load.gpu_layers, load.threads, load.repack,
             load.ctx_size, build, f"v{COSTS_VERSION}")
    return "|".join(str(part) for part in parts) + _servers_key(load)


@dataclass(frozen=True)
class CostsKey:
    """What a stored curve's key says: the model file and the settings and build it holds for."""

    path: Path
    load: LoadSettings
    build: str
    version: int


def parse_settings_key(key: str) -> CostsKey | None:
    """settings_key's parts again (None: not a key of stored costs, or of a format it cannot read)."""
    head, _, servers = key.partition("|rpc:")
    parts = head.split("|")
    try:
        path, _, _, layers, threads, repack, ctx_size = parts[:7]
        build, version = "|".join(parts[7:-1]), int(parts[-1].removeprefix("v"))
        load = LoadSettings(int(layers), ctx_size=int(ctx_size), threads=None if threads == "None" else int(threads),
                            repack=repack == "True", rpc=tuple(servers.split(",")) if servers else ())
    except (ValueError, IndexError):
        return None
    return CostsKey(Path(path), load, build, version)


def _servers_key(load: LoadSettings) -> str:
    """The RPC servers a model spreads over (nothing without --rpc, so the keys stored
    before --rpc existed still hold)."""
    return f"|rpc:{','.join(load.rpc)}" if load.rpc else ""


def exact_key(path: Path, load: LoadSettings, build: str) -> str:
    """Where the exact verify batch sizes of a model and its settings are stored."""
    return settings_key(path, load, build) + f"|exact|v{EXACT_VERSION}"


def draft_key(target_key: str, draft: Path, load: LoadSettings) -> str:
    """Where a draft model's cost per token is stored: with its target's key, as it runs beside it."""
    info = draft.stat()
    return f"{target_key}|draft:{draft.resolve()}|{info.st_size}|{info.st_mtime_ns}|{load.gpu_layers}{_servers_key(load)}"
