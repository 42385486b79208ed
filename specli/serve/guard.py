"""Which web pages may use the server: a check of `Host` and `Origin` on every request, before
any route runs (an ASGI middleware), as Ollama guards its API.

- `Host` must name this server: an IP address (a page reaches an address only as itself),
  `localhost` or a `*.localhost` name, this machine's host name, or a name given with
  `--allow-host`. A page on a domain whose DNS is rebound to 127.0.0.1 sends its own domain
  as Host, and is refused (403): a keyless server on loopback is no one's but this machine's.
- A browser says which page sent a request in `Origin`. The page at `/` (the same origin) and
  pages served from this machine (`http://localhost:PORT`, `http://127.0.0.1:PORT`,
  `http://[::1]:PORT`, any port) may use the API, and so may origins given with
  `--allow-origin`; any other origin is refused (403), preflight or not. The allowed get the
  CORS headers a browser needs (`Access-Control-Allow-Origin`, preflight answers).
  A request without `Origin` (curl, SDKs, servers) is not a browser's and is not held to it.

`*` allows every host (or every origin).
"""

from __future__ import annotations

import ipaddress
import json
import socket
from dataclasses import dataclass, field
from typing import IO
from urllib.parse import urlsplit

from specli.serve.log import RequestLog

LOCAL_NAMES = ("localhost",)
PREFLIGHT_MAX_AGE = "600"


@dataclass(frozen=True)
class Access:
    """The hosts and origins the server answers beyond its own (serve's --allow-host, --allow-origin)."""

    hosts: tuple[str, ...] = ()
    origins: tuple[str, ...] = ()
    machine: tuple[str, ...] = field(default_factory=lambda: _machine_names())

    def host_allowed(self, host: str) -> bool:
        name = _hostname(host)
        if name is None:
            return True  # no Host (HTTP/1.0): not a browser's request
        if "*" in self.hosts or _is_address(name) or name in LOCAL_NAMES or name.endswith(".localhost"):
            return True
        return name in self.machine or name in {h.lower().rstrip(".") for h in self.hosts}

    def origin_allowed(self, origin: str, host: str) -> bool:
        """Whether a page from `origin` may use the server that the request reached as `host`."""
        if "*" in self.origins or origin in self.origins:
            return True
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return False  # "null" (a file, a sandboxed frame) unless allowed by name
        if parts.netloc.lower() == host.lower():
            return True  # the page at / itself
        name = parts.hostname.lower()
        return name in LOCAL_NAMES or name.endswith(".localhost") or (_is_address(name)
                                                                      and ipaddress.ip_address(name).is_loopback)


def _machine_names() -> tuple[str, ...]:
    names = {socket.gethostname()}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass
    return tuple(sorted(name.lower().rstrip(".") for name in names if name))


def _hostname(host: str) -> str | None:
    """The name or address in a Host header, without its port (None: no header)."""
    if not host:
        return None
    if host.startswith("["):  # [::1]:8080
        return host[1:].partition("]")[0].lower()
    return host.rpartition(":")[0].lower().rstrip(".") if host.count(":") == 1 else host.lower().rstrip(".")


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name.split("%")[0])
        return True
    except ValueError:
        return False


class Guard:
    """The ASGI middleware that applies an Access to every HTTP request."""

    def __init__(self, app, access: Access, log: IO[str]) -> None:
        self.app, self.access, self.log = app, access, log

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", [])}
        host, origin = headers.get("host", ""), headers.get("origin")
        log = RequestLog(self.log, scope.get("method", ""), scope.get("path", ""))
        if not self.access.host_allowed(host):
            message = (f"Host {host!r} is not this server's: a web page may be using it through DNS rebinding "
                       f"(start specli serve with --allow-host {_hostname(host)} if that name is yours)")
            return await self._refuse(send, log, message, "host_not_allowed")
        if origin is None:
            return await self.app(scope, receive, send)
        if not self.access.origin_allowed(origin, host):
            message = (f"a web page from {origin} may not use this server (start specli serve with "
                       f"--allow-origin {origin} to let it)")
            return await self._refuse(send, log, message, "origin_not_allowed")
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            return await self._preflight(send, origin, headers)
        return await self.app(scope, receive, _with_cors(send, origin))

    async def _refuse(self, send, log: RequestLog, message: str, code: str) -> None:
        log.line(403, note=message)
        body = json.dumps({"error": {"message": message, "type": "permission_error", "param": None,
                                     "code": code}}).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _preflight(self, send, origin: str, headers: dict[str, str]) -> None:
        asked = headers.get("access-control-request-headers", "authorization, content-type")
        await send({"type": "http.response.start", "status": 204, "headers": [
            *_cors_headers(origin),
            (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
            (b"access-control-allow-headers", asked.encode("latin-1")),
            (b"access-control-max-age", PREFLIGHT_MAX_AGE.encode()),
        ]})
        await send({"type": "http.response.body", "body": b""})


def _cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]


def _with_cors(send, origin: str):
    """`send`, with an allowed origin's CORS headers added to the response's start."""

    async def sending(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *_cors_headers(origin)]}
        await send(message)

    return sending
