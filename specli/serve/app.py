"""`specli serve`'s HTTP API on FastAPI: OpenAI's chat and text completions, its Responses API
(a translation of the chat route: openai_responses.py), the model list, a health check,
llama-server's utility routes (utility.py), and the page.

Each completion route reads its body (body.py) into a generation (generation.py) in a
thread of its own, so the event loop never waits on a request's parsing, templating,
tokenising or schema compiling, and answers it (answer.py); every error has OpenAI's shape,
answered by one handler from one table (errors.py). Every request passes serve.guard's Host
and Origin check first. Until the pair has loaded and its costs are read (`Backend`),
`/health` answers 503 {"status": "loading"} and the API 503 with Retry-After. Each response says which tokens the draft wrote: a streamed chunk's choice
carries `source` (one chunk per run of tokens from one source), a whole response's choice
carries `spans`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import IO, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specli import drafts
from specli.config import debug_enabled
from specli.serve.answer import Answerer
from specli.serve.body import parse
from specli.serve.errors import ERRORS, RETRY_AFTER_SECONDS, ApiError, api_error, error_response
from specli.serve.generation import Asked, read
from specli.serve.guard import Access, Guard
from specli.serve.log import RequestLog
from specli.serve.anthropic_messages import ROUTE as MESSAGES_ROUTE
from specli.serve.anthropic_messages import add_messages_route, error_body
from specli.serve.ollama_api import add_ollama_routes
from specli.serve.openai_responses import add_responses_route
from specli.serve.through_chat import ThroughChat
from specli.serve.page import add_page
from specli.serve.requests import ChatRequest, CompletionRequest
from specli.serve.responses import ErrorBody, ErrorResponse, ModelCard, ModelList, ModelMeta
from specli.serve.utility import add_utility_routes
from specli.serve.state import Backend, ServerInfo
from specli.serve.worker import Worker

MAX_BODY_BYTES = 8 << 20  # a request body larger than this is refused (413)
READERS = 2  # threads that read bodies into generations beside the one that generates


def create_app(worker: Worker | Backend, info: ServerInfo, log: IO[str] = sys.stderr,
               access: Access | None = None) -> FastAPI:
    """The app over `worker` (a Backend: one that may still be loading). `access`: the hosts
    and origins allowed beyond the server's own (none)."""
    backend = worker if isinstance(worker, Backend) else Backend(worker)
    app = FastAPI(title="specli", docs_url=None, redoc_url=None, openapi_url=None)
    _answer_errors(app, log)
    _add_api(app, backend, info, log)
    add_page(app)
    app.add_middleware(_BodyLimit, limit=MAX_BODY_BYTES, log=log)
    app.add_middleware(Guard, access=access or Access(), log=log)  # added last: runs first
    return app


def _answer_errors(app: FastAPI, log: IO[str]) -> None:
    """Every error type in errors.ERRORS, answered in OpenAI's shape with one log line."""

    async def answer(request: Request, error: Exception) -> JSONResponse:
        answer = api_error(error, request.url.path)
        if answer.status == 404 and isinstance(error, StarletteHTTPException):  # no such route: name those there are
            answer = ApiError(404, f"no route {request.method} {request.url.path}; this server has "
                              + ", ".join(_routes(app)), "not_found_error")
        RequestLog(log, request.method, request.url.path).line(answer.status, note=answer.body.message)
        if request.url.path == MESSAGES_ROUTE:  # Anthropic's clients read Anthropic's shape
            return JSONResponse(error_body(answer.status, answer.body.message), status_code=answer.status,
                                headers=answer.headers)
        return error_response(answer)

    for kind, _ in ERRORS:
        app.add_exception_handler(kind, answer)  # type: ignore[arg-type]


def _add_api(app: FastAPI, backend: Backend, info: ServerInfo, log: IO[str]) -> None:
    authorised = Depends(_authorisation(info.api_key))
    readers = ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="specli-read")

    async def asked(model: type[ChatRequest] | type[CompletionRequest], request: Request) -> Asked:
        """The request's body as a generation, read in a reader thread (`key`: the body's
        hash, by which a client that retries keeps its place in the line, worker.Line)."""
        worker = backend.ready()
        raw = await request.body()
        reading = asyncio.get_running_loop().run_in_executor(
            readers, lambda: read(parse(raw, model), worker.session, info.defaults,
                                             fetch_images=info.image_urls))
        return replace(await reading, key=hashlib.sha256(raw).hexdigest())

    async def in_reader(work: Callable):
        return await asyncio.get_running_loop().run_in_executor(readers, work)

    @app.get("/health")
    async def health():
        if backend.worker is None:
            return JSONResponse({"status": "loading"}, status_code=503,
                                headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        worker = backend.worker  # (llama-server's names for its slots)
        return {"status": "ok", "slots_processing": worker.generating,
                "slots_idle": worker.parallel - worker.generating, "requests_waiting": worker.waiting}

    @app.get("/v1/models", dependencies=[authorised])
    async def models() -> dict:
        return _models(backend.ready(), info).model_dump()

    @app.post("/v1/chat/completions", dependencies=[authorised])
    async def chat_completions(request: Request):
        return await Answerer(backend.ready(), info.name, log)(await asked(ChatRequest, request), request)

    @app.post("/v1/completions", dependencies=[authorised])
    async def completions(request: Request):
        return await Answerer(backend.ready(), info.name, log)(await asked(CompletionRequest, request), request)

    through_chat = ThroughChat(backend, info, log, in_reader)
    add_responses_route(app, through_chat, authorised)
    add_messages_route(app, through_chat, authorised)
    add_ollama_routes(app, through_chat, authorised)
    add_utility_routes(app, backend, info, authorised, in_reader)


def _routes(app: FastAPI) -> list[str]:
    """"METHOD /path" of every route the app serves (the page's own files left out)."""
    return [f"{method} {route.path}" for route in app.routes if "." not in route.path
            for method in sorted(getattr(route, "methods", None) or ()) if method != "HEAD"]


def _authorisation(api_key: str | None) -> Callable[[Request], None]:
    """A dependency that lets a request through with `Authorization: Bearer KEY`, or `x-api-key:
    KEY` as Anthropic's clients send it (any, without a key)."""

    def authorised(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            key = request.headers.get("x-api-key", "")
        if not hmac.compare_digest(key.strip().encode(), api_key.encode()):
            raise ApiError(401, "missing or wrong API key (Authorization: Bearer KEY, or x-api-key: KEY)",
                           "authentication_error", code="invalid_api_key")

    return authorised


def _models(worker: Worker, info: ServerInfo) -> ModelList:
    """The loaded pair, with the `draft` values a request may give: the server's own first,
    then the kinds that can draft on it, the most drafting first (specli/drafts.py)."""
    offered = drafts.offered(info.defaults.draft, worker.session.unavailable)
    target = worker.session.target
    card = ModelCard(id=info.name, created=info.started, target=info.target, draft=info.draft,
                     chat=target.chat_template() is not None, drafts=offered, proposers=drafts.labels(),
                     capabilities=["completion"] + (["multimodal"] if worker.session.projector is not None else []),
                     meta=ModelMeta(n_ctx=target.n_ctx, n_vocab=target.n_vocab, slots=worker.parallel))
    return ModelList(data=[card])


class _BodyLimit:
    """Refuses request bodies over `limit` bytes (413), by Content-Length or as they arrive;
    and answers a bug in a handler as a 500 in OpenAI's shape, with one log line (the
    traceback too with SPECLI_DEBUG=1), instead of the server's own page."""

    def __init__(self, app, limit: int, log: IO[str] = sys.stderr) -> None:
        self.app, self.limit, self.log = app, limit, log

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        log = RequestLog(self.log, scope.get("method"), scope.get("path"))
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            log.line(413, note=f"body of {int(declared)} bytes")
            return await self._refuse(send)
        seen, started = 0, False

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge(self.limit)
            return message

        async def watched(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, watched)
        except _TooLarge:
            if not started:
                log.line(413, note=f"body over {self.limit} bytes")
                await self._refuse(send)
        except Exception as error:  # noqa: BLE001 - a bug: this request fails, the server goes on
            log.line(500, note=f"internal error: {type(error).__name__}: {error}")
            if debug_enabled():
                traceback.print_exc(file=self.log)
            if not started:
                await self._refuse(send, 500, f"internal error: {type(error).__name__}: {error}", "server_error",
                                   None)

    async def _refuse(self, send, status: int = 413, message: str | None = None, kind: str = "invalid_request_error",
                      code: str | None = "request_too_large") -> None:
        message = message or f"the request body is larger than {self.limit} bytes"
        body = json.dumps(ErrorResponse(error=ErrorBody(message=message, type=kind, code=code)).model_dump()).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(StarletteHTTPException):
    """A body that grew past the limit as it arrived (no Content-Length said so): raised while
    FastAPI reads it, which passes an HTTPException on to the error handler as it is."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes")
