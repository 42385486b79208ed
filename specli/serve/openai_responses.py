"""OpenAI's Responses API (`POST /v1/responses`) as a thin translation of the chat route: a
request becomes a chat body (its `input` items as messages, `instructions` the system message,
function tools, `tool_choice`, `text.format` as `response_format`, `max_output_tokens`), is
read and generated exactly as `/v1/chat/completions` reads and generates it (tools, schemas,
drafting, provenance), and its answer is written back in the Responses shape: a whole
`response` object, or the typed stream events (`response.created`, `response.output_item.added`,
`response.output_text.delta`, `response.function_call_arguments.delta`, ...,
`response.completed`) translated from the chat stream's chunks.

`previous_response_id` continues a conversation kept in memory (the last RESPONSES_KEPT
responses; a server restarted or one asked about an older one answers 400). Images and
built-in tools (web search, files, computer use) are refused by name.
"""

from __future__ import annotations

import json
import secrets
from contextlib import aclosing
import threading
import time
from collections import OrderedDict
from typing import Any, AsyncIterator, Optional, Union

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from specli.serve.body import parse
from specli.serve.requests import RequestError
from specli.serve.through_chat import ThroughChat, chat_chunks

RESPONSES_KEPT = 256  # responses whose conversation previous_response_id may continue
# Fields the Responses API has that change nothing here (bookkeeping, hints, what to include).
IGNORED = frozenset({"model", "store", "metadata", "include", "truncation", "reasoning", "user", "service_tier",
                     "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "stream_options",
                     "top_logprobs", "max_tool_calls", "background"})
# specli's own fields, as on the chat route.
PASSED = ("draft", "draft_tokens", "exact", "seed", "prediction")


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    input: Union[str, list[dict]] = Field(default_factory=list)
    instructions: Optional[str] = None
    tools: Optional[list[dict]] = None
    tool_choice: Union[str, dict, None] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[dict] = None
    max_output_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    stream: bool = False
    previous_response_id: Optional[str] = None
    background: Optional[bool] = None


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class Conversations:
    """The conversations of the latest responses, by response id, for previous_response_id."""

    def __init__(self, kept: int = RESPONSES_KEPT) -> None:
        self._kept, self._by_id = kept, OrderedDict()
        self._lock = threading.Lock()

    def get(self, response_id: str) -> list[dict]:
        with self._lock:
            messages = self._by_id.get(response_id)
        if messages is None:
            raise RequestError(f"previous_response_id: no response {response_id!r} is kept (this server keeps its "
                               f"latest {self._kept} in memory; send the conversation as input instead)",
                               "previous_response_id")
        return list(messages)

    def put(self, response_id: str, messages: list[dict]) -> None:
        with self._lock:
            self._by_id[response_id] = messages
            while len(self._by_id) > self._kept:
                self._by_id.popitem(last=False)


# --- the request, as a chat body -----------------------------------------------------------


def chat_body(body: ResponsesRequest, conversations: Conversations) -> tuple[dict, list[dict]]:
    """The chat route's body for `body`, and the conversation it holds (without the system
    message `instructions` make: a response continued later gets that request's own)."""
    if body.background:
        raise RequestError("background: responses run in the foreground here", "background")
    extra = dict(body.model_extra or {})
    for name in extra:
        if name not in IGNORED and name not in PASSED:
            raise RequestError(f"{name}: not supported on /v1/responses", name)
    history = conversations.get(body.previous_response_id) if body.previous_response_id else []
    given = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else _messages(body.input)
    conversation = history + given
    if not conversation:
        raise RequestError("input: no message to answer", "input")
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    chat: dict[str, Any] = {"messages": system + conversation, "stream": body.stream}
    if body.stream:
        chat["stream_options"] = {"include_usage": True}
    if body.tools:
        chat["tools"] = [_tool(tool, index) for index, tool in enumerate(body.tools)]
    if body.tool_choice is not None:
        chat["tool_choice"] = _tool_choice(body.tool_choice)
    for name in ("parallel_tool_calls", "temperature", "top_p"):
        if getattr(body, name) is not None:
            chat[name] = getattr(body, name)
    if body.max_output_tokens is not None:
        chat["max_tokens"] = body.max_output_tokens
    if body.text and body.text.get("format"):
        chat.update(_format(body.text["format"]))
    chat.update({name: extra[name] for name in PASSED if name in extra})
    return chat, conversation


def _messages(items: list[dict]) -> list[dict]:
    """Input items as chat messages: messages (developer as system), function calls (as the
    assistant's tool_calls) and their outputs (tool messages); reasoning items are left out."""
    messages: list[dict] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise RequestError(f"input.{index}: an item is an object", f"input.{index}")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise RequestError(f"input.{index}.role: {role!r} is not user, assistant, system or developer",
                                   f"input.{index}.role")
            messages.append({"role": "system" if role == "developer" else role,
                             "content": _text(item.get("content"), f"input.{index}.content")})
        elif kind == "function_call":
            call = {"id": item.get("call_id") or _id("call"), "type": "function",
                    "function": {"name": item.get("name", ""), "arguments": item.get("arguments", "")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id", ""),
                             "content": output if isinstance(output, str) else _text(output, f"input.{index}.output")})
        elif kind != "reasoning":
            raise RequestError(f"input.{index}.type: {kind!r} is not supported (message, function_call, "
                               "function_call_output and reasoning are)", f"input.{index}.type")
    return messages


def _text(content: Any, where: str) -> str | list[dict]:
    """A message's content as chat takes it: a string, or its text parts joined; with an
    `input_image` part, chat's parts (the image an `image_url` part); a file is refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where}: a string or a list of content parts", where)
    parts: list[dict] = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "refusal":
            parts.append({"type": "text", "text": str(part.get("refusal", ""))})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise RequestError(f"{where}.{index}.type: {kind!r} is not supported: specli takes text and images "
                               "(an input_image's image_url; no files)", f"{where}.{index}.type")
    if any(part["type"] == "image_url" for part in parts):
        return parts
    return "".join(part["text"] for part in parts)


def _tool(tool: dict, index: int) -> dict:
    if tool.get("type") != "function":
        raise RequestError(f"tools.{index}.type: {tool.get('type')!r} is not supported: function tools only "
                           "(no built-in web search, file search or computer use)", f"tools.{index}.type")
    function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if key in tool}
    return {"type": "function", "function": function}


def _tool_choice(choice: Union[str, dict]) -> Union[str, dict]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    raise RequestError(f"tool_choice: {choice!r} is not supported (auto, none, required, or a function)",
                       "tool_choice")


def _format(format: dict) -> dict:
    kind = format.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if kind == "json_schema":
        schema = {key: format[key] for key in ("name", "schema", "strict", "description") if key in format}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    raise RequestError(f"text.format.type: {kind!r} is not text, json_object or json_schema", "text.format.type")


# --- the answer, in the Responses shape ----------------------------------------------------


def response_object(body: ResponsesRequest, response_id: str, model: str, created: int, output: list[dict],
                    status: str, usage: Optional[dict], timings: Optional[dict] = None) -> dict:
    return {
        "id": response_id, "object": "response", "created_at": created, "status": status, "model": model,
        "output": output, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "parallel_tool_calls": body.parallel_tool_calls is not False, "previous_response_id": body.previous_response_id,
        "temperature": body.temperature, "top_p": body.top_p, "tool_choice": body.tool_choice or "auto",
        "tools": body.tools or [], "text": body.text or {"format": {"type": "text"}}, "truncation": "disabled",
        "metadata": (body.model_extra or {}).get("metadata") or {}, "usage": usage, "timings": timings,
    }


def response_usage(usage: Optional[dict]) -> Optional[dict]:
    """The chat usage in the Responses names."""
    if not usage:
        return None
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    details = usage.get("completion_tokens_details") or {}
    return {"input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
            "accepted_prediction_tokens": details.get("accepted_prediction_tokens", 0),
            "rejected_prediction_tokens": details.get("rejected_prediction_tokens", 0)}


def message_item(text: str, status: str, spans: Optional[list] = None, item_id: Optional[str] = None) -> dict:
    item = {"type": "message", "id": item_id or _id("msg"), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}
    if spans is not None:
        item["spans"] = spans  # specli's provenance, as on a chat choice
    return item


def call_item(call_id: str, name: str, arguments: str, item_id: Optional[str] = None) -> dict:
    return {"type": "function_call", "id": item_id or _id("fc"), "call_id": call_id, "name": name,
            "arguments": arguments, "status": "completed"}


def reasoning_item(text: str, item_id: Optional[str] = None) -> dict:
    return {"type": "reasoning", "id": item_id or _id("rs"), "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def from_chat(body: ResponsesRequest, completion: dict, model: str) -> tuple[dict, dict]:
    """A whole chat completion as a response, and the assistant's message for the conversation."""
    choice = completion["choices"][0]
    message, finish = choice["message"], choice["finish_reason"]
    status = "incomplete" if finish == "length" else "completed"
    output = []
    if message.get("reasoning_content"):
        output.append(reasoning_item(message["reasoning_content"]))
    if message.get("content"):
        output.append(message_item(message["content"], status, choice.get("spans")))
    for call in message.get("tool_calls") or []:
        output.append(call_item(call["id"], call["function"]["name"], call["function"]["arguments"]))
    response = response_object(body, _id("resp"), model, completion.get("created", int(time.time())), output, status,
                               response_usage(completion.get("usage")), completion.get("timings"))
    said = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        said["tool_calls"] = message["tool_calls"]
    return response, said


class EventTranslator:
    """The chat stream's chunks (`data: {...}` lines, as serve/sse.py writes them) as the
    Responses stream's typed events: each output item opened, its deltas (text with its
    provenance: `source`, `proposer`, `tokens` as on a chat chunk; a call's arguments), closed,
    then `response.completed` (or `.incomplete` at the token limit) with the whole response."""

    def __init__(self, body: ResponsesRequest, model: str) -> None:
        self.body, self.model = body, model
        self.id, self.created = _id("resp"), int(time.time())
        self.sequence = 0
        self.output: list[dict] = []
        self._text: Optional[dict] = None  # the message item being written
        self._reasoning: Optional[dict] = None
        self._calls: dict[int, dict] = {}  # by the chat stream's call index: the function_call item
        self._open_call: Optional[int] = None
        self.finish: Optional[str] = None
        self.usage: Optional[dict] = None
        self.timings: Optional[dict] = None
        self.spans: list[dict] = []
        self.failed = False

    def _event(self, kind: str, **data: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def _response(self, status: str) -> dict:
        return response_object(self.body, self.id, self.model, self.created, self.output, status,
                               response_usage(self.usage), self.timings)

    def start(self) -> list[str]:
        return [self._event("response.created", response=self._response("in_progress")),
                self._event("response.in_progress", response=self._response("in_progress"))]

    async def translate(self, chunks: AsyncIterator[Union[str, bytes]]) -> AsyncIterator[str]:
        for line in self.start():
            yield line
        async with aclosing(chat_chunks(chunks)) as chat:
            async for data in chat:
                for event in self._chunk(data):
                    yield event
        for event in self._end():
            yield event

    def _chunk(self, data: dict) -> list[str]:
        if "error" in data:
            self.failed = True
            error = data["error"]
            return self._close_all("incomplete") + [self._event("error", code=error.get("code"),
                                                                 message=error.get("message"), param=error.get("param"))]
        if data.get("usage"):
            self.usage, self.timings = data["usage"], data.get("timings")
        events: list[str] = []
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                events += self._reasoning_delta(delta["reasoning_content"])
            if delta.get("content"):
                events += self._text_delta(delta["content"], choice)
            for call in delta.get("tool_calls") or []:
                events += self._call_delta(call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return events

    def _reasoning_delta(self, text: str) -> list[str]:
        events = []
        if self._reasoning is None:
            self._reasoning = reasoning_item("")
            self.output.append(self._reasoning)
            events.append(self._event("response.output_item.added", output_index=len(self.output) - 1,
                                      item={**self._reasoning, "content": []}))
        self._reasoning["content"][0]["text"] += text
        return events + [self._event("response.reasoning_text.delta", item_id=self._reasoning["id"],
                                     output_index=self.output.index(self._reasoning), content_index=0, delta=text)]

    def _text_delta(self, text: str, choice: dict) -> list[str]:
        events = self._close_reasoning()
        if self._text is None:
            self._text = message_item("", "in_progress")
            self.output.append(self._text)
            index = len(self.output) - 1
            events += [self._event("response.output_item.added", output_index=index, item={**self._text, "content": []}),
                       self._event("response.content_part.added", item_id=self._text["id"], output_index=index,
                                   content_index=0, part={"type": "output_text", "text": "", "annotations": []})]
        self._text["content"][0]["text"] += text
        source, proposer = choice.get("source"), choice.get("proposer")
        if source:
            self.spans.append({"text": text, "source": source, "proposer": proposer})
        return events + [self._event("response.output_text.delta", item_id=self._text["id"],
                                     output_index=self.output.index(self._text), content_index=0, delta=text,
                                     logprobs=[], source=source, proposer=proposer, tokens=choice.get("tokens"))]

    def _call_delta(self, call: dict) -> list[str]:
        events = self._close_reasoning() + self._close_text("completed")
        index = call.get("index", 0)
        function = call.get("function") or {}
        if index not in self._calls:
            events += self._close_call()
            item = call_item(call.get("id") or _id("call"), function.get("name") or "", "")
            item["status"] = "in_progress"
            self._calls[index] = item
            self._open_call = index
            self.output.append(item)
            events.append(self._event("response.output_item.added", output_index=len(self.output) - 1, item=dict(item)))
        item = self._calls[index]
        if function.get("arguments"):
            item["arguments"] += function["arguments"]
            events.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=self.output.index(item), delta=function["arguments"]))
        return events

    def _close_reasoning(self) -> list[str]:
        if self._reasoning is None:
            return []
        item, self._reasoning = self._reasoning, None
        index = self.output.index(item)
        return [self._event("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0,
                            text=item["content"][0]["text"]),
                self._event("response.output_item.done", output_index=index, item=item)]

    def _close_text(self, status: str) -> list[str]:
        if self._text is None:
            return []
        item, self._text = self._text, None
        item["status"] = status
        item["spans"] = self.spans
        index, part = self.output.index(item), item["content"][0]
        return [self._event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                            text=part["text"], logprobs=[]),
                self._event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                            part=part),
                self._event("response.output_item.done", output_index=index, item=item)]

    def _close_call(self) -> list[str]:
        if self._open_call is None:
            return []
        item = self._calls[self._open_call]
        self._open_call = None
        item["status"] = "completed"
        index = self.output.index(item)
        return [self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            name=item["name"], arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=index, item=item)]

    def _close_all(self, status: str) -> list[str]:
        return self._close_reasoning() + self._close_text(status) + self._close_call()

    def _end(self) -> list[str]:
        if self.failed:
            return []
        status = "incomplete" if self.finish == "length" else "completed"
        events = self._close_all(status)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return events + [self._event(kind, response=self._response(status))]

    def said(self) -> dict:
        """The assistant's message, for the conversation a later response may continue."""
        text = "".join(part["text"] for item in self.output if item["type"] == "message" for part in item["content"])
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        calls = [{"id": item["call_id"], "type": "function", "function": {"name": item["name"],
                                                                          "arguments": item["arguments"]}}
                 for item in self.output if item["type"] == "function_call"]
        if calls:
            message["tool_calls"] = calls
        return message


def add_responses_route(app: FastAPI, answer: ThroughChat, authorised) -> None:
    """`POST /v1/responses`, behind the API key as the chat route is."""
    conversations = Conversations()

    @app.post("/v1/responses", dependencies=[authorised])
    async def responses(request: Request):
        answer.backend.ready()
        raw = await request.body()
        body = parse(raw, ResponsesRequest)
        chat, conversation = chat_body(body, conversations)
        answered = await answer(request, raw, chat)
        model = answer.info.name
        if not body.stream:
            response, said = from_chat(body, answered, model)
            conversations.put(response["id"], conversation + [said])
            return response
        translator = EventTranslator(body, model)

        async def events():
            async for line in translator.translate(answered.body_iterator):
                yield line
            if not translator.failed:
                conversations.put(translator.id, conversation + [translator.said()])

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
