"""--rpc against real ggml-rpc-servers on 127.0.0.1: the target's layers over two, the output
as without them, the draft placed by --draft-rpc, doctor's report, and a server that is down,
killed mid-run or cut off mid-run ending in one line that names it.

The server is built from the llama.cpp that llama-cpp-python vendors (tests/support/rpc_server.py;
minutes the first time, cached after).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time

import pytest
from helpers import assert_lossless, assert_one_line_error

from tests.support.harness import free_port
from tests.support.rpc_server import Server

pytestmark = pytest.mark.slow  # builds and starts servers, loads a real model

PROMPT = "Copy this list exactly: red, green, blue, cyan, magenta, yellow. Copy: red, green,"


def specli(*args: object) -> list[str]:
    return [sys.executable, "-m", "specli", *map(str, args)]


@pytest.fixture(scope="module")
def servers():
    with Server() as first, Server() as second:
        yield first, second


# In a child process: specli's abort handler stays for the life of a process that used RPC,
# and a server serves one client at a time (this test's, not the next test's).
LOSSLESS_CHECK = """
import json, sys
from specli.llama.backend import LoadSettings, Model
from specli.comparison import plain_greedy
from specli.decode.engine import Engine
from specli.decode.policy import FixedDraftPolicy
from specli.decode.request import GenerationRequest
from specli.decode.events import Token
from specli.decode.ngram import NGramProposer

path, endpoints, prompt = sys.argv[1], tuple(sys.argv[2].split(",")), sys.argv[3]
with Model(path, LoadSettings(ctx_size=512, rpc=endpoints)) as model:
    tokens = model.tokenize(prompt)
    plain, margins = plain_greedy(model, tokens, 40)
    model.rewind(0)
    engine = Engine(model, NGramProposer(), FixedDraftPolicy(4), GenerationRequest(max_tokens=40))
    events = list(engine.generate(tokens))
output = [event.id for event in events if isinstance(event, Token) and event.id >= 0]
print(json.dumps({"plain": plain, "margins": [float(m) for m in margins], "output": output,
                  "accepted": events[-1].stats.accepted}))
"""


def test_greedy_speculative_over_rpc_is_plain_decoding_over_rpc(gemma_path, servers):
    endpoints = ",".join(server.endpoint for server in servers)
    result = subprocess.run([sys.executable, "-c", LOSSLESS_CHECK, str(gemma_path), endpoints, PROMPT],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    run = json.loads(result.stdout)
    plain, margins, output = run["plain"], run["margins"], run["output"]
    assert run["accepted"] > 0, "a copy task must keep drafted tokens"
    assert_lossless(plain, margins, output)


def test_run_spreads_the_target_over_both_servers_and_keeps_the_output_head_here(gemma_path, servers):
    endpoints = ",".join(server.endpoint for server in servers)
    result = subprocess.run(specli("run", "--target", gemma_path, "--draft", "ngram", "-k", "4", "-n", "24", "--json",
                                   "--ctx-size", "512", "--rpc", endpoints, "--verbose", PROMPT),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert records[-1]["rpc"] == endpoints.split(",")
    assert sum(record["type"] == "token" for record in records) > 0
    # llama.cpp's load log: layers on each server, and the output head (Gemma ties it to the
    # token embeddings) in a CPU buffer here.
    for server in servers:
        assert f"[{server.endpoint}] model buffer size" in result.stderr, result.stderr[-3000:]
    assert "token_embd.weight" in result.stderr and "buffer type overridden to CPU" in result.stderr


def test_the_draft_goes_to_servers_only_with_draft_rpc(gemma_path, servers):
    first, second = (server.endpoint for server in servers)
    common = ["run", "--target", gemma_path, "--draft", gemma_path, "-k", "3", "-n", "8", "-q", "--ctx-size", "256",
              "--verbose", "--rpc", first, PROMPT]
    local = subprocess.run(specli(*common), capture_output=True, text=True, timeout=300)
    remote = subprocess.run(specli(*common, "--draft-rpc", second), capture_output=True, text=True, timeout=300)
    assert local.returncode == 0 and remote.returncode == 0, local.stderr[-2000:] + remote.stderr[-2000:]
    assert f"[{second}] model buffer size" not in local.stderr  # the draft stayed here
    assert f"[{second}] model buffer size" in remote.stderr
    assert f"[{first}] model buffer size" in local.stderr and f"[{first}] model buffer size" in remote.stderr


def test_a_server_that_is_down_is_named_at_once(gemma_path, servers):
    down = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = subprocess.run(specli("run", "--target", gemma_path, "-n", "4", "--rpc", f"{servers[0].endpoint},{down}", "hello"),
                            capture_output=True, text=True, timeout=60)
    assert_one_line_error(type("R", (), {"code": result.returncode, "out": result.stdout, "err": result.stderr}),
                          f"RPC server {down}: connection refused")
    assert time.monotonic() - started < 30


def test_doctor_reports_each_server_and_its_devices(servers):
    endpoints = [server.endpoint for server in servers]
    down = f"127.0.0.1:{free_port()}"
    result = subprocess.run(specli("doctor", "--json", "--rpc", ",".join([*endpoints, down])),
                            capture_output=True, text=True, timeout=120)
    report = json.loads(result.stdout)
    assert result.returncode == 1  # a server that does not answer is a problem
    assert report["backend"]["rpc"] is True
    states = {state["endpoint"]: state for state in report["rpc_servers"]}
    for endpoint in endpoints:
        assert states[endpoint]["answers"] and states[endpoint]["protocol"] == "7.0.0"
        device = states[endpoint]["devices"][0]
        assert device["description"] == endpoint and device["memory_free"] > 0
    assert not states[down]["answers"] and "connection refused" in states[down]["error"]
    assert any(down in problem for problem in report["problems"])


COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # Gemma goes on counting, for as long as it is let


def _fault_mid_run(gemma_path, endpoints: str, fault, timeout: float) -> tuple[int, str, str, float]:
    """Start a long run over `endpoints`, call `fault()` once it has written a few tokens, and
    wait for the run to end: its exit code, stdout (all of it), stderr, and the seconds it
    took after the fault."""
    process = subprocess.Popen(
        specli("run", "--target", gemma_path, "--draft", "ngram", "-k", "4", "-n", "2000", "--ctx-size", "4096",
               "--rpc", endpoints, COUNTING),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        before = _read_some(process, 60, at_least=16)
        assert len(before) >= 16, f"too little text before the fault: {before!r}"
        fault()
        faulted = time.monotonic()
        out, err = process.communicate(timeout=timeout)
        waited = time.monotonic() - faulted
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, (before + out).decode(), err.decode(), waited


def test_a_server_killed_mid_run_ends_in_one_line_naming_it(gemma_path):
    with Server() as first, Server() as second:
        code, out, err, _ = _fault_mid_run(gemma_path, f"{first.endpoint},{second.endpoint}", second.kill, 60)
    assert code == 1, err
    assert err.count("\n") == 1 and err.startswith(f"specli: error: RPC server {second.endpoint}"), err
    assert "Traceback" not in err
    assert out.startswith(" 11, 12,") and out.endswith("\n"), out  # the text so far, flushed


def _read_some(process: subprocess.Popen, timeout: float, at_least: int = 1) -> bytes:
    """Stdout's first bytes (at least `at_least` of them): the run is generating."""
    deadline = time.monotonic() + timeout
    data = b""
    while len(data) < at_least and time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.5)
        if ready:
            chunk = os.read(process.stdout.fileno(), 4096)
            if not chunk:
                break
            data += chunk
    return data


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="a network namespace needs root and iproute2")
def test_a_server_cut_off_mid_run_is_given_up_in_bounded_time(gemma_path):
    """No reset ever comes from a host that vanished: keepalive and the TCP user timeout
    on ggml-rpc's socket end the wait (specli.llama.rpc.SILENT_PEER_SECONDS)."""
    from benchmarks.netdelay import Namespace
    from specli.llama.rpc import SILENT_PEER_SECONDS

    with Namespace() as namespace:
        prefix = ("ip", "netns", "exec", namespace.name)
        with Server(namespace.address, 50052, prefix=prefix) as server:
            cut = ["ip", "link", "set", namespace.host_link, "down"]
            code, _, err, waited = _fault_mid_run(gemma_path, server.endpoint, lambda: subprocess.run(cut, check=True),
                                                  SILENT_PEER_SECONDS + 60)
    assert code == 1, err
    assert err.count("\n") == 1 and err.startswith(f"specli: error: RPC server {server.endpoint} stopped answering"), err
    assert waited < SILENT_PEER_SECONDS + 15
