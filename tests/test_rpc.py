"""--rpc: how servers are spelled, and the bounded handshake against servers that misbehave.

The servers here are small Python stand-ins on 127.0.0.1 that speak (or break) ggml-rpc's
framing; tests/test_rpc_servers.py runs the real ggml-rpc-server.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from tests.support.harness import free_port
from specli.errors import UsageError
from specli.llama import rpc
from specli.llama.rpc import Endpoint, RpcError


def test_endpoints_are_parsed_as_llama_cpp_spells_them():
    assert rpc.parse_endpoints("127.0.0.1:50052, gpu-box:50053") == (
        Endpoint("127.0.0.1", 50052), Endpoint("gpu-box", 50053))


@pytest.mark.parametrize("text, fragment", [
    ("127.0.0.1", "is not HOST:PORT"),
    (":50052", "is not HOST:PORT"),
    ("a:1,,b:2", "an empty entry"),
    ("box:http", "not a number"),
    ("box:0", "not a number from 1 to 65535"),
    ("box:70000", "not a number from 1 to 65535"),
    ("[::1]:50052", "IPv6"),
    ("fe80::1:50052", "IPv6"),
    ("a:1,a:1", "listed twice"),
    (",".join(f"h{i}:1" for i in range(17)), "at most 16"),
])
def test_misspelled_endpoints_are_usage_errors(text, fragment):
    with pytest.raises(UsageError, match=fragment):
        rpc.parse_endpoints(text)


class FakeServer:
    """Accepts one connection at a time on a free port and hands it to `serve`."""

    def __init__(self, serve) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = Endpoint("127.0.0.1", self.listener.getsockname()[1])
        self.serve = serve
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                try:
                    self.serve(conn)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def receive(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the client hung up")
        data += chunk
    return data


def read_command(conn: socket.socket) -> tuple[int, bytes]:
    command, size = struct.unpack("<BQ", receive(conn, 9))
    return command, receive(conn, size)


def speaking(version: tuple[int, int, int], devices: int = 1):
    def serve(conn: socket.socket) -> None:
        command, payload = read_command(conn)
        assert command == 14 and len(payload) == 24  # HELLO with protocol 7's transport caps
        conn.sendall(struct.pack("<Q", 28) + bytes([*version, 0]) + bytes(24))
        command, payload = read_command(conn)
        assert command == 15 and payload == b""  # DEVICE_COUNT
        conn.sendall(struct.pack("<QI", 4, devices))
        conn.recv(1)  # until the client closes
    return serve


@pytest.fixture
def server_of():
    servers = []

    def start(serve) -> Endpoint:
        servers.append(FakeServer(serve))
        return servers[-1].endpoint

    yield start
    for server in servers:
        server.close()


def test_a_server_of_this_protocol_answers_with_its_devices(server_of):
    endpoint = server_of(speaking((7, 0, 0), devices=2))
    info = rpc.hello(endpoint)
    assert info.protocol == (7, 0, 0) and info.devices == 2


def test_a_refused_connection_names_the_server():
    endpoint = Endpoint("127.0.0.1", free_port())
    with pytest.raises(RpcError, match=f"RPC server {endpoint}: connection refused"):
        rpc.hello(endpoint)


def test_a_silent_server_is_given_up_after_the_timeout(server_of):
    endpoint = server_of(lambda conn: time.sleep(3))  # busy with someone else: never answers
    started = time.monotonic()
    with pytest.raises(RpcError, match=f"RPC server {endpoint} accepted the connection but did not answer within 0.5 s"):
        rpc.hello(endpoint, timeout=0.5)
    assert time.monotonic() - started < 10  # not the 3 s the server would take


@pytest.mark.parametrize("version", [(8, 0, 0), (6, 1, 0), (7, 1, 0)])
def test_another_protocol_version_is_named(server_of, version):
    endpoint = server_of(speaking(version))
    with pytest.raises(RpcError, match=rf"speaks RPC protocol {'.'.join(map(str, version))}; this build speaks 7\.0\.0"):
        rpc.hello(endpoint)


def test_an_older_server_that_hangs_up_on_the_new_hello_is_explained(server_of):
    def old_server(conn: socket.socket) -> None:
        conn.recv(9)  # protocol 3 wants an empty HELLO: a 24-byte one is refused by hanging up

    endpoint = server_of(old_server)
    with pytest.raises(RpcError, match="closed the connection during the handshake: it may speak another RPC protocol"):
        rpc.hello(endpoint)


def test_a_server_without_devices_is_refused(server_of):
    endpoint = server_of(speaking((7, 0, 0), devices=0))
    with pytest.raises(RpcError, match="offers no devices"):
        rpc.hello(endpoint)


def test_after_a_fault_the_servers_that_went_away_are_named(server_of):
    alive = server_of(lambda conn: conn.recv(1))
    gone = Endpoint("127.0.0.1", free_port())
    message = rpc.fault_message([alive, gone], "Remote RPC server crashed or returned malformed response")
    assert message == f"RPC server {gone} stopped answering (connection refused)"
    message = rpc.fault_message([alive], "/src/ggml-rpc.cpp:566: Remote RPC server crashed or returned malformed "
                                         "response", tries=1)
    assert message == f"an RPC server ({alive}) failed: Remote RPC server crashed or returned malformed response"


def test_an_abort_of_llama_cpps_own_is_not_blamed_on_a_server(server_of, monkeypatch):
    alive = server_of(lambda conn: conn.recv(1))
    monkeypatch.setattr(rpc, "_connected", [alive])
    assert rpc._fault_line("/src/ggml.c:1234: GGML_ASSERT(a->ne[0] == b->ne[0]) failed") == (
        "llama.cpp aborted: GGML_ASSERT(a->ne[0] == b->ne[0]) failed")
    assert rpc._fault_line("/src/ggml-rpc.cpp:566: Remote RPC server crashed or returned malformed response").startswith(
        f"an RPC server ({alive}) failed")


def test_watch_sets_keepalive_and_a_user_timeout_on_sockets_to_the_servers(server_of):
    endpoint = server_of(lambda conn: conn.recv(1))
    other = server_of(lambda conn: conn.recv(1))
    with socket.create_connection((endpoint.host, endpoint.port)) as watched, \
            socket.create_connection((other.host, other.port)) as unwatched:
        assert rpc.watch([endpoint]) == 1
        assert watched.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert watched.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == rpc.SILENT_PEER_SECONDS * 1000
        assert unwatched.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
        watched.sendall(b"x")  # the descriptor is still open: watch closed only its duplicate


def test_a_build_without_rpc_says_how_to_get_one(monkeypatch):
    from specli.llama import devices

    monkeypatch.setattr(devices, "rpc_supported", lambda: False)
    with pytest.raises(RpcError, match="no RPC backend") as raised:
        rpc.connect(["127.0.0.1:50052"])
    assert "-DGGML_RPC=ON" in raised.value.hint


def test_stored_costs_are_kept_per_set_of_servers(tmp_path):
    """A decode over a network costs what that network makes it cost: -k auto must not read
    the local costs for it, nor one network's for another."""
    from specli.llama.backend import LoadSettings
    from specli.pricing.keys import settings_key

    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    local = settings_key(model, LoadSettings(), "build")
    near = settings_key(model, LoadSettings(rpc=("10.0.0.2:50052",)), "build")
    far = settings_key(model, LoadSettings(rpc=("10.0.0.2:50052", "10.0.0.3:50052")), "build")
    assert len({local, near, far}) == 3
    assert "rpc" not in local  # keys stored before --rpc existed still hold
