"""Writes a synthetic GGUF with NextN layers (tests/support/synthetic_mtp.py): a MiMo-2, or a
Qwen3.5 (hybrid: gated delta net and attention) in the layout llama.cpp's converter writes.

    python benchmarks/synthetic_mtp.py OUT_DIR [--heads 3] [--head-scale 0]
    python benchmarks/synthetic_mtp.py OUT_DIR --shape 8b --vocab ggml-vocab-llama-bpe.gguf --workers 16
    python benchmarks/synthetic_mtp.py OUT_DIR --shape qwen35-8b --vocab ggml-vocab-llama-bpe.gguf --workers 16
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from tests.support.synthetic_mtp import (HYBRID_SHAPES, SHAPES, write_mtp_model, write_tiny_hybrid,  # noqa: E402
                                         write_tiny_mtp)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES | HYBRID_SHAPES), default="tiny",
                        help="tiny (the tests' model), 8b (Llama 3 8B's trunk, F16; give --vocab); a Qwen3.5 as "
                             "the converter writes it: qwen35 (the tests', F32), qwen35-8b (8B-shaped, F16).")
    parser.add_argument("--heads", type=int, default=1, help="NextN blocks of a MiMo-2 (default: 1).")
    parser.add_argument("--head-scale", type=float, help="What each NextN block of a MiMo-2 adds (0: nothing; default: the shape's).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the random weights.")
    parser.add_argument("--vocab", type=Path, help="A GGUF whose tokenizer to copy (default: SmolLM2's).")
    parser.add_argument("--workers", type=int, default=1, help="Threads making tensors (default: 1).")
    args = parser.parse_args(argv)
    if args.shape in HYBRID_SHAPES:  # its one NextN block (qwen35's MTP graph takes one)
        path = write_tiny_hybrid(args.out_dir, HYBRID_SHAPES[args.shape], seed=args.seed, vocab=args.vocab,
                                 name=f"{args.shape}-mtp-s{args.seed}.gguf", workers=args.workers)
    elif args.shape == "tiny" and args.vocab is None:
        path = write_tiny_mtp(args.out_dir, heads=args.heads, head_scale=args.head_scale, seed=args.seed)
    else:
        spec = dataclasses.replace(SHAPES[args.shape], n_nextn=args.heads,
                                   **({} if args.head_scale is None else {"head_scale": args.head_scale}))
        path = write_mtp_model(args.out_dir / f"mtp-{args.shape}-n{args.heads}-s{args.seed}.gguf", spec,
                               vocab=args.vocab, seed=args.seed, name=f"specli-synthetic-mtp-{args.shape}",
                               workers=args.workers)
    print(f"{path}\t{path.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
