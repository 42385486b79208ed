"""`specli serve`'s bodies, byte for byte: a fixed set of requests (completions and chat, whole
and streamed, greedy and seeded, JSON schema, grammar, tools, refusals, the model list) sent
to real server processes on 127.0.0.1, each answer compared with its golden file in
tests/data/golden/serve/.

What changes from one run to the next is masked before the comparison: response and call ids,
`created`, and the timings' milliseconds and speed. Everything else (text, spans, chunking,
token counts, error messages and params) is what a client reads, and must not change.

Each server answers its requests in order, in one test: the KV cache a request finds holds the
request before it (`cached_tokens`, and the batches its prompt is decoded in). Drafting is
fixed (the server's `-k 4` or a request's `draft_tokens`, no memory of earlier answers), so the
same requests are drafted the same way on every run, whatever this machine's timings.
SPECLI_UPDATE_GOLDEN=1 writes the files from the server instead.
"""

# ruff: noqa: F811
from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path

import httpx
import pytest
from helpers import HERMES, serving

pytestmark = pytest.mark.slow  # real models, real processes

GOLDEN = Path(__file__).parent / "data" / "golden" / "serve"
KEY = "golden-key"

# (masked text, replacement): what differs between two runs of the same requests.
MASKS = [
    (re.compile(r'("id": ?")(chatcmpl|cmpl)-[0-9a-f]{24}"'), r'\1\2-<id>"'),
    (re.compile(r'("id": ?")call_[A-Za-z0-9]{24}"'), r'\1call_<id>"'),
    (re.compile(r'("created": ?)\d+'), r"\g<1>0"),
    (re.compile(r'("(?:prompt_ms|predicted_ms|predicted_per_second)": ?)[-+0-9.eE]+'), r"\g<1>0"),
]

COLOURS = "The three primary colours are red, yellow and blue. The three primary colours are"
CODE = "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n    return 2 * (width + height)\n"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
READ = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 40}}, "required": ["path"],
        "additionalProperties": False}
GREP = {"type": "object", "properties": {"pattern": {"type": "string", "maxLength": 40},
                                         "path": {"type": "string", "maxLength": 40}},
        "required": ["pattern", "path"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": READ}},
    {"type": "function", "function": {"name": "grep", "description": "Search files for a pattern.", "parameters": GREP}},
]
ASK = [{"role": "user", "content": "Read the file src/app/main.py."}]
COLOURS_CHAT = [{"role": "user", "content": "Name three colours."}]
GREEDY = {"temperature": 0, "seed": 1}
USAGE = {"stream": True, "stream_options": {"include_usage": True}}
HISTORY = ASK + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "src/app/main.py"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "def main():\n    print('hello')\n"},
]

# name: (method, path, body). A body that is a str is sent as it is (not JSON).
GEMMA_REQUESTS = {
    "text_greedy": ("POST", "/v1/completions", {"prompt": COLOURS, "max_tokens": 16, "draft_tokens": 4, **GREEDY}),
    "text_greedy_stream": ("POST", "/v1/completions",
                           {"prompt": COLOURS, "max_tokens": 16, "draft_tokens": 4, **GREEDY, **USAGE}),
    "text_seeded": ("POST", "/v1/completions", {"prompt": "Once upon a time, in a small village by the sea,",
                                                "max_tokens": 16, "draft_tokens": 3, "temperature": 0.8,
                                                "top_k": 20, "seed": 7}),
    "text_prediction_stream": ("POST", "/v1/completions", {
        "prompt": "Rewrite this Python code, renaming width to w:\n\n" + CODE + "\nThe rewritten code:\n\n",
        "prediction": {"type": "content", "content": CODE.replace("width", "w")}, "max_tokens": 24,
        "draft_tokens": 6, "stream": True, **GREEDY}),
    "text_json_schema": ("POST", "/v1/completions", {"prompt": "Ada is 36 years old. As JSON:\n", "json_schema": PERSON,
                                                     "max_tokens": 32, "draft_tokens": 4, **GREEDY}),
    "text_grammar_stream": ("POST", "/v1/completions", {
        "prompt": "Is the sky green? Answer yes or no:", "grammar": 'root ::= " yes" | " no"', "max_tokens": 8,
        **GREEDY, **USAGE}),
    "text_response_format_stream": ("POST", "/v1/completions", {
        "prompt": "Ada is 36 years old. As JSON:\n", "max_tokens": 32, "draft_tokens": 4, "stream": True, **GREEDY,
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}}),
    "text_bad_field": ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": "10"}),
    "text_refused_field": ("POST", "/v1/completions", {"prompt": "hi", "best_of": 2}),
    "text_two_constraints": ("POST", "/v1/completions",
                             {"prompt": "hi", "json_schema": {"type": "object"}, "grammar": 'root ::= "a"'}),
    "text_bad_schema": ("POST", "/v1/completions", {"prompt": "hi", "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
            "a": {"type": "strin"}}}}}}),
    "text_empty_prompt": ("POST", "/v1/completions", {"prompt": ""}),
    "text_too_long": ("POST", "/v1/completions", {"prompt": [1] * 1100, "max_tokens": 4}),
    "text_not_json": ("POST", "/v1/completions", "{"),
    "chat_without_template": ("POST", "/v1/chat/completions", {"messages": COLOURS_CHAT, "max_tokens": 4}),
    "not_found": ("GET", "/v1/nothing", None),
    "models": ("GET", "/v1/models", None),
}

SMOL_REQUESTS = {
    "chat_greedy": ("POST", "/v1/chat/completions",
                    {"messages": COLOURS_CHAT, "max_tokens": 16, "draft_tokens": 3, **GREEDY}),
    "chat_greedy_stream": ("POST", "/v1/chat/completions",
                           {"messages": COLOURS_CHAT, "max_tokens": 16, "draft_tokens": 3, **GREEDY, **USAGE}),
    "chat_json_schema": ("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Ada is 36 years old. Give her as JSON."}], "max_tokens": 32,
        "draft_tokens": 4, **GREEDY,
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}}),
    "chat_json_object_stream": ("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Ada is 36 years old. Give her as JSON."}], "max_tokens": 16,
        "response_format": {"type": "json_object"}, **GREEDY, **USAGE}),
    "chat_grammar": ("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Is the sky green? Answer yes or no."}],
        "grammar": 'root ::= "Yes." | "No."', "max_tokens": 8, **GREEDY}),
    "chat_tools_required": ("POST", "/v1/chat/completions", {
        "messages": ASK, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 60,
        "draft_tokens": 4, **GREEDY}),
    "chat_tools_required_stream": ("POST", "/v1/chat/completions", {
        "messages": ASK, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 60,
        "draft_tokens": 4, **GREEDY, **USAGE}),
    "chat_tools_named_stream": ("POST", "/v1/chat/completions", {
        "messages": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "grep"}},
        "parallel_tool_calls": False, "max_tokens": 60, "draft_tokens": 4, "stream": True, **GREEDY}),
    "chat_tools_named": ("POST", "/v1/chat/completions", {
        "messages": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "grep"}},
        "max_tokens": 60, "draft_tokens": 4, **GREEDY}),
    "chat_tools_auto_stream": ("POST", "/v1/chat/completions", {
        "messages": COLOURS_CHAT, "tools": TOOLS, "max_tokens": 12, "draft_tokens": 3, **GREEDY, **USAGE}),
    "chat_tool_history": ("POST", "/v1/chat/completions", {
        "messages": HISTORY, "tools": TOOLS, "tool_choice": "none", "max_tokens": 12, "draft_tokens": 3, **GREEDY}),
    "chat_tools_and_response_format": ("POST", "/v1/chat/completions", {
        "messages": ASK, "tools": TOOLS, "response_format": {"type": "json_object"}, "max_tokens": 60,
        "draft_tokens": 4, **GREEDY}),
    "chat_unknown_tool": ("POST", "/v1/chat/completions", {
        "messages": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "rm"}}}),
    "chat_tool_choice_without_tools": ("POST", "/v1/chat/completions", {"messages": ASK, "tool_choice": "required"}),
    "chat_bad_tool_schema": ("POST", "/v1/chat/completions", {"messages": ASK, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}}}]}),
    "chat_bad_field": ("POST", "/v1/chat/completions", {"messages": ASK, "temperature": "0.5"}),
    "chat_refused_field": ("POST", "/v1/chat/completions", {"messages": ASK, "reasoning_effort": "high"}),
    "chat_no_key": ("POST", "/v1/chat/completions", {"messages": ASK, "max_tokens": 4}),
    "models_chat": ("GET", "/v1/models", None),
}


def masked(text: str) -> str:
    for pattern, replacement in MASKS:
        text = pattern.sub(replacement, text)
    return text


def answer(base: str, method: str, path: str, body, key: str | None) -> str:
    """The response as its golden file holds it: status and media type, then the body."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    if isinstance(body, str):
        headers["content-type"] = "application/json"
        content = body.encode()
    else:
        content = None if body is None else json.dumps(body).encode()
        if content is not None:
            headers["content-type"] = "application/json"
    with httpx.stream(method, base + path, content=content, headers=headers, timeout=300) as response:
        text = response.read().decode()
    return f"{response.status_code} {response.headers.get('content-type')}\n{masked(text)}"


def check(base: str, requests: dict, key: str | None = None, keyless: tuple[str, ...] = ()) -> None:
    update = os.environ.get("SPECLI_UPDATE_GOLDEN") == "1"
    differ = []
    for name, (method, path, body) in requests.items():
        got = answer(base, method, path, body, None if name in keyless else key)
        golden = GOLDEN / f"{name}.txt"
        if update:
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(got, encoding="utf-8")
            continue
        expected = golden.read_text(encoding="utf-8")
        if got != expected:
            differ.append("".join(difflib.unified_diff(expected.splitlines(True), got.splitlines(True),
                                                       f"golden/{name}.txt", "served")))
    assert not differ, "\n".join(differ)


def test_the_base_models_answers_are_the_golden_ones(gemma_path):
    with serving("--target", gemma_path, "--no-memory", "-k", 4) as server:
        check(server.url.removesuffix("/v1"), GEMMA_REQUESTS)


def test_the_chat_models_answers_are_the_golden_ones(smollm_path):
    with serving("--target", smollm_path, "--chat-template-file", HERMES, "--no-memory", "-k", 4,
                 "--api-key", KEY) as server:
        check(server.url.removesuffix("/v1"), SMOL_REQUESTS, KEY, keyless=("chat_no_key",))


def test_the_masks_leave_only_what_varies():
    body = ('{"id":"chatcmpl-0123456789abcdef01234567","created":1764201600,"model":"m.gguf",'
            '"tool_calls":[{"id":"call_AbCdEfGhIjKlMnOpQrStUvWx"}],'
            '"timings":{"prompt_n":3,"prompt_ms":12.5,"predicted_per_second":88.25,"draft_n":4}}')
    assert masked(body) == ('{"id":"chatcmpl-<id>","created":0,"model":"m.gguf","tool_calls":[{"id":"call_<id>"}],'
                            '"timings":{"prompt_n":3,"prompt_ms":0,"predicted_per_second":0,"draft_n":4}}')
    assert masked('data: {"id": "cmpl-0123456789abcdef01234567", "created": 5}') == \
        'data: {"id": "cmpl-<id>", "created": 0}'
