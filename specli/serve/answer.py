"""A request's answer: its generation started on the worker (in its turn), then answered whole,
as a ChatCompletion or Completion whose choice carries `spans` (which text the draft wrote),
or streamed as server-sent events (sse.py).

What goes wrong is raised as the typed error serve.errors answers: the worker's Busy, Closing
and Gone, a GenerationFailed, or an ApiError for a client that left or a shutdown.
"""

from __future__ import annotations

import asyncio
from typing import IO

from fastapi import Request
from fastapi.responses import StreamingResponse

from specli.serve.errors import CLIENT_LEFT, ApiError, GenerationFailed
from specli.serve.generation import Asked
from specli.serve.log import RequestLog
from specli.serve.logprobs import LogprobWriter
from specli.serve.requests import FunctionCall, ToolCall
from specli.serve.responses import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    Completion,
    Span,
    TextChoice,
    finish_reason,
    timings,
    usage,
)
from specli.serve.sse import Chunks, EventStream, Readers, Started
from specli.serve.worker import Worker
from specli.stream import Outcome
from specli.tools.plan import SpecialText, ToolPlan, ToolStream, answer_content
from specli.tools.reasoning import ReasoningStream

DISCONNECT_POLL = 0.2  # seconds between asking whether a whole answer's client has left


class Answerer:
    """Answers each request on the worker; `model` is what responses call the model."""

    def __init__(self, worker: Worker, model: str, log: IO[str]) -> None:
        self.worker, self.model, self.log = worker, model, log

    async def __call__(self, asked: Asked, request: Request):
        log = RequestLog(self.log, request.method, request.url.path)
        if asked.body.stream:
            return await self._stream(asked, request, log)
        return await self._whole(asked, request, log)

    def _special(self, asked: Asked) -> SpecialText:
        """The answer's text with its special tokens written out, where its tool calls are read."""
        target = self.worker.session.target
        return SpecialText(lambda token: target.piece(token, special=True), asked.job.request.stop)

    def _logprobs(self, asked: Asked) -> LogprobWriter | None:
        """The answer's logprob writer, where the request asks for logprobs; a completion's
        offsets count from its prompt's text, as OpenAI's do."""
        if asked.job.request.logprobs is None:
            return None
        target = self.worker.session.target
        offset = 0 if asked.chat else len(b"".join(map(target.piece, asked.job.tokens)).decode("utf-8", "replace"))
        return LogprobWriter(lambda token: target.piece(token, special=True), offset)

    async def _stream(self, asked: Asked, request: Request, log: RequestLog) -> StreamingResponse:
        events: asyncio.Queue = asyncio.Queue()
        future, cancel = await self.worker.start(asked.job, events.put_nowait, gone=request.is_disconnected,
                                                 key=asked.key)
        future.add_done_callback(lambda _: events.put_nowait(None))  # also ends a generation that failed
        calls = ToolStream(asked.plan) if asked.plan is not None else None
        readers = Readers(calls, self._special(asked) if calls is not None else None,
                          ReasoningStream(asked.reasoning) if asked.reasoning is not None else None, self._logprobs(asked))
        stream = EventStream(Chunks(asked.chat, self.model), Started(future, cancel, events), log,
                             usage=asked.body.include_usage, readers=readers)
        return StreamingResponse(stream.events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def _whole(self, asked: Asked, request: Request, log: RequestLog) -> dict:
        future, cancel = await self.worker.start(asked.job, None, gone=request.is_disconnected, key=asked.key)
        while not future.done():  # a client that goes away cancels its generation within a step
            await asyncio.wait({future}, timeout=DISCONNECT_POLL)
            if not future.done() and await request.is_disconnected():
                cancel.set()
                await asyncio.wait({future})
                raise ApiError(CLIENT_LEFT, "the client left; its generation was cancelled")
        error = future.exception()
        if error is not None:
            raise GenerationFailed(error) from error
        outcome: Outcome = future.result()
        if outcome.stats.finish_reason == "cancelled":
            raise ApiError(503, "the generation was cancelled: the server is shutting down", "server_error")
        log.line(200, outcome.stats, waited=outcome.waited)
        special = self._special(asked) if asked.plan is not None else None
        return _response(asked, outcome, self.model, special, self._logprobs(asked)).model_dump()


def _response(asked: Asked, outcome: Outcome, model: str, special: SpecialText | None,
              logprobs: LogprobWriter | None) -> ChatCompletion | Completion:
    spans = [Span(text=text, source=source, proposer=proposer or None) for text, source, proposer in outcome.spans]
    finish = finish_reason(outcome.stats)
    if not asked.chat:
        choice = TextChoice(text=outcome.text, finish_reason=finish, spans=spans,
                            logprobs=logprobs.text(outcome.logprobs) if logprobs is not None else None)
        return Completion(model=model, choices=[choice], usage=usage(outcome.stats), timings=timings(outcome.stats))
    text, special_text, thought = outcome.text, special.all(outcome.tokens) if special is not None else "", ""
    if asked.reasoning is not None:  # the thinking is the same text in both: its markers are no special tokens
        thought, text = asked.reasoning.split(text)
        special_text = asked.reasoning.split(special_text)[1]
    message = AssistantMessage(content=text)
    if asked.plan is not None:
        message, finish = _message(asked.plan, special_text, text, finish)
    message.reasoning_content = thought or None
    choice = ChatChoice(message=message, finish_reason=finish, spans=spans,  # type: ignore[assignment]
                        logprobs=logprobs.chat(outcome.logprobs) if logprobs is not None else None)
    return ChatCompletion(model=model, choices=[choice], usage=usage(outcome.stats), timings=timings(outcome.stats))


def _message(plan: ToolPlan, special_text: str, text: str, finish: str) -> tuple[AssistantMessage, str]:
    """The whole answer's message (content, and the calls read from the text with its
    special tokens written out) and finish reason, as OpenAI's: "tool_calls" where it made
    complete calls, even where the token limit cut only the template's closing frame after
    them (the grammar forces it: nothing of the calls is missing); "length" with the call as
    far as it was written where the limit cut its arguments. An answer that ended inside a
    call otherwise keeps its text as content."""
    parsed = plan.read(special_text)
    calls = [ToolCall(id=plan.new_id(), function=FunctionCall(name=call.name, arguments=call.arguments))
             for call in parsed.calls if call.complete]
    if any(not call.complete for call in parsed.calls):
        return AssistantMessage(content=text, tool_calls=calls or None), finish
    if finish == "length" and plan.choice != "none":
        cut = [call for call in plan.format.parse(special_text, final=False).calls if not call.complete]
        if cut:  # its arguments cut by the limit: the call as far as it was written
            calls += [ToolCall(id=plan.new_id(), function=FunctionCall(name=call.name, arguments=call.arguments))
                      for call in cut]
            return AssistantMessage(content=answer_content(parsed) if parsed.content.strip() else None,
                                    tool_calls=calls), finish
    if not calls:
        return AssistantMessage(content=parsed.content), finish
    return AssistantMessage(content=answer_content(parsed), tool_calls=calls), \
        "tool_calls" if finish in ("stop", "length") else finish
