"""Greedy verification on the host against verification on llama.cpp's device (backend
sampling, `GenerationRequest.verify_on_device`): tok/s and read_us_per_row, on one loaded
target, the two paths alternating run by run.

Every round runs each workload and each configuration (plain decoding, n-gram lookup at
fixed K) once on each path, the path that goes first alternating from round to round, so
drift on the machine falls on both alike; round 0 is a warm-up. The report gives each
figure's median over the rounds, the median of the per-round ratio device / host, and
whether the two paths wrote the same tokens. `--rows` adds the cost of one verify batch of
each size: the decode and the read, each path.

    python benchmarks/device_verify.py                         # the embedded Gemma 3 270M
    python benchmarks/device_verify.py --target model.gguf -k 0,4,8 --runs 7 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from specli.comparison import load_workloads
from specli.decode.events import Stats, Token
from specli.decode.request import DraftKind, GenerationRequest
from specli.llama.backend import LoadSettings, Model
from specli.prompt import prompt_tokens
from specli.session import Session, SessionSpec

PATHS = ("host", "device")


def run_once(session: Session, tokens: list[int], k: int, max_tokens: int) -> tuple[list[int], Stats]:
    """One generation as `specli run` makes it (through Session.engine_for): its whole prompt
    decoded, then plain steps (k 0) or n-gram lookup at a fixed k."""
    session.clear_cache()
    draft = DraftKind.NGRAM if k else DraftKind.NONE
    engine = session.engine_for(GenerationRequest(max_tokens, draft=draft, draft_tokens=max(k, 1)))
    output = []
    for event in engine.generate(tokens):
        if isinstance(event, Token) and event.id >= 0:
            output.append(event.id)
    return output, engine.stats


def compare(sessions: dict[str, Session], workloads, ks: list[int], runs: int, progress) -> list[dict]:
    """sessions: by path, on one loaded target, differing only in where they verify."""
    results = []
    for workload in workloads:
        tokens = prompt_tokens(sessions["host"].target, workload.prompt, chat=workload.chat)
        for k in ks:
            figures = {path: {"tokens_per_second": [], "read_us_per_row": [], "verify_ms_per_step": []} for path in PATHS}
            ratios, same = [], True
            for round_index in range(runs + 1):
                order = PATHS if round_index % 2 == 0 else PATHS[::-1]
                outputs, speeds = {}, {}
                for path in order:
                    outputs[path], stats = run_once(sessions[path], tokens, k, workload.max_tokens)
                    speeds[path] = stats.tokens_per_second
                    if round_index > 0:
                        figures[path]["tokens_per_second"].append(stats.tokens_per_second)
                        figures[path]["read_us_per_row"].append(stats.read_us_per_row)
                        figures[path]["verify_ms_per_step"].append(1000 * stats.verify_seconds / max(1, stats.steps))
                same = same and outputs["host"] == outputs["device"]
                if round_index > 0 and speeds["host"] > 0:
                    ratios.append(speeds["device"] / speeds["host"])
            results.append({
                "workload": workload.name, "k": k, "tokens": len(outputs["host"]), "same_tokens": same,
                "median": {path: {name: statistics.median(values) for name, values in figures[path].items()}
                           for path in PATHS},
                "speed_ratio_median": statistics.median(ratios),
                "speed_ratio_range": [min(ratios), max(ratios)],
            })
            if progress:
                progress(_line(results[-1]))
    return results


def batch_costs(target: Model, sizes: list[int], repeats: int) -> list[dict]:
    """One verify batch of each size after a 32-token prefix: the decode and the read of
    every row (argmax on the host, candidates from the device), medians of `repeats`,
    the two paths alternating."""
    text = target.tokenize("The printing press changed how knowledge moved through Europe. " * 12)
    prefix, rest = text[:32], text[32:]
    out = []
    for size in sizes:
        times = {path: ([], []) for path in PATHS}
        for repeat in range(repeats + 1):
            for path in (PATHS if repeat % 2 == 0 else PATHS[::-1]):
                target.rewind(0)
                (target.decode_argmax if path == "device" else target.decode)(prefix)  # attached or not, as timed
                started = time.perf_counter()
                if path == "device":
                    rows = target.decode_argmax(rest[:size], all_rows=True)
                    decoded = time.perf_counter()
                    list(rows)
                else:
                    rows = target.decode(rest[:size], all_logits=True)
                    decoded = time.perf_counter()
                    [int(row.argmax()) for row in rows]
                read = time.perf_counter()
                if repeat > 0:
                    times[path][0].append(decoded - started)
                    times[path][1].append(read - decoded)
        out.append({"rows": size, **{path: {"decode_ms": 1000 * statistics.median(times[path][0]),
                                             "read_us_per_row": 1e6 * statistics.median(times[path][1]) / size}
                                      for path in PATHS}})
    target.rewind(0)
    return out


def _line(result: dict) -> str:
    host, device = result["median"]["host"], result["median"]["device"]
    return (f"{result['workload']:<15} k={result['k']:<3} tok/s host {host['tokens_per_second']:6.1f} device "
            f"{device['tokens_per_second']:6.1f} (x{result['speed_ratio_median']:.3f}, "
            f"{result['speed_ratio_range'][0]:.3f}-{result['speed_ratio_range'][1]:.3f})  read us/row host "
            f"{host['read_us_per_row']:6.1f} device {device['read_us_per_row']:5.1f}  verify ms/step host "
            f"{host['verify_ms_per_step']:6.1f} device {device['verify_ms_per_step']:6.1f}  "
            f"{'same tokens' if result['same_tokens'] else 'TOKENS DIFFER'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, help="target GGUF (default: the embedded Gemma 3 270M)")
    parser.add_argument("-k", default="0,4,8", help="draft lengths, 0 for plain decoding (default 0,4,8)")
    parser.add_argument("--workloads", default="code-edit,summarise,story", help="names from the shipped workloads")
    parser.add_argument("-n", "--max-tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5, help="measured rounds after a warm-up")
    parser.add_argument("-t", "--threads", type=int)
    parser.add_argument("--rows", default="", help="also time one verify batch of these sizes, e.g. 1,5,9,17")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.target is None:
        from specli.models.demo import embedded_model_path

        args.target = embedded_model_path()
    names = args.workloads.split(",")
    workloads = [w for w in load_workloads() if w.name in names]
    workloads = [type(w)(w.name, w.kind, w.prompt, args.max_tokens, w.chat) for w in workloads]
    progress = None if args.json else print
    load = LoadSettings(ctx_size=2048, threads=args.threads)
    with Model(args.target, load) as target:
        sessions = {path: Session(SessionSpec(args.target, target_load=load, verify_on_device=path == "device"), target)
                    for path in PATHS}
        report = {"target": args.target.name, "threads": args.threads, "runs": args.runs,
                  "results": compare(sessions, workloads, [int(k) for k in args.k.split(",")], args.runs, progress)}
        if args.rows:
            report["batches"] = batch_costs(target, [int(size) for size in args.rows.split(",")], max(5, args.runs))
            if progress:
                for batch in report["batches"]:
                    print(f"rows {batch['rows']:>3}: " + "  ".join(
                        f"{path} decode {batch[path]['decode_ms']:6.2f} ms read {batch[path]['read_us_per_row']:6.1f} us/row"
                        for path in PATHS))
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    return 0 if all(result["same_tokens"] for result in report["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
