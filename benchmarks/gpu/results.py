"""Turn what benchmarks/gpu/run.sh measures into JSON, and all of it into one markdown report.

Subcommands (each writes its JSON atomically, so an interrupted step leaves no half file):

    results.py env OUT.json                       the machine: GPU, driver, nvcc, CMake, CPU, Python
    results.py put OUT.json KEY=VALUE...           merge values (JSON where they parse) into a file
    results.py get FILE.json KEY[.KEY...]          print one value
    results.py junit TESTS.xml OUT.json            pytest's JUnit XML: counts, time, the failures
    results.py costs LLAMA_BENCH.json OUT.json     llama-bench -o json -> seconds per batch size
    results.py best OUT.json FILE.json...          the fastest llama.cpp setting among compare runs
    results.py memory OUT.json [--file F]... -- COMMAND...
                                                   run COMMAND, sampling nvidia-smi's memory use
    results.py summary RESULTS_DIR OUT_DIR          OUT_DIR/results.json and OUT_DIR/summary.md

Only the standard library is used, so it also runs before the venv exists.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1) + "\n")
    partial.replace(path)


def read_json(path: Path) -> object:
    return json.loads(path.read_text())


def _output(command: list[str]) -> str | None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


# --- env ----------------------------------------------------------------------------


def environment() -> dict:
    info: dict = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M)
        info["cpu"] = names[0] if names else None
    gpu = _output(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                   "--format=csv,noheader,nounits"])
    if gpu:
        name, driver, memory, capability = [part.strip() for part in gpu.splitlines()[0].split(",")]
        info["gpu"] = {"name": name, "driver": driver, "memory_mib": int(float(memory)),
                       "compute_capability": capability}
    nvcc = _output([shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc", "--version"])
    info["nvcc"] = nvcc.splitlines()[-1] if nvcc else None
    cmake = _output(["cmake", "--version"])
    info["cmake"] = cmake.splitlines()[0] if cmake else None
    info["commit"] = _output(["git", "-C", str(Path(__file__).resolve().parents[2]), "rev-parse", "HEAD"])
    return info


# --- put / get ----------------------------------------------------------------------


def put(path: Path, assignments: list[str]) -> None:
    data = read_json(path) if path.exists() else {}
    for assignment in assignments:
        key, _, text = assignment.partition("=")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        data[key] = value
    write_json(path, data)


def get(path: Path, dotted: str) -> object:
    value = read_json(path)
    for key in dotted.split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


# --- junit --------------------------------------------------------------------------


def junit(xml_path: Path) -> dict:
    root = ElementTree.parse(xml_path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {key: sum(int(suite.get(key, 0)) for suite in suites) for key in ("tests", "failures", "errors", "skipped")}
    failed = []
    for case in root.iter("testcase"):
        for outcome in ("failure", "error"):
            element = case.find(outcome)
            if element is not None:
                message = (element.get("message") or element.text or "").strip().splitlines()
                failed.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                               "message": message[0][:300] if message else ""})
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["seconds"] = round(sum(float(suite.get("time", 0)) for suite in suites), 1)
    counts["failed"] = failed
    return counts


# --- costs --------------------------------------------------------------------------


def costs(bench_path: Path) -> dict:
    """llama-bench's JSON records of prompt-only tests (n_gen 0) at one depth: the seconds
    one decode of n_prompt tokens takes, the shape of a verify of n_prompt - 1 drafted tokens."""
    records = [r for r in read_json(bench_path) if r.get("n_gen") == 0 and r.get("n_prompt", 0) > 0]
    if not records:
        raise SystemExit(f"results: no prompt-only records in {bench_path}")
    first = records[0]
    return {
        "source": f"llama-bench on {first.get('gpu_info') or first.get('cpu_info')}, {first.get('model_type')}, "
                  f"build {first.get('build_commit')}, after {first.get('n_depth', 0)} tokens of context",
        "seconds": {str(r["n_prompt"]): r["avg_ns"] / 1e9 for r in sorted(records, key=lambda r: r["n_prompt"])},
        "stddev_seconds": {str(r["n_prompt"]): r.get("stddev_ns", 0) / 1e9 for r in records},
        "n_depth": first.get("n_depth", 0),
        "flash_attn": first.get("flash_attn"),
        "n_gpu_layers": first.get("n_gpu_layers"),
    }


# --- best ---------------------------------------------------------------------------


def best(paths: list[Path]) -> dict:
    """Among compare_llamacpp.py --json runs of llama.cpp alone, the fastest setting."""
    candidates = []
    for path in paths:
        data = read_json(path)
        speed = data["tools"]["llama.cpp"]["median_tokens_per_second"]
        candidates.append({"file": path.name, "workload": data["workload"], "median_tokens_per_second": speed,
                           "acceptance_rate": data["tools"]["llama.cpp"]["median_acceptance_rate"]})
    if not candidates:
        raise SystemExit("results: no runs to choose from")
    top = max(candidates, key=lambda c: c["median_tokens_per_second"])
    return {"k": top["workload"]["k"], "ngram_n": top["workload"].get("ngram_n"), "best": top,
            "candidates": candidates}


# --- memory -------------------------------------------------------------------------


def _gpu_memory_used() -> tuple[int | None, dict[int, int]]:
    """(MiB used on GPU 0, {pid: MiB} of the processes nvidia-smi lists)."""
    total = _output(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"])
    apps = _output(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    used = int(float(total.splitlines()[0])) if total else None
    by_pid = {}
    for line in (apps or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and re.match(r"^[\d.]+$", parts[1]):
            by_pid[int(parts[0])] = int(float(parts[1]))
    return used, by_pid


def memory(command: list[str], files: list[Path], interval: float = 0.25) -> dict:
    """Run `command` (a process that loads the models and generates) and sample the GPU's
    memory use until it exits: the peak, over the baseline before it started."""
    available = shutil.which("nvidia-smi") is not None
    baseline, _ = _gpu_memory_used() if available else (None, {})
    started = time.perf_counter()
    # Output to files, not pipes: llama.cpp's verbose log would fill a pipe nobody reads
    # while this loop samples, and block the process.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+", errors="replace") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        peak, peak_process = baseline, 0
        samples = 0
        while process.poll() is None:
            if available:
                used, by_pid = _gpu_memory_used()
                samples += 1
                if used is not None and (peak is None or used > peak):
                    peak = used
                peak_process = max(peak_process, by_pid.get(process.pid, 0))
            time.sleep(interval)
        err.seek(0)
        stderr = err.read()
    offloaded = [{"layers": int(a), "of": int(b)} for a, b in OFFLOADED.findall(stderr)]
    return {
        "command": command,
        "exit_code": process.returncode,
        "seconds": round(time.perf_counter() - started, 2),
        "nvidia_smi": available,
        "samples": samples,
        "baseline_mib": baseline,
        "peak_mib": peak,
        "peak_over_baseline_mib": None if peak is None or baseline is None else peak - baseline,
        "peak_process_mib": peak_process or None,
        "offloaded": offloaded,
        "files_mib": {path.name: round(path.stat().st_size / 2**20) for path in files if path.exists()},
        "stderr_tail": stderr.strip().splitlines()[-5:],
    }


# --- summary ------------------------------------------------------------------------


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for row in rows:
        cells = ("–" if cell is None else str(cell).replace("|", "\\|") for cell in row)
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _sweep_table(label: str, sweep: dict) -> list[str]:
    """llama.cpp's speed and acceptance at each draft length a sweep tried."""
    return _table([label, "t/s", "acceptance"],
                  [[c["workload"]["k"], _f(c["median_tokens_per_second"], 1), _f(c["acceptance_rate"])]
                   for c in sweep["candidates"]])


def _f(value: object, digits: int = 2, suffix: str = "") -> str | None:
    return None if value is None else f"{value:.{digits}f}{suffix}"


def _environment_section(results: dict) -> list[str]:
    env, build, install = results.get("env", {}), results.get("build", {}), results.get("install", {})
    gpu = env.get("gpu") or {}
    rows = [
        ["date", env.get("date")],
        ["GPU", f"{gpu.get('name')} ({gpu.get('memory_mib')} MiB, compute capability "
                f"{gpu.get('compute_capability')}, driver {gpu.get('driver')})" if gpu else "none (CPU smoke run)"],
        ["CPU", f"{env.get('cpu')} ({env.get('cpu_count')} threads)"],
        ["nvcc / CMake / Python", f"{env.get('nvcc')} / {env.get('cmake')} / {env.get('python')}"],
        ["llama-cpp-python", install.get("llama_cpp_python") or build.get("llama_cpp_python")],
        ["build", f"{build.get('mode')}" + (f", {build['seconds']} s" if build.get("seconds") is not None else "")
                  + f": {build.get('cmake_args')}"],
        ["llama.cpp system info", install.get("system_info")],
        ["commit", env.get("commit")],
    ]
    return ["## Environment", ""] + _table(["", ""], rows)


def _tests_section(results: dict) -> list[str]:
    tests = results.get("tests")
    if not tests:
        return []
    lines = ["## (a) Real-model tests, every layer on the GPU", ""]
    lines += _table(["passed", "failed", "errors", "skipped", "seconds", "files"],
                    [[tests["passed"], tests["failures"], tests["errors"], tests["skipped"], tests["seconds"],
                      tests.get("files")]])
    notes = [f"- FAILED {f['test']}: {f['message']}" for f in tests.get("failed", [])]
    if tests.get("without_smollm"):
        notes.append("- The tests that need SmolLM2 were left out: its wheel had not been carried.")
    return lines + notes + ([""] if notes else [])


def _specli_bench_rows(bench: dict) -> list[list[object]]:
    rows = []
    for workload in bench.get("workloads", []):
        configs = workload["configs"]
        plain = configs.get("plain", {})
        auto = configs.get("auto")
        best_k = workload.get("recommended_k")
        fixed = configs.get(f"k={best_k}") if best_k else None

        def speed(summary: dict | None) -> str | None:
            if not summary:
                return None
            text = f"{summary['tokens_per_second']['median']:.1f}"
            if summary.get("speedup"):
                text += f" ({summary['speedup']['median']:.2f}×)"
            return text

        rows.append([workload["name"], speed(plain), speed(auto), f"K={best_k}: {speed(fixed)}" if fixed else None,
                     _f(auto.get("acceptance_rate") if auto else None),
                     _f(auto.get("python_overhead_ms_per_step") if auto else None),
                     _f(plain.get("python_overhead_ms_per_step")),
                     _f((auto or {}).get("time_split", {}).get("overhead"), 3),
                     _f(plain.get("time_split", {}).get("overhead"), 3)])
    return rows


def _compare_row(label: str, data: dict) -> list[object]:
    tools = data["tools"]
    work = data["workload"]
    setting = f"K={work['k']}" if work.get("ngram_n") is None else f"n={work['ngram_n']} m={work['k']}"
    paired = data.get("same_round_ratios", {}).get("specli / llama.cpp")
    speedups = data.get("speedup_over_plain", {})
    agreement = next((t for t in data.get("text_agreement", []) if t["tools"] == ["specli", "llama.cpp"]), None)
    if agreement is None or agreement["same"] is None:
        texts = "?"
    elif agreement["same"]:
        texts = "same"
    elif agreement["first_difference"] == min(agreement["chars"]):  # one stopped earlier
        texts = "same up to the shorter's end"
    else:
        texts = f"differ from char {agreement['first_difference']}"

    def speed(tool: str) -> str | None:
        return _f(tools[tool]["median_tokens_per_second"], 1) if tool in tools else None

    return [label, setting, speed("llama.cpp"), speed("specli"), _f(data.get("specli_over_llama_cpp")),
            f"{paired['median']:.2f} ({paired['min']:.2f}–{paired['max']:.2f})" if paired else None,
            _f(speedups.get("llama.cpp"), suffix="×"), _f(speedups.get("specli"), suffix="×"), texts]


COMPARE_HEADER = ["workload", "llama.cpp setting", "llama.cpp t/s", "specli t/s", "ratio of medians",
                  "same-round ratio (range)", "llama.cpp / own plain", "specli / own plain", "texts"]


def _bench_section(results: dict) -> list[str]:
    lines = []
    header = ["workload", "plain t/s", "-k auto t/s (× plain)", "best fixed K", "auto acceptance",
              "auto py ms/step", "plain py ms/step", "auto py share", "plain py share"]
    for name, title in (("bench-specli", "verifying on the host"),
                        ("bench-specli-on-device", "`--verify-on-device`")):
        bench = results.get(name)
        if bench:
            lines += [f"## (b) `specli bench` on the embedded model, {title}", ""]
            lines += _table(header, _specli_bench_rows(bench))
    sweeps = {name[len("bench-best-"):]: data for name, data in results.items() if name.startswith("bench-best-")}
    if sweeps:
        lines += ["llama.cpp `ngram-simple` alone, by setting (t/s; the fastest is compared below):", ""]
        lines += _table(["workload", "settings tried"], [
            [name, ", ".join(f"n={c['workload']['ngram_n']} m={c['workload']['k']}: {c['median_tokens_per_second']:.1f}"
                             for c in data["candidates"])] for name, data in sorted(sweeps.items())])
    compares = {name[len("bench-compare-"):]: data for name, data in results.items() if name.startswith("bench-compare-")}
    if compares:
        lines += ["## (b) specli `-k auto` against `llama-speculative-simple --spec-type ngram-simple` at its best "
                  "settings", ""]
        lines += _table(COMPARE_HEADER, [_compare_row(name, data) for name, data in sorted(compares.items())])
    return lines


def _synthetic_section(results: dict) -> list[str]:
    lines = []
    pair = results.get("synthetic-pair")
    compares = {label: results[name] for name, label in (("synthetic-compare", "specli -k auto"),
                                                          ("synthetic-compare-k8", "specli -k 8"),
                                                          ("synthetic-compare-auto", "specli -k auto"))
                if name in results}
    sweep = results.get("synthetic-best")
    if not (pair or compares):
        return lines
    lines += ["## (c) Synthetic memory-bound pair, draft-model mode", ""]
    if pair:
        lines += [f"Pair: {pair.get('shape')} shape, target {pair.get('target_mib')} MiB, draft "
                  f"{pair.get('draft_mib')} MiB, written in {pair.get('seconds')} s.", ""]
    if sweep:
        lines += _sweep_table("llama.cpp draft-simple K", sweep)
    if compares:
        lines += ["Fresh processes, the draft model alone in both (`--no-ngram`):", ""]
        lines += _table(COMPARE_HEADER, [_compare_row(label, data) for label, data in compares.items()])
    lines += _fresh_and_warm(compares, results.get("synthetic-warm"))
    curve = results.get("synthetic-costs")
    if curve:
        seconds = {int(k): v for k, v in curve["seconds"].items()}
        one = seconds.get(1)
        lines += [f"Verify cost, {curve['source']}:", ""]
        lines += _table(["tokens in one decode", "ms", "× one token"],
                        [[size, _f(1000 * s, 3), _f(s / one) if one else None] for size, s in sorted(seconds.items())])
    mem = results.get("synthetic-memory")
    if mem:
        offload = ", ".join(f"{o['layers']}/{o['of']}" for o in mem.get("offloaded", [])) or "not reported"
        lines += _table(["GPU memory while both models are loaded", ""], [
            ["peak used (MiB)", mem.get("peak_mib")],
            ["over the baseline before the run (MiB)", mem.get("peak_over_baseline_mib")],
            ["the specli process (MiB)", mem.get("peak_process_mib")],
            ["model files (MiB)", ", ".join(f"{k}: {v}" for k, v in mem.get("files_mib", {}).items())],
            ["layers offloaded (llama.cpp's log)", offload],
        ])
    return lines


def _fresh_and_warm(compares: dict, warm: dict | None) -> list[str]:
    """specli's fresh-process rates (compare_llamacpp) beside its warm ones (`specli bench`)."""
    if not warm or not warm.get("workloads"):
        return []
    configs = warm["workloads"][0]["configs"]
    rows = []
    for label, key in (("specli -k 8", "k=8"), ("specli -k auto", "auto")):
        summary = configs.get(key)
        fresh = compares.get(label, {}).get("tools", {}).get("specli", {}).get("median_tokens_per_second")
        if summary:
            warm_rate = summary["tokens_per_second"]["median"]
            rows.append([label, _f(fresh, 1), _f(warm_rate, 1), _f(fresh / warm_rate) if fresh else None,
                         _f(summary.get("speedup", {}).get("median"), suffix="×"),
                         _f(summary.get("time_split", {}).get("overhead"), 3),
                         summary.get("batch_changes_per_step"), summary.get("cuda_graphs")])
    return ["Fresh against warm (`specli bench`, one process, after its warm-up run):", ""] + _table(
        ["configuration", "fresh t/s", "warm t/s", "fresh / warm", "warm × plain", "warm py share",
         "batch changes a step", "CUDA graphs (reused, captured, reset)"], rows)


def _mtp_section(results: dict) -> list[str]:
    model, same, sweep, compare = (results.get(f"mtp-{name}") for name in ("model", "same-k2", "best", "compare"))
    if not (same or compare):
        return []
    lines = ["## (e) MTP: the target's own NextN layer drafts (`--draft mtp` / `--spec-type draft-mtp`)", ""]
    if model:
        lines += [f"Target: {model.get('shape')} {model.get('arch', 'MiMo-2')} with one NextN layer, "
                  f"{model.get('target_mib')} MiB, "
                  f"written in {model.get('seconds')} s.", ""]
    if sweep:
        lines += _sweep_table("llama.cpp draft-mtp depth", sweep)
    header = ["comparison", *COMPARE_HEADER[1:]]
    header[3] = "specli t/s"
    rows = ([_compare_row("same depth, MTP alone", same)] if same else []) + \
        ([_compare_row("each at its best (specli -k auto)", compare)] if compare else [])
    return lines + _table(header, rows)


def _plain_section(results: dict) -> list[str]:
    plains = {name[len("plain-"):]: data for name, data in results.items() if name.startswith("plain-")}
    if not plains:
        return []
    rows = []
    for name, data in sorted(plains.items()):
        tools = data["tools"]
        specli = tools.get("specli plain", {}).get("median_tokens_per_second")
        llama = tools.get("llama.cpp plain", {}).get("median_tokens_per_second")
        extra = 1000 / specli - 1000 / llama if specli and llama else None
        rows.append([name, _f(llama, 1), _f(specli, 1), _f(1000 / llama, 3) if llama else None,
                     _f(1000 / specli, 3) if specli else None, _f(extra, 3),
                     _f(100 * extra / (1000 / specli), 1, "%") if extra is not None else None])
    return ["## (d) Plain decoding", ""] + _table(
        ["model", "llama.cpp t/s", "specli t/s", "llama.cpp ms/token", "specli ms/token",
         "specli's extra ms/token", "share of specli's token"], rows)


def _replay_section(results: dict) -> list[str]:
    replays = {name[len("replay-"):]: data for name, data in results.items()
               if name.startswith("replay-") and "workloads" in data and "auto_geomean" in data}
    if not replays:
        return []
    rows = [[name, data.get("costs_source"), _f(data["auto_geomean"], 3, "×"),
             _f(data.get("clairvoyant_geomean"), 3, "×"), _f(data.get("python_share"), 3)]
            for name, data in sorted(replays.items())]
    return ["## Replay of `-k auto` (benchmarks/replay.py)", ""] + _table(
        ["curve", "verify costs", "auto, geometric mean", "clairvoyant bound", "Python's share of auto's time"], rows)


def _parallel_section(results: dict) -> list[str]:
    """(f): parallel_bench.py's reports, {clients: {side: figures}}, one table per pair."""
    lines: list[str] = []
    for name, label in (("parallel-draft", "the synthetic pair, its draft model in every slot"),
                        ("parallel-mtp", "the Qwen3.5, its NextN layer in every slot")):
        report = results.get(name)
        if not report:
            continue
        lines += [f"## (f) {label}: C clients at once", "",
                  "ratio: specli `--parallel C` over the side, median of in-round ratios", ""]
        rows = [[clients, side, _f(figures["aggregate"], 1), _f(figures["over_it"]), _f(figures["request_p50"], 1),
                 _f(figures["first_p50"]), _f(figures["rows_per_step"])]
                for clients, sides in report.items() for side, figures in sides.items()]
        lines += _table(["C", "side", "tok/s in all", "ratio", "request tok/s p50", "first token p50 s",
                         "drafted rows a step"], rows)
    return lines


def summary(results_dir: Path, out_dir: Path) -> None:
    results = {}
    for path in sorted(results_dir.glob("*.json")):
        try:
            results[path.stem] = read_json(path)
        except json.JSONDecodeError:
            continue
    write_json(out_dir / "results.json", results)
    lines = ["# specli on a GPU: benchmarks/gpu/run.sh", ""]
    steps = results.get("steps", {})
    if steps:
        lines += _table(["step", "state", "seconds"], [[name, s.get("state"), s.get("seconds")]
                                                       for name, s in steps.items()])
    for section in (_environment_section, _tests_section, _bench_section, _synthetic_section, _plain_section,
                    _mtp_section, _replay_section, _parallel_section):
        try:
            lines += section(results)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:  # a result of another shape
            lines += [f"({section.__name__[1:]}: could not read the results: {error!r})", ""]
    partial = out_dir / "summary.md.partial"
    partial.write_text("\n".join(lines))
    partial.replace(out_dir / "summary.md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("env").add_argument("out", type=Path)
    put_parser = commands.add_parser("put")
    put_parser.add_argument("out", type=Path)
    put_parser.add_argument("assignments", nargs="*")
    get_parser = commands.add_parser("get")
    get_parser.add_argument("file", type=Path)
    get_parser.add_argument("key")
    junit_parser = commands.add_parser("junit")
    junit_parser.add_argument("xml", type=Path)
    junit_parser.add_argument("out", type=Path)
    costs_parser = commands.add_parser("costs")
    costs_parser.add_argument("bench", type=Path)
    costs_parser.add_argument("out", type=Path)
    best_parser = commands.add_parser("best")
    best_parser.add_argument("out", type=Path)
    best_parser.add_argument("files", type=Path, nargs="+")
    memory_parser = commands.add_parser("memory")
    memory_parser.add_argument("out", type=Path)
    memory_parser.add_argument("--file", type=Path, action="append", default=[], help="a model file, for its size")
    summary_parser = commands.add_parser("summary")
    summary_parser.add_argument("results", type=Path)
    summary_parser.add_argument("out", type=Path)
    argv = sys.argv[1:] if argv is None else list(argv)
    run = argv[argv.index("--") + 1:] if "--" in argv else []  # memory's command
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)

    if args.command == "env":
        write_json(args.out, environment())
    elif args.command == "put":
        put(args.out, args.assignments)
    elif args.command == "get":
        value = get(args.file, args.key)
        print(value if isinstance(value, str) else json.dumps(value))
    elif args.command == "junit":
        write_json(args.out, junit(args.xml))
    elif args.command == "costs":
        write_json(args.out, costs(args.bench))
    elif args.command == "best":
        write_json(args.out, best(args.files))
    elif args.command == "memory":
        if not run:
            parser.error("memory: give the command after --")
        report = memory(run, args.file)
        write_json(args.out, report)
        return 0 if report["exit_code"] == 0 else 1
    else:
        summary(args.results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
