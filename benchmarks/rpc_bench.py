"""Plain against speculative decoding with the target over two llama.cpp rpc-servers.

Scenarios: no RPC (the reference), the servers on loopback, then inside a network namespace behind a veth pair
with a round-trip time added (tc netem where the kernel has it, else benchmarks/netdelay.py's
relay; see its docstring). For each scenario:

- the round-trip time as measured (an RPC command and its reply, timed from this side);
- round trips per decode, counted by the relay, for a plain decode and for one
  speculative step (n-gram, K=4);
- `specli bench --rpc ...` on the grounded workloads (-k auto, 4, 8 against plain), with a
  fresh specli cache, so -k auto's calibration runs over this network;
- the calibrated verify costs -k auto priced its drafts with.

    sudo python benchmarks/rpc_bench.py --rtt-ms 1 5 --runs 3    # root: namespaces
    python benchmarks/synthetic.py tiny /tmp/tiny    # a network-bound pair: tiny layers, local draft
    sudo python benchmarks/rpc_bench.py --target /tmp/tiny/tiny-s0-target.gguf --draft /tmp/tiny/tiny-s0-draft.gguf

Writes benchmarks/out/rpc/<date-time>/report.json and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.netdelay import Namespace  # noqa: E402
from tests.support.rpc_server import Server  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NETDELAY = REPO / "benchmarks" / "netdelay.py"
GROUNDED = ("code-edit", "summarise", "extract-fields")


def specli(*args: object, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, SPECLI_CACHE=str(cache))
    return subprocess.run([sys.executable, "-m", "specli", *map(str, args)], capture_output=True, text=True,
                          env=env, check=True)


def measured_rtt_ms(endpoint: str, count: int = 20) -> float:
    """Median time of an RPC command and its reply (DEVICE_COUNT, after HELLO)."""
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def command(code: int, payload: bytes, answer: int) -> None:
            sock.sendall(struct.pack("<BQ", code, len(payload)) + payload)
            need = 8 + answer
            while need:
                chunk = sock.recv(need)
                if not chunk:
                    raise ConnectionError(f"{endpoint} hung up")
                need -= len(chunk)

        command(14, bytes(24), 28)  # HELLO
        times = []
        for _ in range(count):
            started = time.perf_counter()
            command(15, b"", 4)  # DEVICE_COUNT
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def relay_trips(stats_files: list[Path]) -> int:
    return sum(json.loads(path.read_text())["round_trips"] for path in stats_files)


# In one process: a first generation meets each batch shape once (ggml-rpc then asks each
# server for some tensors' sizes, a round trip each, and caches the answers); the second
# is counted, as a bench's measured runs come after its warm-up.
TRIPS = """
import json, sys, time
from specli.llama import rpc
from specli.llama.backend import LoadSettings
from specli.decode.request import DraftKind, GenerationRequest
from specli.session import SessionSpec, open_session

path, endpoints, draft, stats_files = sys.argv[1], tuple(sys.argv[2].split(",")), int(sys.argv[3]), sys.argv[4:]
prompt = "Copy this list exactly: red, green, blue, cyan, magenta, yellow. Copy: red, green,"

def trips():
    time.sleep(0.6)  # the relays write their counters at most every 0.5 s
    return sum(json.load(open(path))["round_trips"] for path in stats_files)

rpc.connect(endpoints)
with open_session(SessionSpec(path, target_load=LoadSettings(ctx_size=512, rpc=endpoints))) as session:
    tokens = session.target.tokenize(prompt)
    request = GenerationRequest(max_tokens=64, draft=DraftKind.NGRAM if draft else DraftKind.NONE,
                                draft_tokens=max(draft, 1))
    counts = []
    for _ in range(2):
        session.clear_cache()  # the whole prompt decoded each time
        before = trips()
        engine = session.engine_for(request)
        for event in engine.generate(tokens):
            pass
        counts.append((trips() - before) / (engine.stats.steps + 1))  # and the prompt's decode
print(json.dumps(counts[-1]))
"""


def trips_per_decode(target: Path, endpoints: str, stats_files: list[Path]) -> dict:
    """Round trips (all servers together) per target decode, once every batch shape has been
    seen: plain, and n-gram steps at K=4."""
    result = {}
    for name, draft in (("plain", 0), ("speculative_k4", 4)):
        run = subprocess.run([sys.executable, "-c", TRIPS, str(target), endpoints, str(draft), *map(str, stats_files)],
                             capture_output=True, text=True, check=True, cwd=REPO)
        result[name] = json.loads(run.stdout)
    return result


def scenario(target: Path, rtt_ms: float | str | None, args, out: Path) -> dict:
    """rtt_ms: "local" (no RPC, the reference), None (servers on loopback), or milliseconds."""
    label = rtt_ms if rtt_ms == "local" else "loopback" if rtt_ms is None else f"{rtt_ms:g} ms"
    cache = out / f"cache-{label.replace(' ', '')}"
    with contextlib.ExitStack() as stack:
        stats_files: list[Path] = []
        if rtt_ms == "local":
            endpoints, delay = [], None
        elif rtt_ms is None:
            servers = [stack.enter_context(Server(threads=args.server_threads)) for _ in range(2)]
            endpoints = [server.endpoint for server in servers]
            delay = None
        else:
            namespace = stack.enter_context(Namespace())
            delay = namespace.add_delay(rtt_ms) or "relay"
            prefix = ("ip", "netns", "exec", namespace.name)
            servers = [stack.enter_context(Server(namespace.address, port, threads=args.server_threads, prefix=prefix))
                       for port in (50052, 50053)]  # a fresh namespace: every port is free
            endpoints = []
            for server in servers:  # a relay in front of each: it counts, and adds the delay without netem
                stats = out / f"relay-{label.replace(' ', '')}-{server.port}.json"
                relay = namespace.run([sys.executable, str(NETDELAY), "relay", "--listen", f"{namespace.address}:0",
                                       "--to", server.endpoint, "--rtt-ms", str(rtt_ms if delay == "relay" else 0),
                                       "--stats", str(stats)], stdout=subprocess.PIPE, text=True)
                endpoints.append(relay.stdout.readline().split()[-1])
                stats_files.append(stats)
        joined = ",".join(endpoints)
        rpc = ["--rpc", joined] if endpoints else []
        report = {"scenario": label, "delay": delay, "endpoints": endpoints,
                  "measured_rtt_ms": [measured_rtt_ms(endpoint) for endpoint in endpoints]}
        if stats_files:
            report["trips"] = trips_per_decode(target, joined, stats_files)
        bench = specli("bench", "--target", target, "--draft", args.draft, "-k", args.k, "--runs", args.runs,
                       "--prompts", out / "grounded.toml", *rpc, "--json", cache=cache)
        report["bench"] = json.loads(bench.stdout)
        doctor = subprocess.run([sys.executable, "-m", "specli", "doctor", "--json", "--target", target, *rpc],
                                capture_output=True, text=True, env=dict(os.environ, SPECLI_CACHE=str(cache)))
        report["costs"] = json.loads(doctor.stdout)["model"]
    return report


def grounded_workloads(out: Path) -> Path:
    from specli.comparison import load_workloads

    path = out / "grounded.toml"
    lines = []
    for workload in load_workloads():
        if workload.name in GROUNDED:
            lines.append("[[workload]]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in asdict(workload).items() if value is not None]
    path.write_text("\n".join(lines) + "\n")
    return path


def print_table(reports: list[dict]) -> None:
    print("| network | RTT measured | trips/decode (plain, K=4 step) | workload | plain tok/s | best speculative | "
          "-k auto | auto drafts/step | verify(8)/verify(1) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for report in reports:
        rtt = f"{statistics.median(report['measured_rtt_ms']):.2f} ms" if report["measured_rtt_ms"] else "-"
        trips = report.get("trips")
        trip_text = f"{trips['plain']:.1f}, {trips['speculative_k4']:.1f}" if trips else "-"
        ratio = report["costs"]["verify_relative"]["8"] if report.get("costs") else None
        for workload in report["bench"]["workloads"]:
            configs = workload["configs"]
            plain = configs["plain"]["tokens_per_second"]["median"]
            speculative = {label: c for label, c in configs.items() if label != "plain" and c["speedup"]}
            if not speculative:
                continue  # nothing generated (a synthetic model may end at once)
            best = max(speculative, key=lambda label: speculative[label]["speedup"]["median"])
            auto = speculative.get("auto")
            print(f"| {report['scenario']} | {rtt} | {trip_text} | {workload['name']} | {plain:.1f} | "
                  f"{best} {speculative[best]['speedup']['median']:.2f}× | "
                  f"{auto['speedup']['median']:.2f}× | {auto['drafted_per_step']:.1f} | "
                  f"{ratio:.2f}× |" if auto else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rtt-ms", type=float, nargs="*", default=[1.0, 5.0], help="Added round-trip times.")
    parser.add_argument("--no-local", action="store_true", help="Skip the reference without RPC and the one on loopback.")
    parser.add_argument("--runs", default="3")
    parser.add_argument("-k", default="auto,4,8")
    parser.add_argument("--server-threads", type=int, default=1, help="CPU threads of each rpc-server.")
    parser.add_argument("--target", type=Path, help="Target GGUF (default: the embedded model).")
    parser.add_argument("--draft", default="ngram", help="Draft GGUF (kept local) or ngram.")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out" / "rpc")
    args = parser.parse_args()
    from specli.models.demo import embedded_model_path

    target = args.target or embedded_model_path()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out / stamp
    out.mkdir(parents=True, exist_ok=True)
    grounded_workloads(out)
    scenarios = ([] if args.no_local else ["local", None]) + list(args.rtt_ms)
    reports = []
    for rtt in scenarios:
        reports.append(scenario(target, rtt, args, out))
        (out / "report.json").write_text(json.dumps(reports, indent=1))
    print_table(reports)
    print(f"\n{out / 'report.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
