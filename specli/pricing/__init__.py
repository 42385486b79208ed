"""What a loaded pair's steps cost, measured on this machine and kept between runs.

`Pricing` gives `-k auto` the costs a session's generations are priced with: the stored ones,
or a quick calibration on a model's first run, or a full one on demand (`specli bench`,
`doctor --calibrate`); and after a generation it marks a stored curve stale where the run's
verify steps were far from its price. It also measures whatever drafts with a model (a draft
model, the target's NextN layers: a Drafter each, by draft kind, specli/pricing/drafters.py)
one way: its cost per token, its catch-up, its greedy agreement with the target, and (`drafts
--measure`) its speed-up.

A fixed draft length measures nothing (measure=False). Where a first run finds the machine
too busy to measure, it leaves a BusyMark under `busy_key`: until the mark's window ends,
later runs draft on the conservative curve without timing anything. The explicit
calibrations ignore the mark, and a stored calibration clears it.

Everything is stored in one CostStore, keyed by the model file, its load settings, the
llama.cpp build and its devices (specli/pricing/keys.py), so no other machine's or build's
timings steer a run. The cost maths itself (curves, timing, judging a calibration) is
specli/decode/costs.py; this module times the models the session loaded (exact_caps
alone loads the target, once per repacking setting, before the session does).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, Protocol

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
    calibrate,
    curve_problem,
    prior_costs,
)
from specli.decode.engine import Engine
from specli.decode.events import Stats
from specli.decode.exact import CPU_ROWS, BatchCap, measure_cap
from specli.decode.request import GenerationRequest
from specli.errors import CalibrationError
from specli.llama import mtp
from specli.llama.backend import LoadSettings, Model, supports_gpu_offload
from specli.pricing.drafters import CATCH_UP_BATCH, Drafter, timed_speedup
from specli.pricing.keys import StoreKey, build_key, cost_store, exact_key, settings_key

# A draft kind's drafter, made with the target's key (read anew: the build and devices are part of it).
DrafterFor = Callable[[StoreKey], Drafter]


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

    def __init__(self, spec: LoadedFiles, target: Model, drafters: Mapping[str, DrafterFor] | None = None, *,
                 notice: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self.target = target
        # By draft kind: the loaded model that drafts for it, as priced (read with the target's key).
        self.drafters = dict(drafters or {})
        self._notice = notice  # hears of a calibration the machine was too busy for, or of stale costs
        self._store: CostStore | None = None
        # The costs generations are priced with, once read: by the kind whose drafter they include (None: none).
        self._kept: dict[str | None, StepCosts] = {}

    @property
    def store(self) -> CostStore:
        if self._store is None:
            self._store = cost_store()
        return self._store

    @property
    def key(self) -> StoreKey:
        """The target's stored costs' key (read anew: the build and devices are part of it)."""
        return settings_key(self.target.path, self.spec.target_load, build_key())

    @property
    def busy_key(self) -> StoreKey:
        """Where a first run's busy finding is stored (BusyMark), beside the target's key."""
        return self.key.beside("busy")

    def drafter(self, kind: str | None) -> Drafter | None:
        """The loaded model that drafts for draft kind `kind`, as it is priced (None: none)."""
        make = self.drafters.get(kind) if kind is not None else None
        return make(self.key) if make is not None else None

    def costs(self, *, measure: bool = True, kind: str | None = None, keep: bool = False) -> StepCosts:
        """The costs -k auto prices this session's generations with, fixed once read: the
        stored ones; else a quick calibration, stored (measure=False: the prior); where the
        machine is too busy, or a recent run found it so (a BusyMark), a conservative curve,
        nothing stored. With `kind`'s drafter's (a draft model, the NextN layers), stored or
        timed now (measure=False: priced by its share). `keep`: what measure=False reads is
        fixed as this session's costs too (a server that measures nothing)."""
        kept = self._kept.get(kind)
        if (measure or keep) and kept is not None:
            return kept
        target = self._stored_costs(say=measure and self._busy_mark() is None)
        if target is None and not measure:
            costs = self._prior(kind)
        else:
            if target is None:
                target = self._first_run_costs(kind)
            costs = self._with_drafter(target, self.drafter(kind), measure)
        if measure or keep:
            self._kept[kind] = costs
        return costs

    def calibrate(self, sizes: tuple[int, ...] = CALIBRATION_SIZES, passes: int = PASSES + 1) -> StepCosts:
        """Time the target's verify batches and its drafters now, and store them (`specli
        bench`, `doctor --calibrate`). CalibrationError, nothing stored, on a busy machine."""
        outcome = self._time_target(sizes, passes)
        if outcome.problem is not None:
            raise CalibrationError(f"the machine is too busy to measure {self.target.path.name}'s verify costs "
                                   f"({outcome.problem}); nothing was stored", "measure again when it is quieter")
        self._store_target(outcome, "calibrated")
        for kind in self.drafters:
            self.calibrate_drafter(self.drafter(kind))
        self._kept.clear()
        return self.costs(kind=next(iter(self.drafters), None))

    def review(self, stats: Stats) -> bool:
        """After a generation whose verify steps took far from their price (costs_ratio outside
        STALE_RANGE over STALE_STEPS steps or more), mark the stored curve stale and say so:
        the next run measures it again (this session's choices stay as they were)."""
        ratio, costs = stats.costs_ratio, next(iter(self._kept.values()), None)
        if ratio is None or stats.priced_steps < STALE_STEPS or costs is None \
                or costs.source in ("prior", "conservative") or STALE_RANGE[0] <= ratio <= STALE_RANGE[1]:
            return False
        stored = self.store.costs(self.key)
        if stored is None or stored.stale is not None:
            return False
        self.store.put_costs(self.key, replace(stored, stale=ratio))
        self._say(f"this run's verify steps took {ratio:.2f}x what the stored costs priced them at: "
                  "they will be measured again on the next run")
        return True

    def calibrate_drafter(self, drafter: Drafter) -> float:
        """Time a drafter's one-token decode and catch-up (per token of CATCH_UP_BATCH) where
        it runs (its share says nothing when the target's decodes cross a network, --rpc),
        and store them with its agreement: its cost per drafted token. Too busy: 0.0, nothing
        stored. Its cache is left empty."""
        drafter.forget()
        timed = calibrate(drafter.decode, drafter.rewind, drafter.token, (1, CATCH_UP_BATCH), passes=4,
                          verify_curve=False)
        drafter.forget()
        if timed.problem is not None:  # too busy: priced by its share this time, measured again next
            return 0.0
        return drafter.store(self.store, timed.verify[1], timed.verify[CATCH_UP_BATCH] / CATCH_UP_BATCH)

    def measure_speedup(self, engine_for: Callable[[GenerationRequest], Engine], kind: str) -> float | None:
        """The speed-up of `kind`'s drafter (a draft model, the NextN layers), timed and stored
        (drafters.timed_speedup) after its costs are measured or read as a first run with it
        does; None: none loaded."""
        drafter = self.drafter(kind)
        return None if drafter is None else timed_speedup(drafter, self.costs(kind=kind), self.target, self.store,
                                                          engine_for)

    def _stored_costs(self, *, say: bool) -> StepCosts | None:
        """The target's stored costs, unless they are implausible or marked stale (`say`: a
        line says they will be measured again)."""
        stored = self.store.costs(self.key)
        if stored is None or stored.source in ("prior", "conservative"):
            return None
        problem = curve_problem(stored.verify)
        if problem is None and stored.stale is None:
            return stored
        if say:
            why = problem or f"a run's verify steps took {stored.stale:.2f}x their price"
            self._say(f"the stored verify costs of {self.target.path.name} no longer hold ({why}): "
                      "measuring them again")
        return None

    def _first_run_costs(self, kind: str | None) -> StepCosts:
        """A quick calibration, stored; or the conservative curve: at once where a recent run
        found the machine too busy (its mark's window), else where this calibration finds it
        so, marking it (one more busy finding in a row)."""
        name, mark = self.target.path.name, self._busy_mark()
        if mark is not None:
            self._say(f"the machine was too busy to measure {name}'s verify costs {_ago(time.time() - mark.found_at)}: "
                      f"drafting cautiously without measuring until {_clock(mark.until)} "
                      "(`specli doctor --calibrate` measures now)")
            return self._prior(kind, conservative=True)
        outcome = self._time_target(FIRST_RUN_SIZES, PASSES)
        if outcome.problem is not None:
            earlier = self.store.busy_mark(self.busy_key)  # one whose window has ended: the row goes on
            mark = BusyMark(time.time(), 1 if earlier is None else earlier.count + 1)
            self.store.put_busy_mark(self.busy_key, mark)
            self._say(f"the machine is too busy to measure {name}'s verify costs ({outcome.problem}): "
                      f"drafting cautiously without measuring until {_clock(mark.until)}")
            return self._prior(kind, conservative=True)
        return self._store_target(outcome, "first run")

    def _busy_mark(self) -> BusyMark | None:
        """The target's busy mark while its window lasts (None: none, or it has ended)."""
        mark = self.store.busy_mark(self.busy_key)
        return mark if mark is not None and time.time() < mark.until else None

    def _say(self, line: str) -> None:
        if self._notice is not None:
            self._notice(line)

    def _with_drafter(self, target: StepCosts, drafter: Drafter | None, measure: bool) -> StepCosts:
        """The target's costs with the drafter's: stored, timed now where they are not
        (`measure`), else priced by its share. Prior and conservative costs are in relative
        units: a drafter is priced by its share there already."""
        if drafter is None or target.source in ("prior", "conservative"):
            return target
        if measure and drafter.measurements(self.store) is None:
            self.calibrate_drafter(drafter)  # the target's costs are stored, this drafter's not yet
        return drafter.priced(target, self.store)

    def _prior(self, kind: str | None, *, conservative: bool = False) -> StepCosts:
        gpu = supports_gpu_offload() and self.spec.target_load.gpu_layers != 0
        drafter = self.drafter(kind)
        return prior_costs(gpu, drafter.share() if drafter is not None else 0.0, conservative=conservative)

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


def _ago(seconds: float) -> str:
    """How long ago, in the unit a person reads it in."""
    return f"{max(0, round(seconds))} s ago" if seconds < 60 else f"{round(seconds / 60)} min ago"


def _clock(moment: float) -> str:
    """A Unix time as the local time of day."""
    return time.strftime("%H:%M", time.localtime(moment))


def exact_caps(spec: LoadedFiles, notice: Callable[[str], None] | None = None, *, measure: bool = True,
               again: bool = False, repacks: tuple[bool, ...] = (True, False)) -> dict[bool, BatchCap]:
    """The exact verify batch sizes along the context (BatchCap) with repacking on (True) and
    off (False) (or only those in `repacks`), measured once per model, settings and build and
    stored with the costs. measure=False: only what is stored; again=True: measured anew.
    Measured on the target as a session loads it: with its NextN layers and their hidden states
    where it has usable ones (mtp.load_model: the trunk's last layer then runs on every row,
    which may round otherwise), stored under a key of its own."""
    store = cost_store()
    caps: dict[bool, BatchCap] = {}
    nextn = mtp.supports_mtp() and spec.target.is_file() and mtp.nextn_layers(spec.target) > 0
    for repack in repacks:
        load = replace(spec.target_load, repack=repack)
        key = exact_key(spec.target, load, build_key())
        key = key.beside("nextn") if nextn else key
        stored = BatchCap.from_json(store.get(key))
        if stored is not None and not again:
            caps[repack] = stored
            continue
        if not measure:
            continue
        if notice is not None:
            notice(f"finding which verify batches are exact with repacking {'on' if repack else 'off'}, "
                   "at several depths of the context (once per model and settings)")
        with mtp.load_model(spec.target, load, verbose=spec.verbose) as model:
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
