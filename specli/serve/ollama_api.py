"""Ollama's routes, for tools that speak only its API: `/api/chat` and `/api/generate` (streamed
as NDJSON by default, as Ollama streams), `/api/tags`, `/api/show` and `/api/version`. A chat or
generate request is a thin translation of the chat route's (a raw `generate`, or a model with
no chat template: the completions route's): `options` (temperature, top_k, top_p, min_p, seed,
num_predict, stop, penalties), `format` ("json" or a JSON schema) and `tools` become its
fields, and the answer comes back in Ollama's shape, with its counts and durations and
specli's provenance (`source`/`proposer` on a streamed chunk, `spans` whole).
"""

from __future__ import annotations

import json
import time
from contextlib import aclosing
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional, Union

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict

from specli import __version__
from specli.llama.gguf_header import read_metadata
from specli.serve.body import parse
from specli.serve.requests import RequestError
from specli.serve.through_chat import ThroughChat, chat_chunks

if TYPE_CHECKING:
    from specli.serve.worker import Worker

API_VERSION = "0.12.0"  # the Ollama API these routes follow (what /api/version says)
# Options that shape the text, as the chat route's fields.
OPTIONS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed",
           "repeat_penalty": "repeat_penalty", "frequency_penalty": "frequency_penalty",
           "presence_penalty": "presence_penalty", "stop": "stop", "num_predict": "max_tokens"}
# Options that would change the text in a way specli cannot follow: refused by name.
REFUSED = ("mirostat", "mirostat_eta", "mirostat_tau", "typical_p", "tfs_z", "penalize_newline")
# Options about resources (context, threads, GPUs, memory): fixed when the server started.


class OllamaChat(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = ""
    messages: list[dict] = []
    tools: Optional[list[dict]] = None
    format: Union[str, dict, None] = None
    options: Optional[dict] = None
    stream: bool = True
    think: Union[bool, str, None] = None


class OllamaGenerate(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = ""
    prompt: str = ""
    system: Optional[str] = None
    raw: bool = False
    format: Union[str, dict, None] = None
    options: Optional[dict] = None
    stream: bool = True
    images: Optional[list] = None
    suffix: Optional[str] = None


def _common(body: Union[OllamaChat, OllamaGenerate]) -> dict[str, Any]:
    """The fields both routes share: options and format, as the chat route's."""
    fields: dict[str, Any] = {}
    for name, value in (body.options or {}).items():
        if name in REFUSED:
            raise RequestError(f"options.{name}: not supported by specli's sampling", f"options.{name}")
        if name in OPTIONS and value is not None and not (name == "num_predict" and value < 0):
            fields[OPTIONS[name]] = value
    if body.format == "json":
        fields["response_format"] = {"type": "json_object"}
    elif isinstance(body.format, dict):
        fields["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": body.format}}
    elif body.format not in (None, ""):
        raise RequestError("format: \"json\" or a JSON schema", "format")
    fields["stream"] = body.stream
    if body.stream:
        fields["stream_options"] = {"include_usage": True}
    return fields


def chat_body(body: OllamaChat) -> dict:
    if body.think:
        raise RequestError("think: not supported here (a template that thinks does so by itself)", "think")
    messages: list[dict] = []
    pending: list[tuple[str, str]] = []  # (id, name) of the calls no tool message has answered yet
    for index, message in enumerate(body.messages):
        role = message.get("role")
        if role == "tool":  # Ollama's name the tool, not the call: each answers the next call of that name
            name = message.get("tool_name", "")
            match = next((call for call in pending if call[1] == name), pending[0] if pending else None)
            if match is not None:
                pending.remove(match)
            messages.append({"role": "tool", "tool_call_id": message.get("tool_call_id") or (match[0] if match else name),
                             "content": message.get("content", "")})
        elif role == "assistant" and message.get("tool_calls"):
            calls = [{"id": f"call_{index}_{number}", "type": "function",
                      "function": {"name": call["function"]["name"],
                                   "arguments": json.dumps(call["function"].get("arguments", {}))}}
                     for number, call in enumerate(message["tool_calls"])]
            pending = [(call["id"], call["function"]["name"]) for call in calls]
            messages.append({"role": "assistant", "content": message.get("content") or None, "tool_calls": calls})
        else:
            messages.append({"role": role, "content": _with_images(message.get("content", ""), message.get("images"),
                                                                    f"messages.{index}.images")})
    chat: dict[str, Any] = {"messages": messages, **_common(body)}
    if body.tools:
        chat["tools"] = body.tools
    return chat


def generate_body(body: OllamaGenerate, templated: bool) -> tuple[dict, bool]:
    """The chat route's body (or, raw or without a chat template, the completions route's) and
    whether it is a chat."""
    if body.images and (body.raw or not templated):
        raise RequestError("images: a raw prompt takes no images (they go through the chat template)", "images")
    if body.suffix:
        raise RequestError("suffix: fill-in-the-middle is not supported", "suffix")
    if body.raw or not templated:
        prompt = (body.system + "\n\n" if body.system and not body.raw else "") + body.prompt
        return {"prompt": prompt, **_common(body)}, False
    system = [{"role": "system", "content": body.system}] if body.system else []
    content = _with_images(body.prompt, body.images, "images")
    return {"messages": system + [{"role": "user", "content": content}], **_common(body)}, True


def _with_images(text: str, images: Any, where: str) -> str | list[dict]:
    """Ollama's `images` (base64 strings) as chat's image_url parts, before the text."""
    if not images:
        return text
    if not isinstance(images, list) or not all(isinstance(image, str) for image in images):
        raise RequestError(f"{where}: a list of base64 strings", where)
    parts = [{"type": "image_url", "image_url": {"url": "data:image;base64," + image}} for image in images]
    return parts + [{"type": "text", "text": text}]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _counts(usage: Optional[dict], timings: Optional[dict], started: float, finish: Optional[str]) -> dict:
    """The last chunk's counts and durations (nanoseconds), as Ollama gives them."""
    usage, timings = usage or {}, timings or {}
    return {"done": True, "done_reason": "length" if finish == "length" else "stop",
            "total_duration": int((time.perf_counter() - started) * 1e9), "load_duration": 0,
            "prompt_eval_count": usage.get("prompt_tokens", 0),
            "prompt_eval_duration": int(timings.get("prompt_ms", 0) * 1e6),
            "eval_count": usage.get("completion_tokens", 0), "eval_duration": int(timings.get("predicted_ms", 0) * 1e6),
            "draft_n": timings.get("draft_n", 0), "draft_n_accepted": timings.get("draft_n_accepted", 0)}


def _calls(calls: list[dict]) -> list[dict]:
    """Chat tool calls as Ollama's: arguments an object (a call cut by the limit: left out)."""
    out = []
    for call in calls:
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
        except json.JSONDecodeError:
            continue
        out.append({"function": {"name": call["function"]["name"], "arguments": arguments}})
    return out


def whole(completion: dict, model: str, chat: bool, as_chat: bool, started: float) -> dict:
    """A whole chat (or completion) answer in /api/chat's (as_chat) or /api/generate's shape."""
    choice = completion["choices"][0]
    text = (choice["message"].get("content") or "") if chat else choice["text"]
    answer: dict[str, Any] = {"model": model, "created_at": _now()}
    if as_chat:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        calls = _calls(choice["message"].get("tool_calls") or []) if chat else []
        if calls:
            message["tool_calls"] = calls
        answer["message"] = message
    else:
        answer["response"] = text
    answer.update(_counts(completion.get("usage"), completion.get("timings"), started, choice["finish_reason"]))
    answer["spans"] = choice.get("spans")
    return answer


async def ndjson(chunks: AsyncIterator[Union[str, bytes]], model: str, chat: bool, as_chat: bool,
                 started: float) -> AsyncIterator[str]:
    """The chat (or completion) stream's chunks as Ollama's NDJSON lines: one per text run
    (with its provenance), a call whole once its arguments are, then the counts."""
    calls: dict[int, dict] = {}
    usage = timings = finish = None
    async with aclosing(chat_chunks(chunks)) as chat_stream:
        async for data in chat_stream:
            if "error" in data:
                yield json.dumps({"error": data["error"].get("message", "")}) + "\n"
                return
            if data.get("usage"):
                usage, timings = data["usage"], data.get("timings")
            for choice in data.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = delta.get("content") if chat else choice.get("text")
                for call in delta.get("tool_calls") or []:
                    kept = calls.setdefault(call.get("index", 0), {"function": {"name": "", "arguments": ""}})
                    function = call.get("function") or {}
                    kept["function"]["name"] += function.get("name") or ""
                    kept["function"]["arguments"] += function.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
                if piece:
                    out: dict[str, Any] = {"model": model, "created_at": _now(), "done": False,
                                           "source": choice.get("source"), "proposer": choice.get("proposer")}
                    if as_chat:
                        out["message"] = {"role": "assistant", "content": piece}
                    else:
                        out["response"] = piece
                    yield json.dumps(out, ensure_ascii=False) + "\n"
    last: dict[str, Any] = {"model": model, "created_at": _now()}
    if as_chat:
        last["message"] = {"role": "assistant", "content": ""}
        if calls:
            last["message"]["tool_calls"] = _calls([calls[index] for index in sorted(calls)])
    else:
        last["response"] = ""
    last.update(_counts(usage, timings, started, finish))
    yield json.dumps(last) + "\n"


def _card(worker: Worker, name: str) -> dict:
    target = worker.session.target
    path = target.path
    stat = path.stat() if path.is_file() else None
    arch = str(read_metadata(path).get("general.architecture", "")) if stat else ""
    modified = datetime.fromtimestamp(stat.st_mtime, timezone.utc).isoformat() if stat else _now()
    return {"name": name, "model": name, "modified_at": modified, "size": stat.st_size if stat else 0,
            "digest": "", "details": {"format": "gguf", "family": arch, "families": [arch] if arch else None,
                                      "parameter_size": "", "quantization_level": ""}}


def add_ollama_routes(app: FastAPI, answer: ThroughChat, authorised) -> None:
    """Ollama's routes, behind the API key as the others are."""
    info = answer.info

    async def answered(request: Request, raw: bytes, body: dict, chat: bool, as_chat: bool, stream: bool):
        started = time.perf_counter()
        result = await answer(request, raw, body, chat_route=chat)
        if not stream:
            return whole(result, info.name, chat, as_chat, started)
        return StreamingResponse(ndjson(result.body_iterator, info.name, chat, as_chat, started),
                                 media_type="application/x-ndjson")

    @app.post("/api/chat", dependencies=[authorised])
    async def ollama_chat(request: Request):
        answer.backend.ready()
        raw = await request.body()
        body = parse(raw, OllamaChat)
        return await answered(request, raw, chat_body(body), True, True, body.stream)

    @app.post("/api/generate", dependencies=[authorised])
    async def ollama_generate(request: Request):
        worker = answer.backend.ready()
        raw = await request.body()
        body = parse(raw, OllamaGenerate)
        fields, chat = generate_body(body, worker.session.target.chat_template() is not None)
        return await answered(request, raw, fields, chat, False, body.stream)

    @app.get("/api/tags", dependencies=[authorised])
    async def ollama_tags():
        return {"models": [_card(answer.backend.ready(), info.name)]}

    @app.post("/api/show", dependencies=[authorised])
    async def ollama_show(request: Request):
        worker = answer.backend.ready()
        target = worker.session.target
        card = _card(worker, info.name)
        template = target.chat_template()
        family = card["details"]["family"]
        capabilities = ["completion"] + (["tools"] if template and "tools" in template else []) \
            + (["vision"] if worker.session.projector is not None else [])
        return {"modelfile": "", "parameters": "", "template": template or "", "details": card["details"],
                "model_info": {"general.architecture": family, f"{family}.context_length": target.n_ctx},
                "capabilities": capabilities, "modified_at": card["modified_at"]}

    @app.get("/api/version")
    async def ollama_version():
        return {"version": API_VERSION, "specli": __version__}
