"""A streamed answer as server-sent events, for both routes: `Chunks` builds a chat's or a
text completion's chunk from one `Piece`, and `EventStream` writes the generation's events
as those chunks.

A streamed choice says which tokens the draft wrote: one chunk per run of a step's tokens
from one source (`source`, `proposer`), with the number of tokens its text holds (`tokens`);
the first chunk of a step that drafted says how many tokens were drafted (`drafted`, kept or
not), so a reader counts the acceptance as it streams.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, replace
from typing import AsyncIterator, Optional, Union

from specli.decode.events import Stats, StepRecord, Token
from specli.serve.errors import CLIENT_LEFT, GenerationFailed, api_error
from specli.serve.log import RequestLog
from specli.serve.logprobs import LogprobWriter
from specli.serve.responses import (
    ChatChunk,
    ChatChunkChoice,
    ChatLogprobs,
    Delta,
    ErrorBody,
    ErrorResponse,
    FunctionCallDelta,
    TextChunk,
    TextChunkChoice,
    TextLogprobs,
    ToolCallDelta,
    finish_reason,
    new_id,
    timings,
    usage,
)
from specli.tools.plan import CallDelta, ContentDelta, SpecialText, ToolStream
from specli.tools.reasoning import ReasoningDelta, ReasoningStream

DONE = "data: [DONE]\n\n"


def event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


@dataclass(frozen=True)
class Piece:
    """What one chunk carries: text (None: a chat chunk of calls only, or the last), or a
    call's delta; who wrote it; how many tokens it holds; the finish reason on the last."""

    text: Optional[str] = None
    source: Optional[str] = None
    proposer: str = ""
    tokens: Optional[int] = None
    calls: Optional[list[ToolCallDelta]] = None
    finish: Optional[str] = None
    reasoning: Optional[str] = None  # a chat's thinking, beside its content
    role: Optional[str] = None  # "assistant" on a chat's first chunk
    logprobs: Union[ChatLogprobs, TextLogprobs, None] = None  # the logprobs of the tokens `tokens` counts
    drafted: Optional[int] = None  # the draft tokens verified since the last chunk that counted them


class Chunks:
    """The chunks of one streamed answer, a chat's or a text completion's, under one id and time."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat, self.model = chat, model
        self.id, self.created = new_id("chatcmpl" if chat else "cmpl"), int(time.time())

    def __call__(self, piece: Piece) -> str:
        shared = dict(finish_reason=piece.finish, source=piece.source, proposer=piece.proposer or None,
                      tokens=piece.tokens, logprobs=piece.logprobs, drafted=piece.drafted)
        data: Union[ChatChunk, TextChunk]
        if self.chat:
            delta = Delta(role=piece.role, content=piece.text, reasoning_content=piece.reasoning,
                          tool_calls=piece.calls)
            data = ChatChunk(id=self.id, created=self.created, model=self.model,
                             choices=[ChatChunkChoice(delta=delta, **shared)])
        else:
            data = TextChunk(id=self.id, created=self.created, model=self.model,
                             choices=[TextChunkChoice(text=piece.text or "", **shared)])
        return event(data.model_dump(exclude_none=self.chat))

    def usage(self, stats: Stats) -> str:
        """The chunk after the last choice, when the request asked for usage."""
        kind = ChatChunk if self.chat else TextChunk
        return event(kind(id=self.id, created=self.created, model=self.model, choices=[], usage=usage(stats),
                          timings=timings(stats)).model_dump(exclude_none=True))


@dataclass(frozen=True)
class Started:
    """A generation the worker started: its Outcome to come, the event that cancels it, and
    its events as they come (each Token and StepRecord, then None)."""

    future: asyncio.Future
    cancel: threading.Event
    events: asyncio.Queue


@dataclass(frozen=True)
class Readers:
    """What reads a stream's text besides the chunks: tool calls (`calls`, reading text with its
    special tokens written out by `special`), a reasoning model's thinking, and logprobs;
    each None where the request does not ask for it."""

    calls: ToolStream | None = None
    special: SpecialText | None = None
    reasoning: ReasoningStream | None = None
    logprobs: LogprobWriter | None = None


class EventStream:
    """The first token as soon as the prompt's decode writes it, then one chunk per run of a
    step's tokens from one source, a last chunk with the finish reason, the usage chunk when
    asked for, then [DONE]. With tools (`calls`, reading text with its special tokens written
    out by `special`), a run's text is read for calls: content until a call opens, then the
    call's id and name, then its arguments in pieces. A reasoning model's thinking (`reasoning`)
    goes out as `reasoning_content`, and only what follows it is read as content and calls.
    Asked for (`logprobs`), the tokens' logprobs go in the chunk that counts them. If the client
    goes away, Starlette stops `events()` and the generation is cancelled."""

    def __init__(self, chunks: Chunks, started: Started, log: RequestLog, *, usage: bool = False,
                 readers: Readers = Readers()) -> None:
        self.chunks, self.started, self.log, self.usage = chunks, started, log, usage
        self.calls, self.special, self.reasoning, self.logprobs = (readers.calls, readers.special, readers.reasoning,
                                                                   readers.logprobs)
        # Tokens whose text is still held back (part of a character, a call being parsed):
        # counted in the next chunk, so that the chunks' `tokens` add up to the answer's; and
        # their logprobs, which go with that count.
        self.held = 0
        self._scored: list = []
        self._drafted = 0  # draft tokens verified by steps whose chunks have not gone out yet
        self._pending: list[Token] = []  # the step's tokens, out when its record comes
        self._first = True  # the prompt decode's token: out at once, not after the first step's

    async def events(self) -> AsyncIterator[str]:
        try:
            if self.chunks.chat:
                yield self.chunks(Piece("", role="assistant"))
            while True:
                event = await self.started.events.get()
                for line in self._released(event):
                    yield line
                if event is None:
                    break
            await asyncio.wait({self.started.future})
            for line in self._end():
                yield line
        finally:
            if not self.started.future.done():
                self.started.cancel.set()
                self.log.line(CLIENT_LEFT, None, "client went away")

    def _released(self, event: object) -> list[str]:
        """The chunks an event releases: a step's tokens when its StepRecord (or the end, None) comes."""
        if isinstance(event, Token) and self._first:
            self._first = False
            return self._run([event])
        if isinstance(event, Token):
            self._pending.append(event)
            return []
        if isinstance(event, StepRecord):
            self._drafted += event.drafted
        lines = [line for tokens in _runs(self._pending) for line in self._run(tokens)]
        self._pending = []
        return lines

    def _run(self, tokens: list[Token]) -> list[str]:
        """Chunks for a run of tokens of one source and proposer."""
        self.held += sum(token.id >= 0 for token in tokens)  # id -1: text held back to the end, no token of its own
        self._scored += [(token.id, token.logprob) for token in tokens if token.logprob is not None]
        source, proposer = tokens[0].source, tokens[0].proposer
        if self.special is None:
            text = "".join(token.text for token in tokens)
        else:
            text = "".join(self.special(token.id) for token in tokens if token.id >= 0)
        lines = self._deltas(self._read(text), source, proposer, self.held)
        if lines:
            self.held = 0
        return lines

    def _read(self, text: str, final: bool = False) -> list[Union[ReasoningDelta, ContentDelta, CallDelta]]:
        """What new text holds: thinking, then content and calls (content only, without tools).
        `final`: the answer has ended, and what was held back is read."""
        found: list[Union[ReasoningDelta, ContentDelta, CallDelta]] = []
        if self.reasoning is not None:
            thought, text = self.reasoning.feed(text, final)
            found += [ReasoningDelta(thought)] if thought else []
        if self.calls is not None:
            found += self.calls.feed(text) + (self.calls.finish() if final else [])
        elif text:
            found.append(ContentDelta(text))
        return found

    def _deltas(self, found: list[Union[ReasoningDelta, ContentDelta, CallDelta]], source: str | None,
                proposer: str, tokens: int | None) -> list[str]:
        """Chunks for what the readers found; the first carries the run's token count (and their logprobs)."""
        lines = []
        logprobs = self._logprobs() if found else None
        drafted = self._taken_drafted() if found else None
        for delta in found:
            if isinstance(delta, ReasoningDelta):
                piece = Piece(None, source, proposer, tokens, reasoning=delta.text)
            elif isinstance(delta, ContentDelta):
                piece = Piece(delta.text, source, proposer, tokens)
            else:
                call = ToolCallDelta(index=delta.index, id=delta.id, type="function" if delta.id else None,
                                     function=FunctionCallDelta(name=delta.name, arguments=delta.arguments))
                piece = Piece(None, source, proposer, tokens, calls=[call])
            lines.append(self.chunks(replace(piece, logprobs=logprobs, drafted=drafted)))
            tokens, logprobs, drafted = None, None, None
        return lines

    def _taken_drafted(self) -> int | None:
        """The steps' drafted tokens not yet counted in a chunk, taken (None: none)."""
        drafted, self._drafted = self._drafted, 0
        return drafted or None

    def _logprobs(self) -> Union[ChatLogprobs, TextLogprobs, None]:
        """The held tokens' logprobs, in the route's form, taken: they go out in one chunk."""
        if self.logprobs is None or not self._scored:
            return None
        scored, self._scored = self._scored, []
        return self.logprobs.chat(scored) if self.chunks.chat else self.logprobs.text(scored)

    def _end(self) -> list[str]:
        """After the last token: the rest of the calls, the finish reason and the usage; or an
        error event where the generation failed or was cut short. Then [DONE]."""
        error = self.started.future.exception()
        if error is not None:
            answer = api_error(GenerationFailed(error))
            self.log.line(answer.status, note=answer.body.message)
            return [event(ErrorResponse(error=answer.body).model_dump()), DONE]
        outcome = self.started.future.result()
        stats = outcome.stats
        if stats.finish_reason == "cancelled":  # the server is shutting down (a client that left reads nothing)
            self.log.line(503, stats, "cancelled: shutting down")
            body = ErrorBody(message="the server is shutting down; the answer is cut short", type="server_error")
            return [event(ErrorResponse(error=body).model_dump()), DONE]
        finish, lines = finish_reason(stats), []
        if self.calls is not None or self.reasoning is not None:
            rest = self.special.flush() if self.special is not None else ""
            lines = self._deltas(self._read(rest, final=True), None, "", self.held or None)
            self.held = self.held if not lines else 0
            # As the whole answer's (answer._message): complete calls, even with only their
            # closing frame cut by the limit, are "tool_calls"; arguments cut are "length".
            if self.calls is not None and self.calls.ids and (finish == "stop" or finish == "length"
                                                              and not self.calls.cut):
                finish = "tool_calls"
        lines.append(self.chunks(Piece(None, finish=finish, tokens=self.held or None, logprobs=self._logprobs(),
                                       drafted=self._taken_drafted())))
        if self.usage:
            lines.append(self.chunks.usage(stats))
        self.log.line(200, stats, waited=outcome.waited)  # before the end: a client may close as soon as it reads it
        return lines + [DONE]


def _runs(tokens: list[Token]) -> list[list[Token]]:
    """A step's tokens in runs of one source and proposer."""
    runs: list[list[Token]] = []
    for token in tokens:
        if runs and (runs[-1][0].source, runs[-1][0].proposer) == (token.source, token.proposer):
            runs[-1].append(token)
        else:
            runs.append([token])
    return runs
