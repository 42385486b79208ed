"""Ollama's routes on `specli serve`, through the `ollama` client unmodified (the version the
test extras pin): chat whole and streamed (NDJSON), a tool and a `format` schema, generate,
list, show and version; and the same greedy request through every route this server speaks
(chat completions, Responses, Anthropic's Messages, Ollama's chat), writing the same text. A
real server on 127.0.0.1 with SmolLM2 and the Hermes test template."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from helpers import HERMES, serving

pytestmark = pytest.mark.slow  # real models, real processes

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
READ = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 40}}, "required": ["path"],
        "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": READ}}
GREEDY = {"temperature": 0, "num_predict": 24}


@pytest.fixture(scope="module")
def server(smollm_path):
    with serving("--target", smollm_path, "--chat-template-file", HERMES, "-c", "2048") as server:
        yield server


def client(server):
    from ollama import Client

    return Client(host=server.url.removesuffix("/v1"))


def test_chat_whole_and_streamed_with_counts_and_provenance(server):
    messages = [{"role": "user", "content": "Name three colours."}]
    whole = client(server).chat(model="smollm2", messages=messages, options=GREEDY)
    assert whole.done and whole.message.role == "assistant" and whole.message.content
    assert whole.eval_count > 0 and whole.prompt_eval_count > 0 and whole.done_reason in ("stop", "length")
    whole_raw = httpx.post(server.url.removesuffix("/v1") + "/api/chat", timeout=60,
                           json={"model": "x", "messages": messages, "options": GREEDY, "stream": False}).json()
    assert "".join(span["text"] for span in whole_raw["spans"]) == whole.message.content  # provenance
    parts = list(client(server).chat(model="smollm2", messages=messages, options=GREEDY, stream=True))
    assert "".join(part.message.content for part in parts) == whole.message.content
    assert parts[-1].done and not any(part.done for part in parts[:-1])
    assert parts[-1].eval_count == whole.eval_count
    raw = httpx.post(server.url.removesuffix("/v1") + "/api/chat", timeout=60,
                     json={"model": "x", "messages": messages, "options": GREEDY})  # streamed by default
    lines = [json.loads(line) for line in raw.text.splitlines()]
    assert raw.headers["content-type"].startswith("application/x-ndjson") and lines[-1]["done"]
    assert {line.get("source") for line in lines[:-1]} <= {"draft", "target"}


@pytest.fixture(scope="module")
def gemma_server(gemma_path):
    """Gemma copies the calls of the conversation before it (SmolLM2 never opens one itself)."""
    with serving("--target", gemma_path, "--chat-template-file", HERMES) as server:
        yield server


def few_shot(path: str) -> list[dict]:
    """A conversation in Ollama's shape whose assistant called read_file twice, then a third request."""
    messages: list[dict] = []
    for name, body in (("a.py", "print('a')"), ("b.py", "print('b')")):
        messages += [{"role": "user", "content": f"Read the file {name}."},
                     {"role": "assistant", "content": "",
                      "tool_calls": [{"function": {"name": "read_file", "arguments": {"path": name}}}]},
                     {"role": "tool", "tool_name": "read_file", "content": body}]
    return messages + [{"role": "user", "content": f"Read the file {path}."}]


def test_a_tool_call_and_a_format_schema(server, gemma_server):
    called = client(gemma_server).chat(model="gemma", messages=few_shot("src/app/main.py"), tools=[TOOL],
                                       options={"temperature": 0, "num_predict": 60, "stop": ["<|im_end|>"]})
    calls = called.message.tool_calls
    assert calls and calls[0].function.name == "read_file", called.message
    assert calls[0].function.arguments == {"path": "src/app/main.py"}
    typed = client(server).chat(model="smollm2", messages=[{"role": "user", "content": "Ann is 31. Give her name "
                                                            "and age as JSON."}], format=PERSON,
                                options={"temperature": 0, "num_predict": 40})
    if typed.done_reason == "stop":
        jsonschema.validate(json.loads(typed.message.content), PERSON)


def test_generate_list_show_and_version(server):
    generated = client(server).generate(model="smollm2", prompt="Say hello.", options=GREEDY)
    assert generated.done and generated.response
    raw = client(server).generate(model="smollm2", prompt="1, 2, 3, 4,", raw=True, options=GREEDY)
    assert raw.response.startswith(" 5")
    listed = client(server).list()
    assert [model.model for model in listed.models] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    shown = client(server).show("smollm2")
    assert "tools" in shown.capabilities and shown.modelinfo["llama.context_length"] == 2048
    assert httpx.get(server.url.removesuffix("/v1") + "/api/version", timeout=30).json()["version"]
    refused = httpx.post(server.url.removesuffix("/v1") + "/api/chat", timeout=30, json={
        "model": "x", "messages": [{"role": "user", "content": "Hi"}], "options": {"mirostat": 2}})
    assert refused.status_code == 400 and "mirostat" in refused.json()["error"]["message"]


def test_the_same_request_writes_the_same_text_through_every_route(server):
    """Greedy, the same conversation and limit: chat completions, Responses, Messages and
    Ollama's chat answer with one text."""
    root = server.url.removesuffix("/v1")
    system, user = "Answer briefly.", "Name three colours."
    chat = server.client().chat.completions.create(model="x", temperature=0, max_tokens=24, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": user}]).choices[0].message.content
    responses = server.client().responses.create(model="x", temperature=0, max_output_tokens=24, instructions=system,
                                                 input=user).output_text
    messages = httpx.post(root + "/v1/messages", timeout=60, json={
        "model": "x", "max_tokens": 24, "system": system, "messages": [{"role": "user", "content": user}]}).json()
    ollama = client(server).chat(model="x", options=GREEDY, messages=[{"role": "system", "content": system},
                                                                      {"role": "user", "content": user}])
    assert chat and responses == chat and messages["content"][0]["text"] == chat and ollama.message.content == chat
