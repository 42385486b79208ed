"""Compare specli's speculative decoding with llama.cpp's own, run by run.

Both tools decode the same prompt greedily with the same target, the same
proposer (a draft model, or n-gram lookup in the context) and the same draft
length K. Runs alternate between the tools, and the order flips every round,
so drift (thermal, page cache, other load) hits both alike. The report gives
each tool's median generation speed, its spread, the ratio of medians, and the
median (and range) of the ratios taken within each round, the steadier figure on a
box whose speed drifts.

    python benchmarks/compare_llamacpp.py \\
        --llama-bin benchmarks/out/llama.cpp-src/build-0.3.36/bin/llama-speculative-simple \\
        -m target.gguf --draft draft.gguf -k 4 -n 128 --runs 5 --prompt "Once upon a time"

    python benchmarks/compare_llamacpp.py -m gemma.gguf --ngram --prompt-file copy.txt

llama.cpp side: `llama-speculative-simple` (`--llama-bin`, or $LLAMA_SPECULATIVE_BIN),
whose stderr line "decoded N tokens in X seconds, speed: Y t/s" times the
generation loop after the prompt. `--llama-plain-bin` (or $LLAMA_COMPLETION_BIN)
adds llama.cpp's plain greedy decoding as a reference row: `llama-completion`,
timed by its "eval time = ... ms / N runs (..., Y tokens per second)" line,
which likewise leaves the prompt out, and also its sampler (timed apart as "sampling
time"), so that row is a little faster than the loop it stands for.

specli side: `specli run --json ...`; the last stdout line is
{"type": "stats", "tokens": ..., "seconds": ..., "tokens_per_second": ..., "acceptance_rate": ...}.

Each tool's generated text is read back (llama.cpp echoes it on stdout, specli in its
JSON token events) and compared: greedy near-ties can flip with the batch shape, so the
tools may write different texts, and then their speeds measure different work. The
report says where the texts first differ.

    python benchmarks/compare_llamacpp.py -m gemma.gguf --ngram --workload code-edit \
        -k 48 --ngram-n 12 --specli-k auto --plain

`--plain-only` times the two plain rows alone. `--gpu-layers N` passes -ngl N (and -ngld N
with a draft model) to llama.cpp and --gpu-layers N to specli; 999 puts every layer of both
models on the GPU in both tools (llama.cpp's own default, -1, lets it fit what it decides).

Every native n-gram mode over a prompt set (`--native-modes`): each prompt of the TOML
files is decoded by specli (`-k auto`, its default n-gram lookup), by llama.cpp with each
n-gram `--spec-type` at its own defaults (NATIVE_MODES: ngram-simple, ngram-mod,
ngram-map-k, ngram-map-k4v, ngram-cache and the ngram-mod,ngram-simple chain), and plainly
by both, in rounds whose order rotates. Per prompt the report names the fastest native mode
that wrote specli's text ("like for like": texts compared over the shorter of the two, as
llama-speculative-simple may run past -n) and the ratio of specli's median speed to it; the
summary gives the geometric mean over the prompts where some mode agreed, per category too,
and how many prompts had no agreeing mode. With `--draft` instead of `--ngram` the native
modes are NATIVE_DRAFT_MODES (draft-simple, and draft-simple,ngram-mod) and specli also runs
with `--no-ngram` (its draft model alone).

    python benchmarks/compare_llamacpp.py -m gemma.gguf --ngram --native-modes \
        --prompts benchmarks/prompts/public-dev.toml --prompts benchmarks/prompts/public-heldout.toml \
        --runs 3 --json > benchmarks/out/native-modes.json

Only the standard library is used.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

LLAMA_BIN_ENV = "LLAMA_SPECULATIVE_BIN"
LLAMA_PLAIN_BIN_ENV = "LLAMA_COMPLETION_BIN"
NATIVE_MODES = ("ngram-simple", "ngram-mod", "ngram-map-k", "ngram-map-k4v", "ngram-cache", "ngram-mod,ngram-simple")
# With a draft model (--draft): llama.cpp's draft model alone and chained with ngram-mod.
NATIVE_DRAFT_MODES = ("draft-simple", "draft-simple,ngram-mod")

# speculative-simple: "decoded  128 tokens in    2.345 seconds, speed:   54.583 t/s"
# simple:             "main: decoded 127 tokens in 2.35 s, speed: 54.04 t/s"
DECODED = re.compile(r"decoded\s+(\d+)\s+tokens\s+in\s+([\d.]+)\s*s(?:econds)?,\s*speed:\s*([\d.]+)\s*t/s")
# completion (common_perf_print), generation only; the prompt line counts "tokens", not "runs":
# "eval time =    3289.66 ms /   127 runs   (   25.90 ms per token,    38.61 tokens per second)"
EVAL_TIME = re.compile(r"eval time\s*=\s*([\d.]+)\s*ms\s*/\s*(\d+)\s+runs\s*\(\s*[\d.]+\s*ms per token,\s*([\d.]+)\s*tokens per second\)")
N_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
N_ACCEPT = re.compile(r"n_accept\s*=\s*(\d+)")
N_THREADS = re.compile(r"n_threads\s*=\s*(\d+)")


class RunError(RuntimeError):
    """A tool exited with an error or printed no timing."""


@dataclasses.dataclass
class Run:
    tool: str
    tokens: int
    seconds: float
    tokens_per_second: float
    acceptance_rate: float | None = None
    threads: int | None = None  # as the tool reports it
    wall_seconds: float = 0.0
    text: str | None = None  # the generated text, when it could be read back


@dataclasses.dataclass
class Workload:
    model: Path
    draft: Path | None  # None: n-gram lookup in the context
    prompt: str
    k: int
    n: int
    ngram_n: int
    threads: int | None
    ctx_size: int
    specli_k: str | None = None  # specli's -k when it differs from llama.cpp's (e.g. "auto")
    gpu_layers: int | None = None  # layers of each model on the GPU (None: each tool's default)
    mtp: bool = False  # the target's own NextN layers draft (llama.cpp: draft-mtp; specli: --draft mtp)


# ---------------------------------------------------------------------------
# llama.cpp
# ---------------------------------------------------------------------------


def llama_speculative_command(binary: str, work: Workload, extra: Sequence[str] = ()) -> list[str]:
    """The llama-speculative-simple command line for `work`, greedy."""
    command = [binary, *_llama_common_arguments(work)]
    if work.mtp:
        command += ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(work.k), "--spec-draft-n-min", "0",
                    "--spec-draft-p-min", "0"]
    elif work.draft is not None:
        command += [
            "-md", str(work.draft), "--spec-type", "draft-simple",
            "--spec-draft-n-max", str(work.k), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
        ]
        if work.gpu_layers is not None:
            command += ["-ngld", str(work.gpu_layers)]
    else:
        command += [
            "--spec-type", "ngram-simple",
            "--spec-ngram-simple-size-n", str(work.ngram_n), "--spec-ngram-simple-size-m", str(work.k),
        ]
    return command + list(extra)


def llama_native_command(binary: str, work: Workload, spec_type: str, extra: Sequence[str] = ()) -> list[str]:
    """llama-speculative-simple with one native --spec-type (or a chain), at its defaults; with
    the workload's draft model where the type names one."""
    draft = ["-md", str(work.draft)] if work.draft is not None and "draft" in spec_type else []
    if draft and work.gpu_layers is not None:
        draft += ["-ngld", str(work.gpu_layers)]
    return [binary, *_llama_common_arguments(work), *draft, "--spec-type", spec_type, *extra]


def llama_plain_command(binary: str, work: Workload, extra: Sequence[str] = ()) -> list[str]:
    """The llama-completion command line for plain greedy decoding of `work`."""
    return [binary, *_llama_common_arguments(work), "-no-cnv", *extra]


def _llama_common_arguments(work: Workload) -> list[str]:
    # --no-escape: the prompt is used as is, as specli does; -t also sets the draft's threads.
    arguments = [
        "-m", str(work.model), "-p", work.prompt, "--no-escape", "-n", str(work.n),
        "-c", str(work.ctx_size), "--temp", "0", "--top-k", "1", "--seed", "42",
    ]
    if work.threads is not None:
        arguments += ["-t", str(work.threads)]
    if work.gpu_layers is not None:
        arguments += ["-ngl", str(work.gpu_layers)]
    return arguments


def parse_llama_output(text: str, tool: str) -> Run:
    """Read the generation timing (and acceptance, if any) from llama.cpp's log."""
    decoded = DECODED.findall(text)
    if decoded:
        tokens, seconds, speed = decoded[-1]
    elif evaluated := EVAL_TIME.findall(text):
        milliseconds, tokens, speed = evaluated[-1]
        seconds = str(float(milliseconds) / 1000)
    else:
        raise RunError(f"{tool}: no 'decoded N tokens in X s, speed: Y t/s' or 'eval time' line in its output")
    drafted, accepted = N_DRAFTED.findall(text), N_ACCEPT.findall(text)
    acceptance = None
    if drafted and accepted and int(drafted[-1]) > 0:
        acceptance = int(accepted[-1]) / int(drafted[-1])
    threads = N_THREADS.findall(text)
    return Run(tool, int(tokens), float(seconds), float(speed), acceptance, int(threads[0]) if threads else None)


def generated_text(stdout: str, prompt: str) -> str | None:
    """What llama.cpp generated: its stdout echoes the prompt (after special tokens such as
    <bos>) and then the generation; llama-completion may add " [end of text]"."""
    start = stdout.find(prompt)
    if start < 0:
        return None
    text = stdout[start + len(prompt):]
    end_marker = text.rfind("[end of text]")
    if end_marker >= 0:
        text = text[:end_marker]
    return text.rstrip()


def first_difference(a: str, b: str) -> int | None:
    """Index of the first character where the texts differ (None: identical)."""
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def run_llama(tool: str, command: Sequence[str], timeout: float, prompt: str = "") -> Run:
    started = time.perf_counter()
    result = subprocess.run(
        command, capture_output=True, text=True, errors="replace", timeout=timeout, stdin=subprocess.DEVNULL
    )
    wall = time.perf_counter() - started
    output = result.stdout + "\n" + result.stderr
    if result.returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise RunError(f"{tool} exited with {result.returncode}:\n{tail}\ncommand: {shlex.join(command)}")
    run = parse_llama_output(output, tool)
    run.wall_seconds = wall
    run.text = generated_text(result.stdout, prompt) if prompt else None
    return run


# ---------------------------------------------------------------------------
# specli
# ---------------------------------------------------------------------------


def specli_command(
    specli: Sequence[str], work: Workload, extra: Sequence[str] = (), *, plain: bool = False
) -> list[str]:
    """The `specli run` command line for `work`, greedy, raw prompt (no chat template).

    `plain`: no proposer (`--draft none`), plain decoding for reference.
    """
    draft = "none" if plain else "mtp" if work.mtp else str(work.draft) if work.draft else "ngram"
    command = [
        *specli, "run", "--json", "--temp", "0", "-n", str(work.n), "-k", work.specli_k or str(work.k),
        "-c", str(work.ctx_size), "--target", str(work.model), "--draft", draft, "--no-chat",
    ]
    if work.threads is not None:
        command += ["--threads", str(work.threads)]
    if work.gpu_layers is not None:  # the draft's layers follow the target's
        command += ["--gpu-layers", str(work.gpu_layers)]
    return command + list(extra) + ["--", work.prompt]  # "--": a prompt may start with a dash (SQL comments)


def parse_specli_output(stdout: str, tool: str = "specli") -> Run:
    """The last JSON line on stdout is specli's {"type": "stats", ...} summary."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            stats = json.loads(line)
        except json.JSONDecodeError:
            continue
        if stats.get("type") != "stats":
            continue
        drafted = stats.get("drafted")
        text = "".join(
            event.get("text", "") for event in json_lines(stdout) if event.get("type") == "token"
        ).rstrip()
        return Run(
            tool,
            int(stats["tokens"]),
            float(stats["seconds"]),
            float(stats["tokens_per_second"]),
            None if drafted == 0 else stats.get("acceptance_rate"),  # plain decoding drafts nothing
            stats.get("threads"),
            text=text,
        )
    raise RunError(f'{tool}: no {{"type": "stats", ...}} line on stdout')


def json_lines(stdout: str) -> list[dict]:
    """The JSON objects among a tool's output lines (`specli run --json`'s events)."""
    events = []
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def run_specli(tool: str, command: Sequence[str], timeout: float, prompt: str = "") -> Run:
    started = time.perf_counter()
    env = dict(os.environ, NO_COLOR="1")
    result = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        raise RunError(f"{tool} exited with {result.returncode}:\n{tail}\ncommand: {shlex.join(command)}")
    run = parse_specli_output(result.stdout, tool)
    run.wall_seconds = wall
    return run


# ---------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------


def summarize(runs: Sequence[Run]) -> dict:
    speeds = [r.tokens_per_second for r in runs]
    acceptance = [r.acceptance_rate for r in runs if r.acceptance_rate is not None]
    return {
        "runs": len(runs),
        "median_tokens_per_second": statistics.median(speeds),
        "min_tokens_per_second": min(speeds),
        "max_tokens_per_second": max(speeds),
        "stdev_tokens_per_second": statistics.stdev(speeds) if len(speeds) > 1 else 0.0,
        "median_tokens": statistics.median(r.tokens for r in runs),
        "median_acceptance_rate": statistics.median(acceptance) if acceptance else None,
        "threads": runs[0].threads,
        "tokens_per_second": speeds,
        "text": runs[0].text,
        "same_text_every_run": len({r.text for r in runs}) == 1,
    }


def paired_ratios(runs: dict[str, list[Run]], a: str, b: str) -> dict | None:
    """a's speed over b's, round by round: runs of one round are seconds apart, so a box
    whose speed drifts (a busy neighbour, thermal limits) moves both sides of each ratio
    alike, where a ratio of medians can pair a fast spell of one tool with a slow one of
    the other. Median, min, max and every round's ratio; None when a tool did not run."""
    if not runs.get(a) or not runs.get(b):
        return None
    ratios = [x.tokens_per_second / y.tokens_per_second for x, y in zip(runs[a], runs[b]) if y.tokens_per_second > 0]
    if not ratios:
        return None
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "rounds": ratios}


def format_ratio(label: str, of_medians: float, paired: dict | None) -> str:
    line = f"{label} (median t/s): {of_medians:.2f}"
    if paired is not None:
        line += f"; same round: median {paired['median']:.2f} ({paired['min']:.2f}-{paired['max']:.2f})"
    return line


def text_agreement(summary: dict[str, dict]) -> list[dict]:
    """Whether pairs of tools wrote the same text. Greedy ties can flip with the batch
    shape, so two tools (or one tool, speculative and plain) may write different texts:
    their speeds then measure different work."""
    pairs = [("specli", "llama.cpp"), ("specli", "specli plain"), ("llama.cpp", "llama.cpp plain"),
             ("specli plain", "llama.cpp plain")]
    found = []
    for a, b in pairs:
        if a not in summary or b not in summary:
            continue
        text_a, text_b = summary[a]["text"], summary[b]["text"]
        if text_a is None or text_b is None:
            found.append({"tools": [a, b], "same": None})
            continue
        index = first_difference(text_a, text_b)
        found.append({"tools": [a, b], "same": index is None, "first_difference": index,
                      "chars": [len(text_a), len(text_b)]})
    return found


def format_agreement(agreement: list[dict], summary: dict[str, dict]) -> str:
    lines = []
    for entry in agreement:
        a, b = entry["tools"]
        if entry["same"] is None:
            lines.append(f"text {a} vs {b}: unknown (could not read one of them back)")
        elif entry["same"]:
            lines.append(f"text {a} vs {b}: identical ({entry['chars'][0]} chars)")
        else:
            i = entry["first_difference"]
            show = lambda tool: repr(summary[tool]["text"][max(0, i - 20): i + 20])  # noqa: E731
            lines.append(f"text {a} vs {b}: DIFFERENT from char {i} of {entry['chars'][0]}/{entry['chars'][1]}: "
                         f"{show(a)} vs {show(b)}")
    for tool, s in summary.items():
        if not s["same_text_every_run"]:
            lines.append(f"note: {tool} wrote different texts in different runs")
    return "\n".join(lines)


def format_table(summary: dict[str, dict]) -> str:
    lines = [f"{'tool':<16} {'runs':>4} {'median t/s':>11} {'min':>8} {'max':>8} {'stdev':>7} {'tokens':>7} {'accept':>7}"]
    for tool, s in summary.items():
        accept = "-" if s["median_acceptance_rate"] is None else f"{s['median_acceptance_rate']:.1%}"
        lines.append(
            f"{tool:<16} {s['runs']:>4} {s['median_tokens_per_second']:>11.2f} {s['min_tokens_per_second']:>8.2f} "
            f"{s['max_tokens_per_second']:>8.2f} {s['stdev_tokens_per_second']:>7.2f} {s['median_tokens']:>7.0f} {accept:>7}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, required=True, help="Target GGUF.")
    proposer = parser.add_mutually_exclusive_group(required=True)
    proposer.add_argument("--draft", type=Path, help="Draft GGUF (llama.cpp: --spec-type draft-simple).")
    proposer.add_argument("--ngram", action="store_true", help="N-gram lookup in the context (llama.cpp: ngram-simple).")
    proposer.add_argument("--mtp", action="store_true",
                          help="The target's own NextN layers (llama.cpp: draft-mtp; specli: --draft mtp, with "
                               "lookup in front unless --specli-arg --no-ngram).")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompts", type=Path, action="append",
                        help="With --native-modes: a workloads TOML whose every prompt is compared (repeatable).")
    prompt.add_argument("-p", "--prompt", help="Prompt text, used as is (no chat template).")
    prompt.add_argument("-f", "--prompt-file", type=Path, help="Read the prompt from this file.")
    prompt.add_argument("-w", "--workload", help="A workload's prompt (and its token budget, unless -n is given) "
                        "from specli/workloads.toml, by name.")
    parser.add_argument("-k", "--draft-tokens", type=int, default=4, help="Draft length K (default: 4).")
    parser.add_argument(
        "--specli-k", default=None,
        help="specli's -k when it should differ from llama.cpp's, e.g. 'auto' (default: the same K).",
    )
    parser.add_argument("-n", "--max-tokens", type=int, default=None,
                        help="Tokens to generate (default: the workload's budget, else 128).")
    parser.add_argument("--runs", type=int, default=5, help="Timed runs per tool (default: 5).")
    parser.add_argument("--warmup", type=int, default=1, help="Untimed runs per tool first, to warm the page cache (default: 1).")
    parser.add_argument("--ngram-n", type=int, default=3, help="N-gram lookup length for llama.cpp's ngram-simple (default: 3).")
    parser.add_argument("-t", "--threads", type=int, help="CPU threads for both tools (default: each tool's own).")
    parser.add_argument("-c", "--ctx-size", type=int, default=4096, help="llama.cpp context size (default: 4096).")
    parser.add_argument("--llama-bin", default=os.environ.get(LLAMA_BIN_ENV),
                        help=f"llama-speculative-simple binary (default: ${LLAMA_BIN_ENV}).")
    parser.add_argument("--plain", action="store_true",
                        help="Also time plain decoding: llama-completion and `specli run --draft none`.")
    parser.add_argument("--llama-plain-bin", default=os.environ.get(LLAMA_PLAIN_BIN_ENV),
                        help=f"llama-completion binary for --plain (default: ${LLAMA_PLAIN_BIN_ENV}, "
                             "else llama-completion next to --llama-bin).")
    parser.add_argument("--plain-only", action="store_true",
                        help="Time plain decoding alone: llama-completion and `specli run --draft none`.")
    parser.add_argument("--gpu-layers", type=int,
                        help="Layers of each model on the GPU: llama.cpp's -ngl (and -ngld for a draft model), "
                             "specli's --gpu-layers; 999 puts every layer there in both (default: each tool's own).")
    parser.add_argument("--llama-arg", action="append", default=[], help="Extra argument for llama.cpp (repeatable).")
    parser.add_argument("--specli", default=f"{shlex.quote(sys.executable)} -m specli",
                        help="Command that starts specli (default: this Python's `-m specli`).")
    parser.add_argument("--specli-arg", action="append", default=[], help="Extra argument for `specli run` (repeatable).")
    parser.add_argument("--skip-specli", action="store_true", help="Run llama.cpp only.")
    parser.add_argument("--rows", type=Path, metavar="FILE",
                        help="With --native-modes: append each prompt's row (and every tool's text) to FILE as a "
                             "JSON line as soon as it is measured.")
    parser.add_argument("--equal-length", metavar="ROWS",
                        help="With --prompts and --rows: for each prompt of ROWS (a --native-modes --rows file) where "
                             "a native mode wrote specli's text, time that mode again and specli with -n set to the "
                             "tokens it decoded; rows go to --rows.")
    parser.add_argument("--before", metavar="COMMAND",
                        help="With --native-modes: another command that starts specli (say, a checkout of the code "
                             "before a change), run with the same arguments in the same rounds as 'specli before'.")
    parser.add_argument("--timeout", type=float, default=600, help="Seconds allowed per run (default: 600).")
    parser.add_argument("--json", action="store_true", help="Print one JSON object instead of a table.")
    parser.add_argument("--native-modes", action="store_true",
                        help="Every native --spec-type at its defaults against specli's -k auto over the --prompts "
                             "sets, like for like: the n-gram ones (--ngram), or draft-simple alone and chained with "
                             "ngram-mod (--draft; specli then also runs --no-ngram).")
    args = parser.parse_args(argv)
    if bool(args.prompts) != (args.native_modes or bool(args.equal_length)):
        parser.error("--prompts goes with --native-modes or --equal-length")
    if args.equal_length and not args.rows:
        parser.error("--equal-length writes its rows to --rows")
    if args.plain_only:
        args.plain = True
    if not args.llama_bin and not (args.plain_only and args.llama_plain_bin):
        parser.error(f"name the llama-speculative-simple binary with --llama-bin or ${LLAMA_BIN_ENV} "
                     "(build it with benchmarks/build_llama_cpp.sh)")
    if args.plain and not args.llama_plain_bin:
        args.llama_plain_bin = str(Path(args.llama_bin).with_name("llama-completion"))
    return args


def tool_commands(args: argparse.Namespace, work: Workload) -> dict[str, tuple]:
    """Tool name -> (runner, command line). Speculative rows first, plain references after."""
    specli = shlex.split(args.specli)
    commands: dict[str, tuple] = {}
    if not args.plain_only:
        commands["llama.cpp"] = (run_llama, llama_speculative_command(args.llama_bin, work, args.llama_arg))
        if not args.skip_specli:
            commands["specli"] = (run_specli, specli_command(specli, work, args.specli_arg))
    if args.plain:
        commands["llama.cpp plain"] = (run_llama, llama_plain_command(args.llama_plain_bin, work))
        if not args.skip_specli:
            commands["specli plain"] = (run_specli, specli_command(specli, work, args.specli_arg, plain=True))
    return commands


def load_prompt_sets(paths: Sequence[Path]) -> list[dict]:
    """The workloads of each file, in order, as dicts (read as `specli bench` reads them)."""
    from specli.comparison import load_workloads

    return [dataclasses.asdict(workload) for path in paths for workload in load_workloads(path)]


def agrees(a: str | None, b: str | None) -> bool:
    """The same text over the shorter of the two (llama-speculative-simple may write past -n)."""
    if a is None or b is None:
        return False
    shorter = min(len(a), len(b))
    return shorter > 0 and a[:shorter] == b[:shorter]


def native_modes(args: argparse.Namespace) -> int:
    """Every native n-gram mode against specli, prompt by prompt, like for like."""
    specli = shlex.split(args.specli)
    plain_bin = args.llama_plain_bin or str(Path(args.llama_bin).with_name("llama-completion"))
    modes = NATIVE_DRAFT_MODES if args.draft else NATIVE_MODES
    report = []
    for workload in load_prompt_sets(args.prompts):
        work = Workload(model=args.model, draft=args.draft, prompt=workload["prompt"], k=args.draft_tokens,
                        n=args.max_tokens or int(workload.get("max_tokens", 128)), ngram_n=args.ngram_n,
                        threads=args.threads, ctx_size=args.ctx_size, specli_k=args.specli_k or "auto",
                        gpu_layers=args.gpu_layers)
        commands = {"specli": (run_specli, specli_command(specli, work, args.specli_arg)),
                    "specli plain": (run_specli, specli_command(specli, work, args.specli_arg, plain=True)),
                    "llama.cpp plain": (run_llama, llama_plain_command(plain_bin, work)),
                    **{mode: (run_llama, llama_native_command(args.llama_bin, work, mode, args.llama_arg))
                       for mode in modes}}
        if args.draft:  # the draft model alone, as the reference the combined proposer must not lose to
            commands["specli --no-ngram"] = (run_specli, specli_command(specli, work, [*args.specli_arg, "--no-ngram"]))
        if args.before:  # another specli (the code before a change), in the same rounds
            commands["specli before"] = (run_specli, specli_command(shlex.split(args.before), work, args.specli_arg))
        runs: dict[str, list[Run]] = {name: [] for name in commands}
        names = list(commands)
        try:
            for round_index in range(args.warmup + args.runs):
                shift = round_index % len(names)
                for name in names[shift:] + names[:shift]:
                    runner, command = commands[name]
                    run = runner(name, command, args.timeout, work.prompt)
                    if round_index >= args.warmup:
                        runs[name].append(run)
        except (RunError, subprocess.TimeoutExpired, OSError) as error:
            print(f"error: {workload['name']}: {error}", file=sys.stderr)
            return 1
        speed = {name: statistics.median(r.tokens_per_second for r in tool_runs) for name, tool_runs in runs.items()}
        text = {name: tool_runs[0].text for name, tool_runs in runs.items()}
        agreeing = [mode for mode in modes if agrees(text[mode], text["specli"])]
        best_any = max(modes, key=speed.__getitem__)
        best = _best_agreeing(modes, text, speed, "specli")
        before_best = _best_agreeing(modes, text, speed, "specli before") if args.before else None
        row = {"name": workload["name"], "kind": workload.get("kind", ""), "tokens_per_second": speed,
               "best_native": best_any, "best_native_like_for_like": best,
               "specli_over_best_native": speed["specli"] / speed[best] if best else None,
               "specli_over_best_native_any_text": speed["specli"] / speed[best_any],
               "specli_over_plain": speed["specli"] / speed["specli plain"],
               "specli_over_no_ngram": speed["specli"] / speed["specli --no-ngram"] if args.draft else None,
               "before_over_plain": speed["specli before"] / speed["specli plain"] if args.before else None,
               "before_over_best_native": speed["specli before"] / speed[before_best] if before_best else None,
               "plain_texts_agree": agrees(text["specli plain"], text["llama.cpp plain"]),
               "specli_text_is_plain": agrees(text["specli"], text["specli plain"]),
               "agreeing_modes": agreeing}
        report.append(row)
        if args.rows:  # as it goes: a run cut short keeps the prompts it finished
            with open(args.rows, "a", encoding="utf-8") as rows:
                rows.write(json.dumps({**row, "texts": text}) + "\n")
        ratio = f"{row['specli_over_best_native']:.2f}x {best}" if best else "no native mode wrote specli's text"
        print(f"{workload['name']}: specli {speed['specli']:.1f} t/s, plain {speed['specli plain']:.1f}; "
              f"best native {speed[best_any]:.1f} ({best_any}); like for like: {ratio}", file=sys.stderr, flush=True)
    summary = summarize_native(report)
    if args.json:
        print(json.dumps({"prompts": report, "summary": summary, "runs": args.runs, "model": str(args.model)}))
    else:
        print(format_native(report, summary))
    return 0


def _best_agreeing(modes: Sequence[str], text: dict, speed: dict, tool: str) -> str | None:
    """The fastest native mode that wrote `tool`'s text, if any did."""
    agreeing = [mode for mode in modes if agrees(text[mode], text[tool])]
    return max(agreeing, key=speed.__getitem__) if agreeing else None


def equal_length(args: argparse.Namespace) -> int:
    """Like for like at the same length: llama-speculative-simple writes past -n (up to half as
    many tokens again here), and the text past it is often the easiest (a layout repeating),
    so its tokens a second and specli's measure different spans. For each prompt of the
    --native-modes rows (--equal-length FILE) where a native mode wrote specli's text, that
    mode runs again, and specli (and --before) run with -n set to the tokens it decoded, in
    alternating rounds."""
    rows = {}
    for line in Path(args.equal_length).read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["name"]] = row
    specli = shlex.split(args.specli)
    for workload in load_prompt_sets(args.prompts):
        row = rows.get(workload["name"])
        mode = row and row["best_native_like_for_like"]
        if not mode:
            continue
        work = Workload(model=args.model, draft=args.draft, prompt=workload["prompt"], k=args.draft_tokens,
                        n=args.max_tokens or int(workload.get("max_tokens", 128)), ngram_n=args.ngram_n,
                        threads=args.threads, ctx_size=args.ctx_size, specli_k=args.specli_k or "auto",
                        gpu_layers=args.gpu_layers)
        native = (run_llama, llama_native_command(args.llama_bin, work, mode, args.llama_arg))
        try:
            decoded = native[0](mode, native[1], args.timeout, work.prompt).tokens  # also the warm-up
            # specli's rate leaves out the prompt decode's token, as llama.cpp's does: one more.
            same = dataclasses.replace(work, n=decoded + 1)
            commands = {mode: native, "specli": (run_specli, specli_command(specli, same, args.specli_arg))}
            if args.before:
                commands["specli before"] = (run_specli, specli_command(shlex.split(args.before), same, args.specli_arg))
            runs: dict[str, list[Run]] = {name: [] for name in commands}
            names = list(commands)
            for round_index in range(args.runs):
                shift = round_index % len(names)
                for name in names[shift:] + names[:shift]:
                    runner, command = commands[name]
                    runs[name].append(runner(name, command, args.timeout, work.prompt))
        except (RunError, subprocess.TimeoutExpired, OSError) as error:
            print(f"error: {workload['name']}: {error}", file=sys.stderr)
            return 1
        speed = {name: statistics.median(r.tokens_per_second for r in tool_runs) for name, tool_runs in runs.items()}
        tokens = {name: statistics.median(r.tokens for r in tool_runs) for name, tool_runs in runs.items()}
        result = {"name": workload["name"], "kind": workload.get("kind", ""), "mode": mode, "tokens": tokens,
                  "tokens_per_second": speed, "specli_over_native": speed["specli"] / speed[mode],
                  "before_over_native": speed["specli before"] / speed[mode] if args.before else None,
                  "texts_agree": agrees(runs[mode][0].text, runs["specli"][0].text)}
        with open(args.rows, "a", encoding="utf-8") as out:
            out.write(json.dumps(result) + "\n")
        print(f"{workload['name']}: {mode} {speed[mode]:.1f} t/s over {tokens[mode]:.0f} tokens, specli "
              f"{speed['specli']:.1f} over {tokens['specli']:.0f}: {result['specli_over_native']:.2f}x",
              file=sys.stderr, flush=True)
    return 0


def summarize_native(report: list[dict]) -> dict:
    """Geometric means of specli over the best native mode: like for like, overall and per category."""
    def geo(values: list[float]) -> float | None:
        return statistics.geometric_mean(values) if values else None

    like = [row for row in report if row["specli_over_best_native"] is not None]
    kinds = sorted({row["kind"] for row in report})
    summary = {
        "like_for_like_prompts": len(like), "prompts": len(report),
        "geomean_like_for_like": geo([row["specli_over_best_native"] for row in like]),
        "min_like_for_like": min((row["specli_over_best_native"] for row in like), default=None),
        "geomean_any_text": geo([row["specli_over_best_native_any_text"] for row in report]),
        "geomean_over_plain": geo([row["specli_over_plain"] for row in report]),
        "min_over_plain": min(row["specli_over_plain"] for row in report),
        "min_over_no_ngram": min((row["specli_over_no_ngram"] for row in report if row["specli_over_no_ngram"]),
                                 default=None),
        "by_kind": {kind: geo([row["specli_over_best_native"] for row in like if row["kind"] == kind]) for kind in kinds},
    }
    before = [row for row in report if row.get("before_over_plain")]
    if before:  # --before: the same figures for the other specli
        before_like = [row["before_over_best_native"] for row in before if row["before_over_best_native"]]
        summary.update({
            "before_geomean_over_plain": geo([row["before_over_plain"] for row in before]),
            "before_min_over_plain": min(row["before_over_plain"] for row in before),
            "before_like_for_like_prompts": len(before_like),
            "before_geomean_like_for_like": geo(before_like),
        })
    return summary


def format_native(report: list[dict], summary: dict) -> str:
    lines = ["| prompt | kind | specli t/s | vs own plain | best native (any text) | like for like: best agreeing mode | specli / it |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in report:
        speed = row["tokens_per_second"]
        best = row["best_native_like_for_like"]
        lines.append(f"| {row['name']} | {row['kind']} | {speed['specli']:.1f} | {row['specli_over_plain']:.2f}x | "
                     f"{speed[row['best_native']]:.1f} {row['best_native']} | {best or '-'} | "
                     f"{row['specli_over_best_native']:.2f}x |" if best else
                     f"| {row['name']} | {row['kind']} | {speed['specli']:.1f} | {row['specli_over_plain']:.2f}x | "
                     f"{speed[row['best_native']]:.1f} {row['best_native']} | - | - |")
    geo = summary["geomean_like_for_like"]
    lines.append(f"\nlike for like ({summary['like_for_like_prompts']} of {summary['prompts']} prompts): "
                 f"geometric mean {geo:.2f}x, lowest {summary['min_like_for_like']:.2f}x" if geo else
                 "\nno prompt where a native mode wrote specli's text")
    lines.append(f"any text: {summary['geomean_any_text']:.2f}x; specli over its own plain: "
                 f"{summary['geomean_over_plain']:.2f}x, lowest {summary['min_over_plain']:.2f}x")
    if summary.get("before_geomean_over_plain"):
        like = summary["before_geomean_like_for_like"]
        lines.append(f"specli before: {summary['before_geomean_over_plain']:.2f}x its plain, lowest "
                     f"{summary['before_min_over_plain']:.2f}x; like for like ({summary['before_like_for_like_prompts']} "
                     f"prompts) " + (f"{like:.2f}x" if like else "-"))
    if summary["min_over_no_ngram"] is not None:
        lines.append(f"specli over its draft model alone (--no-ngram): lowest {summary['min_over_no_ngram']:.2f}x")
    lines.append("by category (like for like): " + ", ".join(
        f"{kind} {value:.2f}x" if value else f"{kind} -" for kind, value in summary["by_kind"].items()))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.equal_length:
        return equal_length(args)
    if args.native_modes:
        return native_modes(args)
    max_tokens = args.max_tokens
    if args.workload:
        prompt, budget = shipped_workload(args.workload)
        max_tokens = max_tokens or budget
    else:
        prompt = args.prompt if args.prompt is not None else args.prompt_file.read_text()
    work = Workload(
        model=args.model, draft=args.draft, prompt=prompt, k=args.draft_tokens, n=max_tokens or 128,
        ngram_n=args.ngram_n, threads=args.threads, ctx_size=args.ctx_size, specli_k=args.specli_k,
        gpu_layers=args.gpu_layers, mtp=args.mtp,
    )
    commands = tool_commands(args, work)
    for name, (_, command) in commands.items():
        shown = [f"<prompt: {len(prompt)} chars>" if part == prompt and len(prompt) > 60 else part for part in command]
        print(f"{name}: {shlex.join(shown)}", file=sys.stderr)
    tools = {name: functools.partial(runner, name, command, args.timeout, prompt)
             for name, (runner, command) in commands.items()}

    names = list(tools)
    runs: dict[str, list[Run]] = {name: [] for name in names}
    try:
        for _ in range(args.warmup):
            for name in names:
                tools[name]()
        for round_index in range(args.runs):
            order = names if round_index % 2 == 0 else names[::-1]
            for name in order:
                run = tools[name]()
                runs[name].append(run)
                accept = "" if run.acceptance_rate is None else f", acceptance {run.acceptance_rate:.1%}"
                print(f"[{round_index + 1}/{args.runs}] {name}: {run.tokens} tokens, "
                      f"{run.tokens_per_second:.2f} t/s{accept}", file=sys.stderr)
    except (RunError, subprocess.TimeoutExpired, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1

    summary = {name: summarize(tool_runs) for name, tool_runs in runs.items()}
    median = {name: s["median_tokens_per_second"] for name, s in summary.items()}
    ratio = median["specli"] / median["llama.cpp"] if "specli" in median and "llama.cpp" in median else None
    speedups = {
        tool: median[tool] / median[f"{tool} plain"]
        for tool in ("llama.cpp", "specli") if tool in median and f"{tool} plain" in median
    }
    paired = {"specli / llama.cpp": paired_ratios(runs, "specli", "llama.cpp"),
              **{f"{tool} / {tool} plain": paired_ratios(runs, tool, f"{tool} plain") for tool in ("llama.cpp", "specli")}}
    agreement = text_agreement(summary)

    if args.json:
        print(json.dumps({
            "workload": {
                "model": str(work.model), "draft": "mtp" if work.mtp else str(work.draft) if work.draft else "ngram",
                "k": work.k, "n": work.n, "ngram_n": work.ngram_n if work.draft is None else None,
                "threads": work.threads, "gpu_layers": work.gpu_layers, "runs": args.runs,
                "prompt_chars": len(prompt),
            },
            "tools": summary,
            "specli_over_llama_cpp": ratio,
            "speedup_over_plain": speedups,
            "same_round_ratios": {label: value for label, value in paired.items() if value is not None},
            "text_agreement": agreement,
        }))
    else:
        print(format_table(summary))
        if ratio is not None:
            print(format_ratio("specli / llama.cpp", ratio, paired["specli / llama.cpp"]))
        for tool, speedup in speedups.items():
            print(format_ratio(f"{tool} speculative / plain", speedup, paired[f"{tool} / {tool} plain"]))
        if agreement:
            print(format_agreement(agreement, summary))
    return 0


def shipped_workload(name: str) -> tuple[str, int]:
    """(prompt, max_tokens) of a workload `specli bench` ships (specli/workloads.toml)."""
    from specli.comparison import load_workloads

    workloads = load_workloads()
    for workload in workloads:
        if workload.name == name:
            return workload.prompt, workload.max_tokens
    names = ", ".join(w.name for w in workloads)
    raise SystemExit(f"error: no workload named {name!r} in specli/workloads.toml (there are: {names})")


if __name__ == "__main__":
    sys.exit(main())
