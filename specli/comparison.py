"""Plain against speculative decoding on the same prompts, in one process (`specli bench`).

Every configuration (plain, `-k auto`, fixed K values) runs each workload once as a
warm-up, then `runs` times in rounds; the order of configurations rotates from round to
round so drift on the machine falls on all of them alike. A speedup is the ratio of the
speculative run to the plain run of the same round; the report gives its median and
spread. Greedy outputs are compared with plain decoding as a losslessness check. A run whose
output leaves plain's (a near-tie that a batched verify rounds the other way) writes other
text, or more of it past plain's end, so it is also timed on the text it shares with plain:
the time to its last shared token against plain's time to the same token. (That leaves out
what both would still pay to reach plain's end, so it is a little kind to the speculative
run, whose last step verifies a whole draft; a run identical to plain is timed end to end.)
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Union

import numpy as np

from specli.decode.events import Stats, StepRecord, Token
from specli.decode.request import AUTO, DraftKind, DraftTokens, GenerationRequest
from specli.decode.sampling import top_two_margin
from specli.errors import ConfigError
from specli.llama.backend import library_versions
from specli.prompt import prompt_tokens
from specli.pricing import exact_caps
from specli.session import Session, SessionSpec, open_session
from specli.stream import stream

PLAIN = "plain"

Config = Union[DraftTokens, str]  # a draft length, or PLAIN


def benchmark(spec: SessionSpec, request: GenerationRequest, workloads: list[Workload], configs: list[DraftTokens],
              runs: int, max_tokens: int | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Load the models, run every configuration (plain, and `request` at each draft length in
    `configs`) on every workload; the report as a dict."""
    if max_tokens:
        workloads = [replace(w, max_tokens=max_tokens) for w in workloads]
    exact = exact_caps(spec, progress)
    with open_session(spec, progress) as session:
        reason = session.plain_reason(request)
        if reason is not None and progress:
            progress(reason)
        if AUTO in configs and session.pricing.costs(measure=False).source != "calibrated":
            if progress:
                progress("timing the target's verify batches for -k auto (stored for later runs)")
            session.pricing.calibrate()
        report = run_bench(session, request, workloads, configs, runs, progress)
        # Where the verified rows' argmax was taken: the device only for greedy runs without a penalty.
        on_device = spec.verify_on_device and request.sampling.pure_greedy
        report.update(exact=request.exact, repack=session.spec.target_load.repack, verify_on_device=on_device,
                      exact_batch={"repack": exact[True].report(), "no_repack": exact[False].report()})
    draft = spec.draft_model.name if spec.draft_model is not None else request.draft
    report.update(target=spec.target.name, draft=draft, temperature=request.sampling.temperature, seed=request.seed,
                  llama_cpp=library_versions())
    return report


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str
    prompt: str
    max_tokens: int = 128
    chat: bool | None = False


def default_workloads_file() -> Path:
    """The workloads specli ships (`specli bench`'s default), inside the package."""
    return Path(__file__).resolve().parent / "workloads.toml"


def load_workloads(path: Path | None = None) -> list[Workload]:
    """Workloads from a TOML file of [[workload]] tables (name, kind, prompt, max_tokens, chat)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    path = path or default_workloads_file()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise ConfigError(f"workloads file not found: {path}") from error
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: {error}") from error
    workloads = []
    for i, entry in enumerate(data.get("workload", [])):
        unknown = set(entry) - {"name", "kind", "prompt", "max_tokens", "chat"}
        if unknown or "prompt" not in entry:
            problem = f"unknown key {sorted(unknown)[0]}" if unknown else "missing key prompt"
            raise ConfigError(f"{path}: workload[{i}]: {problem}")
        workloads.append(
            Workload(
                name=str(entry.get("name", f"workload-{i}")),
                kind=str(entry.get("kind", "unspecified")),
                prompt=str(entry["prompt"]),
                max_tokens=int(entry.get("max_tokens", 128)),
                chat=entry.get("chat", False),
            )
        )
    if not workloads:
        raise ConfigError(f"{path}: no [[workload]] entries")
    return workloads


def _graph_events(runs: list[Stats]) -> dict[str, int] | None:
    """What the CUDA backend logged of its graphs over the runs (None: no GPU build logged any)."""
    logged = [run.cuda_graphs for run in runs if run.cuda_graphs is not None]
    return {event: sum(counts[event] for counts in logged) for event in logged[0]} if logged else None


@dataclass
class Measurement:
    tokens_per_second: list[float] = field(default_factory=list)
    speedups: list[float] = field(default_factory=list)
    stats: list[Stats] = field(default_factory=list)
    identical: list[bool] = field(default_factory=list)
    first_difference: list[int] = field(default_factory=list)  # where a run's output left plain's
    plain_margins: list[float] = field(default_factory=list)  # plain's top-two margin per token
    # Each run timed on the opening text it shares with the same round's plain run
    # (shared_text_speedup): like for like where a run's output leaves plain's.
    shared_speedups: list[float] = field(default_factory=list)
    shared_tokens: list[int] = field(default_factory=list)

    def summary(self) -> dict:
        total = Stats.combine(self.stats)
        steps = total.steps or 1
        seconds = total.seconds or 1e-9
        return {
            "tokens_per_second": _spread(self.tokens_per_second),
            "speedup": _spread(self.speedups) if self.speedups else None,
            "acceptance_rate": total.acceptance_rate if total.drafted else None,
            "mean_accepted_length": total.mean_accepted_length if total.drafted else None,
            "drafted_per_step": total.drafted / steps,  # -k auto: how long it chose to draft
            "acceptance_by_position": total.acceptance_by_position,
            "time_split": {
                "draft": total.draft_decode_seconds / seconds,  # the draft model's decodes (its loop: overhead)
                "verify": total.verify_seconds / seconds,
                "overhead": total.overhead_seconds / seconds,
            },
            "python_overhead_ms_per_step": total.python_overhead_ms_per_step,
            # ... split into what every step pays and what each logits row read adds.
            "loop_overhead_ms_per_step": total.loop_overhead_ms_per_step,
            "read_us_per_row": total.read_us_per_row if total.rows_read else None,
            "rows_read_per_step": total.rows_read / steps,
            "batch_changes_per_step": total.batch_changes / steps,  # a GPU replays its graph where none
            "cuda_graphs": _graph_events(self.stats),
            "tokens": _spread([float(s.tokens) for s in self.stats]),  # generated per run
            "identical_to_plain": all(self.identical) if self.identical else None,
            # Runs whose output left plain's: a batched verify can round a near-tie the other
            # way (not under --exact), and a run that writes other text, or more of it past
            # plain's end, measures other work.
            "runs_differing": self.identical.count(False) if self.identical else None,
            "speedup_on_plain_text": _spread(self.shared_speedups) if self.shared_speedups else None,
            "plain_text_tokens": min(self.shared_tokens) if self.shared_tokens else None,
            "first_difference": min(self.first_difference) if self.first_difference else None,
            "plain_margin_at_first_difference": self._margin_at_first_difference(),
            "runs": len(self.stats),
        }

    def _margin_at_first_difference(self) -> float | None:
        if not self.first_difference:
            return None
        index = min(self.first_difference)
        return self.plain_margins[index] if index < len(self.plain_margins) else None


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else {}


def _label(config: Config) -> str:
    return config if isinstance(config, str) else f"k={config}"


def run_bench(session: Session, request: GenerationRequest, workloads: list[Workload], configs: list[DraftTokens],
              runs: int, progress: Callable[[str], None] | None = None) -> dict:
    """Measure every configuration on every workload; returns the report as a dict."""
    all_configs: list[Config] = [PLAIN, *configs]
    proposer = session.engine_for(request).proposer
    report: dict = {"proposer": proposer.name, "translated": proposer.translated, "runs": runs, "workloads": []}
    for workload in workloads:
        tokens = prompt_tokens(session.target, workload.prompt, chat=workload.chat)
        results = {_label(c): Measurement() for c in all_configs}
        reference: list[int] = []
        for round_index in range(runs + 1):  # round 0 is the warm-up
            order = all_configs[round_index % len(all_configs):] + all_configs[: round_index % len(all_configs)]
            played: dict[str, Run] = {}
            for config in order:
                output, times, stats = _generate(session, request, config, tokens, workload.max_tokens)
                played[_label(config)] = Run(output, times, stats.tokens_per_second)
                if round_index > 0:
                    results[_label(config)].stats.append(stats)
                    results[_label(config)].tokens_per_second.append(stats.tokens_per_second)
            if round_index == 0:
                reference = played[PLAIN].output
                if request.sampling.greedy:
                    margins = plain_greedy(session.target, tokens, workload.max_tokens)[1]
                    for measurement in results.values():
                        measurement.plain_margins = margins
                continue
            _compare_round(results, played, reference, greedy=request.sampling.greedy)
            if progress:
                progress(f"{workload.name}: round {round_index}/{runs}")
        report["workloads"].append(_workload_report(workload, len(tokens), results))
    return report


@dataclass(frozen=True)
class Run:
    """One configuration's run in a round: its output, when each token was released, its rate."""

    output: list[int]
    times: list[float]
    tokens_per_second: float


def _compare_round(results: dict[str, Measurement], played: dict[str, Run], reference: list[int], *,
                   greedy: bool) -> None:
    """Each speculative run of a measured round against the same round's plain run; greedy,
    each run's output against the warm-up's plain output (`reference`) too."""
    plain = played[PLAIN]
    for label, run in played.items():
        measurement = results[label]
        if label != PLAIN and plain.tokens_per_second > 0:
            measurement.speedups.append(run.tokens_per_second / plain.tokens_per_second)
        if not greedy:
            continue
        measurement.identical.append(run.output == reference)
        if run.output != reference:
            measurement.first_difference.append(_first_difference(run.output, reference))
        if label == PLAIN:
            continue
        if run.output == plain.output and plain.tokens_per_second > 0:
            # Plain's text exactly: timed end to end, the step that finds the end included.
            measurement.shared_speedups.append(run.tokens_per_second / plain.tokens_per_second)
            measurement.shared_tokens.append(len(run.output))
            continue
        shared, ratio = shared_text_speedup(run.output, run.times, plain.output, plain.times)
        if ratio is not None:
            measurement.shared_speedups.append(ratio)
            measurement.shared_tokens.append(shared)


def _workload_report(workload: Workload, prompt_length: int, results: dict[str, Measurement]) -> dict:
    """A workload's summaries, and the fixed draft length that ran fastest."""
    summaries = {label: m.summary() for label, m in results.items()}
    fixed = {label: s for label, s in summaries.items() if label.startswith("k=")}
    best = max(fixed, key=lambda label: fixed[label]["tokens_per_second"]["median"]) if fixed else None
    return {
        "name": workload.name,
        "kind": workload.kind,
        "prompt_tokens": prompt_length,
        "max_tokens": workload.max_tokens,
        "configs": summaries,
        "recommended_k": int(best[2:]) if best else None,
    }


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def shared_text_speedup(output: list[int], times: list[float], plain_output: list[int],
                        plain_times: list[float]) -> tuple[int, float | None]:
    """How many opening tokens a run shares with plain decoding's output, and how many times
    faster than plain it released them. times[i]: seconds from the release of the first token
    (the prompt's decode writes it, so it is left out, as in tokens_per_second) to that of
    token i. None: fewer than two tokens shared, nothing to time."""
    shared = _first_difference(output, plain_output)
    if shared < 2:
        return shared, None
    spent, plain_spent = times[shared - 1], plain_times[shared - 1]
    return shared, (plain_spent / spent if spent > 0 else None)


def plain_greedy(model, prompt: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy decoding one token at a time, and the gap between the two best logits of each
    row it read (one per token written, and one for the token that ended it). A speculative
    output that leaves plain's where this gap is small met a near-tie: llama.cpp's batched
    kernels round differently from its one-token ones."""
    model.rewind(0)
    row = model.decode(prompt)[0]
    output: list[int] = []
    margins: list[float] = []
    for _ in range(max_tokens):
        margins.append(top_two_margin(row))
        token = int(np.argmax(row))
        if model.is_end_of_generation(token):
            break
        output.append(token)
        if model.n_past >= model.n_ctx:
            break
        row = model.decode([token])[0]
    model.rewind(0)
    return output, margins


class _ReleaseTimes:
    """A sink that notes when each token was released."""

    def __init__(self) -> None:
        self.released: list[float] = []

    def start(self) -> None:
        pass

    def token(self, event: Token) -> None:
        if event.id >= 0:
            self.released.append(time.perf_counter())

    def step(self, record: StepRecord) -> None:
        pass

    def finish(self, stats: Stats) -> None:
        pass


def _generate(session: Session, request: GenerationRequest, config: Config, tokens: list[int],
              max_tokens: int) -> tuple[list[int], list[float], Stats]:
    """The output, when each of its tokens was released (seconds after the first), and the stats."""
    if config == PLAIN:
        request = replace(request, draft=DraftKind.NONE, max_tokens=max_tokens)
    else:
        request = replace(request, draft_tokens=config, max_tokens=max_tokens)
    session.clear_cache()  # each run decodes its prompt afresh, as `specli run` does
    engine = session.engine_for(request)
    times = _ReleaseTimes()
    outcome = stream(engine, tokens, times)
    return outcome.tokens, [t - times.released[0] for t in times.released], outcome.stats
