"""Prefill per turn of a three-turn chat on a hybrid target (recurrent layers beside attention,
as Qwen3.5/3.6 have), with the target's state checkpoints (what `specli chat` and `serve` keep)
and without them (a rewind into the conversation then decodes it all again).

    python benchmarks/hybrid_chat.py --runs 3
    python benchmarks/hybrid_chat.py --target Qwen3.5-0.8B-Q8_0.gguf --runs 3

Without --target it writes a synthetic Qwen3.5 (tests/support/synthetic_mtp.py; n_embd 512,
12 layers, SmolLM2's vocabulary) and chats through a template that drops an earlier answer's
reasoning as Qwen3.5's does, so each turn's prompt parts from the cache at the last answer. A
long system prompt stands for an agent's instructions. Each turn answers greedily (plain
decoding); the figures are medians over the runs, sides alternating within each run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from tests.support.synthetic_mtp import REASONING_TEMPLATE, HybridSpec, write_tiny_hybrid  # noqa: E402
from specli.decode.events import Finished, Token  # noqa: E402
from specli.decode.request import DraftKind, GenerationRequest  # noqa: E402
from specli.llama.backend import STATE_CHECKPOINTS, LoadSettings  # noqa: E402
from specli.prompt import chat_tokens  # noqa: E402
from specli.session import SessionSpec, open_session  # noqa: E402

SYSTEM = " ".join(f"Rule {i}: answer plainly, cite the file you read, and keep each step short." for i in range(40))
QUESTIONS = ("Which files define the engine, and what does each hold?", "And where are the costs stored?",
             "Summarise both answers in a sentence.")
SHAPE = HybridSpec(n_embd=512, n_layer=12, n_head=8, n_head_kv=2, n_ff=1536, ssm_heads=4, ssm_head_dim=64)


def conversation(target: Path, template: str | None, checkpoints: int, threads: int | None,
                 max_tokens: int) -> list[tuple[int, int, float]]:
    """Per turn: prompt tokens, positions the target decoded for it, prefill seconds."""
    load = LoadSettings(ctx_size=4096, threads=threads, recurrent_snapshots=0)
    spec = SessionSpec(target, None, load, load, chat_template=template, checkpoints=checkpoints)
    with open_session(spec) as session:
        engine = session.engine_for(GenerationRequest(max_tokens=max_tokens, draft=DraftKind.NONE))
        messages = [{"role": "system", "content": SYSTEM}]
        turns = []
        for question in QUESTIONS:
            messages.append({"role": "user", "content": question})
            prompt = chat_tokens(session.target, messages)
            decoded: list[int] = []
            session.target.on_decode = lambda first, n: decoded.append(n)
            events = list(engine.generate(prompt))
            finished = next(event for event in events if isinstance(event, Finished))
            text = "".join(event.text for event in events if isinstance(event, Token))
            messages.append({"role": "assistant", "content": text})
            steps = max(0, finished.stats.tokens - 1)  # each generation step decodes one token
            turns.append((len(prompt), sum(decoded) - steps, finished.stats.prefill_seconds))
    return turns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, help="A hybrid GGUF (default: a synthetic Qwen3.5, written now).")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("-n", "--max-tokens", type=int, default=48)
    parser.add_argument("-t", "--threads", type=int)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        target, template = (args.target, None) if args.target else (write_tiny_hybrid(folder, SHAPE), REASONING_TEMPLATE)
        sides = {"without": 0, "with": STATE_CHECKPOINTS}
        results: dict[str, list[list[tuple[int, int, float]]]] = {side: [] for side in sides}
        for run in range(args.runs):
            for side in (list(sides) if run % 2 == 0 else list(sides)[::-1]):
                results[side].append(conversation(target, template, sides[side], args.threads, args.max_tokens))
    print("| turn | prompt tokens | decoded without checkpoints | prefill without | decoded with | prefill with | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for turn in range(len(QUESTIONS)):
        row = {side: [run[turn] for run in results[side]] for side in sides}
        prompt = row["with"][0][0]
        seconds = {side: statistics.median(r[2] for r in row[side]) for side in sides}
        decoded = {side: statistics.median(r[1] for r in row[side]) for side in sides}
        print(f"| {turn + 1} | {prompt} | {decoded['without']:.0f} | {seconds['without'] * 1000:.0f} ms "
              f"| {decoded['with']:.0f} | {seconds['with'] * 1000:.0f} ms | {seconds['without'] / seconds['with']:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
