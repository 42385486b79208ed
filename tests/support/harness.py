"""What the benchmarks and the tests that start processes share: a free loopback port, a server
process waited for until its /health answers 200 (or it exits, or time runs out), and stopped.

llama-server and `specli serve` both answer /health with 503 while they load and 200 once they
serve, so one wait fits both. Errors are RuntimeError with the process's story in one message."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing listens on now (the OS's choice)."""
    with socket.create_server((host, 0)) as probe:
        return probe.getsockname()[1]


def wait_healthy(process: subprocess.Popen, url: str, timeout: float, name: str = "the server") -> None:
    """Until GET `url`/health answers 200. RuntimeError if `process` exits first, or after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass  # not listening yet, or 503 while the model loads
        time.sleep(0.2)
    raise RuntimeError(f"{name} was not ready after {timeout:.0f} s")


def stop(process: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds; waited for either way."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
