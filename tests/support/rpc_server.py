"""llama.cpp's ggml-rpc-server for tests and benchmarks: built once from the very llama.cpp
that the installed llama-cpp-python vendors (the RPC protocol must match), then started on
free loopback ports.

The binary is cached in $SPECLI_RPC_CACHE, else in the checkout's git-ignored `.cache/`.
SPECLI_RPC_SERVER names a binary to use instead (one built elsewhere, or with CUDA).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.harness import free_port

REPO = Path(__file__).resolve().parents[2]
TARGET = "ggml-rpc-server"
CMAKE_ARGS = "-DGGML_RPC=ON"


def cache_dir() -> Path:
    return Path(os.environ.get("SPECLI_RPC_CACHE") or REPO / ".cache" / "rpc-server")


def binary() -> Path:
    """The server binary: SPECLI_RPC_SERVER, else the cached build for this llama-cpp-python,
    else built now with benchmarks/build_llama_cpp.sh (a few minutes on two cores)."""
    given = os.environ.get("SPECLI_RPC_SERVER")
    if given:
        return Path(given)
    import llama_cpp

    tag = hashlib.sha256(f"{llama_cpp.__version__}|{CMAKE_ARGS}".encode()).hexdigest()[:10]
    cached = cache_dir() / f"{TARGET}-{llama_cpp.__version__}-{tag}"
    if cached.exists():
        return cached
    work = cache_dir() / "src"
    env = dict(os.environ, PYTHON=sys.executable, TARGETS=TARGET, CMAKE_ARGS=CMAKE_ARGS)
    built = subprocess.run(["bash", str(REPO / "benchmarks" / "build_llama_cpp.sh"), str(work)], env=env,
                           stdout=subprocess.PIPE, text=True, check=True).stdout.split()[-1]
    partial = cached.with_suffix(".partial")
    shutil.copy2(built, partial)
    os.replace(partial, cached)  # never a half-copied binary under the final name
    return cached


class Server:
    """One ggml-rpc-server on HOST:PORT (a free loopback port by default), stopped on exit.

    `prefix` runs it through another command (`ip netns exec NAME`). Its output goes to a
    log file, read back by `log()`.
    """

    def __init__(self, host: str = "127.0.0.1", port: int | None = None, *, threads: int = 1,
                 prefix: tuple[str, ...] = (), log_dir: Path | None = None) -> None:
        self.host, self.port = host, port or free_port(host)
        self.endpoint = f"{self.host}:{self.port}"
        log_dir = log_dir or cache_dir() / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"server-{self.port}.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([*prefix, str(binary()), "-H", host, "-p", str(self.port), "-t", str(threads)],
                                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            self._wait_listening()
        except BaseException:
            self.kill()
            raise

    def _wait_listening(self, timeout: float = 30.0) -> None:
        """Until a connect succeeds (the server takes it as a client that leaves at once)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{TARGET} exited with {self.process.returncode}: {self.log()}")
            try:
                socket.create_connection((self.host, self.port), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{TARGET} did not start within {timeout:g} s: {self.log()}") from None
                time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
