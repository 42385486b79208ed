"""The server: the pair loaded, its HTTP API (app.py) on uvicorn, one generation at a time
(worker.py).

The pair is loaded once, before the socket opens; one line on stderr gives the URL once it
is ready, and one line per request follows. SIGINT or SIGTERM cancels the generation in
flight (within one step) and stops the server with exit code 0.
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

from specli.decode.request import GenerationRequest
from specli.errors import SpecliError
from specli.render import notifier
from specli.serve.app import ServerInfo, create_app
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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Server(uvicorn.Server):
    """uvicorn, with one "ready" line naming the URL, and a signal that first cancels the
    generation in flight so the graceful shutdown does not wait for it to finish."""

    def __init__(self, config: uvicorn.Config, worker, err: IO[str]) -> None:
        super().__init__(config)
        self._worker, self._err = worker, err

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            self._err.write(f"specli: serving {self._worker.session.spec.target.name} at http://{shown}:{port}/v1, "
                            f"its page at http://{shown}:{port}/ (Ctrl-C stops)\n")
            self._err.flush()

    def handle_exit(self, sig, frame) -> None:
        self._worker.closing.set()
        super().handle_exit(sig, frame)

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM stop the server; once it has stopped, the process exits 0
        (uvicorn's own handling raises the signal again, ending it by the signal)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


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
    """Load the pair, then serve until SIGINT or SIGTERM. Returns the exit code."""
    err = err or sys.stderr
    notice = notifier(err)
    if not is_loopback(settings.host) and not settings.api_key:
        notice(f"warning: serving on {settings.host} without --api-key: anyone who can reach this port can use it")
    sock = listen(settings.host, settings.port)
    with sock, open_session(spec, notice) as session:
        reason = session.plain_reason(settings.defaults)
        if reason is not None:
            notice(reason)
        worker = Worker(session, queue=settings.queue, memory=settings.memory)
        draft = spec.draft_model.name if spec.draft_model is not None else settings.defaults.draft.value
        info = ServerInfo(settings.name or spec.target.name, spec.target.name, draft, settings.api_key,
                          settings.defaults, int(time.time()))
        app = create_app(worker, info, err)
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=5, lifespan="off")
        try:
            _Server(config, worker, err).run(sockets=[sock])
        finally:
            worker.close()
    return 0
