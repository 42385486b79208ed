"""A fake Hugging Face Hub for tests: a real HTTP server on 127.0.0.1, answering like the Hub.

It serves `/{repo}/resolve/{revision}/{file}` to HEAD and GET with the headers huggingface_hub
reads (`X-Repo-Commit`, `ETag`, `Content-Length`, `Accept-Ranges`), honours `Range`, answers
404/401/403 with the Hub's `X-Error-Code`, and can cut a transfer midway, hang in the middle of one
(for a test to kill the client), or ignore `Range`. A file can also be served as the Hub serves LFS and
Xet files: the resolve URL redirects to `/cdn/<sha256>`, naming the content in `X-Linked-Etag` and
`X-Linked-Size`. A repo can hold older commits beside `main`, each with its own files. The repo API
`/api/models/{repo}[/revision/{revision}]` answers as the Hub does: the commit (`sha`) and the files
(`siblings`), with each file's size and LFS sha256 when asked for `blobs`; `/api/models?search=WORDS`
lists the repos whose id holds the words. Every request is logged, with the body bytes sent for it.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import threading
from dataclasses import dataclass, field
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

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
    hang_at: int | None = None  # GETs send the file up to this offset, then hang until this is None again
    ignores_range: bool = False  # answer 200 and the whole file to a `Range` request, as some servers do
    redirect: bool = False  # the resolve URL answers 302 to `/cdn/<etag>`, as for LFS and Xet files

    @cached_property
    def etag(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def size(self) -> int:
        return self.advertised_size if self.advertised_size is not None else len(self.content)


@dataclass
class ServedRepo:
    commit: str  # where `main` points
    files: dict[str, ServedFile] = field(default_factory=dict)  # the files at `main`
    token: str | None = None  # when set, the repo is gated and needs `Authorization: Bearer <token>`
    older: dict[str, dict[str, ServedFile]] = field(default_factory=dict)  # other commits and their files

    def at(self, revision: str) -> tuple[str, dict[str, ServedFile]] | None:
        """The commit a revision names and its files; None for an unknown revision."""
        if revision in ("main", self.commit):
            return self.commit, self.files
        if revision in self.older:
            return revision, self.older[revision]
        return None


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None
    sent: int = 0  # body bytes written to the client


class FakeHub:
    """Start with `with FakeHub() as hub:`; point `HF_ENDPOINT` at `hub.url`.

    Redirected files are served by a second server, the CDN: another origin, as on the real Hub.
    """

    def __init__(self) -> None:
        self.repos: dict[str, ServedRepo] = {}
        self.requests: list[Request] = []
        self.closing = threading.Event()
        self._servers = [ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self)) for _ in ("hub", "cdn")]
        for server in self._servers:
            server.daemon_threads = True

    @property
    def url(self) -> str:
        return _url_of(self._servers[0])

    @property
    def cdn_url(self) -> str:
        return _url_of(self._servers[1])

    def add_file(self, repo: str, filename: str, content: bytes, *, commit: str | None = None, **options) -> ServedFile:
        """Serve a file at `main`, or at an older `commit` of the repo (40 hex digits)."""
        served = ServedFile(content, **options)
        head = self.repos.setdefault(repo, ServedRepo(commit=hashlib.sha1(repo.encode()).hexdigest()))
        if commit is None or commit == head.commit:
            head.files[filename] = served
        else:
            head.older.setdefault(commit, {})[filename] = served
        return served

    def gate(self, repo: str, token: str) -> None:
        self.repos[repo].token = token

    def gets(self, filename: str) -> list[Request]:
        return [request for request in self.requests if request.method == "GET" and request.path.endswith(filename)]

    def __enter__(self) -> FakeHub:
        for server in self._servers:
            threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.closing.set()
        for server in self._servers:
            server.shutdown()
            server.server_close()


def _url_of(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


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
            self.request_log = Request(self.command, self.path, self.headers.get("Range"), self.headers.get("Authorization"))
            hub.requests.append(self.request_log)
            parts = [unquote(part) for part in urlsplit(self.path).path.split("/")]
            if len(parts) == 3 and parts[1] == "cdn":
                return self._send_cdn(parts[2], body=body)
            if len(parts) == 3 and parts[1:3] == ["api", "models"]:
                return self._send_search(body=body)
            if len(parts) >= 5 and parts[1:3] == ["api", "models"]:
                return self._send_info(parts[3:], body=body)
            if len(parts) < 6 or parts[3] != "resolve":
                return self._error(404, "RepoNotFound", body=body)
            repo_id, revision, filename = f"{parts[1]}/{parts[2]}", parts[4], "/".join(parts[5:])
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound", body=body)
            if repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}":
                status = 403 if self.headers.get("Authorization") else 401
                return self._error(status, "GatedRepo", body=body)
            found = repo.at(revision)
            if found is None:
                return self._error(404, "RevisionNotFound", body=body)
            commit, files = found
            served = files.get(filename)
            if served is None:
                return self._error(404, "EntryNotFound", body=body, commit=commit)
            if served.redirect:
                return self._redirect(served, commit)
            self._send_file(served, commit, body=body)

        def _send_info(self, parts: list[str], *, body: bool) -> None:
            """`/api/models/{owner}/{name}` or `.../revision/{revision}`: the commit and its files.
            As on the Hub, a gated repo's listing is public; only its files need the token."""
            if len(parts) not in (2, 4) or (len(parts) == 4 and parts[2] != "revision"):
                return self._error(404, "RepoNotFound", body=body)
            repo_id = f"{parts[0]}/{parts[1]}"
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound", body=body)
            found = repo.at(parts[3] if len(parts) == 4 else "main")
            if found is None:
                return self._error(404, "RevisionNotFound", body=body)
            commit, files = found
            blobs = parse_qs(urlsplit(self.path).query).get("blobs", [""])[0].lower() == "true"
            siblings = []
            for filename, served in files.items():
                sibling = {"rfilename": filename}
                if blobs:  # a GGUF is stored with LFS: its size and sha256 come in `lfs`
                    lfs = {"sha256": served.etag, "size": served.size, "pointerSize": 134}
                    sibling.update(size=served.size, blobId=hashlib.sha1(served.content).hexdigest(), lfs=lfs)
                siblings.append(sibling)
            self._send_json({"id": repo_id, "modelId": repo_id, "sha": commit, "private": False,
                             "gated": "manual" if repo.token else False, "siblings": siblings}, body=body)

        def _send_search(self, *, body: bool) -> None:
            """`/api/models?search=...`: the repos whose id holds the words, as the Hub lists them."""
            query = parse_qs(urlsplit(self.path).query)
            words = query.get("search", [""])[0].lower()
            found = [{"id": repo_id, "modelId": repo_id, "tags": ["gguf"]} for repo_id in sorted(hub.repos)
                     if words in repo_id.lower()][: int(query.get("limit", ["1000"])[0])]
            self._send_json(found, body=body)

        def _send_json(self, value: object, *, body: bool) -> None:
            payload = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if body:
                self._write(memoryview(payload))

        def _redirect(self, served: ServedFile, commit: str) -> None:
            self.send_response(302)
            self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", f'"{hashlib.sha1(served.content).hexdigest()}"')  # the git pointer's, not the file's
            self.send_header("X-Linked-Etag", f'"{served.etag}"')
            self.send_header("X-Linked-Size", str(served.size))
            self.send_header("Location", f"{hub.cdn_url}/cdn/{served.etag}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _send_cdn(self, etag: str, *, body: bool) -> None:
            every = [files for repo in hub.repos.values() for files in (repo.files, *repo.older.values())]
            files = [served for listing in every for served in listing.values() if served.etag == etag]
            if not files:
                return self._error(404, "NotFound", body=body)
            self._send_file(files[0], None, body=body)

        def _send_file(self, served: ServedFile, commit: str | None, *, body: bool) -> None:
            start, end = (0, None) if served.ignores_range else _range(self.headers.get("Range"))
            last = len(served.content) - 1 if end is None else min(end, len(served.content) - 1)
            payload = memoryview(served.content)[start:last + 1]
            ranged = start > 0 or end is not None
            self.send_response(206 if ranged else 200)
            if commit:  # the Hub names it; a CDN does not
                self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", f'"{served.etag}"')
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            if ranged:
                self.send_header("Content-Range", f"bytes {start}-{last}/{len(served.content)}")
            self.send_header("Content-Length", str(served.size - start if not body and end is None else len(payload)))
            self.end_headers()
            if not body:
                return
            if served.hang_at is not None and start < served.hang_at:
                self._write(payload[: served.hang_at - start])
                while served.hang_at is not None and not hub.closing.wait(0.05):
                    pass
                self.close_connection = True
                return
            if served.cuts > 0:
                served.cuts -= 1
                self._write(payload[: len(payload) // 2])
                self.close_connection = True  # the client sees the body end early
                return
            self._write(payload)

        def _write(self, data: memoryview) -> None:
            self.request_log.sent += len(data)  # counted first: the client may finish reading before write returns
            self.wfile.write(data)
            self.wfile.flush()

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


def _range(header: str | None) -> tuple[int, int | None]:
    """The first and last byte of `Range: bytes=N-` or `bytes=N-M` (None: to the end); (0, None)
    without a range."""
    if not header or not header.startswith("bytes="):
        return 0, None
    first, _, last = header.removeprefix("bytes=").partition("-")
    return int(first or 0), int(last) if last else None
