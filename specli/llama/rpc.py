"""llama.cpp RPC servers: their addresses, a bounded handshake, and what a fault says.

The model work itself is ggml-rpc's (specli.llama.devices adds the servers and specli.llama.backend
places a model's layers on them). ggml-rpc aborts the process on any network fault and
its connect has no timeout, so this module talks to a server first in plain Python: a TCP
connect and the protocol's HELLO, each bounded by a timeout, naming the server in every
error. Mid-run, `watch` bounds a silent peer with TCP keepalive and a user timeout on
ggml's own sockets, and `_abort` (ggml's abort callback) turns ggml's abort into the output
so far (`on_fault`) and one line naming the server that went away.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import struct
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from specli.config import debug_enabled
from specli.errors import SpecliError, UsageError
from specli.install import RPC_INSTALL
from specli.llama import devices

# ggml/include/ggml-rpc.h and ggml/src/ggml-rpc/ggml-rpc.cpp of the vendored llama.cpp.
PROTOCOL = (7, 0, 0)
_HELLO = 14  # RPC_CMD_HELLO ("must be always 14": every protocol version answers it)
_DEVICE_COUNT = 15  # RPC_CMD_DEVICE_COUNT
_CAPS_SIZE = 24  # RPC_CONN_CAPS_SIZE: no transport upgrade asked for (all zero)
MAX_SERVERS = 16  # GGML_RPC_MAX_SERVERS

CONNECT_TIMEOUT = 5.0  # seconds for a connect, and for a server's answer to HELLO
# A server that stops answering mid-run (host down, network cut: no reset ever comes)
# is given up after about this long: keepalive probes while ggml waits for a reply,
# and TCP_USER_TIMEOUT for data the peer never acknowledges.
SILENT_PEER_SECONDS = 20


class RpcError(SpecliError):
    """An RPC server that cannot be used: unreachable, silent, or of another protocol."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoints(text: str, option: str = "--rpc") -> tuple[Endpoint, ...]:
    """`HOST:PORT[,HOST:PORT...]`, as llama.cpp's --rpc spells it."""
    endpoints: list[Endpoint] = []
    for item in (part.strip() for part in text.split(",")):
        host, sep, port = item.rpartition(":")
        if not item or not sep or not host:
            raise UsageError(f"{option} {text}: {item or 'an empty entry'} is not HOST:PORT",
                             "for example --rpc 192.168.1.10:50052,192.168.1.11:50052")
        if ":" in host or host.startswith("["):
            # ggml-rpc splits an endpoint at its first colon: an IPv6 literal cannot work.
            raise UsageError(f"{option} {text}: {item} is an IPv6 address, which llama.cpp's RPC cannot parse",
                             "use an IPv4 address or a host name")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"{option} {text}: the port of {item} is not a number from 1 to 65535")
        endpoint = Endpoint(host, int(port))
        if endpoint in endpoints:
            raise UsageError(f"{option} {text}: {endpoint} is listed twice")
        endpoints.append(endpoint)
    if len(endpoints) > MAX_SERVERS:
        raise UsageError(f"{option}: at most {MAX_SERVERS} servers (llama.cpp's limit), not {len(endpoints)}")
    return tuple(endpoints)


def _version_text(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))


def compatible(version: tuple[int, int, int]) -> bool:
    """ggml-rpc's own rule: the same major version, and no newer minor version than ours."""
    return version[0] == PROTOCOL[0] and version[1] <= PROTOCOL[1]


def _connect(endpoint: Endpoint, timeout: float) -> socket.socket:
    try:
        return socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except (OSError, UnicodeError) as error:
        hint = "is the host up, and the port open in its firewall?" if isinstance(error, socket.timeout) else (
            f"start it there with: ggml-rpc-server -H {endpoint.host} -p {endpoint.port}")
        raise RpcError(f"RPC server {endpoint}: {_reason(error, endpoint, timeout)}", hint) from None


def _reason(error: OSError | UnicodeError, endpoint: Endpoint, timeout: float) -> str:
    """Why a connect failed, in a few words."""
    if isinstance(error, UnicodeError):  # a label too long for IDNA
        return f"{endpoint.host} is not a valid host name"
    if isinstance(error, socket.timeout):
        return f"no connection within {timeout:g} s"
    if isinstance(error, socket.gaierror):
        return f"cannot resolve {endpoint.host}"
    if error.errno == errno.ECONNREFUSED:
        return "connection refused"
    return error.strerror or str(error)


def _receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError
        data += chunk
    return data


def _command(sock: socket.socket, command: int, payload: bytes, answer: int) -> bytes:
    """One request and its reply, framed as ggml-rpc frames them: | cmd u8 | size u64 | data |
    out, | size u64 | data | back."""
    sock.sendall(struct.pack("<BQ", command, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _receive(sock, 8))
    if size != answer:
        raise ValueError(size)
    return _receive(sock, size)


@dataclass(frozen=True)
class ServerInfo:
    endpoint: Endpoint
    protocol: tuple[int, int, int]
    devices: int


def hello(endpoint: Endpoint, timeout: float = CONNECT_TIMEOUT) -> ServerInfo:
    """Connect, say HELLO and ask for the device count, each step within `timeout`; the
    connection is closed again (an rpc-server serves one client at a time).

    Raises RpcError naming the server: down, refusing, silent (busy with another client),
    or speaking another protocol version than this build's.
    """
    mismatch_hint = "build ggml-rpc-server from the llama.cpp that llama-cpp-python vendors (`specli doctor` names its commit)"
    with _connect(endpoint, timeout) as sock:
        sock.settimeout(timeout)
        try:
            answer = _command(sock, _HELLO, bytes(_CAPS_SIZE), 4 + _CAPS_SIZE)
            protocol = tuple(answer[:3])
            if not compatible(protocol):
                raise RpcError(f"RPC server {endpoint} speaks RPC protocol {_version_text(protocol)}; "
                               f"this build speaks {_version_text(PROTOCOL)}", mismatch_hint)
            (devices,) = struct.unpack("<I", _command(sock, _DEVICE_COUNT, b"", 4))
        except socket.timeout:
            raise RpcError(f"RPC server {endpoint} accepted the connection but did not answer within {timeout:g} s",
                           "an rpc-server serves one client at a time: is another program using it?") from None
        except (ConnectionError, ValueError):
            # An older server wants an empty HELLO: it drops the connection or answers another size.
            raise RpcError(f"RPC server {endpoint} closed the connection during the handshake: it may speak another "
                           f"RPC protocol than this build's {_version_text(PROTOCOL)}", mismatch_hint) from None
        except OSError as error:
            raise RpcError(f"RPC server {endpoint}: {error.strerror or error} during the handshake") from None
    if devices == 0:
        raise RpcError(f"RPC server {endpoint} offers no devices")
    return ServerInfo(endpoint, protocol, devices)


def unreachable(endpoints: Iterable[Endpoint], timeout: float = 1.0) -> list[tuple[Endpoint, str]]:
    """The servers that no longer accept a TCP connection, with why. A plain connect, no
    HELLO: a live server still busy serving this process queues it and answers nothing."""
    down = []
    for endpoint in endpoints:
        try:
            socket.create_connection((endpoint.host, endpoint.port), timeout=timeout).close()
        except (OSError, UnicodeError) as error:
            down.append((endpoint, _reason(error, endpoint, timeout)))
    return down


def _sockets_to(endpoints: Iterable[Endpoint]) -> Iterator[socket.socket]:
    """Duplicates of this process's TCP sockets connected to `endpoints` (ggml-rpc's: it
    exposes none of its own), each closed once the caller moves on. Linux only."""
    resolved = set()
    for endpoint in endpoints:
        try:
            infos = socket.getaddrinfo(endpoint.host, endpoint.port, socket.AF_INET, socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            continue
        resolved |= {(info[4][0], endpoint.port) for info in infos}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.fromfd(int(name), socket.AF_INET, socket.SOCK_STREAM)  # a duplicate
        except OSError:
            continue
        with sock:  # closes the duplicate only: ggml's descriptor stays open
            try:
                if sock.getpeername() not in resolved:
                    continue
            except OSError:  # not an IPv4 TCP socket, or not connected
                continue
            yield sock


def watch(endpoints: Iterable[Endpoint]) -> int:
    """Bound a silent server on the sockets ggml-rpc has open to `endpoints` (one per server
    while a model's buffers live there; backend.Model calls this as soon as they exist):
    keepalive probes while a reply is awaited and a user timeout for unacknowledged data, so
    that a vanished host fails a read (and ggml aborts, see _abort) instead of hanging.
    Returns how many sockets it set."""
    if not hasattr(socket, "TCP_USER_TIMEOUT"):
        return 0
    count = 0
    interval = 5
    for sock in _sockets_to(endpoints):
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, interval)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, SILENT_PEER_SECONDS // interval - 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, SILENT_PEER_SECONDS * 1000)
            count += 1
        except OSError:
            continue
    return count


def fault_message(endpoints: Iterable[Endpoint], abort_message: str, tries: int = 4) -> str:
    """One line for a ggml abort while RPC servers are in use, naming the server(s) gone. A
    server that is shutting down may still accept connections for a moment: ask again."""
    endpoints = list(endpoints)
    for attempt in range(tries):
        down = unreachable(endpoints)
        if down:
            named = " and ".join(f"{endpoint} stopped answering ({why})" for endpoint, why in down)
            return f"RPC server {named}"
        if attempt + 1 < tries:
            time.sleep(0.5)
    listed = ", ".join(map(str, endpoints))
    reason = re.sub(r"^\S+:\d+: ", "", abort_message.strip()) or "llama.cpp aborted"  # without ggml's file:line
    return f"an RPC server ({listed}) failed: {reason}"


_connected: list[Endpoint] = []  # servers ggml-rpc has been given, in this process (named by _abort)
_fault_hooks: list[Callable[[], None]] = []  # see on_fault


def connect(endpoints: Iterable[str]) -> None:
    """Before a model touches them: this build has RPC, and every server answers HELLO in
    time with a protocol it can use. From then on a ggml abort ends the process through
    `_abort`: the output so far flushed (see on_fault), one line naming the server, exit 1.

    A server ggml-rpc holds a connection to right now (a loaded model's buffers live there)
    is not asked: a server serves one client at a time, so it would not answer. ggml-rpc
    drops the connection when no buffer needs it and reconnects later, so a server is asked
    again before each model that finds none.
    """
    servers = parse_endpoints(",".join(endpoints))
    if not devices.rpc_supported():
        raise RpcError("this llama-cpp-python build has no RPC backend", f"reinstall it: {RPC_INSTALL}")
    devices.set_abort_handler(_abort)
    for endpoint in servers:
        if next(_sockets_to([endpoint]), None) is None:
            hello(endpoint)
        if endpoint not in _connected:
            _connected.append(endpoint)
        devices.rpc_server_devices(str(endpoint))


@contextmanager
def on_fault(hook: Callable[[], None]) -> Iterator[None]:
    """Run `hook` (flush what was generated) if an RPC fault ends the process meanwhile."""
    _fault_hooks.append(hook)
    try:
        yield
    finally:
        _fault_hooks.remove(hook)


_aborting = threading.Lock()

# What ggml-rpc says when it cannot go on (ggml-rpc.cpp's GGML_ABORTs).
_RPC_ABORTS = ("Remote RPC server", "Failed to connect", "RPC handshake failed", "Failed to parse endpoint",
               "RPC transport")


def _abort(message: str) -> None:
    """ggml is about to abort: say which server went away (or what llama.cpp said, for an abort
    of its own), flush the output so far, and exit 1 instead. It runs on whichever thread
    aborts (ggml-rpc's dispatcher, mid-run); a second abort meanwhile waits for the first.
    With SPECLI_DEBUG=1, ggml's message and every thread's stack follow, then the abort."""
    import faulthandler

    _aborting.acquire()  # held by another thread that is reporting: it ends the process
    try:
        line = _fault_line(message)
        for hook in list(_fault_hooks):
            try:
                hook()
            except BaseException:
                pass
        try:
            sys.stdout.flush()
        except BaseException:
            pass
        sys.stderr.write(f"specli: error: {line}\n")
        if debug_enabled():
            sys.stderr.write(f"{message}\n")
            sys.stderr.flush()
            faulthandler.dump_traceback(all_threads=True)
            return
        sys.stderr.flush()
    except BaseException:
        os.write(2, b"specli: error: llama.cpp aborted\n")
    os._exit(1)


def _fault_line(message: str) -> str:
    if any(text in message for text in _RPC_ABORTS) or unreachable(_connected):
        return fault_message(_connected, message)
    reason = re.sub(r"^\S+:\d+: ", "", message.strip()) or "no reason given"
    return f"llama.cpp aborted: {reason}"
