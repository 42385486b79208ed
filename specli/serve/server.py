"""The server: the pair loaded, its HTTP API (app.py) on uvicorn, one generation at a time
(worker.py).

The port answers from the start: while the pair loads and its costs are read, `/health` is
503 {"status": "loading"} and the API 503 with Retry-After, as llama-server does. One line
on stderr gives the URL once it is ready, and one line per request follows. SIGINT or
SIGTERM cancels the generation in flight (within one step) and stops the server with exit
code 0; Ctrl-C while loading is "interrupted", exit 130.
"""

from __future__ import annotations

import ipaddress
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Iterator

import uvicorn

from specli.decode.request import AUTO, GenerationRequest
from specli.diagnostics import caches_line
from specli.errors import Interrupted, SpecliError
from specli.render import notifier
from specli.serve.app import Backend, ServerInfo, create_app
from specli.serve.guard import Access
from specli.serve.worker import Worker
from specli.session import SessionSpec, open_session

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_QUEUE = 8


@dataclass(frozen=True)
class ServeSettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    queue: int = DEFAULT_QUEUE  # requests that may wait while one generates; more get 503
    memory: bool = True  # n-gram lookup also searches recent requests' outputs
    name: str | None = None  # what responses call the model (default: the target file's name)
    # What a request gets for the fields it does not give: the server's drafting and sampling
    # options, and no token limit (until the end, or the context's).
    defaults: GenerationRequest = GenerationRequest(max_tokens=1 << 30)
    access: Access = Access()  # hosts and origins allowed beyond the server's own (--allow-host, --allow-origin)
    metrics: bool = False  # /metrics answers (--metrics)
    image_urls: bool = False  # requests' http(s) image URLs are fetched (--allow-image-urls)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Server(uvicorn.Server):
    """uvicorn, answering from before the pair has loaded (the app's Backend says "loading"
    until then), in a thread of its own: the main thread loads, and then waits for it.
    `handle_exit` first cancels the generation in flight, so the graceful shutdown does not
    wait for it to finish."""

    def __init__(self, config: uvicorn.Config, backend: Backend) -> None:
        super().__init__(config)
        self._backend = backend

    def handle_exit(self, sig, frame) -> None:
        if self._backend.worker is not None:
            self._backend.worker.closing.set()
        super().handle_exit(sig, frame)

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        """None here: the main thread takes SIGINT and SIGTERM (`_serving`)."""
        yield


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the models load: a port in use is one line, at once."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.set_inheritable(True)
        return sock
    except OSError as error:
        raise SpecliError(f"cannot listen on {host}:{port}: {error.strerror or error}",
                          "pick another --port, or stop what holds this one") from None
    except (UnicodeError, OverflowError) as error:
        raise SpecliError(f"cannot listen on {host}:{port}: {error}") from None


def serve(spec: SessionSpec, settings: ServeSettings, err: IO[str] | None = None) -> int:
    """Answer on the port at once ("loading"), load the pair and read its costs, then serve
    until SIGINT or SIGTERM. Returns the exit code; Ctrl-C while loading is a KeyboardInterrupt."""
    err = err or sys.stderr
    notice = notifier(err)
    if not is_loopback(settings.host) and not settings.api_key:
        notice(f"warning: serving on {settings.host} without --api-key: anyone who can reach this port can use it")
    if "*" in settings.access.origins and not settings.api_key:
        notice("warning: --allow-origin '*' without --api-key: any web page a browser here opens can use this server")
    sock = listen(settings.host, settings.port)
    draft = spec.draft_model.name if spec.draft_model is not None else settings.defaults.draft
    from specli import __version__
    from specli.llama.backend import library_versions

    build = f"specli {__version__}, llama-cpp-python {library_versions()['llama_cpp_python']}"
    info = ServerInfo(settings.name or spec.target.name, spec.target.name, draft, settings.api_key,
                      settings.defaults, int(time.time()), settings.metrics, build, settings.image_urls)
    backend = Backend()
    config = uvicorn.Config(create_app(backend, info, err, settings.access), host=settings.host, port=settings.port,
                            log_level="warning", access_log=False, timeout_graceful_shutdown=5, lifespan="off")
    server = _Server(config, backend)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="specli-http", daemon=True)
    with sock:
        thread.start()
        try:
            with _loading(spec), open_session(spec, notice) as session:
                reason = session.plain_reason(settings.defaults)
                if reason is not None:
                    notice(reason)
                if session.target.recurrent:  # its state is a cache of its own, by sequence and snapshot
                    notice(f"{spec.target.name} has recurrent layers: "
                           f"{caches_line(session.target.cache_memory(), session.target.sequences)}")
                backend.worker = Worker(session, queue=settings.queue, memory=settings.memory,
                                        measure=settings.defaults.draft_tokens == AUTO and settings.defaults.drafts)
                try:
                    _serving(server, thread, spec, sock, err)
                finally:
                    backend.worker.close()
        finally:
            server.should_exit = True
            thread.join(timeout=10)
    return 0


@contextmanager
def _loading(spec: SessionSpec) -> Iterator[None]:
    """Ctrl-C while the pair loads or its costs are read: one line ("interrupted"), exit 130."""
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while loading {spec.target.name}") from None


def _serving(server: _Server, thread: threading.Thread, spec: SessionSpec, sock: socket.socket, err: IO[str]) -> None:
    """The ready line, then wait for the HTTP thread to end: SIGINT and SIGTERM stop it."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    err.write(f"specli: serving {spec.target.name} at http://{shown}:{port}/v1, its page at http://{shown}:{port}/ "
              "(Ctrl-C stops)\n")
    err.flush()
    previous = {sig: signal.signal(sig, server.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while thread.is_alive():
            thread.join(timeout=0.5)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        raise SpecliError(f"the HTTP server on {shown}:{port} stopped before it started")
