"""Network latency for the RPC benchmark: a network namespace and a delaying TCP relay.

specli (the client) runs in the root namespace and llama.cpp's `rpc-server` processes run in a
network namespace joined to it by a veth pair, so every byte between them crosses a link whose
delay the benchmark sets. The usual tool, `tc ... netem delay`, needs the kernel's sch_netem,
which the kernel this was written on lacks ("Specified qdisc kind is unknown"). So
`Namespace.add_delay` tries netem and, where it is missing, the benchmark puts a `DelayRelay`
in front of each server: a user-space TCP relay inside the namespace, listening on the
namespace's veth address and forwarding to the server on 127.0.0.1 there, that delivers every
chunk rtt/2 after it arrived, in each direction. Bytes keep their order, and the delay adds
latency without limiting throughput: the relay keeps reading while earlier chunks wait.

Counters, per connection and in total: `bytes_up` (client to server), `bytes_down` (server to
client) and `round_trips`, the number of times the traffic turned from client->server to
server->client as chunks reached the relay: a request and its reply are one round trip however
many chunks each takes, and requests that get no reply add none. The relay process keeps them
as one JSON line in --stats, replaced atomically at most every 0.5 s and on exit; a benchmark
reads the file before and after a run and subtracts.

    python benchmarks/netdelay.py relay --listen 10.213.0.2:50052 --to 127.0.0.1:50062 \\
        --rtt-ms 5 --stats /tmp/relay.json
    python benchmarks/netdelay.py overhead --rtt-ms 0 1 5   # what the relay adds on loopback
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

CHUNK = 1 << 20
_serial = itertools.count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


class Namespace:
    """A network namespace joined to the root one by a veth pair on a private /30: `host_address`
    on the root side, `address` inside. When the with-block ends, however it ends (SIGTERM
    included), the processes started through `run` are killed and the veth pair and the
    namespace are removed."""

    def __init__(self) -> None:
        pid, serial = os.getpid(), next(_serial)
        self.name = f"specli-bench-{pid}-{serial}"
        self.host_link, self.inner_link = f"sb{pid}-{serial}h", f"sb{pid}-{serial}n"  # at most 15 characters
        self.processes: list[subprocess.Popen] = []
        self._made: set[str] = set()  # what close() removes: only what this object made
        self._previous_sigterm = None

    def __enter__(self) -> Namespace:
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, _raise_exit)
        try:
            used = _ip("-4", "-o", "addr", "show").stdout
            subnet = next((i for i in ((os.getpid() + step) % 256 for step in range(256))
                           if f"inet 10.213.{i}." not in used), None)
            if subnet is None:
                raise RuntimeError("every 10.213.x.0/30 subnet is in use")
            self.host_address, self.address = f"10.213.{subnet}.1", f"10.213.{subnet}.2"
            _ip("netns", "add", self.name)
            self._made.add("netns")
            _ip("link", "add", self.host_link, "type", "veth", "peer", "name", self.inner_link)
            self._made.add("link")
            _ip("link", "set", self.inner_link, "netns", self.name)
            _ip("addr", "add", f"{self.host_address}/30", "dev", self.host_link)
            _ip("link", "set", self.host_link, "up")
            _ip("-n", self.name, "addr", "add", f"{self.address}/30", "dev", self.inner_link)
            _ip("-n", self.name, "link", "set", self.inner_link, "up")
            _ip("-n", self.name, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, argv: list[str], **popen_kwargs) -> subprocess.Popen:
        """Starts `argv` inside the namespace; it is killed when the namespace closes."""
        process = subprocess.Popen(["ip", "netns", "exec", self.name, *argv], **popen_kwargs)
        self.processes.append(process)
        return process

    def add_delay(self, rtt_ms: float) -> str | None:
        """netem delay of rtt/2 on each end of the pair: "netem", or None where the kernel has
        no netem (then relay each server through a DelayRelay)."""
        for link, namespace in ((self.host_link, []), (self.inner_link, ["-n", self.name])):
            result = subprocess.run(["tc", *namespace, "qdisc", "add", "dev", link, "root", "netem",
                                     "delay", f"{rtt_ms / 2}ms"], capture_output=True, text=True)
            if result.returncode and "qdisc kind is unknown" in result.stderr:
                return None
            if result.returncode:
                raise RuntimeError(f"tc netem on {link}: {result.stderr.strip()}")
        return "netem"

    def close(self) -> None:
        # SIGINT/SIGTERM wait until the cleanup is done (the mask is this thread's own).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for process in self.processes:
                process.terminate()
            for process in self.processes:
                try:
                    process.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            if "netns" in self._made:
                for pid in _ip("netns", "pids", self.name, check=False).stdout.split():  # their children
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            if "link" in self._made:
                _ip("link", "del", self.host_link, check=False)  # removes both ends
            if "netns" in self._made:
                _ip("netns", "del", self.name, check=False)
            self._made.clear()
            if self._previous_sigterm is not None:
                signal.signal(signal.SIGTERM, self._previous_sigterm)
                self._previous_sigterm = None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class DelayRelay:
    """Forwards each TCP connection made to `listen` to `target`, delivering every chunk rtt/2
    after it arrived, in each direction, and counts bytes and round trips (module docstring)."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int], rtt_ms: float) -> None:
        self.target, self.delay = target, rtt_ms / 2000
        self.server = socket.create_server(listen)
        self.address = self.server.getsockname()[:2]
        self.connections: list[dict] = []
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()

    def stats(self) -> dict:
        with self.lock:
            connections = [dict(counters) for counters in self.connections]
        totals = {key: sum(c[key] for c in connections) for key in ("bytes_up", "bytes_down", "round_trips")}
        return {**totals, "connections": connections}

    def start(self) -> DelayRelay:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def serve_forever(self) -> None:
        while True:
            try:
                client, peer = self.server.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._connect, args=(client, peer), daemon=True).start()

    def close(self) -> None:
        with self.lock:
            sockets = [self.server, *self.sockets]
        for sock in sockets:
            _abort(sock)  # wakes accept() and recv()
        self.server.close()

    def _connect(self, client: socket.socket, peer) -> None:
        try:
            server = socket.create_connection(self.target, timeout=10)
            server.settimeout(None)
        except OSError:
            client.close()
            return
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        counters = {"peer": f"{peer[0]}:{peer[1]}", "bytes_up": 0, "bytes_down": 0, "round_trips": 0, "open": True}
        last = ["down"]  # direction of the latest chunk to arrive
        with self.lock:
            self.connections.append(counters)
            self.sockets += [client, server]
        down = threading.Thread(target=self._forward, args=(server, client, "down", counters, last))
        down.start()
        self._forward(client, server, "up", counters, last)
        down.join()
        with self.lock:
            counters["open"] = False
            self.sockets.remove(client)
            self.sockets.remove(server)
        client.close()
        server.close()

    def _forward(self, source, sink, direction, counters, last) -> None:
        """Writes each chunk read from `source` to `sink` `delay` after it arrived. One thread does
        both, waiting in select() for the next chunk or the next due time: no chunk changes thread,
        and the delay adds latency, never a pause between chunks."""
        queue: collections.deque = collections.deque()  # (due time, bytes) in arrival order
        reading = True
        try:
            while reading or queue:
                wait = max(0.0, queue[0][0] - time.monotonic()) if queue else None
                if reading and select.select([source], [], [], wait)[0]:  # microsecond timeouts (poll: milliseconds)
                    data = source.recv(CHUNK)
                    arrived = time.monotonic()
                    with self.lock:
                        counters[f"bytes_{direction}"] += len(data)
                        if data and direction == "down" and last[0] == "up":
                            counters["round_trips"] += 1  # the traffic turned: a reply
                        if data:
                            last[0] = direction
                    if data:
                        queue.append((arrived + self.delay, data))
                    reading = bool(data)
                elif not reading:
                    time.sleep(wait)
                while queue and queue[0][0] <= time.monotonic():
                    sink.sendall(queue.popleft()[1])
            sink.shutdown(socket.SHUT_WR)
        except OSError:  # either side went away: end both directions
            _abort(source)
            _abort(sink)


def _abort(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def echo_server(host: str = "127.0.0.1") -> tuple[str, int]:
    """An echo server on a free port, in daemon threads (tests and `overhead`)."""
    listener = socket.create_server((host, 0))

    def echo(conn: socket.socket) -> None:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(CHUNK):
                conn.sendall(data)

    def serve() -> None:
        while True:
            threading.Thread(target=echo, args=(listener.accept()[0],), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[:2]


def exchange(sock: socket.socket, payload: bytes) -> bytes:
    """Sends `payload` and reads as many bytes back: one round trip to an echo server."""
    sock.sendall(payload)
    reply = bytearray()
    while len(reply) < len(payload):
        if not (data := sock.recv(CHUNK)):
            raise ConnectionError("connection closed before the reply was complete")
        reply += data
    return bytes(reply)


def _overhead(rtts: list[float], exchanges: int) -> None:
    """Median 64-byte exchange with an echo server here, direct and through a relay process."""
    def median_us(address: tuple[str, int]) -> float:
        with socket.create_connection(address) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            times = []
            for _ in range(exchanges):
                start = time.perf_counter()
                exchange(sock, b"x" * 64)
                times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6

    target = echo_server()
    for rtt in rtts:
        relay = subprocess.Popen([sys.executable, __file__, "relay", "--listen", "127.0.0.1:0", "--to",
                                  "%s:%d" % target, "--rtt-ms", str(rtt)], stdout=subprocess.PIPE, text=True)
        try:
            direct, relayed = median_us(target), median_us(_endpoint(relay.stdout.readline().split()[-1]))
            print(f"rtt {rtt:g} ms: direct {direct:.0f} us, relayed {relayed:.0f} us, "
                  f"{relayed - direct - rtt * 1000:.0f} us more than the rtt ({exchanges} exchanges)")
        finally:
            relay.terminate()
            relay.wait()


def _write_stats(relay: DelayRelay, path: str, written: dict | None = None) -> dict:
    """Writes the counters unless they equal `written`; returns them."""
    if (stats := relay.stats()) != written:
        with open(f"{path}.tmp", "w") as file:
            file.write(json.dumps(stats) + "\n")
        os.replace(f"{path}.tmp", path)  # a reader sees the old line or the new one, never half
    return stats


def _endpoint(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("relay", help="Relay TCP with a delay; prints 'listening on HOST:PORT' when ready.")
    serve.add_argument("--listen", type=_endpoint, required=True, help="HOST:PORT to listen on (port 0: any free one).")
    serve.add_argument("--to", type=_endpoint, required=True, help="HOST:PORT of the server.")
    serve.add_argument("--rtt-ms", type=float, default=0.0, help="Round-trip time to add, in ms.")
    serve.add_argument("--stats", help="File that holds the counters as one JSON line.")
    measure = commands.add_parser("overhead", help="Median exchange on loopback, direct and through a relay.")
    measure.add_argument("--rtt-ms", type=float, nargs="+", default=[0.0])
    measure.add_argument("--exchanges", type=int, default=200)
    args = parser.parse_args(argv)
    if args.command == "overhead":
        _overhead(args.rtt_ms, args.exchanges)
        return 0
    signal.signal(signal.SIGTERM, _raise_exit)
    relay = DelayRelay(args.listen, args.to, args.rtt_ms)
    stop = threading.Event()

    def keep_stats(written: dict) -> None:  # at most every 0.5 s, and once more on exit
        while not stop.wait(0.5):
            written = _write_stats(relay, args.stats, written)
        _write_stats(relay, args.stats, written)

    writer = threading.Thread(target=keep_stats, args=(_write_stats(relay, args.stats),)) if args.stats else None
    try:
        if writer:
            writer.start()
        print(f"listening on {relay.address[0]}:{relay.address[1]}", flush=True)
        relay.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        relay.close()
        stop.set()
        if writer:
            writer.join()
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
