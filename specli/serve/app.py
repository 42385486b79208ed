"""`specli serve`'s HTTP API: OpenAI's chat and text completions, the model list and a
health check, on FastAPI.

Every error has OpenAI's shape, {"error": {"message", "type", "param", "code"}}. Each
response says which tokens the draft wrote: a streamed chunk's choice carries `source`
(one chunk per run of tokens from one source), a whole response's choice carries `spans`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import time
import traceback
from dataclasses import dataclass, replace
from typing import IO, Any, AsyncIterator, Callable, Union

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specli.config import debug_enabled
from specli.decode.constraint import ConstraintError
from specli.decode.engine import ContextLengthError, check_prompt_fits
from specli.decode.events import Stats, Token
from specli.decode.request import DraftKind, GenerationRequest
from specli.errors import PromptError, SpecliError
from specli.prompt import chat_tokens, prompt_tokens
from specli.serve.page import add_page
from specli.serve.schema import (
    AssistantMessage,
    ChatChoice,
    ChatChunk,
    ChatChunkChoice,
    ChatCompletion,
    ChatRequest,
    Completion,
    CompletionRequest,
    CompletionTokensDetails,
    Delta,
    ErrorBody,
    ErrorResponse,
    FunctionCall,
    FunctionCallDelta,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    RequestError,
    Span,
    TextChoice,
    TextChunk,
    TextChunkChoice,
    Timings,
    ToolCall,
    ToolCallDelta,
    Usage,
    _new_id,
)
from specli.serve.worker import Busy, Closing, Gone, Job, Worker
from specli.stream import Outcome
from specli.tools.plan import (
    ContentDelta,
    SpecialText,
    ToolPlan,
    ToolStream,
    ToolsUnsupported,
    answer_content,
    tool_format,
)

MAX_BODY_BYTES = 8 << 20  # a request body larger than this is refused (413)
RETRY_AFTER_SECONDS = 1
CLIENT_LEFT = 499  # nginx's "client closed request": logged, never read by the client
FINISH_REASONS = {"eog": "stop", "stop": "stop", "length": "length", "context": "length"}


@dataclass(frozen=True)
class ServerInfo:
    name: str  # what responses call the model: the pair, or the target file
    target: str
    draft: str
    api_key: str | None
    defaults: GenerationRequest  # what a request's own fields override (serve's options)
    started: int


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.body = status, ErrorBody(message=message, type=kind, param=param, code=code)
        self.headers = headers


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(ErrorResponse(error=error.body).model_dump(), status_code=error.status, headers=error.headers)


def create_app(worker: Worker, info: ServerInfo, log: IO[str] = sys.stderr) -> FastAPI:
    app = FastAPI(title="specli", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError) -> JSONResponse:
        _log_line(log, request, error.status, note=error.body.message if error.status == CLIENT_LEFT else "")
        return _error_response(error)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = [str(part) for part in first.get("loc", ()) if part != "body"]
        param = ".".join(where) or None
        if first.get("type") == "json_invalid":
            message = f"the body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}"
            param = None
        else:
            message = f"{param}: {first.get('msg', 'invalid')}" if param else str(first.get("msg", "invalid request"))
        _log_line(log, request, 400)
        return _error_response(ApiError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        code = "request_too_large" if error.status_code == 413 else None
        _log_line(log, request, error.status_code)
        return _error_response(ApiError(error.status_code, str(error.detail), kind, code=code))

    def authorised(request: Request) -> None:
        if info.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, key = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), info.api_key.encode()):
            raise ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)", "authentication_error",
                           code="invalid_api_key")

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=[Depends(authorised)])
    async def models() -> dict:
        own = info.defaults.draft  # first, then the most drafting to none
        kinds = [own] + [kind for kind in (DraftKind.MODEL, DraftKind.NGRAM, DraftKind.NONE) if kind is not own]
        drafts = [kind.value for kind in kinds if kind is not DraftKind.MODEL or worker.session.draft is not None]
        card = ModelCard(id=info.name, created=info.started, target=info.target, draft=info.draft,
                         chat=worker.session.target.chat_template() is not None, drafts=drafts)
        return ModelList(data=[card]).model_dump()

    @app.post("/v1/chat/completions", dependencies=[Depends(authorised)])
    async def chat_completions(body: ChatRequest, request: Request):
        target = worker.session.target
        plan = _tool_plan(body, worker)
        job = _job(body, worker, info, lambda: chat_tokens(target, body.conversation(), body.template_tools()),
                   plan)
        return await _respond(request, body, job, worker, info, log, chat=True, plan=plan)

    @app.post("/v1/completions", dependencies=[Depends(authorised)])
    async def completions(body: CompletionRequest, request: Request):
        def tokens() -> list[int]:
            prompt = body.prompt
            if isinstance(prompt, list) and not prompt:
                raise RequestError("the prompt is empty", "prompt")
            if isinstance(prompt, list) and isinstance(prompt[0], int):  # token ids, as OpenAI's API allows
                n_vocab = worker.session.target.n_vocab
                if any(not 0 <= token < n_vocab for token in prompt):
                    raise RequestError(f"prompt: token ids run from 0 to {n_vocab - 1}", "prompt")
                return list(prompt)
            text = prompt[0] if isinstance(prompt, list) else prompt
            if not text:
                raise RequestError("the prompt is empty", "prompt")
            return prompt_tokens(worker.session.target, text, chat=False)

        job = _job(body, worker, info, tokens)
        return await _respond(request, body, job, worker, info, log, chat=False)

    add_page(app)
    app.add_middleware(_BodyLimit, limit=MAX_BODY_BYTES, log=log)
    return app


def _tool_plan(body: ChatRequest, worker: Worker) -> ToolPlan | None:
    """The request's tools in the format of the loaded template (None: no tools, or
    tool_choice "none"); ApiError (400) names what cannot be served."""
    try:
        body.refused()
        if not body.tools or body.choice == "none":
            return None
        target = worker.session.target
        functions = body.functions_called()
        format = tool_format(target.chat_template(), target.path.name)
    except RequestError as error:
        raise ApiError(400, error.message, param=error.param, code=error.code) from None
    except ToolsUnsupported as error:
        raise ApiError(400, f"{error.message}: tools are not supported ({error.hint})", param="tools") from None
    return ToolPlan(format, functions, body.choice, parallel=body.parallel_tool_calls is not False)


def _job(body: Union[ChatRequest, CompletionRequest], worker: Worker, info: ServerInfo,
         tokens: Callable[[], list[int]], plan: ToolPlan | None = None) -> Job:
    """The request as a generation, or ApiError (400) naming what cannot be served."""
    try:
        body.refused()
        request = body.generation_request(info.defaults)
        if plan is not None:
            try:
                request = replace(request, constraint=plan.constraint(worker.session.target.special_token))
            except ConstraintError as error:
                raise RequestError(error.message, "tools") from None
        if request.draft is DraftKind.MODEL and worker.session.draft is None:
            raise RequestError("draft 'model': the server has no draft model loaded (start it with --draft)", "draft")
        prompt = tokens()
        check_prompt_fits(len(prompt), worker.session.target.n_ctx)
    except RequestError as error:
        raise ApiError(400, error.message, param=error.param, code=error.code) from None
    except ContextLengthError as error:
        raise ApiError(400, error.message, param="messages" if isinstance(body, ChatRequest) else "prompt",
                       code="context_length_exceeded") from None
    except PromptError as error:  # no chat template, a template that fails
        raise ApiError(400, error.message + (f" ({error.hint})" if error.hint else ""), param="messages") from None
    return Job(prompt, request)


async def _respond(request: Request, body: Union[ChatRequest, CompletionRequest], job: Job, worker: Worker,
                   info: ServerInfo, log: IO[str], *, chat: bool, plan: ToolPlan | None = None):
    special = SpecialText(lambda token: worker.session.target.piece(token, special=True), job.request.stop)
    if body.stream:
        events: asyncio.Queue = asyncio.Queue()
        future, cancel = await _start(worker, job, events.put_nowait, request, log)
        future.add_done_callback(lambda _: events.put_nowait(None))  # also ends a generation that failed
        calls = ToolStream(plan) if plan is not None else None
        return StreamingResponse(_sse(request, body, future, cancel, events, info, log, chat=chat,
                                      calls=calls, special=special),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    future, cancel = await _start(worker, job, None, request, log)
    while not future.done():  # a client that goes away cancels its generation within a step
        await asyncio.wait({future}, timeout=0.2)
        if not future.done() and await request.is_disconnected():
            cancel.set()
            await asyncio.wait({future})
            raise ApiError(CLIENT_LEFT, "the client left; its generation was cancelled")
    outcome = _outcome(future, request, log)
    if outcome.stats.finish_reason == "cancelled":
        raise ApiError(503, "the generation was cancelled: the server is shutting down", "server_error")
    spans = [Span(text=text, source=source, proposer=proposer or None) for text, source, proposer in outcome.spans]
    usage, timings = _usage(outcome.stats), _timings(outcome.stats)
    finish = FINISH_REASONS.get(outcome.stats.finish_reason, outcome.stats.finish_reason)
    _log_line(log, request, 200, outcome.stats)
    if chat:
        message = AssistantMessage(content=outcome.text)
        if plan is not None:
            message, finish = _answer(plan, special.all(outcome.tokens), outcome.text, finish)
        choice = ChatChoice(message=message, finish_reason=finish, spans=spans)
        return ChatCompletion(model=info.name, choices=[choice], usage=usage, timings=timings).model_dump()
    choice = TextChoice(text=outcome.text, finish_reason=finish, spans=spans)
    return Completion(model=info.name, choices=[choice], usage=usage, timings=timings).model_dump()


def _answer(plan: ToolPlan, special_text: str, text: str, finish: str) -> tuple[AssistantMessage, str]:
    """The whole answer's message (content, and the calls read from the text with its
    special tokens written out) and finish reason: "tool_calls" where it made calls. An
    answer cut off inside a call keeps its text as content."""
    parsed = plan.read(special_text)
    calls = [ToolCall(id=plan.new_id(), function=FunctionCall(name=call.name, arguments=call.arguments))
             for call in parsed.calls if call.complete]
    if any(not call.complete for call in parsed.calls):
        return AssistantMessage(content=text, tool_calls=calls or None), finish
    if not calls:
        return AssistantMessage(content=parsed.content), finish
    return AssistantMessage(content=answer_content(parsed), tool_calls=calls), \
        "tool_calls" if finish == "stop" else finish


async def _start(worker: Worker, job: Job, on_event, request: Request, log: IO[str]):
    try:
        return await worker.start(job, on_event, gone=request.is_disconnected)
    except Gone:
        raise ApiError(CLIENT_LEFT, "the client left while the request waited for its turn") from None
    except Busy:
        raise ApiError(503, f"the server is busy: {worker.queue} requests are already waiting", "server_error",
                       code="queue_full", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
    except Closing:
        raise ApiError(503, "the server is shutting down", "server_error") from None


def _outcome(future: asyncio.Future, request: Request, log: IO[str]) -> Outcome:
    """The generation's outcome; an error inside it (llama.cpp failing a decode) ends this
    request only, as a 500."""
    try:
        return future.result()
    except SpecliError as error:
        raise ApiError(500, error.message, "server_error") from None
    except Exception as error:  # noqa: BLE001 - one request's failure, reported in its own response
        raise ApiError(500, f"internal error: {type(error).__name__}: {error}", "server_error") from None


async def _sse(request: Request, body, future: asyncio.Future, cancel, events: asyncio.Queue, info: ServerInfo,
               log: IO[str], *, chat: bool, calls: ToolStream | None = None,
               special: SpecialText | None = None) -> AsyncIterator[str]:
    """Server-sent events: the first token as soon as the prompt's decode writes it, then one
    chunk per run of a step's tokens from one source, a last chunk with the finish reason, the
    usage chunk when asked for, then [DONE]. With tools (`calls`), a run's text is read for
    calls: content until a call opens, then the call's id and name, then its arguments in
    pieces. If the client goes away, Starlette stops this generator and the `finally` cancels
    the generation."""
    chunk_id, created = _new_id("chatcmpl" if chat else "cmpl"), int(time.time())

    def chunk(text: str | None, source: str | None, finish: str | None = None, first: bool = False,
              proposer: str = "", tool_calls: list[ToolCallDelta] | None = None, tokens: int | None = None) -> str:
        if chat:
            delta = Delta(role="assistant" if first else None, content=text, tool_calls=tool_calls)
            data = ChatChunk(id=chunk_id, created=created, model=info.name,
                             choices=[ChatChunkChoice(delta=delta, finish_reason=finish, source=source,
                                                      proposer=proposer or None, tokens=tokens)])
        else:
            data = TextChunk(id=chunk_id, created=created, model=info.name,
                             choices=[TextChunkChoice(text=text or "", finish_reason=finish, source=source,
                                                      proposer=proposer or None, tokens=tokens)])
        return _event(data.model_dump(exclude_none=chat))

    def deltas(found: list, source: str | None, proposer: str = "", tokens: int | None = None) -> list[str]:
        """Chunks for what a call's parser found; the first carries the run's token count."""
        out = []
        for delta in found:
            if isinstance(delta, ContentDelta):
                out.append(chunk(delta.text, source, proposer=proposer, tokens=tokens))
            else:
                function = FunctionCallDelta(name=delta.name, arguments=delta.arguments)
                call = ToolCallDelta(index=delta.index, id=delta.id, type="function" if delta.id else None,
                                     function=function)
                out.append(chunk(None, source, proposer=proposer, tool_calls=[call], tokens=tokens))
            tokens = None
        return out

    # Tokens whose text is still held back (part of a character, a call being parsed): counted
    # in the next chunk, so that the chunks' `tokens` add up to the answer's.
    held = 0

    def run(tokens: list[Token]) -> list[str]:
        """Chunks for a run of tokens of one source and proposer."""
        nonlocal held
        held += sum(token.id >= 0 for token in tokens)  # id -1: text held back to the end, no token of its own
        if calls is None or special is None:
            text = "".join(token.text for token in tokens)
            lines = [chunk(text, tokens[0].source, proposer=tokens[0].proposer, tokens=held)] if text else []
        else:
            text = "".join(special(token.id) for token in tokens if token.id >= 0)
            lines = deltas(calls.feed(text), tokens[0].source, tokens[0].proposer, tokens=held)
        if lines:
            held = 0
        return lines

    try:
        if chat:
            yield chunk("", None, first=True)
        pending: list[Token] = []
        first = True  # the prompt decode's token: out at once, not after the first step's tokens
        while True:
            event = await events.get()
            if isinstance(event, Token) and first:
                first = False
                for line in run([event]):
                    yield line
                continue
            if isinstance(event, Token):
                pending.append(event)
                continue
            for tokens in _runs(pending):  # a StepRecord, or the end (None)
                for line in run(tokens):
                    yield line
            pending = []
            if event is None:
                break
        await asyncio.wait({future})
        try:
            outcome = _outcome(future, request, log)
        except ApiError as error:
            _log_line(log, request, error.status)
            yield _event(ErrorResponse(error=error.body).model_dump())
            yield "data: [DONE]\n\n"
            return
        stats = outcome.stats
        if stats.finish_reason == "cancelled":  # the server is shutting down (a client that left reads nothing)
            _log_line(log, request, 503, stats, "cancelled: shutting down")
            yield _event(ErrorResponse(error=ErrorBody(message="the server is shutting down; the answer is cut short",
                                                       type="server_error")).model_dump())
            yield "data: [DONE]\n\n"
            return
        finish = FINISH_REASONS.get(stats.finish_reason, stats.finish_reason)
        if calls is not None and special is not None:
            lines = deltas(calls.feed(special.flush()) + calls.finish(), None, tokens=held or None)
            held = held if not lines else 0
            for line in lines:
                yield line
            if calls.ids and finish == "stop":
                finish = "tool_calls"
        yield chunk(None if chat else "", None, finish, tokens=held or None)
        if body.include_usage:
            usage = _usage(stats)
            if chat:
                data: Any = ChatChunk(id=chunk_id, created=created, model=info.name, choices=[], usage=usage,
                                      timings=_timings(stats)).model_dump(exclude_none=True)
            else:
                data = TextChunk(id=chunk_id, created=created, model=info.name, choices=[], usage=usage,
                                 timings=_timings(stats)).model_dump(exclude_none=True)
            yield _event(data)
        _log_line(log, request, 200, stats)  # before the end: a client may close as soon as it reads it
        yield "data: [DONE]\n\n"
    finally:
        if not future.done():
            cancel.set()
            _log_line(log, request, 499, None, "client went away")


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _runs(tokens: list[Token]) -> list[list[Token]]:
    """A step's tokens in runs of one source and proposer."""
    runs: list[list[Token]] = []
    for token in tokens:
        if runs and (runs[-1][0].source, runs[-1][0].proposer) == (token.source, token.proposer):
            runs[-1].append(token)
        else:
            runs.append([token])
    return runs


def _usage(stats: Stats) -> Usage:
    return Usage(
        prompt_tokens=stats.prompt_tokens,
        completion_tokens=stats.tokens,
        total_tokens=stats.prompt_tokens + stats.tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=stats.prompt_cached),
        completion_tokens_details=CompletionTokensDetails(accepted_prediction_tokens=stats.accepted,
                                                          rejected_prediction_tokens=stats.drafted - stats.accepted),
    )


def _timings(stats: Stats) -> Timings:
    decoded = stats.generated_after_first
    return Timings(prompt_n=stats.prompt_tokens - stats.prompt_cached, prompt_ms=1000 * stats.prefill_seconds,
                   predicted_n=stats.tokens, predicted_ms=1000 * stats.seconds,
                   predicted_per_second=decoded / stats.seconds if stats.seconds > 0 else 0.0,
                   draft_n=stats.drafted, draft_n_accepted=stats.accepted)


def _log_line(log: IO[str], request: Request, status: int, stats: Stats | None = None, note: str = "") -> None:
    """One line per request: method, path, status, tokens, tok/s, acceptance."""
    parts = [f"specli: {request.method} {request.url.path} {status}"]
    if stats is not None:
        parts.append(f"{stats.tokens} tokens, {stats.tokens_per_second:.1f} tok/s")
        if stats.drafted:
            parts.append(f"accepted {stats.accepted}/{stats.drafted} ({100 * stats.acceptance_rate:.0f}%)")
    if note:
        parts.append(note)
    log.write(" | ".join(parts) + "\n")
    log.flush()


class _BodyLimit:
    """Refuses request bodies over `limit` bytes (413), by Content-Length or as they arrive;
    and answers a bug in a handler as a 500 in OpenAI's shape, with one log line (the
    traceback too with SPECLI_DEBUG=1), instead of the server's own page."""

    def __init__(self, app, limit: int, log: IO[str] = sys.stderr) -> None:
        self.app, self.limit, self.log = app, limit, log

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            self.log.write(f"specli: {scope.get('method')} {scope.get('path')} 413 | body of {int(declared)} bytes\n")
            return await self._refuse(send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge(self.limit)
            return message

        started = False

        async def watched(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, watched)
        except _TooLarge:
            if not started:
                self.log.write(f"specli: {scope.get('method')} {scope.get('path')} 413 | body over {self.limit} bytes\n")
                await self._refuse(send)
        except Exception as error:  # noqa: BLE001 - a bug: this request fails, the server goes on
            self.log.write(f"specli: {scope.get('method')} {scope.get('path')} 500 | internal error: "
                           f"{type(error).__name__}: {error}\n")
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
    FastAPI reads it, which passes an HTTPException on to the `_http` handler as it is."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes")
