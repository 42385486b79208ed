"""Structured output: specli and llama-server decoding under a JSON Schema, prompt by prompt.

Every prompt of benchmarks/prompts/extraction.toml (a grounding text such as a record, a log line
or a code snippet, then "Extract the fields as JSON:") is decoded greedily, at the same token
budget (-n; default the entry's max_tokens, else 160), with its JSON Schema enforced; entries marked `json_object = true` get
{"type": "object"} ("JSON mode": any JSON object). The configurations:

  llama plain          llama-server, no speculation
  llama <spec-type>    llama-server --spec-type <type> at its defaults, for each n-gram type of
                       --modes (default ngram-simple, ngram-mod, ngram-map-k; those the binary's
                       --help does not list are left out with a warning)
  llama ... dumps      the same servers sent, instead of `json_schema`, llama.cpp's own grammar for
                       the schema with json.dumps's whitespace (", " and ": ", nothing else): the
                       way specli writes JSON. llama.cpp's schema grammar lets the model choose its
                       whitespace (Gemma takes newlines and indents), so without these rows no
                       llama-server text matches specli's (--llama-json schema|dumps|both, default
                       both). Texts can still part: llama.cpp lets the model spell forced text in
                       any tokens, specli forces the canonical tokenization, so contexts differ
  specli               `specli run --json ... --json-schema-file SCHEMA` with its default drafting
                       (the grammar forces what only one token can continue, n-gram lookup drafts)
  specli plain         the same with `--draft none`

llama-server is started once per configuration (on 127.0.0.1, a free port, `-np 1 -c 4096`, after
its /health answers, one untimed warm-up request; a mode whose drafter learns across requests,
ngram-mod or ngram-cache, is started afresh before each timed request, as it would otherwise
draft a prompt's second round from its first answer), and each prompt is POSTed to /completion with
`prompt`, `n_predict`, `json_schema` (turned into a grammar by llama.cpp's own
json-schema-to-grammar), `cache_prompt: false`, temperature 0 and top_k 1; the rate is
`timings.predicted_per_second` (generation after the prompt), acceptance from
`timings.draft_n` / `timings.draft_n_accepted`. specli runs as one process per prompt (a
prompt file and a schema file in a temporary folder); its rate is the stats line's
`tokens_per_second` (generation after the prompt as well), its text the concatenated token
events, and the grammar's share the tokens whose `proposer` is "grammar". Every server is
stopped at the end, whatever happens.

For each prompt, the configurations run in `--runs` rounds (default 3) whose order rotates, so
drift on a busy box hits them alike; the report takes medians. Per prompt it gives:

  valid     whether every output parsed (json.loads) and met the schema (types, required, enum,
            additionalProperties false, nested objects, arrays of strings and their maxItems):
            "ok", or the configurations that failed; a text cut off by -n fails
  specli    median tokens/s, its ratio to specli plain, and the grammar-forced share
  vs llama  specli over the fastest llama-server configuration (plain and dumps included) that
            wrote the same text (compared over the shorter of the two), "like for like"; and over
            the fastest of any text
The summary gives geometric means and the lowest prompt, for the tuning prompts and for the
held-out ones (`heldout = true`) apart, and how many outputs were valid per configuration.

    python benchmarks/structured.py --runs 3 -t 1 > benchmarks/out/structured.md
    python benchmarks/structured.py --only-llama --runs 1 -t 1 --prompt nginx-access-log --prompt invoice
    python benchmarks/structured.py --set heldout --llama-json dumps -t 1
    python benchmarks/structured.py --json > benchmarks/out/structured.json

`--only-llama` or `--only-specli` runs one side; `-t N` gives both tools N threads (on a loaded
2-core box, llama.cpp's default of every core can run several times slower: give both -t 1).

Only the standard library is used (and compare_llamacpp.py beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: benchmarks/ is a package
from benchmarks.compare_llamacpp import json_lines  # noqa: E402
from tests.support.harness import free_port, stop, wait_healthy  # noqa: E402

HERE = Path(__file__).resolve().parent
LLAMA_SERVER_ENV = "LLAMA_SERVER_BIN"
DEFAULT_SERVER = HERE / "out" / "llama.cpp-src" / "build-0.3.36" / "bin" / "llama-server"
DEFAULT_MODEL = Path.home() / ".cache" / "specli" / "models" / "gemma-3-270m-q4_k_m.gguf"
DEFAULT_PROMPTS = HERE / "prompts" / "extraction.toml"
DEFAULT_MODES = ("ngram-simple", "ngram-mod", "ngram-map-k")
ANY_OBJECT = {"type": "object"}
PLAIN = "llama plain"
SPECLI, SPECLI_PLAIN = "specli", "specli plain"
DUMPS = " dumps"  # suffix of the llama-server configurations sent the json.dumps-whitespace grammar
# Modes whose drafter learns across requests (ngram-mod keeps one hash pool for the server's
# life): a server of these answers each timed request fresh, else a prompt's second round (or
# its dumps variant after its schema one) is drafted from its own first answer.
REMEMBERING_MODES = {"ngram-mod", "ngram-cache"}


class RunError(RuntimeError):
    """A tool failed, timed out, or answered without what is measured."""


def post(port: int, path: str, body: dict, timeout: float, name: str, log_tail=None) -> dict:
    """POST `body` as JSON to 127.0.0.1:port/path and read the JSON answer; RunError names what
    failed (with the server's log tail, where given, when the request got no answer)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise RunError(f"{name}: HTTP {error.code}: {error.read().decode(errors='replace')[:500]}") from None
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as error:
        tail = f"\n{log_tail()}" if log_tail is not None else ""
        raise RunError(f"{name}: {path} failed: {error}{tail}") from None


# ---------------------------------------------------------------------------
# Prompts and schemas
# ---------------------------------------------------------------------------


def load_prompts(path: Path) -> list[dict]:
    """The [[prompt]] entries, each with its schema parsed ({"type": "object"} in JSON mode)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    entries = tomllib.loads(path.read_text(encoding="utf-8"))["prompt"]
    for entry in entries:
        if entry.get("json_object"):
            if "schema" in entry:
                raise SystemExit(f"error: {entry['name']}: json_object and schema both set")
            entry["schema_json"] = ANY_OBJECT
        else:
            entry["schema_json"] = json.loads(entry["schema"])
    return entries


def validate(value: object, schema: dict, path: str = "$") -> list[str]:
    """Errors of `value` against the subset of JSON Schema the prompts use: type (object, array,
    string, integer, number, boolean), enum, properties, required, additionalProperties false,
    items, minItems, maxItems. An empty list: valid."""
    kind = schema.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
    }
    if kind is not None:
        if kind not in checks:
            return [f"{path}: schema type {kind!r} is not checked here"]
        if not checks[kind](value):
            return [f"{path}: {type(value).__name__}, not {kind}"]
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in enum")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        errors += [f"{path}: missing {key!r}" for key in schema.get("required", []) if key not in value]
        if schema.get("additionalProperties") is False:
            errors += [f"{path}: extra {key!r}" for key in value if key not in properties]
        for key, sub in properties.items():
            if key in value:
                errors += validate(value[key], sub, f"{path}.{key}")
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            errors.append(f"{path}: {len(value)} items, more than maxItems {schema['maxItems']}")
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{path}: {len(value)} items, fewer than minItems {schema['minItems']}")
        for index, item in enumerate(value if "items" in schema else []):
            errors += validate(item, schema["items"], f"{path}[{index}]")
    return errors


def check_output(text: str | None, schema: dict) -> list[str]:
    """Errors of a generated text: not JSON, or not the schema's."""
    if text is None:
        return ["no text"]
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        return [f"not JSON ({error.msg} at char {error.pos} of {len(text)})"]
    return validate(value, schema)


def agrees(a: str | None, b: str | None) -> bool:
    """The same text over the shorter of the two."""
    if a is None or b is None:
        return False
    shorter = min(len(a), len(b))
    return shorter > 0 and a[:shorter] == b[:shorter]


# ---------------------------------------------------------------------------
# llama-server
# ---------------------------------------------------------------------------


def server_spec_types(binary: str) -> set[str]:
    """The --spec-type values that `llama-server --help` lists."""
    result = subprocess.run([binary, "--help"], check=False, capture_output=True, text=True, errors="replace", timeout=60,
                            stdin=subprocess.DEVNULL)
    found = re.search(r"--spec-type\s+([\w,-]+)", result.stdout + result.stderr)
    return set(found.group(1).split(",")) if found else set()


class Server:
    """One llama-server process: started, waited for (/health), asked, stopped."""

    def __init__(self, name: str, command: list[str], port: int, log_path: Path):
        self.name, self.command, self.port, self.log_path = name, command, port, log_path
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float) -> None:
        with open(self.log_path, "wb") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
        try:
            wait_healthy(self.process, f"http://127.0.0.1:{self.port}", timeout, "llama-server")
        except RuntimeError as error:
            raise RunError(f"{self.name}: {error}:\n{self.log_tail()}\ncommand: {shlex.join(self.command)}") from None

    def complete(self, body: dict, timeout: float) -> dict:
        return post(self.port, "/completion", body, timeout, self.name, self.log_tail)

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process, timeout=15)

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""


def server_command(args: argparse.Namespace, mode: str | None, port: int) -> list[str]:
    command = [
        args.llama_server, "-m", str(args.model), "-c", str(args.ctx_size), "--host", "127.0.0.1",
        "--port", str(port), "-np", "1", "--no-webui", "--temp", "0", "--top-k", "1", "--seed", "42",
    ]
    if mode:
        command += ["--spec-type", mode]
    if args.threads is not None:
        command += ["-t", str(args.threads), "-tb", str(args.threads)]
    if args.gpu_layers is not None:
        command += ["-ngl", str(args.gpu_layers)]
    return command + list(args.llama_arg)


def llama_body(entry: dict, n: int, dumps: bool = False) -> dict:
    """The /completion request: the schema as `json_schema`, or (`dumps`) the grammar that
    llama.cpp makes of it with json.dumps's whitespace, as `grammar`."""
    constraint = {"grammar": entry["dumps_grammar"]} if dumps else {"json_schema": entry["schema_json"]}
    return {"prompt": entry["prompt"], "n_predict": n, **constraint, "cache_prompt": False,
            "temperature": 0, "top_k": 1, "seed": 42, "stream": False}


def dumps_grammar(server: Server, entry: dict, timeout: float) -> str:
    """llama.cpp's own grammar for the entry's schema (a one-token request echoes it in
    generation_settings), with its whitespace made json.dumps's, as specli writes JSON: ", "
    between items, ": " after a key, nothing else. llama.cpp's grammar allows any whitespace
    there (`space ::= | " " | "\n"{1,2} [ \t]{0,20}`) and the model takes newlines and
    indents, so its text never matches specli's; with this grammar it can."""
    body = {"prompt": "{", "n_predict": 1, "json_schema": entry["schema_json"], "cache_prompt": False}
    grammar = (server.complete(body, timeout).get("generation_settings") or {}).get("grammar")
    if not grammar or not re.search(r"^space ::= ", grammar, flags=re.MULTILINE):
        raise RunError(f"{server.name}: no grammar with a space rule echoed for {entry['name']}")
    grammar = grammar.replace('"," space', '", "').replace('":" space', '": "')
    return re.sub(r"^space ::= .*$", 'space ::= ""', grammar, flags=re.MULTILINE)


def run_llama(server: Server, entry: dict, n: int, timeout: float, dumps: bool = False) -> dict:
    reply = server.complete(llama_body(entry, n, dumps), timeout)
    timings = reply.get("timings") or {}
    if "predicted_per_second" not in timings:
        raise RunError(f"{server.name}: no timings.predicted_per_second in the reply")
    drafted, accepted = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
    return {
        "tokens_per_second": float(timings["predicted_per_second"]),
        "tokens": int(timings.get("predicted_n", reply.get("tokens_predicted", 0))),
        "drafted": drafted, "accepted": accepted, "acceptance_rate": accepted / drafted if drafted else None,
        "stop_type": reply.get("stop_type"), "prompt_tokens": timings.get("prompt_n"), "text": reply.get("content", ""),
    }


# ---------------------------------------------------------------------------
# specli
# ---------------------------------------------------------------------------


def specli_command(args: argparse.Namespace, entry: dict, n: int, prompt_file: Path, schema_file: Path,
                   *, plain: bool) -> list[str]:
    command = [*shlex.split(args.specli), "run", "--json", "--temp", "0", "--no-chat", "--target", str(args.model),
               "-c", str(args.ctx_size), "-f", str(prompt_file), "-n", str(n)]
    if entry.get("json_object"):
        command += ["--json-schema", json.dumps(ANY_OBJECT)]
    else:
        command += ["--json-schema-file", str(schema_file)]
    if plain:
        command += ["--draft", "none"]
    if args.threads is not None:
        command += ["--threads", str(args.threads)]
    if args.gpu_layers is not None:
        command += ["--gpu-layers", str(args.gpu_layers)]
    return command + list(args.specli_arg)


def run_specli(name: str, command: list[str], timeout: float) -> dict:
    env = dict(os.environ, NO_COLOR="1")
    try:
        result = subprocess.run(command, check=False, capture_output=True, text=True, errors="replace",
                                timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RunError(f"{name}: no answer in {timeout:.0f} s\ncommand: {shlex.join(command)}") from None
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        raise RunError(f"{name} exited with {result.returncode}:\n{tail}\ncommand: {shlex.join(command)}")
    events = json_lines(result.stdout)
    stats = next((event for event in reversed(events) if event.get("type") == "stats"), None)
    if stats is None:
        raise RunError(f'{name}: no {{"type": "stats", ...}} line on stdout\ncommand: {shlex.join(command)}')
    tokens = [event for event in events if event.get("type") == "token"]
    forced = sum(1 for event in tokens if event.get("proposer") == "grammar")
    drafted = stats.get("drafted")
    return {
        "tokens_per_second": float(stats["tokens_per_second"]), "tokens": int(stats.get("tokens", len(tokens))),
        "acceptance_rate": None if not drafted else stats.get("acceptance_rate"),
        "grammar_share": forced / len(tokens) if tokens else None,
        "drafted_by": stats.get("drafted_by"), "accepted_by": stats.get("accepted_by"),
        "text": "".join(str(event.get("text", "")) for event in tokens),
    }


# ---------------------------------------------------------------------------
# Rounds
# ---------------------------------------------------------------------------


def measure(args: argparse.Namespace, entries: list[dict], modes: list[str], folder: Path) -> tuple[list[dict], list[str]]:
    """Every prompt in every configuration, --runs rotating rounds; the rows and the errors."""
    servers: dict[str, Server] = {}
    errors: list[str] = []
    rows = []
    try:
        if not args.only_specli:
            for mode in [None, *modes]:
                name = f"llama {mode}" if mode else PLAIN
                port = free_port()
                server = Server(name, server_command(args, mode, port), port, folder / f"server-{mode or 'plain'}.log")
                servers[name] = server  # stopped in the finally, started or not
                print(f"starting {name}: {shlex.join(server.command)}", file=sys.stderr, flush=True)
                server.start(args.server_timeout)
                # Untimed: a fresh server's first request ran tens of times slower on the 2-core box.
                started = time.perf_counter()
                server.complete(llama_body(entries[0], 16), args.timeout)
                print(f"{name}: warm-up request {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        if servers and args.llama_json != "schema":
            for entry in entries:
                entry["dumps_grammar"] = dumps_grammar(servers[PLAIN], entry, args.timeout)
        variants = {"schema": [False], "dumps": [True], "both": [False, True]}[args.llama_json]
        for index, entry in enumerate(entries):
            n = args.max_tokens or int(entry.get("max_tokens", 160))
            prompt_file, schema_file = folder / f"{index:02d}.prompt.txt", folder / f"{index:02d}.schema.json"
            prompt_file.write_text(entry["prompt"], encoding="utf-8")
            schema_file.write_text(json.dumps(entry["schema_json"]), encoding="utf-8")
            tools = {name + (DUMPS if dumps else ""):
                     (lambda server=server, entry=entry, n=n, dumps=dumps:
                      run_llama(restarted(server, args, entries[0]) if remembers(server) else server,
                                entry, n, args.timeout, dumps))
                     for dumps in variants for name, server in servers.items()}
            if not args.only_llama:
                for name, plain in ((SPECLI, False), (SPECLI_PLAIN, True)):
                    command = specli_command(args, entry, n, prompt_file, schema_file, plain=plain)
                    tools[name] = lambda name=name, command=command: run_specli(name, command, args.timeout)
            names = list(tools)
            runs: dict[str, list[dict]] = {name: [] for name in names}
            failed: dict[str, str] = {}
            for round_index in range(args.runs):
                shift = (round_index + index) % len(names)
                for name in names[shift:] + names[:shift]:
                    if name in failed:
                        continue
                    try:
                        runs[name].append(tools[name]())
                    except RunError as error:
                        failed[name] = str(error)
                        errors.append(f"{entry['name']}: {error}")
                        print(f"error: {entry['name']}: {error}", file=sys.stderr, flush=True)
            row = summarize_prompt(entry, n, {name: r for name, r in runs.items() if r and name not in failed})
            row["failed"] = failed
            rows.append(row)
            print(progress_line(row), file=sys.stderr, flush=True)
    finally:
        for server in servers.values():
            server.stop()
    return rows, errors


def remembers(server: Server) -> bool:
    return any(f"--spec-type {mode}" in " ".join(server.command) for mode in REMEMBERING_MODES)


def restarted(server: Server, args: argparse.Namespace, warm_up: dict) -> Server:
    """The server stopped and started again (the same command), warmed up untimed: a drafter
    that learns across requests starts from nothing."""
    server.stop()
    server.start(args.server_timeout)
    server.complete(llama_body(warm_up, 16), args.timeout)
    return server


def summarize_prompt(entry: dict, n: int, runs: dict[str, list[dict]]) -> dict:
    configs = {}
    for name, tool_runs in runs.items():
        texts = [run["text"] for run in tool_runs]
        problems = [check_output(text, entry["schema_json"]) for text in texts]
        acceptance = [run["acceptance_rate"] for run in tool_runs if run.get("acceptance_rate") is not None]
        shares = [run["grammar_share"] for run in tool_runs if run.get("grammar_share") is not None]
        configs[name] = {
            "median_tokens_per_second": statistics.median(run["tokens_per_second"] for run in tool_runs),
            "tokens_per_second": [run["tokens_per_second"] for run in tool_runs],
            "median_tokens": statistics.median(run["tokens"] for run in tool_runs),
            "median_acceptance_rate": statistics.median(acceptance) if acceptance else None,
            "grammar_share": statistics.median(shares) if shares else None,
            "valid": all(not p for p in problems),
            "errors": next((p for p in problems if p), []),
            "text": texts[0], "same_text_every_run": len(set(texts)) == 1,
            **({"stop_type": tool_runs[0].get("stop_type"), "prompt_tokens": tool_runs[0].get("prompt_tokens")}
               if "stop_type" in tool_runs[0] else {}),
            **({"drafted_by": tool_runs[0].get("drafted_by"), "accepted_by": tool_runs[0].get("accepted_by")}
               if "drafted_by" in tool_runs[0] else {}),
        }
    speed = {name: c["median_tokens_per_second"] for name, c in configs.items()}
    llama = [name for name in configs if name.startswith("llama ")]
    row: dict = {"name": entry["name"], "category": entry.get("category", ""), "heldout": bool(entry.get("heldout")),
                 "json_object": bool(entry.get("json_object")), "max_tokens": n, "configs": configs,
                 "invalid": [name for name, c in configs.items() if not c["valid"]]}
    if llama:
        best_any = max(llama, key=speed.__getitem__)
        row["best_llama"] = best_any
        for suffix, key in (("", "best_llama_over_plain"), (DUMPS, "best_llama_dumps_over_plain")):
            group = [name for name in llama if name.endswith(DUMPS) == bool(suffix)]
            if PLAIN + suffix in speed:  # the fastest of one grammar's configurations over its plain
                row[key] = max(speed[name] for name in group) / speed[PLAIN + suffix]
    if SPECLI in configs:
        text = configs[SPECLI]["text"]
        agreeing = [name for name in llama if agrees(configs[name]["text"], text)]
        best = max(agreeing, key=speed.__getitem__) if agreeing else None
        row.update({
            "specli_over_plain": speed[SPECLI] / speed[SPECLI_PLAIN] if SPECLI_PLAIN in speed else None,
            "specli_text_is_plain": agrees(text, configs[SPECLI_PLAIN]["text"]) if SPECLI_PLAIN in configs else None,
            "agreeing_llama": agreeing, "best_llama_like_for_like": best,
            "specli_over_best_llama": speed[SPECLI] / speed[best] if best else None,
            "specli_over_best_llama_any_text": speed[SPECLI] / speed[row["best_llama"]] if llama else None,
            "grammar_share": configs[SPECLI]["grammar_share"],
        })
    return row


def progress_line(row: dict) -> str:
    parts = [f"{name} {c['median_tokens_per_second']:.1f}" for name, c in row["configs"].items()]
    valid = "valid" if not row["invalid"] else "INVALID: " + ", ".join(row["invalid"])
    return f"{row['name']}: " + ", ".join(parts) + f" t/s; {valid}"


# ---------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------


def _geo_min(rows: list[dict], key: str) -> dict:
    values = [(row[key], row["name"]) for row in rows if row.get(key)]
    if not values:
        return {"geomean": None, "min": None, "min_prompt": None, "prompts": 0}
    lowest = min(values)
    return {"geomean": statistics.geometric_mean(v for v, _ in values), "min": lowest[0], "min_prompt": lowest[1],
            "prompts": len(values)}


def summarize(rows: list[dict]) -> dict:
    summary: dict = {}
    for label, subset in (("tuning", [r for r in rows if not r["heldout"]]), ("heldout", [r for r in rows if r["heldout"]]),
                          ("all", rows)):
        summary[label] = {
            "prompts": len(subset),
            "specli_over_plain": _geo_min(subset, "specli_over_plain"),
            "specli_over_best_llama": _geo_min(subset, "specli_over_best_llama"),
            "specli_over_best_llama_any_text": _geo_min(subset, "specli_over_best_llama_any_text"),
            "best_llama_over_plain": _geo_min(subset, "best_llama_over_plain"),
            "best_llama_dumps_over_plain": _geo_min(subset, "best_llama_dumps_over_plain"),
            "grammar_share": _geo_min(subset, "grammar_share"),
        }
    names = sorted({name for row in rows for name in row["configs"]})
    summary["valid"] = {name: [sum(1 for r in rows if name in r["configs"] and r["configs"][name]["valid"]),
                               sum(1 for r in rows if name in r["configs"])] for name in names}
    summary["median_tokens_per_second"] = {
        name: statistics.median(r["configs"][name]["median_tokens_per_second"] for r in rows if name in r["configs"])
        for name in names}
    return summary


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def format_report(rows: list[dict], summary: dict, names: list[str]) -> str:
    lines = ["| prompt | set | " + " | ".join(names) + " | valid | specli / plain | like for like: best llama "
             "| specli / it | specli / fastest llama | grammar share |",
             "| --- | --- | " + " | ".join("---" for _ in names) + " | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        cells = []
        for name in names:
            config = row["configs"].get(name)
            if config is None:
                cells.append("-")
                continue
            accept = config["median_acceptance_rate"]
            cells.append(f"{config['median_tokens_per_second']:.1f}" + (f" ({accept:.0%})" if accept is not None else ""))
        valid = "ok" if not row["invalid"] else "NO: " + ", ".join(row["invalid"])
        share = row.get("grammar_share")
        lines.append(
            f"| {row['name']} | {'heldout' if row['heldout'] else 'tuning'}{' json' if row['json_object'] else ''} | "
            + " | ".join(cells) + f" | {valid} | {_x(row.get('specli_over_plain'))} | "
            f"{row.get('best_llama_like_for_like') or '-'} | {_x(row.get('specli_over_best_llama'))} | "
            f"{_x(row.get('specli_over_best_llama_any_text'))} | {'-' if share is None else f'{share:.0%}'} |")
    lines.append("\nt/s: median tokens per second (acceptance of drafted tokens in brackets)")
    for label in ("tuning", "heldout", "all"):
        part = summary[label]
        if not part["prompts"]:
            continue
        pieces = []
        for key, title in (("specli_over_plain", "specli / specli plain"),
                           ("specli_over_best_llama", "specli / best llama, like for like"),
                           ("specli_over_best_llama_any_text", "specli / fastest llama, any text"),
                           ("best_llama_over_plain", "fastest llama / llama plain"),
                           ("best_llama_dumps_over_plain", "fastest llama dumps / llama plain dumps")):
            figure = part[key]
            if figure["geomean"]:
                pieces.append(f"{title} {figure['geomean']:.2f}x (lowest {figure['min']:.2f}x {figure['min_prompt']}, "
                              f"{figure['prompts']} prompts)")
        share = part["grammar_share"]
        if share["geomean"]:
            pieces.append(f"grammar share geomean {share['geomean']:.0%}")
        lines.append(f"{label} ({part['prompts']} prompts): " + ("; ".join(pieces) or "-"))
    lines.append("valid outputs: " + ", ".join(f"{name} {ok}/{total}" for name, (ok, total) in summary["valid"].items()))
    for row in rows:
        for name in row["invalid"]:
            config = row["configs"][name]
            lines.append(f"invalid: {row['name']} {name}: {'; '.join(config['errors'][:3])}: {config['text'][:120]!r}")
        for name, config in row["configs"].items():
            if not config["same_text_every_run"]:
                lines.append(f"note: {row['name']} {name} wrote different texts in different runs")
        for name, error in row.get("failed", {}).items():
            lines.append(f"failed: {row['name']} {name}: {error.splitlines()[0]}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help=f"Prompt file (default: {DEFAULT_PROMPTS}).")
    parser.add_argument("--prompt", action="append", default=[], metavar="NAME",
                        help="Only this prompt of the file (repeatable).")
    parser.add_argument("--set", choices=("all", "tuning", "heldout"), default="all",
                        help="Only the tuning prompts or only the held-out ones (default: all).")
    parser.add_argument("-m", "--model", type=Path, default=DEFAULT_MODEL, help=f"Target GGUF (default: {DEFAULT_MODEL}).")
    parser.add_argument("-n", "--max-tokens", type=int,
                        help="Tokens to generate at most (default: the prompt's max_tokens, else 160).")
    parser.add_argument("--runs", type=int, default=3, help="Rounds per prompt (default: 3).")
    parser.add_argument("-c", "--ctx-size", type=int, default=4096, help="Context size for both tools (default: 4096).")
    parser.add_argument("-t", "--threads", type=int, help="CPU threads for both tools (default: each tool's own).")
    parser.add_argument("--gpu-layers", type=int, help="-ngl for llama-server, --gpu-layers for specli (default: each tool's own).")
    parser.add_argument("--llama-server", default=os.environ.get(LLAMA_SERVER_ENV, str(DEFAULT_SERVER)),
                        help=f"llama-server binary (default: ${LLAMA_SERVER_ENV}, else {DEFAULT_SERVER}).")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES),
                        help=f"llama-server --spec-type values, comma-separated (default: {','.join(DEFAULT_MODES)}).")
    parser.add_argument("--llama-json", choices=("schema", "dumps", "both"), default="both",
                        help="How llama-server gets the constraint: `json_schema` (its grammar allows any "
                             "whitespace), `dumps` (that grammar with json.dumps's whitespace, as specli writes, "
                             "sent as `grammar`; configurations named '... dumps'), or both (default).")
    parser.add_argument("--llama-arg", action="append", default=[], help="Extra argument for llama-server (repeatable).")
    parser.add_argument("--specli", default=f"{shlex.quote(sys.executable)} -m specli",
                        help="Command that starts specli (default: this Python's `-m specli`).")
    parser.add_argument("--specli-arg", action="append", default=[], help="Extra argument for `specli run` (repeatable).")
    side = parser.add_mutually_exclusive_group()
    side.add_argument("--only-llama", action="store_true", help="llama-server only.")
    side.add_argument("--only-specli", action="store_true", help="specli only.")
    parser.add_argument("--timeout", type=float, default=300, help="Seconds allowed per request or run (default: 300).")
    parser.add_argument("--server-timeout", type=float, default=180,
                        help="Seconds allowed for a llama-server to load and answer /health (default: 180).")
    parser.add_argument("--json", action="store_true", help="Print everything as one JSON object instead of a table.")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    entries = load_prompts(args.prompts)
    if args.prompt:
        unknown = set(args.prompt) - {entry["name"] for entry in entries}
        if unknown:
            raise SystemExit(f"error: no prompt named {', '.join(sorted(unknown))} in {args.prompts}")
        entries = [entry for entry in entries if entry["name"] in args.prompt]
    if args.set != "all":
        entries = [entry for entry in entries if bool(entry.get("heldout")) == (args.set == "heldout")]
    if not entries:
        raise SystemExit("error: no prompts left to run")
    modes: list[str] = []
    if not args.only_specli:
        if not Path(args.llama_server).is_file():
            raise SystemExit(f"error: no llama-server at {args.llama_server} (name it with --llama-server or "
                             f"${LLAMA_SERVER_ENV}; TARGETS=llama-server benchmarks/build_llama_cpp.sh builds it)")
        known = server_spec_types(args.llama_server)
        for mode in filter(None, args.modes.split(",")):
            if mode in known:
                modes.append(mode)
            else:
                print(f"warning: this llama-server has no --spec-type {mode}; left out", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="specli-structured-") as folder:
        try:
            rows, errors = measure(args, entries, modes, Path(folder))
        except (RunError, OSError) as error:  # a server that did not start; every server is stopped
            print(f"error: {error}", file=sys.stderr)
            return 1
    llama = [PLAIN, *(f"llama {mode}" for mode in modes)]
    variants = {"schema": [""], "dumps": [DUMPS], "both": ["", DUMPS]}[args.llama_json]
    names = ([] if args.only_specli else [name + suffix for suffix in variants for name in llama]) + \
            ([] if args.only_llama else [SPECLI, SPECLI_PLAIN])
    summary = summarize(rows)
    if args.json:
        print(json.dumps({"model": str(args.model), "max_tokens": args.max_tokens, "runs": args.runs,
                          "threads": args.threads, "configurations": names, "prompts": rows, "summary": summary,
                          "errors": errors}))
    else:
        print(format_report(rows, summary, names))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
