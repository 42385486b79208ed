"""Drafting with an image in the prompt against plain decoding with the same image.

    python benchmarks/vision_bench.py --smollm SmolLM2-135M-Instruct.Q4_1.gguf --gemma gemma-3-270m-q4_k_m.gguf

The projectors are the synthetic ones of tests/support/synthetic_vision.py (a red image embeds
as " red": no real vision model ships on a package registry), written for each target. Each
prompt is an image followed by text the answer copies (what reading a form or repeating the
question's words does). Sides, each a session of its own, all on the same prompts, alternating
within each round: plain (`--draft none`), lookup (`ngram`, `-k auto`) and a draft model
(`-k auto`: SmolLM2 for itself; for Gemma, SmolLM2 through text). It prints each side's decode
tok/s (median over rounds of the prompts' total), its ratio to plain taken within each round
(median), the tokens the answers share with plain's (lossless: all), and the image's encode
and the prompt's prefill times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specli.decode.request import DraftKind, GenerationRequest  # noqa: E402
from specli.llama import vision  # noqa: E402
from specli.llama.backend import LoadSettings  # noqa: E402
from specli.prompt import prompt_with_images  # noqa: E402
from specli.session import SessionSpec, open_session  # noqa: E402
from specli.stream import stream  # noqa: E402
from tests.support import synthetic_vision as sv  # noqa: E402

PROMPTS = [
    "\nCopy this line exactly: The red fox and the blue bird met at the old mill by the river every morning.",
    "\nRepeat the form's fields as a list: name, address, city, postcode, country, phone number, email.",
    "\nWrite this sentence three times: The quick brown fox jumps over the lazy dog.",
    "\nWhat colour is the image? Then copy: Invoice 4471, due 30 June, amount 1,250.00 EUR, paid by card.",
]


class Quiet:
    def start(self) -> None: ...
    def token(self, event) -> None: ...
    def step(self, record) -> None: ...
    def finish(self, stats) -> None: ...


def run_side(target: Path, projector: Path, draft: Path | None, kind: str, image: vision.Image, chat: bool,
             max_tokens: int, threads: int | None) -> dict:
    load = LoadSettings(ctx_size=1024, threads=threads)
    spec = SessionSpec(target, draft, load, load, projector=projector)
    totals = {"tokens": 0, "seconds": 0.0, "encode": 0.0, "prefill": 0.0, "accepted": 0, "texts": []}
    with open_session(spec) as session:
        request = GenerationRequest(max_tokens=max_tokens, draft=kind)
        for prompt in PROMPTS:
            session.clear_cache()  # each prompt decoded whole, its image encoded, as a fresh run
            tokens, media = prompt_with_images(session.projector, session.target, prompt, [image], chat=chat)
            outcome = stream(session.engine_for(request, images=True), tokens, Quiet(), media=media)
            stats = outcome.stats
            totals["tokens"] += stats.tokens
            totals["seconds"] += stats.seconds
            totals["encode"] += stats.encode_seconds
            totals["prefill"] += stats.prefill_seconds
            totals["accepted"] += stats.accepted
            totals["texts"].append(outcome.tokens)
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smollm", type=Path, required=True)
    parser.add_argument("--gemma", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", "--max-tokens", type=int, default=64)
    parser.add_argument("-t", "--threads", type=int)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="vision-bench-"))
    image = vision.read_image(sv.png_bytes(sv.RED), "red.png")
    pairs = [("SmolLM2", args.smollm, True, args.smollm)]
    if args.gemma is not None:
        pairs.append(("Gemma 3 270M", args.gemma, False, args.smollm))
    for name, target, chat, draft in pairs:
        projector = sv.write_projector(folder / f"mmproj-{target.stem}.gguf", target)
        sides = {"plain": (None, DraftKind.NONE), "lookup": (None, DraftKind.NGRAM),
                 "draft model": (draft, DraftKind.MODEL)}  # (with lookup in front, as a pair drafts)
        rates: dict[str, list[float]] = {side: [] for side in sides}
        ratios: dict[str, list[float]] = {side: [] for side in sides}
        last: dict[str, dict] = {}
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            runs = {side: run_side(target, projector, sides[side][0], sides[side][1], image, chat,
                                   args.max_tokens, args.threads) for side in order}
            plain = runs["plain"]["tokens"] / runs["plain"]["seconds"]
            for side, totals in runs.items():
                rate = totals["tokens"] / totals["seconds"]
                rates[side].append(rate)
                ratios[side].append(rate / plain)
            last = runs
        print(f"{name} ({len(PROMPTS)} prompts, an image each, {args.max_tokens} tokens, {args.rounds} rounds)")
        for side in sides:
            same = sum(a == b for a, b in zip(last[side]["texts"], last["plain"]["texts"]))
            print(f"  {side:12s} {statistics.median(rates[side]):6.1f} tok/s  {statistics.median(ratios[side]):.2f}x plain "
                  f"(rounds {', '.join(f'{r:.2f}' for r in ratios[side])})  accepted {last[side]['accepted']}  "
                  f"same text {same}/{len(PROMPTS)}  encode {1000 * last[side]['encode'] / len(PROMPTS):.1f} ms  "
                  f"prefill {1000 * last[side]['prefill'] / len(PROMPTS):.0f} ms a prompt")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
