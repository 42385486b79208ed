"""Measure a target's verify-cost curve (seconds per all-logits decode, every batch size from
1 to 49) under given load settings, as a JSON file that `replay.py replay --costs` reads.

`-k auto` must never lose to plain decoding on any curve it may meet, so the policy is
replayed on several: this box as it runs by default, with llama.cpp's weight repacking off
(`--no-repack`), on one thread (`-t 1`), the synthetic memory-bound target, and the paper
model's GPU curve (named in replay.py).

    python benchmarks/cost_curves.py -m gemma.gguf -o benchmarks/out/curves/box.json
    python benchmarks/cost_curves.py -m gemma.gguf --no-repack -o benchmarks/out/curves/no-repack.json
    python benchmarks/cost_curves.py -m gemma.gguf -t 1 -o benchmarks/out/curves/t1.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from specli.decode.adaptive import MAX_DRAFT
from specli.decode.costs import calibrate
from specli.llama.backend import LoadSettings
from specli.session import SessionSpec, open_session


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, required=True)
    parser.add_argument("-t", "--threads", type=int)
    parser.add_argument("--no-repack", action="store_true")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes over the sizes (each size's fastest kept)")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)

    load = LoadSettings(threads=args.threads, repack=not args.no_repack)
    with open_session(SessionSpec(args.model, target_load=load)) as session:
        target = session.target
        token = target.bos if target.bos >= 0 else 0
        sizes = tuple(range(1, MAX_DRAFT + 2))
        outcome = calibrate(lambda tokens: target.decode(tokens, all_logits=True), target.rewind, token, sizes,
                            args.repeats)
    if outcome.problem is not None:
        print(f"the machine was too busy to measure: {outcome.problem}", file=sys.stderr)
        return 1
    seconds = outcome.verify
    settings = [f"-t {args.threads}" if args.threads else "", "--no-repack" if args.no_repack else ""]
    source = f"{args.model.name} {' '.join(s for s in settings if s)} on {platform.machine()}, cost_curves.py".replace("  ", " ")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"source": source, "seconds": seconds}, indent=1))
    ratios = {size: seconds[size] / seconds[1] for size in (2, 4, 8, 16, 49)}
    print(f"{args.output}: 1 token {1e3 * seconds[1]:.1f} ms; " +
          ", ".join(f"{size}: {ratio:.2f}x" for size, ratio in ratios.items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
