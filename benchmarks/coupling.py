"""How often a sampling draft model's token is kept: keyed (Gumbel) coupling against
rejection sampling, on the same target and draft distributions.

specli samples with keyed noise: the target's token at a position is the Gumbel-max draw
argmax(log p + g(seed, position, x)), and the draft model drafts with the same noise, so a
draft token is kept when the two draws agree. Rejection sampling (Leviathan et al. 2023)
keeps a token drawn from q with probability min(1, p/q), which keeps the first draft token
with probability sum_x min(p(x), q(x)), the best any coupling can do. This script walks a
sampled output of the target and, at every position, prints both chances for that
position's p and q: the figure behind specli's choice of sampler (docs/design.md, "Draft models").

    python benchmarks/coupling.py TARGET.gguf DRAFT.gguf -p "The quick brown fox" -n 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from specli.decode.sampling import SamplingSettings, keyed_choice, warp
from specli.llama.backend import LoadSettings, Model


def acceptance(target: Path, draft: Path, prompt: str, tokens: int, settings: SamplingSettings, keys: int,
               threads: int | None) -> dict:
    load = LoadSettings(ctx_size=1024, threads=threads)
    with Model(target, load) as big, Model(draft, load) as small:
        context = big.tokenize(prompt)
        p_row = big.decode(context)[-1].copy()
        q_row = small.decode(context)[-1].copy()
        rejection, keyed = [], []
        for position in range(len(context), len(context) + tokens):
            p, q = warp(p_row, settings), warp(q_row, settings)
            ids = np.union1d(p.ids, q.ids)
            p_dense = np.zeros(ids.size)
            q_dense = np.zeros(ids.size)
            p_dense[np.searchsorted(ids, p.ids)] = p.probs
            q_dense[np.searchsorted(ids, q.ids)] = q.probs
            rejection.append(float(np.minimum(p_dense, q_dense).sum()))
            # The keyed draws of both models at this position, under `keys` different seeds.
            keyed.append(statistics.fmean(keyed_choice(p, seed, position) == keyed_choice(q, seed, position)
                                          for seed in range(keys)))
            token = keyed_choice(p, 0, position)  # the target's own sampled text goes on
            if big.is_end_of_generation(token):
                break
            p_row = big.decode([token])[-1].copy()
            q_row = small.decode([token])[-1].copy()
    return {
        "positions": len(rejection),
        "rejection_sampling": statistics.fmean(rejection),
        "keyed_coupling": statistics.fmean(keyed),
        "temperature": settings.temperature,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("-p", "--prompt", default="The quick brown fox")
    parser.add_argument("-n", "--tokens", type=int, default=64)
    parser.add_argument("--temp", type=float, action="append", help="temperatures (repeatable; default 0.8 and 1.0)")
    parser.add_argument("--keys", type=int, default=400, help="seeds per position for the keyed estimate")
    parser.add_argument("-t", "--threads", type=int)
    args = parser.parse_args(argv)
    results = []
    for temperature in args.temp or [0.8, 1.0]:
        settings = SamplingSettings.for_temperature(temperature)
        results.append(acceptance(args.target, args.draft, args.prompt, args.tokens, settings, args.keys, args.threads))
        print(json.dumps(results[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
