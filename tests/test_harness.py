"""tests/support/harness.py, which benchmarks and tests share to start servers: a free port, the
wait for /health (through its 503s while loading), a process that dies first, and the stop."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.support.harness import free_port, stop, wait_healthy

# A server whose /health answers 503 twice (loading), then 200; it logs nothing.
LOADING_SERVER = """
import http.server, sys
calls = []
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        calls.append(self.path)
        self.send_response(200 if len(calls) > 2 else 503)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_a_free_port_can_be_listened_on():
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):
        pass


def test_the_wait_goes_through_the_loading_503s_and_the_stop_ends_the_process():
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", LOADING_SERVER, str(port)])
    try:
        wait_healthy(process, f"http://127.0.0.1:{port}", timeout=30)
        assert process.poll() is None
    finally:
        stop(process, timeout=10)
    assert process.poll() is not None


def test_a_process_that_exits_before_it_is_ready_is_named_with_its_code():
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(RuntimeError, match="the toy server exited with 3 before it was ready"):
        wait_healthy(process, f"http://127.0.0.1:{free_port()}", timeout=30, name="the toy server")


def test_a_server_that_never_answers_times_out():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(RuntimeError, match="was not ready after 1 s"):
            wait_healthy(process, f"http://127.0.0.1:{free_port()}", timeout=1)
    finally:
        stop(process, timeout=5)
