"""Time to first token of a chat's second turn: with the KV caches kept from the first turn
(what `specli chat` does) against re-decoding the whole conversation.

    python benchmarks/chat_turns.py --target SmolLM2-135M-Instruct.Q4_1.gguf --runs 5

Each run opens a session, answers a first question, then asks a second one twice: once on the
session that answered the first (its caches hold the conversation), once after
`clear_cache` (as a fresh run, it decodes the whole conversation). It prints the median
prefill seconds of both, and the tokens each decoded.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from specli.decode.engine import Engine
from specli.decode.events import Finished
from specli.decode.request import DraftKind, GenerationRequest
from specli.llama.backend import LoadSettings
from specli.prompt import chat_tokens
from specli.session import SessionSpec, open_session

FIRST = "Write a short paragraph about lighthouses and the people who kept them."
SECOND = "Now summarise that paragraph in one sentence."


def second_turn_prefill(target: Path, draft: str, threads: int | None) -> tuple[float, int, float, int]:
    load = LoadSettings(ctx_size=2048, threads=threads)
    model = None if draft in (DraftKind.NGRAM, DraftKind.NONE) else Path(draft)
    kind = DraftKind.MODEL if model is not None else draft
    with open_session(SessionSpec(target, model, load, load)) as session:
        request = GenerationRequest(max_tokens=96, draft=kind)
        engine = session.engine_for(request)
        messages = [{"role": "user", "content": FIRST}]
        prompt = chat_tokens(session.target, messages)
        reply = [e for e in engine.generate(prompt)]
        finished = reply[-1]
        assert isinstance(finished, Finished)
        text = "".join(getattr(e, "text", "") for e in reply)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": SECOND}]
        prompt = chat_tokens(session.target, messages)
        kept = _first_token(session.engine_for(replace(request, max_tokens=1)), prompt)
        # With what the target's cache holds forgotten, as a fresh run: it decodes it all.
        session.clear_cache()
        fresh = _first_token(session.engine_for(GenerationRequest(1, draft=DraftKind.NONE)), prompt)
    return kept[0], kept[1], fresh[0], fresh[1]


def _first_token(engine: Engine, prompt: list[int]) -> tuple[float, int]:
    for event in engine.generate(prompt):
        if isinstance(event, Finished):
            stats = event.stats
            return stats.prefill_seconds, stats.prompt_tokens - stats.prompt_cached
    raise AssertionError("no Finished event")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--draft", default="ngram")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("-t", "--threads", type=int)
    args = parser.parse_args(argv)
    samples = [second_turn_prefill(args.target, args.draft, args.threads) for _ in range(args.runs)]
    kept = statistics.median(s[0] for s in samples)
    fresh = statistics.median(s[2] for s in samples)
    print(f"turn 2, caches kept: {kept * 1000:.1f} ms to the first token ({samples[0][1]} tokens decoded)")
    print(f"turn 2, re-decoded:  {fresh * 1000:.1f} ms to the first token ({samples[0][3]} tokens decoded)")
    print(f"ratio: {fresh / kept:.1f}x (medians of {args.runs} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
