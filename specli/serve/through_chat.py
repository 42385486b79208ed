"""What every other dialect's route shares (the Responses API, Anthropic's Messages): its body,
translated to the chat route's, is read and generated as a chat request is, and the chat
answer (a whole ChatCompletion, or the stream of chat chunks) is handed back for the dialect
to write in its own shape. So tools, schemas, drafting and provenance have one copy."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import IO, TYPE_CHECKING, AsyncIterator, Callable, Union

from fastapi import Request

from specli.serve.answer import Answerer
from specli.serve.body import parse
from specli.serve.generation import read
from specli.serve.requests import ChatRequest, CompletionRequest

if TYPE_CHECKING:
    from specli.serve.state import Backend, ServerInfo


class ThroughChat:
    """Answers a dialect's request as the chat route would answer `chat` (a chat body as JSON):
    a ChatCompletion as a dict, or (chat["stream"]) the StreamingResponse of its chunks; or as
    the completions route would (a raw prompt)."""

    def __init__(self, backend: Backend, info: ServerInfo, log: IO[str], in_reader: Callable) -> None:
        self.backend, self.info, self.log, self.in_reader = backend, info, log, in_reader

    async def __call__(self, request: Request, raw: bytes, chat: dict, *, chat_route: bool = True):
        """`chat_route` False: `chat` is a completions body, answered as /v1/completions does."""
        worker = self.backend.ready()
        chat_raw = json.dumps(chat).encode()
        model = ChatRequest if chat_route else CompletionRequest
        asked = await self.in_reader(lambda: read(parse(chat_raw, model), worker.session, self.info.defaults,
                                                        fetch_images=self.info.image_urls))
        # (a client that retries the same body keeps its place: keyed by the dialect's own body)
        asked = replace(asked, key=hashlib.sha256(raw).hexdigest())
        return await Answerer(worker, self.info.name, self.log)(asked, request)


async def chat_chunks(stream: AsyncIterator[Union[str, bytes]]) -> AsyncIterator[dict]:
    """The chat stream's chunks (its `data: {...}` lines, as serve/sse.py writes them) as dicts,
    [DONE] left out. Closed (a client that left), it closes the chat stream, which cancels the
    generation: read it inside `contextlib.aclosing`."""
    try:
        async for raw in stream:
            text = raw.decode() if isinstance(raw, bytes) else raw
            for line in text.split("\n"):
                if line.startswith("data: ") and line != "data: [DONE]":
                    yield json.loads(line[len("data: "):])
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()
