"""`specli run --batch` on 64 prompts, against 64 separate `specli run`s and against
llama-server `-np N` fed the same 64 prompts by N clients.

The prompts are the shipped workloads and benchmarks/heldout.toml's, cycled to 64, each
written greedily to the same token limit. Sides, alternating in order round by round:
`run --batch --parallel N` and `--parallel 1` (one process, one generation at a time), one
`specli run` process per prompt (each loads the model), and llama-server -np N (started
once per round, its start not counted). Reported: wall seconds and tokens per second in all,
medians over the rounds, and the ratio of each side to `run --batch --parallel N` within a round.

    python benchmarks/batch_bench.py --target gemma.gguf [--llama-server PATH] [--parallel 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from benchmarks.parallel_bench import held_out_prompts, run_clients  # noqa: E402
from benchmarks.serve_bench import llama_server  # noqa: E402
from specli.comparison import load_workloads  # noqa: E402

def prompts(count: int) -> list[str]:
    texts = [workload.prompt for workload in load_workloads()]
    texts += held_out_prompts()
    return [texts[i % len(texts)] for i in range(count)]


def specli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specli", "run", *map(str, args)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, check=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--llama-server", type=Path)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("-n", "--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-c", "--ctx", type=int, default=1024)
    args = parser.parse_args(argv)
    texts = prompts(args.count)
    with tempfile.TemporaryDirectory() as work:
        batch = Path(work) / "prompts.jsonl"
        batch.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in texts))
        common = ("--target", args.target, "--no-chat", "-n", args.max_tokens, "-c", args.ctx)

        def batched(parallel: int) -> tuple[float, int]:
            started = time.perf_counter()
            out = specli(*common, "--batch", batch, "--parallel", parallel).stdout
            return time.perf_counter() - started, sum(json.loads(line)["stats"]["tokens"] for line in out.splitlines())

        def separate() -> tuple[float, int]:
            started, tokens = time.perf_counter(), 0
            for text in texts:
                out = specli(*common, "--json", text).stdout
                tokens += json.loads(out.splitlines()[-1])["tokens"]
            return time.perf_counter() - started, tokens

        def served() -> tuple[float, int]:
            with llama_server(args.llama_server, args.target, None, args.ctx, args.parallel) as url:
                figures = run_clients(url, args.parallel, args.count // args.parallel,
                                      [(text, args.max_tokens) for text in texts])
            return figures["wall"], figures["tokens"]

        sides = {f"run --batch --parallel {args.parallel}": lambda: batched(args.parallel),
                 "run --batch --parallel 1": lambda: batched(1), f"{args.count} separate specli run": separate}
        if args.llama_server is not None:
            sides[f"llama-server -np {args.parallel}"] = served
        rounds: list[dict[str, tuple[float, int]]] = []  # (seconds, tokens)
        names = list(sides)
        for index in range(args.rounds):
            figures = {}
            for name in names[index % len(names):] + names[: index % len(names)]:
                figures[name] = sides[name]()
                tokens = figures[name][1]
                print(f"round {index + 1} {name}: {figures[name][0]:.1f} s, {tokens} tokens", file=sys.stderr)
            rounds.append(figures)
    base = names[0]
    print(f"{'side':<36} {'seconds':>8} {'tok/s':>7} {'x':>6}")
    for name in names:
        seconds = statistics.median(r[name][0] for r in rounds)
        rate = statistics.median(r[name][1] / r[name][0] for r in rounds)
        ratio = statistics.median(r[name][0] / r[base][0] for r in rounds)  # how many times the batch's time
        print(f"{name:<36} {seconds:8.1f} {rate:7.1f} {ratio:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
