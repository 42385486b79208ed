"""specli's raw batched decode against `llama-batched-bench` at the same sizes: B sequences,
each a prompt of P tokens, then G steps of one row a sequence, in one unified KV cache.

For each B of `--npl`: every sequence emptied, then the B prompts decoded in one batch (split
at specli's batch size, as llama.cpp splits its own into ubatches), the last row of each with
logits; then G decodes of B rows, one a sequence, every row with logits (a step of B requests
beside each other, what `serve --parallel B` decodes when nobody drafts). The same shapes as
`llama-batched-bench -kvu -npp P -ntg G -npl B` (its -c: B_max x (P + G), specli's -c that
per sequence), which is run in the same rounds, alternating order.

Reported per B, medians over rounds: prompt and generation tokens per second of each side,
specli over llama.cpp (in-round), and each side's generation rate at B over its rate at 1: what
batching alone can give several requests at once on this machine, before any drafting. On a
compute-bound CPU that is far below B (rows cost nearly what they cost alone), which bounds
what `--parallel` can gain over one request at a time.

    python benchmarks/batched_raw.py -m smollm2.gguf --llama-batched-bench PATH [--npl 1,2,4,8]
        [-npp 128] [-ntg 32] [--rounds 3]

Build llama-batched-bench from the llama.cpp that llama-cpp-python vendors:
    TARGETS=llama-batched-bench benchmarks/build_llama_cpp.sh
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from specli.llama.backend import LoadSettings, Model  # noqa: E402


def specli_rates(model: Model, sizes: Sequence[int], prompt: int, steps: int) -> dict[int, tuple[float, float]]:
    """(prompt tok/s, generation tok/s) for each number of sequences, on one loaded model."""
    token = model.bos if model.bos >= 0 else 0
    rates = {}
    for size in sizes:
        for sequence in range(model.sequences):
            model.forget(sequence, 0)
        rows = [(sequence, position) for sequence in range(size) for position in range(prompt)]
        started = time.perf_counter()
        for at in range(0, len(rows), model.batch_size):  # the prompts, a batch at a time
            chunk = rows[at : at + model.batch_size]
            parts: dict[int, list[int]] = {}
            for sequence, position in chunk:
                parts.setdefault(sequence, []).append(position)
            model.decode_sequences([(sequence, positions[0], [token] * len(positions),
                                     [position == prompt - 1 for position in positions])
                                    for sequence, positions in parts.items()])
        prefill = time.perf_counter() - started
        started = time.perf_counter()
        for step in range(steps):
            outs = model.decode_sequences([(sequence, prompt + step, [token], [True]) for sequence in range(size)])
            [int(out[-1].argmax()) for out in outs]  # each request's choice, as a greedy step reads it
        generation = time.perf_counter() - started
        rates[size] = (size * prompt / prefill, size * steps / generation)
    return rates


def llama_rates(binary: Path, model: Path, sizes: Sequence[int], prompt: int, steps: int,
                threads: int) -> dict[int, tuple[float, float]]:
    command = [str(binary), "-m", str(model), "-c", str(max(sizes) * (prompt + steps)), "-b", "2048", "-ub", "512",
               "-npp", str(prompt), "-ntg", str(steps), "-npl", ",".join(map(str, sizes)), "-kvu", "-t", str(threads),
               "--output-format", "jsonl"]
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        sys.exit(f"{binary.name} failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    rates = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            rates[int(row["pl"])] = (float(row["speed_pp"]), float(row["speed_tg"]))
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, required=True)
    parser.add_argument("--llama-batched-bench", type=Path, help="llama.cpp's llama-batched-bench (omit: specli only)")
    parser.add_argument("--npl", default="1,2,4,8", help="sequences side by side")
    parser.add_argument("-npp", type=int, default=128, help="prompt tokens a sequence")
    parser.add_argument("-ntg", type=int, default=32, help="generation steps")
    parser.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    sizes = sorted({int(size) for size in args.npl.split(",")})
    settings = LoadSettings(ctx_size=args.npp + args.ntg, sequences=max(sizes), threads=args.threads)
    sides: dict[str, list[dict[int, tuple[float, float]]]] = {"specli": [], "llama.cpp": []}
    with Model(args.model, settings) as model:
        specli_rates(model, sizes[:1], min(args.npp, 16), 2)  # warm up, as llama-batched-bench does
        for round_ in range(args.rounds):
            order = ["specli", "llama.cpp"] if args.llama_batched_bench else ["specli"]
            for side in order if round_ % 2 == 0 else order[::-1]:
                sides[side].append(specli_rates(model, sizes, args.npp, args.ntg) if side == "specli" else
                                   llama_rates(args.llama_batched_bench, args.model, sizes, args.npp, args.ntg,
                                               args.threads))
    print(f"{args.model.name}: {args.npp} prompt tokens and {args.ntg} steps a sequence, -t {args.threads}, "
          f"medians of {args.rounds} rounds")
    print("| B | specli prompt tok/s | llama.cpp | ratio | specli generation tok/s | llama.cpp | ratio "
          "| batching gain, specli / llama.cpp |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        def median(side: str, phase: int, over: int | None = None) -> float:
            return statistics.median(rates[size][phase] / (rates[over][phase] if over else 1) for rates in sides[side])

        row = [str(size), f"{median('specli', 0):.1f}"]
        if sides["llama.cpp"]:
            pairs = list(zip(sides["specli"], sides["llama.cpp"]))
            ratio = [statistics.median(ours[size][phase] / theirs[size][phase] for ours, theirs in pairs)
                     for phase in (0, 1)]
            row += [f"{median('llama.cpp', 0):.1f}", f"{ratio[0]:.2f}x", f"{median('specli', 1):.1f}",
                    f"{median('llama.cpp', 1):.1f}", f"{ratio[1]:.2f}x",
                    f"{median('specli', 1, sizes[0]):.2f}x / {median('llama.cpp', 1, sizes[0]):.2f}x"]
        else:
            row += ["-", "-", f"{median('specli', 1):.1f}", "-", "-", f"{median('specli', 1, sizes[0]):.2f}x / -"]
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
