"""Tool calls in an agent's session: specli serve and llama-server, turn by turn.

benchmarks/prompts/agent.toml is a coding agent's session: a task, four tools (read_file, grep,
edit_file, run_tests) and 24 steps, each a call and the tool's answer. Turn N sends
/v1/chat/completions the system message, the task and steps 1..N-1 (each an assistant message
with its call, then the tool message), with the tools, `tool_choice: "required"`,
`parallel_tool_calls: false`, temperature 0 and `max_tokens` (-n, default 160): the model writes
the next call, constrained to the tools' schemas. Most calls copy a path, a name or a line from
an earlier tool result, as an agent's do.

Configurations, each a server on 127.0.0.1 given the same chat template (--template; default
the tests' Hermes-format template, as the installable models have no template with tools):
  specli          `specli serve` with its default drafting (the grammar forces the call's frame,
                  n-gram lookup copies arguments)
  specli plain    `specli serve --draft none`: one token per step under the same constraint
  llama plain     `llama-server --jinja --chat-template-file T`, no speculation, sent the same
                  /v1/chat/completions request
  llama <type>    the same with `--spec-type <type>`, for each n-gram type of --modes
  llama strict …  the same servers, sent the turn's prompt as llama.cpp renders it (/apply-template)
                  to /completion with a grammar that allows one call and nothing else, with
                  json.dumps's whitespace, as specli writes it. llama-server's own grammar for
                  "required" lets the model write any text before the call (an `until
                  <tool_call>` rule) and any whitespace inside it: a small model then often
                  never calls, and no text matches specli's. This grammar is llama.cpp's own
                  for the calls' JSON schema (echoed by a one-token request), its whitespace made
                  ", " and ": ", inside "<tool_call>\n" ... "\n</tool_call>"

A replay runs every turn once per configuration, in an order that rotates by turn; the servers
start before a replay and stop after it (each replay is a fresh session: what a server learns
across requests it learns from the turns before, as in a real session). --runs replays (default
3); per turn the report takes the median rate. A rate is `timings.predicted_n` over
`timings.predicted_ms` (the answer after its prompt is read; both servers report them).

Reported, per configuration: calls that parse (the server's `message.tool_calls`) and meet their
tool's schema; tokens/s over the whole session (all turns' tokens over all their time); and for
specli, the geometric mean and lowest of the per-turn ratios to specli plain, and to the fastest
llama-server configuration whose call is the same (name and arguments, as JSON) on that turn.

    python benchmarks/agent_tools.py --runs 3 -t 1
    python benchmarks/agent_tools.py --runs 1 --turns 6 --json > benchmarks/out/agent.json

Only the standard library is used (and structured.py beside it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: benchmarks/ is a package
from tests.support.harness import free_port  # noqa: E402
from benchmarks.structured import (  # noqa: E402
    DEFAULT_MODEL,
    DEFAULT_SERVER,
    LLAMA_SERVER_ENV,
    RunError,
    Server,
    post,
    server_spec_types,
    validate,
)

HERE = Path(__file__).resolve().parent
DEFAULT_SESSION = HERE / "prompts" / "agent.toml"
DEFAULT_TEMPLATE = HERE.parent / "tests" / "data" / "templates" / "smollm2-hermes-tools.jinja"
DEFAULT_MODES = ("ngram-simple", "ngram-mod", "ngram-map-k")
SPECLI, SPECLI_PLAIN, LLAMA_PLAIN = "specli", "specli plain", "llama plain"


def load_session(path: Path) -> dict:
    import tomllib

    session = tomllib.loads(path.read_text(encoding="utf-8"))
    session["openai_tools"] = [{"type": "function", "function": tool} for tool in session["tools"]]
    session["schemas"] = {tool["name"]: tool["parameters"] for tool in session["tools"]}
    return session


def turn_messages(session: dict, turn: int) -> list[dict]:
    """The conversation before turn `turn` (0-based): system, task, then steps[:turn]."""
    messages = [{"role": "system", "content": session["system"]}, {"role": "user", "content": session["task"]}]
    for i, step in enumerate(session["steps"][:turn]):
        call_id = f"call_{i:04d}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": step["call"]["name"], "arguments": json.dumps(step["call"]["arguments"])}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": step["result"]})
    return messages


def measure_turn(port: int, name: str, session: dict, turn: int, args: argparse.Namespace) -> dict:
    body = {"model": "x", "messages": turn_messages(session, turn), "tools": session["openai_tools"],
            "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0, "top_k": 1, "seed": 42,
            "max_tokens": args.max_tokens}
    reply = post(port, "/v1/chat/completions", body, args.timeout, name)
    timings = reply.get("timings") or {}
    tokens, ms = int(timings.get("predicted_n", 0)), float(timings.get("predicted_ms", 0.0))
    choice = (reply.get("choices") or [{}])[0]
    calls = (choice.get("message") or {}).get("tool_calls") or []
    errors: list[str] = []
    call = None
    if len(calls) != 1:
        errors.append(f"{len(calls)} calls")
    else:
        function = calls[0].get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "")
        except json.JSONDecodeError as error:
            arguments, errors = None, [f"arguments are not JSON: {error.msg}"]
        schema = session["schemas"].get(function.get("name"))
        if schema is None:
            errors.append(f"no tool {function.get('name')!r}")
        elif arguments is not None:
            errors += validate(arguments, schema)
        call = {"name": function.get("name"), "arguments": arguments}
    spans = choice.get("spans") or []
    forced = sum(len(span["text"]) for span in spans if span.get("proposer") == "grammar")
    written = sum(len(span["text"]) for span in spans)
    return {"tokens": tokens, "ms": ms, "rate": tokens / ms * 1000 if ms > 0 else 0.0, "call": call,
            "errors": errors, "finish": choice.get("finish_reason"), "forced_chars": forced,
            "written_chars": written, "drafted": timings.get("draft_n", 0),
            "accepted": timings.get("draft_n_accepted", 0)}


def strict_grammar(port: int, session: dict, timeout: float) -> str:
    """llama.cpp's grammar for one call to any of the tools (see the module doc)."""
    calls = [{"type": "object", "properties": {"name": {"const": tool["name"]}, "arguments": tool["parameters"]},
              "required": ["name", "arguments"], "additionalProperties": False} for tool in session["tools"]]
    body = {"prompt": "{", "n_predict": 1, "json_schema": {"anyOf": calls}, "cache_prompt": False}
    reply = post(port, "/completion", body, timeout, "llama strict")
    grammar = (reply.get("generation_settings") or {}).get("grammar")
    if not grammar or not re.search(r"^root ::= ", grammar, flags=re.MULTILINE):
        raise RunError("llama-server echoed no grammar for the tools' schema")
    grammar = grammar.replace('"," space', '", "').replace('":" space', '": "')
    grammar = re.sub(r"^space ::= .*$", 'space ::= ""', grammar, flags=re.MULTILINE)
    grammar = re.sub(r"^root ::= ", "call ::= ", grammar, flags=re.MULTILINE)
    return 'root ::= "<tool_call>\\n" call "\\n</tool_call>"\n' + grammar


def measure_strict(port: int, name: str, session: dict, turn: int, args: argparse.Namespace, grammar: str) -> dict:
    """The turn through /completion under the strict grammar; the call read from its text."""
    prompt = post(port, "/apply-template", {"messages": turn_messages(session, turn), "tools": session["openai_tools"]},
                  args.timeout, name)["prompt"]
    reply = post(port, "/completion", {"prompt": prompt, "grammar": grammar, "n_predict": args.max_tokens,
                                       "temperature": 0, "top_k": 1, "seed": 42}, args.timeout, name)
    timings = reply.get("timings") or {}
    tokens, ms = int(timings.get("predicted_n", 0)), float(timings.get("predicted_ms", 0.0))
    text = reply.get("content", "")
    found = re.fullmatch(r"\s*<tool_call>\n(.*)\n</tool_call>\s*", text, flags=re.S)
    errors, call = [], None
    try:
        value = json.loads(found.group(1)) if found else None
    except json.JSONDecodeError as error:
        value, errors = None, [f"not JSON: {error.msg}"]
    if isinstance(value, dict):
        call = {"name": value.get("name"), "arguments": value.get("arguments")}
        schema = session["schemas"].get(call["name"])
        errors += [f"no tool {call['name']!r}"] if schema is None else validate(call["arguments"], schema)
    elif not errors:
        errors.append("no call")
    return {"tokens": tokens, "ms": ms, "rate": tokens / ms * 1000 if ms > 0 else 0.0, "call": call, "errors": errors,
            "finish": reply.get("stop_type"), "forced_chars": 0, "written_chars": len(text),
            "drafted": timings.get("draft_n", 0), "accepted": timings.get("draft_n_accepted", 0)}


def specli_command(args: argparse.Namespace, port: int, plain: bool) -> list[str]:
    command = [*shlex.split(args.specli), "serve", "--target", str(args.model), "--chat-template-file",
               str(args.template), "--port", str(port), "-c", str(args.ctx_size)]
    if plain:
        command += ["--draft", "none"]
    if args.threads is not None:
        command += ["-t", str(args.threads)]
    return command + list(args.specli_arg)


def llama_command(args: argparse.Namespace, port: int, mode: str | None) -> list[str]:
    command = [args.llama_server, "-m", str(args.model), "--jinja", "--chat-template-file", str(args.template),
               "-c", str(args.ctx_size), "--host", "127.0.0.1", "--port", str(port), "-np", "1", "--no-webui"]
    if mode:
        command += ["--spec-type", mode]
    if args.threads is not None:
        command += ["-t", str(args.threads), "-tb", str(args.threads)]
    return command + list(args.llama_arg)


def configurations(args: argparse.Namespace, modes: list[str]) -> list[tuple[str, callable]]:
    """(name, the command for a port); a "llama strict" server is sent strict-grammar requests."""
    llama = [(LLAMA_PLAIN, None), *((f"llama {mode}", mode) for mode in modes)]
    return [(SPECLI, lambda port: specli_command(args, port, plain=False)),
            (SPECLI_PLAIN, lambda port: specli_command(args, port, plain=True)),
            *((name, lambda port, mode=mode: llama_command(args, port, mode)) for name, mode in llama),
            *((name.replace("llama", "llama strict"), lambda port, mode=mode: llama_command(args, port, mode))
              for name, mode in llama)]


def replay(args: argparse.Namespace, session: dict, configs: list, folder: Path, turns: int) -> dict[str, list[dict]]:
    """One replay: every configuration's server started, every turn asked of each, all stopped."""
    servers: dict[str, Server] = {}
    try:
        for name, command in configs:
            port = free_port()
            server = Server(name, command(port), port, folder / f"{name.replace(' ', '-')}.log")
            server.start(args.server_timeout)
            servers[name] = server
        results: dict[str, list[dict]] = {name: [] for name, _ in configs}
        names = [name for name, _ in configs]
        strict = [name for name in names if name.startswith("llama strict")]
        grammar = strict_grammar(servers[strict[0]].port, session, args.timeout) if strict else ""
        for turn in range(turns):
            order = names[turn % len(names):] + names[: turn % len(names)]
            for name in order:
                port = servers[name].port
                results[name].append(measure_strict(port, name, session, turn, args, grammar) if name in strict
                                     else measure_turn(port, name, session, turn, args))
            print(f"  turn {turn + 1}/{turns}: " + ", ".join(
                f"{name} {results[name][-1]['rate']:.0f}" for name in names), file=sys.stderr)
        return results
    finally:
        for server in servers.values():
            server.stop()


def _geo(values: list[float]) -> float | None:
    values = [value for value in values if value > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summarize(replays: list[dict[str, list[dict]]], names: list[str], turns: int) -> dict:
    per_turn = {name: [] for name in names}  # the median-rate turn of each configuration
    valid = {name: 0 for name in names}
    total = {name: 0 for name in names}
    for name in names:
        for turn in range(turns):
            runs = [replay[name][turn] for replay in replays]
            valid[name] += sum(not run["errors"] for run in runs)
            total[name] += len(runs)
            runs.sort(key=lambda run: run["rate"])
            per_turn[name].append(runs[len(runs) // 2])
    session_rate = {name: sum(t["tokens"] for t in per_turn[name]) / sum(t["ms"] for t in per_turn[name]) * 1000
                    for name in names if sum(t["ms"] for t in per_turn[name]) > 0}
    summary: dict = {"valid": valid, "total": total, "session_tokens_per_second": session_rate}
    if SPECLI in names and SPECLI_PLAIN in names:
        ratios = [s["rate"] / p["rate"] for s, p in zip(per_turn[SPECLI], per_turn[SPECLI_PLAIN]) if p["rate"] > 0]
        summary["vs_plain"] = {"geomean": _geo(ratios), "lowest": min(ratios) if ratios else None,
                               "session": session_rate[SPECLI] / session_rate[SPECLI_PLAIN]}
        forced = sum(t["forced_chars"] for t in per_turn[SPECLI])
        summary["grammar_share_of_chars"] = forced / max(1, sum(t["written_chars"] for t in per_turn[SPECLI]))
    llama = [name for name in names if name.startswith("llama")]
    if SPECLI in names and llama:
        like, fastest_any = [], []
        for turn in range(turns):
            mine = per_turn[SPECLI][turn]
            rates = {name: per_turn[name][turn]["rate"] for name in llama}
            fastest_any.append(mine["rate"] / max(rates.values()))
            same = [rates[name] for name in llama if per_turn[name][turn]["call"] == mine["call"]]
            if same:
                like.append(mine["rate"] / max(same))
        best = max(llama, key=lambda name: session_rate.get(name, 0))
        summary["vs_llama"] = {"like_for_like_geomean": _geo(like), "like_for_like_lowest": min(like) if like else None,
                               "like_for_like_turns": len(like), "any_geomean": _geo(fastest_any),
                               "best_mode": best, "session_vs_best_mode": session_rate[SPECLI] / session_rate[best]}
    summary["per_turn"] = {name: [{"rate": round(t["rate"], 2), "tokens": t["tokens"], "call": t["call"],
                                   "errors": t["errors"]} for t in per_turn[name]] for name in names}
    return summary


def format_report(summary: dict, names: list[str], turns: int) -> str:
    lines = ["| configuration | valid calls | tokens/s (session) |", "|---|---|---|"]
    for name in names:
        rate = summary["session_tokens_per_second"].get(name)
        lines.append(f"| {name} | {summary['valid'][name]}/{summary['total'][name]} | "
                     f"{rate:.1f} |" if rate else f"| {name} | {summary['valid'][name]}/{summary['total'][name]} | - |")
    if "vs_plain" in summary:
        plain = summary["vs_plain"]
        lines.append(f"\nspecli / specli plain: geomean {plain['geomean']:.2f}x over {turns} turns, lowest "
                     f"{plain['lowest']:.2f}x, session {plain['session']:.2f}x; the grammar forced "
                     f"{100 * summary['grammar_share_of_chars']:.0f}% of the calls' characters")
    if "vs_llama" in summary:
        llama = summary["vs_llama"]
        like = (f"geomean {llama['like_for_like_geomean']:.2f}x, lowest {llama['like_for_like_lowest']:.2f}x"
                if llama["like_for_like_geomean"] else "no turn with the same call")
        lines.append(f"specli / fastest llama-server with the same call: {like} "
                     f"({llama['like_for_like_turns']} of {turns} turns); over the fastest of any call "
                     f"{llama['any_geomean']:.2f}x; session vs {llama['best_mode']}: "
                     f"{llama['session_vs_best_mode']:.2f}x")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--session", type=Path, default=DEFAULT_SESSION, help="Agent session (TOML).")
    parser.add_argument("-m", "--model", type=Path, default=DEFAULT_MODEL, help="Target GGUF.")
    parser.add_argument("--template", type=Path, default=DEFAULT_TEMPLATE, help="Chat template with tools.")
    parser.add_argument("-n", "--max-tokens", type=int, default=160, help="Tokens per turn at most (default: 160).")
    parser.add_argument("--turns", type=int, help="Only the first N turns (default: all).")
    parser.add_argument("--runs", type=int, default=3, help="Replays (default: 3).")
    parser.add_argument("-c", "--ctx-size", type=int, default=8192, help="Context size (default: 8192).")
    parser.add_argument("-t", "--threads", type=int, help="CPU threads for both servers (default: each one's own).")
    parser.add_argument("--llama-server", default=os.environ.get(LLAMA_SERVER_ENV, str(DEFAULT_SERVER)),
                        help=f"llama-server binary (default: ${LLAMA_SERVER_ENV}, else {DEFAULT_SERVER}).")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help="llama-server --spec-type values.")
    parser.add_argument("--no-llama", action="store_true", help="specli's two configurations only.")
    parser.add_argument("--llama-arg", action="append", default=[], help="Extra argument for llama-server.")
    parser.add_argument("--specli", default=f"{shlex.quote(sys.executable)} -m specli", help="Starts specli.")
    parser.add_argument("--specli-arg", action="append", default=[], help="Extra argument for `specli serve`.")
    parser.add_argument("--timeout", type=float, default=300, help="Seconds allowed per request (default: 300).")
    parser.add_argument("--server-timeout", type=float, default=180, help="Seconds allowed for a server to start.")
    parser.add_argument("--json", action="store_true", help="Print everything as one JSON object instead of a table.")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    session = load_session(args.session)
    turns = min(args.turns or len(session["steps"]), len(session["steps"]))
    modes: list[str] = []
    if not args.no_llama:
        if not Path(args.llama_server).is_file():
            raise SystemExit(f"error: no llama-server at {args.llama_server} (--llama-server, or --no-llama)")
        known = server_spec_types(args.llama_server)
        modes = [mode for mode in filter(None, args.modes.split(",")) if mode in known]
    configs = configurations(args, modes)
    if args.no_llama:
        configs = configs[:2]
    names = [name for name, _ in configs]
    replays = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="specli-agent-") as folder:
        try:
            for run in range(args.runs):
                print(f"replay {run + 1}/{args.runs}", file=sys.stderr)
                replays.append(replay(args, session, configs, Path(folder), turns))
        except (RunError, OSError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    summary = summarize(replays, names, turns)
    if args.json:
        print(json.dumps({"model": str(args.model), "template": str(args.template), "turns": turns,
                          "runs": args.runs, "threads": args.threads, "max_tokens": args.max_tokens,
                          "seconds": round(time.time() - started), "configurations": names, "summary": summary}))
    else:
        print(format_report(summary, names, turns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
