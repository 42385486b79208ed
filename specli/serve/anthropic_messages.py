"""Anthropic's Messages API (`POST /v1/messages`, as llama-server serves it for Claude Code and
the `anthropic` SDK) as a thin translation of the chat route: `system`, messages of text,
`tool_use` and `tool_result` blocks, `tools` (`input_schema`), `tool_choice` (auto, any, tool,
none), `stop_sequences` and the sampling fields become a chat body, read and generated as
`/v1/chat/completions` does (tools, drafting, provenance); the answer comes back as a
`message` (text and `tool_use` blocks, `stop_reason`, usage, and specli's `spans` and
`timings`), or as Anthropic's stream events. Errors take Anthropic's shape on this route
(serve/app.py), and `x-api-key` is taken as `--api-key` is.
"""

from __future__ import annotations

import json
import secrets
from contextlib import aclosing
from typing import Any, AsyncIterator, Optional, Union

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from specli.serve.body import parse
from specli.serve.requests import RequestError
from specli.serve.through_chat import ThroughChat, chat_chunks

ROUTE = "/v1/messages"
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # Anthropic's: chat's
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}  # chat's: Anthropic's
# Fields of Anthropic's API that change nothing here.
IGNORED = frozenset({"model", "metadata", "service_tier", "container", "mcp_servers", "context_management"})
PASSED = ("draft", "draft_tokens", "exact", "seed")  # specli's own, as on the chat route
# Anthropic's error types by HTTP status.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error"}


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    max_tokens: int = Field(ge=1)  # required, as Anthropic requires it
    messages: list[dict] = Field(min_length=1)
    system: Union[str, list[dict], None] = None
    tools: Optional[list[dict]] = None
    tool_choice: Optional[dict] = None
    stop_sequences: Optional[list[str]] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    stream: bool = False
    thinking: Optional[dict] = None


def error_body(status: int, message: str) -> dict:
    """An error in Anthropic's shape."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def chat_body(body: MessagesRequest) -> dict:
    """The chat route's body for `body`."""
    extra = dict(body.model_extra or {})
    for name in extra:
        if name not in IGNORED and name not in PASSED:
            raise RequestError(f"{name}: not supported on {ROUTE}", name)
    if body.thinking and body.thinking.get("type") not in (None, "disabled"):
        raise RequestError("thinking: extended thinking is not supported here (a template that thinks does so "
                           "by itself)", "thinking")
    messages = [{"role": "system", "content": _text(body.system, "system")}] if body.system else []
    for index, message in enumerate(body.messages):
        messages += _messages(message, index)
    chat: dict[str, Any] = {"messages": messages, "max_tokens": body.max_tokens, "stream": body.stream}
    if body.stream:
        chat["stream_options"] = {"include_usage": True}
    if body.tools:
        chat["tools"] = [_tool(tool, index) for index, tool in enumerate(body.tools)]
    if body.tool_choice:
        chat.update(_tool_choice(body.tool_choice))
    if body.stop_sequences:
        chat["stop"] = body.stop_sequences
    for name in ("temperature", "top_p", "top_k"):
        if getattr(body, name) is not None:
            chat[name] = getattr(body, name)
    chat.update({name: extra[name] for name in PASSED if name in extra})
    return chat


def _messages(message: dict, index: int) -> list[dict]:
    """One Anthropic message as chat messages: a user turn's tool_result blocks become tool
    messages (before its text), an assistant turn's tool_use blocks its tool_calls."""
    role, content, where = message.get("role"), message.get("content"), f"messages.{index}"
    if role not in ("user", "assistant"):
        raise RequestError(f"{where}.role: {role!r} is not user or assistant", f"{where}.role")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise RequestError(f"{where}.content: a string or a list of blocks", f"{where}.content")
    texts, calls, results, parts = [], [], [], []  # parts: the user's text and images, in order
    for number, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        place = f"{where}.content.{number}"
        if kind == "text":
            texts.append(str(block.get("text", "")))
            parts.append({"type": "text", "text": texts[-1]})
        elif kind == "image" and role == "user":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"), place)}})
        elif kind == "tool_use" and role == "assistant":
            calls.append({"id": block.get("id", ""), "type": "function",
                          "function": {"name": block.get("name", ""), "arguments": json.dumps(block.get("input", {}))}})
        elif kind == "tool_result" and role == "user":
            result = block.get("content", "")
            text = result if isinstance(result, str) else _text(result, f"{place}.content")
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id", ""),
                            "content": ("Error: " + text) if block.get("is_error") else text})
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise RequestError(f"{place}.type: {kind!r} is not supported here (text, image, tool_use, "
                               "tool_result; no documents)", f"{place}.type")
    said: list[dict] = []
    if role == "assistant":
        said.append({"role": "assistant", "content": "".join(texts) or None, **({"tool_calls": calls} if calls else {})})
    else:
        said += results
        if len(parts) > len(texts):  # images among the text
            said.append({"role": "user", "content": parts})
        elif texts or not results:
            said.append({"role": "user", "content": "".join(texts)})
    return said


def _image_url(source: Any, place: str) -> str:
    """An image block's source as an image_url: base64 data as a data: URL, a url as given
    (the chat route says what it takes)."""
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
        return f"data:{source.get('media_type', 'image')};base64,{source['data']}"
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    raise RequestError(f"{place}.source: an image's source is base64 data or a url", f"{place}.source")


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(block, dict) and block.get("type") == "text" for block in content):
        return "".join(str(block.get("text", "")) for block in content)
    raise RequestError(f"{where}: text, or a list of text blocks", where)


def _tool(tool: dict, index: int) -> dict:
    if "input_schema" not in tool or tool.get("type") not in (None, "custom"):
        raise RequestError(f"tools.{index}: a tool with a name and an input_schema (no server tools here)",
                           f"tools.{index}")
    function = {"name": tool.get("name", ""), "parameters": tool["input_schema"]}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: dict) -> dict:
    kind = choice.get("type")
    chosen: dict[str, Any] = {}
    if choice.get("disable_parallel_tool_use"):
        chosen["parallel_tool_calls"] = False
    if kind in TOOL_CHOICES:
        return {**chosen, "tool_choice": TOOL_CHOICES[kind]}
    if kind == "tool" and choice.get("name"):
        return {**chosen, "tool_choice": {"type": "function", "function": {"name": choice["name"]}}}
    raise RequestError(f"tool_choice: {choice!r} is not auto, any, tool (with a name) or none", "tool_choice")


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _input(arguments: str) -> Optional[dict]:
    """A call's arguments as tool_use's input (None: cut by the token limit, not whole JSON)."""
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _usage(usage: Optional[dict]) -> dict:
    if not usage:
        return {"input_tokens": 0, "output_tokens": 0}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def from_chat(completion: dict, model: str) -> dict:
    """A whole chat completion as an Anthropic message (a call whose arguments the token limit
    cut is left out: tool_use's input is an object; stop_reason says max_tokens)."""
    choice = completion["choices"][0]
    message = choice["message"]
    content: list[dict] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        arguments = _input(call["function"]["arguments"])
        if arguments is not None:
            content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": arguments})
    return {"id": _id("msg"), "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": STOP_REASONS.get(choice["finish_reason"], "end_turn"), "stop_sequence": None,
            "usage": _usage(completion.get("usage")), "spans": choice.get("spans"), "timings": completion.get("timings")}


class MessageEvents:
    """The chat stream's chunks as Anthropic's stream events: message_start, then each content
    block (text deltas with their provenance, `source` and `proposer`; a tool_use's input as
    input_json_delta), message_delta with the stop reason and usage, message_stop."""

    def __init__(self, model: str) -> None:
        self.model, self.id = model, _id("msg")
        self._index = -1  # the open block's index (-1: none yet)
        self._open: Optional[str] = None  # "text", or the chat call index of the open tool_use
        self._calls: dict[int, int] = {}
        self.finish: Optional[str] = None
        self.usage: Optional[dict] = None

    @staticmethod
    def _event(kind: str, **data: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"

    async def translate(self, chunks: AsyncIterator[Union[str, bytes]]) -> AsyncIterator[str]:
        message = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}
        yield self._event("message_start", message=message)
        async with aclosing(chat_chunks(chunks)) as chat:
            async for data in chat:
                for event in self._chunk(data):
                    yield event
        for event in self._end():
            yield event

    def _chunk(self, data: dict) -> list[str]:
        if "error" in data:
            self.finish = "error"
            return [self._event("error", error={"type": "api_error", "message": data["error"].get("message", "")})]
        if data.get("usage"):
            self.usage = data["usage"]
        events: list[str] = []
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self._open != "text":
                    events += self._stop() + self._start({"type": "text", "text": ""})
                    self._open = "text"
                events.append(self._event("content_block_delta", index=self._index,
                                          delta={"type": "text_delta", "text": delta["content"]},
                                          source=choice.get("source"), proposer=choice.get("proposer")))
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                if call.get("index", 0) not in self._calls:
                    events += self._stop() + self._start({"type": "tool_use", "id": call.get("id") or _id("toolu"),
                                                          "name": function.get("name") or "", "input": {}})
                    self._calls[call.get("index", 0)] = self._index
                    self._open = f"call {call.get('index', 0)}"
                if function.get("arguments"):
                    events.append(self._event("content_block_delta", index=self._calls[call.get("index", 0)],
                                              delta={"type": "input_json_delta", "partial_json": function["arguments"]}))
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return events

    def _start(self, block: dict) -> list[str]:
        self._index += 1
        return [self._event("content_block_start", index=self._index, content_block=block)]

    def _stop(self) -> list[str]:
        if self._open is None:
            return []
        self._open = None
        return [self._event("content_block_stop", index=self._index)]

    def _end(self) -> list[str]:
        if self.finish == "error":
            return []
        usage = _usage(self.usage)
        return self._stop() + [
            self._event("message_delta", delta={"stop_reason": STOP_REASONS.get(self.finish or "stop", "end_turn"),
                                                "stop_sequence": None},
                        usage={"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"]}),
            self._event("message_stop")]


def add_messages_route(app: FastAPI, answer: ThroughChat, authorised) -> None:
    """`POST /v1/messages`, behind the API key (`x-api-key` too) as the chat route is."""

    @app.post(ROUTE, dependencies=[authorised])
    async def messages(request: Request):
        answer.backend.ready()
        raw = await request.body()
        body = parse(raw, MessagesRequest)
        answered = await answer(request, raw, chat_body(body))
        if not body.stream:
            return from_chat(answered, answer.info.name)
        events = MessageEvents(answer.info.name)
        return StreamingResponse(events.translate(answered.body_iterator), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
