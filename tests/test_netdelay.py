"""benchmarks/netdelay.py: the delaying relay on loopback, and a real network namespace."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks import netdelay
from benchmarks.netdelay import DelayRelay, Namespace, echo_server, exchange

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "netdelay.py"


@pytest.fixture
def relay_to_echo():
    relays = []

    def start(rtt_ms: float) -> DelayRelay:
        relays.append(DelayRelay(("127.0.0.1", 0), echo_server(), rtt_ms).start())
        return relays[-1]

    yield start
    for relay in relays:
        relay.close()


def connect(address) -> socket.socket:
    sock = socket.create_connection(address, timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_bytes_come_back_unchanged(relay_to_echo):
    relay = relay_to_echo(20)
    payload = os.urandom(8 << 20)
    with connect(relay.address) as sock:
        assert exchange(sock, b"hello") == b"hello"
        # The echo's replies flow while the payload is still going out, so send from a thread.
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        reply = bytearray()
        while len(reply) < len(payload):
            reply += sock.recv(1 << 20)
        sender.join()
    assert reply == payload
    wait_for(lambda: relay.stats()["connections"][0]["open"] is False)
    stats = relay.stats()
    assert stats["bytes_up"] == stats["bytes_down"] == 5 + len(payload)


@pytest.mark.parametrize("rtt_ms", [20, 0])
def test_each_exchange_is_one_round_trip_and_waits_the_rtt(relay_to_echo, rtt_ms):
    relay = relay_to_echo(rtt_ms)
    with connect(relay.address) as sock:
        start = time.monotonic()
        for index in range(10):
            message = f"request {index}".encode() * 100
            assert exchange(sock, message) == message
        elapsed = time.monotonic() - start
    assert elapsed >= 10 * rtt_ms / 1000  # each chunk is held rtt/2 each way, never less
    stats = relay.stats()
    assert stats["round_trips"] == 10
    assert stats["bytes_up"] == stats["bytes_down"] == sum(len(f"request {i}") * 100 for i in range(10))


def test_requests_without_replies_add_no_round_trip():
    received = []
    sink = socket.create_server(("127.0.0.1", 0))  # reads everything, answers once

    def serve() -> None:
        conn, _ = sink.accept()
        with conn:
            while len(b"".join(received)) < 30:
                received.append(conn.recv(100))
            conn.sendall(b"done")
            conn.recv(1)

    threading.Thread(target=serve, daemon=True).start()
    relay = DelayRelay(("127.0.0.1", 0), sink.getsockname()[:2], 2).start()
    try:
        with connect(relay.address) as sock:
            for _ in range(3):
                sock.sendall(b"x" * 10)
                time.sleep(0.01)
            assert sock.recv(4) == b"done"
        assert relay.stats()["round_trips"] == 1
    finally:
        relay.close()
        sink.close()


@pytest.mark.slow
def test_relay_process_writes_its_counters(tmp_path):
    stats_path = tmp_path / "relay.json"
    target = echo_server()
    relay = subprocess.Popen([sys.executable, str(SCRIPT), "relay", "--listen", "127.0.0.1:0",
                              "--to", "%s:%d" % target, "--rtt-ms", "2", "--stats", str(stats_path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        host, _, port = relay.stdout.readline().split()[-1].rpartition(":")
        assert json.loads(stats_path.read_text())["round_trips"] == 0
        with connect((host, int(port))) as sock:
            for _ in range(3):
                assert exchange(sock, b"ping") == b"ping"
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=10) == 0
    finally:
        relay.kill()
        relay.wait()
    stats = json.loads(stats_path.read_text())
    assert (stats["round_trips"], stats["bytes_up"], stats["bytes_down"]) == (3, 12, 12)
    assert not list(tmp_path.glob("*.tmp"))


needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="network namespaces need root and iproute2")


def leftovers(namespace: Namespace) -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [name for name, listing in ((namespace.name, names), (namespace.host_link, links),
                                       (namespace.inner_link, links)) if name in listing]


@pytest.mark.slow
@needs_root
def test_namespace_relays_to_a_server_inside_and_leaves_nothing(tmp_path):
    stats_path = tmp_path / "relay.json"
    echo = "import sys, time; from benchmarks.netdelay import echo_server; print(echo_server()[1], flush=True); time.sleep(600)"
    with pytest.raises(RuntimeError, match="inside the with-block"):
        with Namespace() as namespace:
            server = namespace.run([sys.executable, "-c", echo], stdout=subprocess.PIPE, text=True, cwd=ROOT)
            server_port = int(server.stdout.readline())
            relay = namespace.run([sys.executable, str(SCRIPT), "relay", "--listen", f"{namespace.address}:0",
                                   "--to", f"127.0.0.1:{server_port}", "--rtt-ms", "4", "--stats", str(stats_path)],
                                  stdout=subprocess.PIPE, text=True)
            relay_port = int(relay.stdout.readline().rpartition(":")[2])
            with pytest.raises(OSError):  # the server's loopback is the namespace's own
                socket.create_connection(("127.0.0.1", server_port), timeout=5).close()
            with connect((namespace.address, relay_port)) as sock:
                for _ in range(3):
                    assert exchange(sock, b"ping") == b"ping"
            wait_for(lambda: json.loads(stats_path.read_text())["round_trips"] == 3)
            qdiscs = subprocess.run(["tc", "qdisc", "show", "dev", namespace.host_link],
                                    capture_output=True, text=True).stdout
            assert "netem" not in qdiscs
            assert (namespace.add_delay(2) == "netem") == ("netem" in subprocess.run(
                ["tc", "qdisc", "show", "dev", namespace.host_link], capture_output=True, text=True).stdout)
            raise RuntimeError("inside the with-block")
    assert server.poll() is not None and relay.poll() is not None
    assert leftovers(namespace) == []


@needs_root
def test_namespace_setup_failing_halfway_removes_what_it_made(monkeypatch):
    real_ip = netdelay._ip

    def failing_ip(*args, **kwargs):
        if args[:2] == ("link", "set") and args[-1] == "up":  # after the namespace and the pair exist
            raise RuntimeError("link up failed")
        return real_ip(*args, **kwargs)

    monkeypatch.setattr(netdelay, "_ip", failing_ip)
    namespace = Namespace()
    with pytest.raises(RuntimeError, match="link up failed"):
        namespace.__enter__()
    monkeypatch.undo()
    assert leftovers(namespace) == []


@pytest.mark.slow
@needs_root
def test_namespace_is_removed_on_sigterm():
    script = ("import time; from benchmarks.netdelay import Namespace\n"
              "with Namespace() as n:\n"
              "    n.run(['sleep', '600'])\n"
              "    print(n.name, n.host_link, flush=True)\n"
              "    time.sleep(600)\n")
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    name, host_link = process.stdout.readline().split()
    assert name in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 128 + signal.SIGTERM
    assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert host_link not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
