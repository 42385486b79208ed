"""A fake Hugging Face Hub for tests: a real HTTP server on 127.0.0.1, answering like the Hub.

It serves `/{repo}/resolve/{revision}/{file}` to HEAD and GET with the headers huggingface_hub
reads (`X-Repo-Commit`, `ETag`, `Content-Length`, `Accept-Ranges`), honours `Range`, answers
404/401/403 with the Hub's `X-Error-Code`, and can cut a transfer midway. Every request is logged.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
from dataclasses import dataclass, field
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np


def make_gguf(values: int = 4096, seed: int = 0) -> bytes:
    """A small valid GGUF file: one float32 tensor whose content depends on `seed`."""
    import gguf

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_block_count(1)
        writer.add_tensor("weights", np.random.default_rng(seed).standard_normal(values).astype(np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path.read_bytes()


@dataclass
class ServedFile:
    content: bytes
    cuts: int = 0  # how many GETs still end after half the body
    advertised_size: int | None = None  # a size to announce instead of the real one

    @cached_property
    def etag(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def size(self) -> int:
        return self.advertised_size if self.advertised_size is not None else len(self.content)


@dataclass
class ServedRepo:
    commit: str
    files: dict[str, ServedFile] = field(default_factory=dict)
    token: str | None = None  # when set, the repo is gated and needs `Authorization: Bearer <token>`


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


class FakeHub:
    """Start with `with FakeHub() as hub:`; point `HF_ENDPOINT` at `hub.url`."""

    def __init__(self) -> None:
        self.repos: dict[str, ServedRepo] = {}
        self.requests: list[Request] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add_file(self, repo: str, filename: str, content: bytes, **options) -> ServedFile:
        commit = hashlib.sha1(repo.encode()).hexdigest()
        served = ServedFile(content, **options)
        self.repos.setdefault(repo, ServedRepo(commit=commit)).files[filename] = served
        return served

    def gate(self, repo: str, token: str) -> None:
        self.repos[repo].token = token

    def gets(self, filename: str) -> list[Request]:
        return [request for request in self.requests if request.method == "GET" and request.path.endswith(filename)]

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def log_message(self, format: str, *args) -> None:
            pass

        def _serve(self, *, body: bool) -> None:
            hub.requests.append(
                Request(self.command, self.path, self.headers.get("Range"), self.headers.get("Authorization"))
            )
            parts = [unquote(part) for part in urlsplit(self.path).path.split("/")]
            if len(parts) < 6 or parts[3] != "resolve":
                return self._error(404, "RepoNotFound", body=body)
            repo_id, revision, filename = f"{parts[1]}/{parts[2]}", parts[4], "/".join(parts[5:])
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound", body=body)
            if repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}":
                status = 403 if self.headers.get("Authorization") else 401
                return self._error(status, "GatedRepo", body=body)
            if revision not in ("main", repo.commit):
                return self._error(404, "RevisionNotFound", body=body)
            served = repo.files.get(filename)
            if served is None:
                return self._error(404, "EntryNotFound", body=body, commit=repo.commit)
            self._send_file(served, repo.commit, body=body)

        def _send_file(self, served: ServedFile, commit: str, *, body: bool) -> None:
            start = _range_start(self.headers.get("Range"))
            payload = memoryview(served.content)[start:]
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", f'"{served.etag}"')
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(served.content) - 1}/{len(served.content)}")
            self.send_header("Content-Length", str(served.size - start if not body else len(payload)))
            self.end_headers()
            if not body:
                return
            if served.cuts > 0:
                served.cuts -= 1
                self.wfile.write(payload[: len(payload) // 2])
                self.wfile.flush()
                self.close_connection = True  # the client sees the body end early
                return
            self.wfile.write(payload)

        def _error(self, status: int, code: str, *, body: bool, commit: str | None = None) -> None:
            message = f"{code} ({status})".encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", code)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Length", str(len(message) if body else 0))
            self.end_headers()
            if body:
                self.wfile.write(message)

    return Handler


def _range_start(header: str | None) -> int:
    """The first byte of `Range: bytes=N-`; 0 without a range."""
    if not header or not header.startswith("bytes="):
        return 0
    return int(header.removeprefix("bytes=").split("-")[0] or 0)
