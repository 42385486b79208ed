"""How far a batched verify moves the target's greedy choice: margins by batch shape.

Greedy speculative output equals plain decoding wherever the verify batch picks the same
argmax as the one-token decode would. llama.cpp's CPU kernels are not batch-invariant, so
a batch's logits differ slightly from one-token logits, and where the target's two best
logits are closer than that difference the argmax can flip. This script measures how
close is close: it decodes each workload's plain greedy output again, teacher-forced, in
chunks of b tokens with every row's logits (as a verify that keeps every drafted token
would, its KV cache built by batches too), starting at a few offsets, and reports, per
workload, the largest drop of plain's token's margin (its logit minus the best other one)
against plain decoding's own margin, and how many positions flipped in some shape.

    python benchmarks/batch_margins.py -m gemma.gguf                   # shipped workloads
    python benchmarks/batch_margins.py -m gemma.gguf --prompts benchmarks/heldout.toml -b 4,8

Chunks of one token reproduce plain decoding exactly (same path): a drop there is a bug.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specli.comparison import plain_greedy

BATCHES = (2, 3, 4, 5, 8, 9, 16, 17, 32, 48)


@dataclass
class Shift:
    workload: str
    tokens: int
    largest_drop: float  # plain margin minus batched margin, worst position and shape
    where: tuple[int, int, int] | None  # (batch, offset, token index) of that drop
    plain_margin: float | None  # plain's margin there
    flipped: int  # positions where some shape's argmax was not plain's token


def token_margin(row: np.ndarray, token: int) -> float:
    """row[token] minus the best other logit (negative: another token wins)."""
    value = float(row[token])
    other = float(np.max(np.delete(row, token)))
    return value - other


def batched_margins(model, prompt: list[int], output: list[int], batch: int, offset: int) -> list[float]:
    """Plain's tokens fed back in chunks of `batch` (the first chunk `offset` long when
    offset > 0); margin of output[j] in the row that predicts it, for j >= 1 (output[0]
    comes from the prompt's decode in both paths)."""
    model.rewind(0)
    model.decode(prompt)
    margins = [float("nan")]
    start, size = 0, offset or batch
    while start < len(output) - 1:
        chunk = output[start : start + size]
        rows = model.decode(chunk, all_logits=True)
        for r in range(len(chunk)):
            j = start + r + 1
            if j < len(output):
                margins.append(token_margin(rows[r], output[j]))
        start += len(chunk)
        size = batch
    return margins


def measure(model, name: str, prompt: list[int], max_tokens: int, batches: tuple[int, ...]) -> Shift:
    output, plain = plain_greedy(model, prompt, max_tokens)
    drop, where, flipped = 0.0, None, set()
    for batch in batches:
        for offset in sorted({0, batch // 2}):
            for j, margin in enumerate(batched_margins(model, prompt, output, batch, offset)):
                if j == 0:
                    continue
                if margin < 0:
                    flipped.add(j)
                if plain[j] - margin > drop:
                    drop, where = plain[j] - margin, (batch, offset, j)
    return Shift(name, len(output), drop, where, plain[where[2]] if where else None, len(flipped))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, help="workloads TOML (default: the shipped ones)")
    parser.add_argument("-b", "--batches", default=",".join(map(str, BATCHES)), help="batch sizes to try")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from specli.comparison import load_workloads
    from specli.llama.backend import LoadSettings, Model
    from specli.prompt import prompt_tokens

    batches = tuple(int(b) for b in args.batches.split(","))
    shifts = []
    with Model(args.model, LoadSettings()) as model:
        for workload in load_workloads(args.prompts):
            prompt = prompt_tokens(model, workload.prompt, chat=workload.chat)
            shift = measure(model, workload.name, prompt, workload.max_tokens, batches)
            shifts.append(shift)
            if not args.json:
                place = (f"batch {shift.where[0]}, offset {shift.where[1]}, token {shift.where[2]} "
                         f"(plain margin {shift.plain_margin:.2f})") if shift.where else "-"
                print(f"{shift.workload:16} largest margin drop {shift.largest_drop:5.2f} at {place}; "
                      f"{shift.flipped} of {shift.tokens} positions flip in some shape", flush=True)
    if args.json:
        print(json.dumps([shift.__dict__ for shift in shifts]))
    elif shifts:
        print(f"largest over workloads: {max(s.largest_drop for s in shifts):.2f} logits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
