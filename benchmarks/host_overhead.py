"""The host's own cost of a generation, measured without a GPU: specli's real session, engine,
proposers, draft-length policy and output stream run over simulated models
(benchmarks/device_sim.py) whose decodes cost simulated device time and no real one.

    PYTHONPATH=. python benchmarks/host_overhead.py                  # a table
    PYTHONPATH=. python benchmarks/host_overhead.py --json           # the same as JSON
    PYTHONPATH=. python benchmarks/host_overhead.py --proposers draft -k 8 --profile

Each configuration (plain, then -k 1, 4, 8, 16 and auto for n-gram lookup and for a draft model)
generates `--tokens` greedy tokens after a `--prompt-tokens` prompt, in `--runs` rounds that
alternate the configurations; figures are the medians over rounds. Host time is the wall time
from the first token's event to the end of the generation, less the wall time spent inside the
simulated models' device calls (their ledgers say how much): what is left is specli's own work
(proposing, the backend's Python around each decode, reading rows, the policy, the stats, the
text stream and a real TextRenderer writing to /dev/null), done on this machine's CPU. It is
given per step, per drafted token and per token written, and split by phase: proposing (the
step's draft time less the draft model's device calls), the verify call (less the target's),
reading rows, and the rest. "draft µs/drafted" is proposing's host time per drafted token.

Simulated tok/s counts this host time plus the simulated device time (decodes by the measured
curve, copies of rows to the host, decodes without a CUDA graph after a change of shape and
the captures that follow): what the host's
cost would do to a run on that device, were the device's host as fast as this one. -k auto
prices its choices with the simulated device's steady costs, as a steady calibration would.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: benchmarks/ is a package
import specli  # noqa: E402,F401  (llama.cpp's libraries load before numpy)
from benchmarks.device_sim import (  # noqa: E402
    CAPTURE_MS,
    COPY_GBPS,
    DEFAULT_VOCAB,
    DRAFT_ONE_TOKEN_MS,
    GRAPHLESS_MS,
    DeviceCosts,
    Ledger,
    Script,
    SimulatedModel,
    h200_costs,
    make_script,
)
from specli.decode.costs import CALIBRATION_SIZES, PRIOR_LOOP, StepCosts  # noqa: E402
from specli.decode.draft_model import DraftModel  # noqa: E402
from specli.decode.events import Stats, StepRecord, Token  # noqa: E402
from specli.decode.request import AUTO, DraftKind, DraftTokens, GenerationRequest  # noqa: E402
from specli.render import TextRenderer  # noqa: E402
from specli.pricing import CATCH_UP_BATCH, Pricing  # noqa: E402
from specli.session import Session, SessionSpec  # noqa: E402
from specli.stream import stream  # noqa: E402

GOAL_STEP_US = 400.0  # host time a step at K=8, 152k vocabulary
GOAL_DRAFTED_US = 15.0  # proposing's host time per drafted token
PROPOSERS = {
    "ngram": (DraftKind.NGRAM, True),  # (the request's draft kind, lookup in front of a draft model)
    "draft": (DraftKind.MODEL, False),
    "draft+ngram": (DraftKind.MODEL, True),
}
DRAFT_LENGTHS: tuple[DraftTokens, ...] = (0, 1, 4, 8, 16, AUTO)


@dataclass(frozen=True)
class Setup:
    """What every run of a measurement shares: the script, the device, the budget."""

    script: Script
    target_costs: DeviceCosts
    draft_costs: DeviceCosts
    max_tokens: int = 256
    verify_on_device: bool = False
    # specli's GPU paths (reusable batch shapes, a draft's device choices and one-token
    # catch-up); False: the models say they are on no GPU, so the host paths a CPU takes run.
    gpu_paths: bool = True


class SteadyPricing(Pricing):
    """The simulated device's steady costs, neither read from the store nor measured."""

    def __init__(self, session: Session, costs: StepCosts) -> None:
        super().__init__(session.spec, session.target)
        self._steady = costs

    def costs(self, *, measure: bool = True, kind: str | None = None, keep: bool = False) -> StepCosts:
        return self._steady


class SimulatedSession(Session):
    """A Session over simulated models, whose -k auto prices with the device's steady costs."""

    def __init__(self, spec: SessionSpec, target: SimulatedModel, draft: SimulatedModel | None,
                 costs: StepCosts) -> None:
        loaded = {DraftKind.MODEL: DraftModel(draft, on_gpu=draft.on_gpu)} if draft is not None else None  # type: ignore[arg-type]
        super().__init__(spec, target, loaded)  # type: ignore[arg-type]
        self.pricing = SteadyPricing(self, costs)


def steady_costs(setup: Setup, with_draft: bool) -> StepCosts:
    """The costs a steady calibration would store on the simulated device: verify batches with
    every row copied out, the loop at the calibration's default share, and the draft's decode,
    its catch-up and its agreement."""
    target, draft, n_vocab = setup.target_costs, setup.draft_costs, setup.script.n_vocab
    verify = {size: target.decode(size) + target.copy(size, n_vocab) for size in CALIBRATION_SIZES}
    costs = StepCosts(verify, loop=PRIOR_LOOP * verify[1], source="calibrated",
                      shape_change=target.graphless + target.capture if setup.gpu_paths else None)
    if not with_draft:
        return costs
    agreement = sum(setup.script.draft_agrees) / len(setup.script.draft_agrees)
    # On the GPU paths a greedy draft's choice is taken on the device: no row crosses.
    choice = draft.greedy if setup.gpu_paths else draft.copy(1, n_vocab)
    return replace(costs, draft_per_token=draft.decode(1) + choice,
                   draft_catch_up=(draft.decode(CATCH_UP_BATCH) + draft.copy(1, n_vocab)) / CATCH_UP_BATCH,
                   draft_acceptance=agreement)


def open_session(setup: Setup, proposer: str) -> SimulatedSession:
    """Fresh simulated models (no shape decoded yet, as in a fresh process) in a session."""
    with_draft = PROPOSERS[proposer][0] == DraftKind.MODEL
    target = SimulatedModel(setup.script, setup.target_costs)
    draft = SimulatedModel(setup.script, setup.draft_costs, draft=True) if with_draft else None
    for model in (target, draft):
        if model is not None:
            model.on_gpu = setup.gpu_paths
    spec = SessionSpec(target.path, draft.path if draft else None, verify_on_device=setup.verify_on_device)
    return SimulatedSession(spec, target, draft, steady_costs(setup, with_draft))


def request_for(proposer: str, draft_tokens: DraftTokens, max_tokens: int) -> GenerationRequest:
    """Greedy, seeded; K=0: plain decoding."""
    kind, lookup = PROPOSERS[proposer]
    if draft_tokens == 0:
        return GenerationRequest(max_tokens=max_tokens, seed=0, draft=DraftKind.NONE)
    return GenerationRequest(max_tokens=max_tokens, seed=0, draft=kind, lookup=lookup, draft_tokens=draft_tokens)


class WindowSink:
    """A TextRenderer to /dev/null that notes the wall clock and the models' ledgers at the
    first token's event and at the end: the window every step falls in."""

    def __init__(self, out, models: Sequence[SimulatedModel]) -> None:
        self.renderer = TextRenderer(out, out, colour=True, quiet=True)
        self.models = models
        self.started: tuple[float, list[Ledger]] | None = None
        self.ended: tuple[float, list[Ledger]] | None = None

    def _mark(self) -> tuple[float, list[Ledger]]:
        return time.perf_counter(), [model.ledger.snapshot() for model in self.models]

    def start(self) -> None:
        self.renderer.start()

    def token(self, event: Token) -> None:
        if self.started is None:
            self.started = self._mark()
        self.renderer.token(event)

    def step(self, record: StepRecord) -> None:
        self.renderer.step(record)

    def finish(self, stats: Stats) -> None:
        self.ended = self._mark()
        self.renderer.finish(stats)

    def spent(self) -> tuple[float, list[Ledger]]:
        """The window's wall seconds, and each model's ledger over it."""
        assert self.started is not None and self.ended is not None
        return self.ended[0] - self.started[0], [e.since(s) for s, e in zip(self.started[1], self.ended[1])]


@dataclass
class RunFigures:
    """One generation: counts, and seconds of host time (by phase) and of device time."""

    tokens: int  # written by steps (the prompt's decode wrote one more)
    steps: int
    drafted: int
    accepted: int
    host: float
    propose: float
    verify_call: float
    read: float
    device: float
    target: Ledger
    draft: Ledger | None
    output: list[int] = field(repr=False)

    @property
    def rest(self) -> float:
        return self.host - self.propose - self.verify_call - self.read


def run_once(setup: Setup, proposer: str, draft_tokens: DraftTokens,
             profiler: cProfile.Profile | None = None) -> RunFigures:
    """One generation on fresh simulated models, through specli.stream (`profiler`: profiled)."""
    session = open_session(setup, proposer)
    models = [session.target] + [thing.model for thing in session.loaded.values()]
    engine = session.engine_for(request_for(proposer, draft_tokens, setup.max_tokens))
    with open(os.devnull, "w") as out:
        sink = WindowSink(out, models)  # type: ignore[arg-type]
        if profiler is None:
            outcome = stream(engine, setup.script.prompt, sink)
        else:
            outcome = profiler.runcall(stream, engine, setup.script.prompt, sink)
    wall, ledgers = sink.spent()
    target, draft = ledgers[0], ledgers[1] if len(ledgers) > 1 else None
    inside = sum(ledger.inside_seconds for ledger in ledgers)
    steps = outcome.steps
    return RunFigures(
        tokens=outcome.stats.generated_after_first, steps=len(steps), drafted=outcome.stats.drafted,
        accepted=outcome.stats.accepted, host=wall - inside,
        propose=sum(s.draft_seconds for s in steps) - (draft.inside_seconds if draft else 0.0),
        verify_call=sum(s.verify_seconds for s in steps) - target.decode_inside_seconds,
        read=sum(s.read_seconds for s in steps), device=sum(ledger.device_seconds for ledger in ledgers),
        target=target, draft=draft, output=outcome.tokens)


def summarise(label: str, runs: list[RunFigures]) -> dict:
    """Medians over runs of the host figures; the counts, which repeat exactly, from the first."""
    first = runs[0]
    steps, drafted = max(first.steps, 1), first.drafted
    median = statistics.median
    host = median([r.host for r in runs])
    summary = {
        "config": label, "runs": len(runs), "tokens": first.tokens, "steps": first.steps,
        "drafted_per_step": drafted / steps, "acceptance": first.accepted / drafted if drafted else None,
        "tokens_per_step": first.tokens / steps,
        "host_us_per_step": 1e6 * host / steps,
        "host_us_per_drafted": 1e6 * host / drafted if drafted else None,
        "host_us_per_token": 1e6 * host / max(first.tokens, 1),
        "host_us_per_step_min_max": [1e6 * min(r.host for r in runs) / steps, 1e6 * max(r.host for r in runs) / steps],
        "host_split_us_per_step": {name: 1e6 * median([getattr(r, name) for r in runs]) / steps
                                   for name in ("propose", "verify_call", "read", "rest")},
        "draft_us_per_drafted": 1e6 * median([r.propose for r in runs]) / drafted if drafted else None,
        "device_ms_per_step": 1e3 * first.device / steps,
        "simulated_tokens_per_second": first.tokens / (host + first.device),
        "device_only_tokens_per_second": first.tokens / first.device if first.device else None,
        "host_share": host / (host + first.device),
        "shape_changes_per_step": {"target": first.target.shape_changes / steps,
                                   "draft": first.draft.shape_changes / steps if first.draft else 0.0},
        "graphless_and_captures": {"target": [first.target.graphless, first.target.captures],
                                   "draft": [first.draft.graphless, first.draft.captures] if first.draft else [0, 0]},
        "repeats_exactly": all(r.output == first.output for r in runs),
    }
    return summary


def configurations(proposers: Sequence[str], lengths: Sequence[DraftTokens]) -> list[tuple[str, str, DraftTokens]]:
    """(label, proposer, K): plain once (K=0 is the same for every proposer), then each pair."""
    configs = [("plain", "ngram", 0)] if 0 in lengths else []
    return configs + [(f"{p} k={k}", p, k) for p in proposers for k in lengths if k != 0]


def measure(setup: Setup, configs: list[tuple[str, str, DraftTokens]], rounds: int) -> list[dict]:
    """Every configuration once a round, in the same order, `rounds` times; then the summaries."""
    figures: dict[str, list[RunFigures]] = {label: [] for label, _, _ in configs}
    for _ in range(rounds):
        for label, proposer, draft_tokens in configs:
            figures[label].append(run_once(setup, proposer, draft_tokens))
    return [summarise(label, figures[label]) for label, _, _ in configs]


def profile(setup: Setup, proposer: str, draft_tokens: DraftTokens, rounds: int, top: int = 30) -> str:
    """cProfile over `rounds` generations of one configuration (the prompt's decode included,
    loading not): the top functions by own time, the simulated device's left out."""
    profiler = cProfile.Profile()
    for _ in range(rounds):
        run_once(setup, proposer, draft_tokens, profiler)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(r"^(?!.*device_sim)", top)
    return text.getvalue()


def goals(summaries: list[dict], vocab: int) -> list[str]:
    """The goals, and how each K=8 configuration stands against them (`vocab`: this run's)."""
    lines = [f"goals: host <= {GOAL_STEP_US:.0f} us a step at K=8 with a 152k vocabulary; "
             f"<= {GOAL_DRAFTED_US:.0f} us of proposing's host time per drafted token (this run: {vocab:,} tokens)"]
    for s in summaries:
        if not s["config"].endswith(" k=8"):
            continue
        step, drafted = s["host_us_per_step"], s["draft_us_per_drafted"]
        line = f"  {s['config']}: {step:.0f} us a step ({_met(step <= GOAL_STEP_US)})"
        if drafted is not None:
            line += f", {drafted:.1f} us per drafted token ({_met(drafted <= GOAL_DRAFTED_US)})"
        lines.append(line)
    return lines


def _met(met: bool) -> str:
    return "met" if met else "not met"


def render(report: dict) -> str:
    columns = ("config", "tok/step", "drafted", "accept", "host us/step", "propose/verify/read/rest",
               "us/drafted", "draft us/drafted", "us/token", "device ms/step", "sim tok/s", "host %", "shapes/step t+d")
    rows = [columns]
    for s in report["configs"]:
        split = s["host_split_us_per_step"]
        rows.append((
            s["config"], f"{s['tokens_per_step']:.2f}", f"{s['drafted_per_step']:.2f}",
            f"{s['acceptance']:.2f}" if s["acceptance"] is not None else "-", f"{s['host_us_per_step']:.0f}",
            "/".join(f"{split[name]:.0f}" for name in ("propose", "verify_call", "read", "rest")),
            f"{s['host_us_per_drafted']:.1f}" if s["host_us_per_drafted"] is not None else "-",
            f"{s['draft_us_per_drafted']:.1f}" if s["draft_us_per_drafted"] is not None else "-",
            f"{s['host_us_per_token']:.0f}", f"{s['device_ms_per_step']:.2f}",
            f"{s['simulated_tokens_per_second']:.0f}", f"{100 * s['host_share']:.1f}",
            f"{s['shape_changes_per_step']['target']:.2f}+{s['shape_changes_per_step']['draft']:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]
    machine = report["machine"]
    lines.append(f"load average {machine['load_before']} before, {machine['load_after']} after; "
                 f"{report['settings']['runs']} rounds, medians")
    return "\n".join(lines + goals(report["configs"], report["settings"]["vocab"]))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--vocab", type=int, default=DEFAULT_VOCAB, help="vocabulary size (floats per row)")
    parser.add_argument("--tokens", type=int, default=256, help="tokens to generate a run")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="the prompt's length")
    parser.add_argument("--runs", type=int, default=5, help="rounds over the configurations (medians)")
    parser.add_argument("--proposers", default="ngram,draft",
                        help=f"comma-separated, of {', '.join(PROPOSERS)}")
    parser.add_argument("-k", "--draft-tokens", default="0,1,4,8,16,auto", help="draft lengths; 0 is plain")
    parser.add_argument("--agreement", type=float, default=0.95,
                        help="the draft's chance to agree with the target at a position")
    parser.add_argument("--copy-share", type=float, default=0.5, help="the script's share of copied spans")
    parser.add_argument("--seed", type=int, default=0, help="the script's seed")
    parser.add_argument("--draft-ms", type=float, default=DRAFT_ONE_TOKEN_MS,
                        help="the draft's one-token decode (an assumption: 1/14 of the H200 target's)")
    parser.add_argument("--copy-gbps", type=float, default=COPY_GBPS, help="output rows to the host (0: free)")
    parser.add_argument("--graphless-ms", type=float, default=GRAPHLESS_MS,
                        help="a target decode run without its CUDA graph, after a change of shape (the draft's: scaled)")
    parser.add_argument("--capture-ms", type=float, default=CAPTURE_MS, help="capturing the target's graph")
    parser.add_argument("--verify-on-device", action="store_true", help="the target chooses each row's argmax")
    parser.add_argument("--no-gpu-paths", dest="gpu_paths", action="store_false",
                        help="run the paths a CPU takes (no batch shapes, the draft's rows read on the host)")
    parser.add_argument("--profile", action="store_true",
                        help="profile the first configuration with cProfile instead of measuring")
    return parser.parse_args(argv)


def setup_from(args: argparse.Namespace) -> Setup:
    script = make_script(args.vocab, args.prompt_tokens, args.tokens + 64, seed=args.seed,
                         copy_share=args.copy_share, agreement=args.agreement)
    device = dict(copy_gbps=args.copy_gbps, graphless_ms=args.graphless_ms, capture_ms=args.capture_ms)
    return Setup(script, h200_costs(**device), h200_costs(draft=True, draft_ms=args.draft_ms, **device),
                 args.tokens, args.verify_on_device, args.gpu_paths)


def main(argv: Sequence[str] | None = None) -> int:
    from specli.decode.request import parse_draft_tokens

    args = parse_args(argv)
    setup = setup_from(args)
    proposers = [p.strip() for p in args.proposers.split(",") if p.strip()]
    lengths = [0 if part.strip() == "0" else parse_draft_tokens(part.strip()) for part in args.draft_tokens.split(",")]
    configs = configurations(proposers, lengths)
    if args.profile:
        label, proposer, draft_tokens = configs[0]
        print(f"{label}, {args.runs} runs:\n" + profile(setup, proposer, draft_tokens, args.runs))
        return 0
    load_before = [round(x, 2) for x in os.getloadavg()]
    summaries = measure(setup, configs, args.runs)
    report = {
        "machine": {"cpus": os.cpu_count(), "load_before": load_before,
                    "load_after": [round(x, 2) for x in os.getloadavg()]},
        "settings": {key: value for key, value in vars(args).items() if key not in ("json", "profile")},
        "devices": {"target": asdict(setup.target_costs), "draft": asdict(setup.draft_costs)},
        "goals": {"host_us_per_step_k8": GOAL_STEP_US, "draft_us_per_drafted": GOAL_DRAFTED_US},
        "configs": summaries,
    }
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
