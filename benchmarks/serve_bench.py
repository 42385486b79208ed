"""Replay server traffic against `specli serve` and llama.cpp's `llama-server`, same model.

Two kinds of traffic, both on /v1/completions (or, with --chat, on /v1/chat/completions as
messages), streamed (so the time to the first token is seen), greedy:

- agent: a coding agent's conversation that resends its whole history every turn and
  writes one JSON tool call per turn. The history is scripted (the same prompts reach every
  server); each turn's answer is measured, then the scripted answer is appended.
- edit: code edits (rename a name in a function), sent without a Predicted Output, with one
  (`prediction`: the edited code, or the code before the edit, what an editor holds), and with
  the target's own answer as the prediction (one that is right); llama-server has no
  `prediction`, so it gets the edits alone.

Configurations: specli plain (`--draft none`), specli with n-gram drafting and its suffix
memory on and off, and llama-server plain and with each n-gram `--spec-type` (and the
ngram-mod,ngram-simple chain). Every round starts every server afresh for each kind of
traffic, in a rotated order, so no server carries caches or memory from one replay into the
next. The report gives per
configuration and traffic: tokens per second over the whole replay (completion tokens /
request time), median time to the first token, acceptance, and whether the text equals
specli plain's.

    python benchmarks/serve_bench.py --target gemma.gguf --llama-server PATH [--rounds 3] [--json OUT]
    python benchmarks/serve_bench.py --chat --target smollm2-instruct.gguf --llama-server PATH
    python benchmarks/serve_bench.py --target gemma.gguf --exact --traffic edit,"edit + old code as prediction"

--exact starts specli's servers with --exact and asks every request for `exact: true`
(llama-server is left out); --traffic replays only the kinds named.

Build llama-server from the llama.cpp that llama-cpp-python vendors:
    TARGETS=llama-server benchmarks/build_llama_cpp.sh
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: benchmarks/ is a package
from tests.support.harness import free_port, stop, wait_healthy  # noqa: E402

LLAMA_SPEC_TYPES = ("ngram-simple", "ngram-mod", "ngram-map-k", "ngram-map-k4v", "ngram-cache", "ngram-mod,ngram-simple")

AGENT_SYSTEM = """You are a coding agent working in a Python repository. Each turn, call exactly one tool by
writing one JSON object on one line: {"tool": NAME, "arguments": {...}}. Tools: read_file(path),
list_dir(path), grep(pattern, path), run_tests(path), edit_file(path, old, new).

User: Show the top of the repository.
Assistant: {"tool": "list_dir", "arguments": {"path": "."}}
Tool: README.md\nsrc\ntests\npyproject.toml

User: Read the README.
Assistant: {"tool": "read_file", "arguments": {"path": "README.md"}}
Tool: # app\nA small command-line application.
"""
AGENT_TURNS = [
    ("Find where the configuration is loaded.", '{"tool": "grep", "arguments": {"pattern": "load_config", "path": "src"}}',
     "src/app/config.py:12: def load_config(path):\nsrc/app/main.py:8: config = load_config(args.config)"),
    ("Read the loader.", '{"tool": "read_file", "arguments": {"path": "src/app/config.py"}}',
     "def load_config(path):\n    with open(path) as f:\n        return json.load(f)"),
    ("List the tests.", '{"tool": "list_dir", "arguments": {"path": "tests"}}',
     "test_config.py\ntest_main.py\ntest_utils.py"),
    ("Read the config tests.", '{"tool": "read_file", "arguments": {"path": "tests/test_config.py"}}',
     "def test_load_config(tmp_path):\n    (tmp_path / 'c.json').write_text('{}')\n    assert load_config(tmp_path / 'c.json') == {}"),
    ("Run the config tests.", '{"tool": "run_tests", "arguments": {"path": "tests/test_config.py"}}',
     "1 passed in 0.02s"),
    ("Find every caller of the loader.", '{"tool": "grep", "arguments": {"pattern": "load_config(", "path": "src"}}',
     "src/app/main.py:8: config = load_config(args.config)\nsrc/app/cli.py:21: cfg = load_config(path)"),
    ("Read the command line module.", '{"tool": "read_file", "arguments": {"path": "src/app/cli.py"}}',
     "def main(path):\n    cfg = load_config(path)\n    return run(cfg)"),
    ("Make the loader accept a missing file.", '{"tool": "edit_file", "arguments": {"path": "src/app/config.py", "old": "    with open(path) as f:", "new": "    if not os.path.exists(path):\\n        return {}\\n    with open(path) as f:"}}',
     "edited src/app/config.py"),
    ("Run all the tests.", '{"tool": "run_tests", "arguments": {"path": "tests"}}',
     "9 passed in 0.11s"),
    ("Read the main module.", '{"tool": "read_file", "arguments": {"path": "src/app/main.py"}}',
     "import argparse\nfrom app.config import load_config\n"),
]
AGENT_MAX_TOKENS = 48
EDIT_MAX_TOKENS = 200

EDIT_SOURCES = [
    ("total", "amount", '''def apply_discount(items, total, rate):
    """Return the total after a discount, and the saving."""
    if total <= 0:
        return total, 0
    saving = round(total * rate, 2)
    total = total - saving
    for item in items:
        item["price"] = round(item["price"] * (1 - rate), 2)
    return total, saving


def summarise(items, total):
    lines = [f"{item['name']}: {item['price']}" for item in items]
    lines.append(f"total: {total}")
    return "\\n".join(lines)
'''),
    ("path", "location", '''def read_rows(path, skip_header=True):
    rows = []
    with open(path, newline="") as handle:
        reader = csv.reader(handle)
        if skip_header:
            next(reader, None)
        for row in reader:
            if row:
                rows.append(row)
    return rows


def write_rows(path, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerows(rows)
    return len(rows)
'''),
]


@dataclass
class Result:
    seconds: float = 0.0
    tokens: int = 0
    first_token: list[float] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    texts: list[str] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@contextmanager
def specli_server(target: Path, *extra: str) -> Iterator[str]:
    port = free_port()
    # stderr is not read while the benchmark runs: a pipe would fill with request lines and stall it
    process = subprocess.Popen([sys.executable, "-m", "specli", "serve", "--target", str(target), "--port", str(port),
                                *extra], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(process, url, 120, "specli serve")
        yield url
    finally:
        stop(process, timeout=60)


@contextmanager
def llama_server(binary: Path, target: Path, spec_type: str | None, ctx: int, slots: int = 1,
                 draft: Path | None = None) -> Iterator[str]:
    """llama-server with `slots` slots (-np) of `ctx` positions each (its -c is divided between
    them); `draft`: its draft model (-md)."""
    port = free_port()
    command = [str(binary), "-m", str(target), "--host", "127.0.0.1", "--port", str(port), "-c", str(ctx * slots),
               "-t", str(os.cpu_count() or 1), "-np", str(slots), "--no-webui"]
    if spec_type:
        command += ["--spec-type", spec_type]
    if draft is not None:
        command += ["-md", str(draft)]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(process, url, 120, f"llama-server ({' '.join(command)})")
        yield url
    finally:
        stop(process)


EXTRA: dict = {}  # fields every request carries (--exact)


def complete(url: str, prompt: str | list[dict], max_tokens: int, result: Result, extra: dict | None = None) -> str:
    """One streamed greedy completion of a raw prompt (a string: /v1/completions) or of chat
    messages (a list: /v1/chat/completions); adds its time, tokens and drafting to `result`."""
    chat = isinstance(prompt, list)
    body = {"messages" if chat else "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **EXTRA, **(extra or {})}
    started = time.perf_counter()
    first = None
    pieces: list[str] = []
    final: dict = {}
    with httpx.stream("POST", url + ("/v1/chat/completions" if chat else "/v1/completions"), json=body,
                      timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            choice = data["choices"][0] if data.get("choices") else {}
            piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            if piece:
                first = first or time.perf_counter()
                pieces.append(piece)
            if data.get("usage") or data.get("timings"):
                final = data
    result.seconds += time.perf_counter() - started
    result.first_token.append((first or time.perf_counter()) - started)
    usage = final.get("usage") or {}
    timings = final.get("timings") or {}
    result.tokens += usage.get("completion_tokens") or timings.get("predicted_n") or len(pieces)
    result.drafted += timings.get("draft_n", 0)
    result.accepted += timings.get("draft_n_accepted", 0)
    text = "".join(pieces)
    result.texts.append(text)
    return text


def agent_messages() -> tuple[list[dict], str]:
    """AGENT_SYSTEM as chat messages: its first paragraph as the system message, then each
    example exchange as a user and an assistant message, the tool's output opening the next
    user message (returned last, for the first scripted turn)."""
    system, examples = AGENT_SYSTEM.split("\n\n", 1)
    messages = [{"role": "system", "content": system}]
    output = ""
    for exchange in examples.strip().split("\n\nUser: "):
        task, call, next_output = re.fullmatch(r"(?:User: )?(.*)\nAssistant: (.*)\nTool: (.*)", exchange, re.S).groups()
        messages += [{"role": "user", "content": tool_and_task(output, task)}, {"role": "assistant", "content": call}]
        output = next_output
    return messages, output


def tool_and_task(output: str, task: str) -> str:
    return f"Tool: {output}\n\n{task}" if output else task


def agent(url: str, chat: bool) -> Result:
    """The agent's turns, its whole history resent each turn: as one raw prompt, or as chat
    messages (the tool's output and the next task in one user message)."""
    result = Result()
    history = AGENT_SYSTEM
    messages, pending = agent_messages()
    for task, call, output in AGENT_TURNS:
        if chat:
            messages.append({"role": "user", "content": tool_and_task(pending, task)})
            complete(url, messages, AGENT_MAX_TOKENS, result)
            messages.append({"role": "assistant", "content": call})
            pending = output
        else:
            history += f"\nUser: {task}\nAssistant: "
            complete(url, history, AGENT_MAX_TOKENS, result, {"stop": ["\n"]})
            history += f"{call}\nTool: {output}\n"
    return result


def edit_prompt(old: str, new: str, code: str) -> str:
    return f"# The same code with `{old}` renamed to `{new}` everywhere.\n\n# Before:\n{code}\n# After:\n"


def edit_messages(old: str, new: str, code: str) -> list[dict]:
    return [{"role": "user", "content": f"Rename `{old}` to `{new}` everywhere in this code. Reply with the whole "
                                        f"code only.\n\n```python\n{code}```"}]


def edits(url: str, chat: bool, predictions: Sequence[str] | None = None) -> Result:
    """Each edit once, with `predictions` (one per edit) as Predicted Outputs if given."""
    result = Result()
    for index, (old, new, code) in enumerate(EDIT_SOURCES):
        if chat:
            prompt, extra = edit_messages(old, new, code), {}
        else:
            prompt, extra = edit_prompt(old, new, code), {"stop": ["\n# ", "\n\n\n\n"]}
        if predictions is not None:
            extra["prediction"] = {"type": "content", "content": predictions[index]}
        complete(url, prompt, EDIT_MAX_TOKENS, result, extra)
    return result


def old_code(chat: bool) -> list[str]:
    """The code before each edit: what an editor sends when it predicts the file unchanged."""
    return [f"```python\n{code}```" if chat else code for _, _, code in EDIT_SOURCES]


def edited_code(chat: bool) -> list[str]:
    """The edits done right: each name renamed (fenced for chat, as an instruction model
    answers). What an editor sends as the prediction."""
    edited = [re.sub(rf"\b{old}\b", new, code) for old, new, code in EDIT_SOURCES]
    return [f"```python\n{code}```" if chat else code for code in edited]


def configurations(target: Path, binary: Path | None, ctx: int, exact: bool = False):
    """(name, server context manager factory, specli?) for every configuration (`exact`: specli
    servers started with --exact, which loads the weights as exactness wants them)."""
    common = ("-c", str(ctx), *(("--exact",) if exact else ()))
    yield "specli plain", lambda: specli_server(target, "--draft", "none", *common), True
    yield "specli ngram", lambda: specli_server(target, *common), True
    yield "specli ngram, no memory", lambda: specli_server(target, "--no-memory", *common), True
    if binary is not None:
        yield "llama-server plain", lambda: llama_server(binary, target, None, ctx), False
        for spec_type in LLAMA_SPEC_TYPES:
            yield f"llama-server {spec_type}", (lambda s=spec_type: llama_server(binary, target, s, ctx)), False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True, help="The GGUF both servers serve.")
    parser.add_argument("--llama-server", type=Path, help="llama-server binary (leave out to measure specli only).")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-c", "--ctx-size", type=int, default=4096)
    parser.add_argument("--chat", action="store_true",
                        help="Send chat messages to /v1/chat/completions (an instruction model with a chat template).")
    parser.add_argument("--json", type=Path, help="Write every measurement here.")
    parser.add_argument("--exact", action="store_true", help="specli servers with --exact, every request exact: true (no llama-server).")
    parser.add_argument("--traffic", help="Comma-separated kinds to replay (default: all): agent, edit, "
                                          "edit + prediction, edit + old code as prediction, edit + its own text as prediction.")
    args = parser.parse_args(argv)

    configs = list(configurations(args.target, None if args.exact else args.llama_server, args.ctx_size, args.exact))
    if args.exact:
        EXTRA["exact"] = True
    chat = args.chat
    # The edits are sent three ways: alone; with the edit done right as the prediction (what an
    # editor sends, though a small model may not do the edit); and with the text the target
    # writes itself as the prediction (a prediction that is right: the most drafting can
    # gain on this machine). That text comes from a specli plain server before the rounds.
    with configs[0][1]() as url:
        own_text = edits(url, chat).texts
    traffic = {"agent": lambda url: agent(url, chat), "edit": lambda url: edits(url, chat),
               "edit + prediction": lambda url: edits(url, chat, edited_code(chat)),
               "edit + old code as prediction": lambda url: edits(url, chat, old_code(chat)),
               "edit + its own text as prediction": lambda url: edits(url, chat, own_text)}
    if args.traffic:
        named = [kind.strip() for kind in args.traffic.split(",")]
        unknown = [kind for kind in named if kind not in traffic]
        if unknown:
            parser.error(f"unknown traffic {unknown[0]!r}: one of {', '.join(traffic)}")
        traffic = {kind: traffic[kind] for kind in named}
    rounds: dict[tuple[str, str], list[Result]] = {}
    for round_index in range(args.rounds):
        shift = round_index % len(configs)
        for name, server, is_specli in configs[shift:] + configs[:shift]:
            # A fresh server for each kind of traffic: no KV cache or suffix memory from one
            # replay helps the next (the edits with a prediction repeat the edits' prompts).
            for kind, replay in traffic.items():
                if "prediction" in kind and not is_specli:
                    continue
                with server() as url:
                    rounds.setdefault((name, kind), []).append(replay(url))
            print(f"serve_bench: round {round_index + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)

    report = []
    for (name, kind), results in rounds.items():
        reference = rounds.get(("specli plain", "edit" if "prediction" in kind else kind))
        same = reference is not None and all(r.texts == reference[0].texts for r in results)
        report.append({
            "config": name, "traffic": kind,
            "tokens_per_second": statistics.median(r.tokens_per_second for r in results),
            "first_token_ms": 1000 * statistics.median(t for r in results for t in r.first_token),
            "acceptance": (sum(r.accepted for r in results) / sum(r.drafted for r in results)
                           if sum(r.drafted for r in results) else None),
            "same_text_as_specli_plain": same,
            "runs": [r.tokens_per_second for r in results],
            "texts": results[0].texts,
        })
    for kind in traffic:
        rows = [row for row in report if row["traffic"] == kind]
        plain = next((row["tokens_per_second"] for row in rows if row["config"] == "specli plain"), None)
        if "prediction" in kind:  # against the edits' own plain decoding, with no prediction
            plain = next((row["tokens_per_second"] for row in report
                          if row["traffic"] == "edit" and row["config"] == "specli plain"), None)
        print(f"\n{kind}\n| config | tok/s | vs specli plain | first token ms | acceptance | = specli plain |")
        print("| --- | --- | --- | --- | --- | --- |")
        for row in rows:
            ratio = f"{row['tokens_per_second'] / plain:.2f}x" if plain else "-"
            accept = f"{100 * row['acceptance']:.0f}%" if row["acceptance"] is not None else "-"
            print(f"| {row['config']} | {row['tokens_per_second']:.1f} | {ratio} | {row['first_token_ms']:.0f} | "
                  f"{accept} | {'yes' if row['same_text_as_specli_plain'] else 'no'} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
