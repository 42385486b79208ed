"""Concurrent clients against `specli serve --parallel N`, specli one at a time, and llama.cpp's
`llama-server -np N`, same model, same requests.

Each of C clients sends its share of the same streamed, greedy /v1/completions requests (the
shipped workloads' prompts, client i starting at prompt i), one after the other, all clients at
once. Sides, each started afresh for every measurement, in an order rotated round by round:

- specli `--parallel C` with n-gram drafting (-k auto), and with `--draft none`;
- specli `--parallel 1` (one generation at a time, the rest queued: specli before --parallel);
- llama-server `-np C`, plain and with `--spec-type ngram-simple` and `ngram-mod` (its -c is
  C times specli's, which llama-server divides between its slots; `--llama-modes` chooses).

With `--draft-model FILE` both specli sides that draft draft with it (n-gram lookup in front,
as `--draft FILE` does), and llama-server's `draft-simple` mode drafts with it (`-md FILE`).

With `--opening CHARS`, every prompt opens with the same text of about that many characters
(benchmarks/heldout.toml's prompts, as reference material): the system prompt and tools that
agents fired at once share. specli decodes it once and lends its cells to the slots that start
alike; llama-server finds it only in an idle slot.

With `--exact`, one more specli `--parallel C` side, where the first client asks every one of
its requests for `exact: true` (which runs alone: the others wait while it decodes). It shows
what an exact request costs the others (its `over_it`) and what the exact requests get
(`exact_p50`: their tokens per second).

Reported per side and C: aggregate tokens per second (all completion tokens over the wall
time of the whole run), each request's tokens per second and time to its first token (p50,
p95), and, where the server says, drafted and kept tokens and the mean drafted rows per
request per step (drafted / (tokens - accepted): a step writes one token of the target's own
besides the kept ones). Medians over rounds; the ratios are taken within each round.

    python benchmarks/parallel_bench.py --target gemma.gguf --llama-server PATH [--clients 1,2,4,8] [--rounds 3]
        [--draft-model smollm.gguf --llama-modes plain,draft-simple] [--exact]

Build llama-server from the llama.cpp that llama-cpp-python vendors:
    TARGETS=llama-server benchmarks/build_llama_cpp.sh
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from benchmarks.serve_bench import Result, complete, llama_server, specli_server  # noqa: E402
from specli.comparison import load_workloads  # noqa: E402


EXACT_SIDE = "specli --parallel {clients}, client 1 exact"


def sides(target: Path, binary: Path | None, clients: int, ctx: int, draft: Path | None = None,
          modes: Sequence[str] = ("plain", "ngram-simple", "ngram-mod"), exact: bool = False):
    """(name, server factory) for every side at `clients` concurrent clients."""
    common = ("-c", str(ctx), "--no-memory", "--queue", "64", *(("--draft", str(draft)) if draft else ()))
    yield f"specli --parallel {clients}", lambda: specli_server(target, "--parallel", str(clients), *common)
    if exact:
        yield EXACT_SIDE.format(clients=clients), lambda: specli_server(target, "--parallel", str(clients), *common)
    yield f"specli --parallel {clients} --draft none", lambda: specli_server(
        target, "--parallel", str(clients), *common, "--draft", "none")
    if clients > 1:
        yield "specli --parallel 1", lambda: specli_server(target, "--parallel", "1", *common)
    if binary is not None:
        for mode in modes:
            spec_type = None if mode == "plain" else mode
            name = f"llama-server -np {clients}" + (f" --spec-type {spec_type}" if spec_type else "")
            md = draft if spec_type is not None and spec_type.startswith("draft") else None
            yield name + (" -md" if md else ""), (lambda s=spec_type, md=md: llama_server(binary, target, s, ctx,
                                                                                        clients, md))


HELD_OUT = Path(__file__).with_name("heldout.toml")


def held_out_prompts() -> list[str]:
    return [entry["prompt"] for entry in tomllib.loads(HELD_OUT.read_text(encoding="utf-8"))["workload"]]


def prompts(max_tokens: int, opening: int = 0) -> list[tuple[str, int]]:
    """The workloads' prompts, each opening with the same `opening` characters of reference text."""
    head = "Reference material:\n\n" + "\n\n".join(held_out_prompts())[:opening] + "\n\nTask:\n\n" if opening else ""
    return [(head + workload.prompt, min(max_tokens, workload.max_tokens)) for workload in load_workloads()]


def run_clients(url: str, clients: int, per_client: int, requests: list[tuple[str, int]], exact_clients: int = 0) -> dict:
    """Every client's requests, all clients at once (the first `exact_clients` asking for
    `exact: true`); the figures of the whole run."""
    results = [Result() for _ in range(clients)]
    per_request: list[tuple[float, float]] = []  # (tokens per second, time to the first token)
    exact_rates: list[float] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        for n in range(per_client):
            prompt, max_tokens = requests[(index + n * clients) % len(requests)]
            one = Result()
            complete(url, prompt, max_tokens, one, {"exact": True} if index < exact_clients else None)
            with lock:
                if one.tokens:  # (a request that ends at once, at an end of generation, has no rate)
                    per_request.append((one.tokens_per_second, one.first_token[0]))
                if index < exact_clients:
                    exact_rates.append(one.tokens_per_second)
                for name in ("seconds", "tokens", "drafted", "accepted"):
                    setattr(results[index], name, getattr(results[index], name) + getattr(one, name))

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    tokens = sum(r.tokens for r in results)
    drafted, accepted = sum(r.drafted for r in results), sum(r.accepted for r in results)
    rates, firsts = sorted(rate for rate, _ in per_request), sorted(first for _, first in per_request)
    return {"aggregate": tokens / wall, "tokens": tokens, "wall": wall,
            "request_p50": _quantile(rates, 0.5), "request_p95": _quantile(rates, 0.05),  # the slow tail
            "first_p50": _quantile(firsts, 0.5), "first_p95": _quantile(firsts, 0.95),
            "drafted": drafted, "accepted": accepted, "exact_p50": _quantile(sorted(exact_rates), 0.5),
            "rows_per_step": drafted / max(1, tokens - accepted)}


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def measure(target: Path, binary: Path | None, clients: int, args, progress: Callable[[str], None]) -> dict:
    """Every side at `clients`, `args.rounds` rounds in rotated order; medians and in-round ratios."""
    requests = prompts(args.max_tokens, args.opening)
    named = list(sides(target, binary, clients, args.ctx, args.draft_model, args.llama_modes.split(","), args.exact))
    rounds: list[dict[str, dict]] = []
    for round_index in range(args.rounds):
        shift = round_index % len(named)
        figures = {}
        for name, server in named[shift:] + named[:shift]:
            with server() as url:
                complete(url, "Hello", 4, Result())  # a warm-up request, not counted
                figures[name] = run_clients(url, clients, args.per_client, requests,
                                            1 if name == EXACT_SIDE.format(clients=clients) else 0)
            progress(f"C={clients} round {round_index + 1} {name}: {figures[name]['aggregate']:.1f} tok/s in all")
        rounds.append(figures)
    report = {}
    base = f"specli --parallel {clients}"
    for name, _ in named:
        runs = [r[name] for r in rounds]
        report[name] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        report[name]["over_it"] = statistics.median(r[base]["aggregate"] / r[name]["aggregate"] for r in rounds)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--llama-server", type=Path, help="llama-server binary (leave out for specli alone)")
    parser.add_argument("--clients", default="1,2,4,8")
    parser.add_argument("--draft-model", type=Path, help="the draft model both sides draft with")
    parser.add_argument("--llama-modes", default="plain,ngram-simple,ngram-mod",
                        help="llama-server's sides: plain and --spec-type values (draft-simple: with -md)")
    parser.add_argument("--per-client", type=int, default=3, help="requests each client sends, one after the other")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-c", "--ctx", type=int, default=2048, help="context per request")
    parser.add_argument("--json", type=Path, help="write the report here too")
    parser.add_argument("--opening", type=int, default=0, help="characters of one opening every prompt shares")
    parser.add_argument("--exact", action="store_true", help="a side where the first client's requests are exact")
    args = parser.parse_args(argv)
    report = {}
    for clients in (int(c) for c in args.clients.split(",")):
        report[clients] = measure(args.target, args.llama_server, clients, args, lambda line: print(line, file=sys.stderr))
        print(f"\n{clients} client(s): {'side':<52} {'agg tok/s':>9} {'x':>6} {'req p50':>8} {'req p95':>8} "
              f"{'ttft p50':>8} {'ttft p95':>8} {'rows/step':>9}")
        for name, figures in report[clients].items():
            print(f"{'':12}{name:<52} {figures['aggregate']:9.1f} {figures['over_it']:6.2f} {figures['request_p50']:8.1f} "
                  f"{figures['request_p95']:8.1f} {figures['first_p50']:8.2f} {figures['first_p95']:8.2f} "
                  f"{figures['rows_per_step']:9.2f}"
                  + (f"  (exact requests: {figures['exact_p50']:.1f} tok/s p50)" if figures["exact_p50"] else ""))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
