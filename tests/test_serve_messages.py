"""Anthropic's Messages API on `specli serve` (`POST /v1/messages`), through the `anthropic`
client unmodified (the version the test extras pin): text whole and streamed, a tool round
trip, a recorded Claude Code-style request, errors in Anthropic's shape and `x-api-key`. A real
server on 127.0.0.1 with SmolLM2 and the Hermes test template. The same request writes the
same text as on /v1/chat/completions."""

from __future__ import annotations

import httpx
import pytest
from helpers import HERMES, serving

pytestmark = pytest.mark.slow  # real models, real processes

KEY = "sk-test-messages"
READ = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 40}}, "required": ["path"],
        "additionalProperties": False}
TOOL = {"name": "read_file", "description": "Read a file.", "input_schema": READ}


@pytest.fixture(scope="module")
def server(smollm_path):
    with serving("--target", smollm_path, "--chat-template-file", HERMES, "-c", "2048", "--api-key", KEY) as server:
        yield server


def client(server):
    from anthropic import Anthropic

    return Anthropic(base_url=server.url.removesuffix("/v1"), api_key=KEY, max_retries=0)


def test_a_message_is_the_chat_routes_text_whole_and_streamed(server):
    asked = dict(model="smollm2", max_tokens=24, system="Answer briefly.",
                 messages=[{"role": "user", "content": "Name three colours."}])
    whole = client(server).messages.create(**asked)
    chat = server.client(api_key=KEY).chat.completions.create(model="x", temperature=0, max_tokens=24, messages=[
        {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name three colours."}])
    assert whole.content[0].type == "text" and whole.content[0].text == chat.choices[0].message.content
    assert whole.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[chat.choices[0].finish_reason]
    assert whole.usage.output_tokens == chat.usage.completion_tokens
    assert "".join(span["text"] for span in whole.model_extra["spans"]) == whole.content[0].text
    with client(server).messages.stream(**asked) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


def test_a_tool_round_trip_whole_and_streamed(server):
    asked = dict(model="smollm2", max_tokens=60, tools=[TOOL],
                 tool_choice={"type": "any", "disable_parallel_tool_use": True},
                 messages=[{"role": "user", "content": "Read the file src/app/main.py."}])
    first = client(server).messages.create(**asked)
    (use,) = [block for block in first.content if block.type == "tool_use"]
    assert first.stop_reason == "tool_use" and use.name == "read_file" and set(use.input) == {"path"}
    with client(server).messages.stream(**asked) as stream:
        streamed = stream.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [(use.name, use.input)]
    second = client(server).messages.create(model="smollm2", max_tokens=24, tools=[TOOL], messages=[
        *asked["messages"], {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "print('hello')"}]}])
    assert second.content and second.content[0].type in ("text", "tool_use")


def test_a_claude_code_style_request_is_answered(server):
    """As Claude Code sends them: system blocks, a text block with cache_control, metadata,
    tools with input_schema, streamed, with `x-api-key` and `anthropic-version` headers."""
    body = {
        "model": "claude-sonnet-4-5", "max_tokens": 32, "stream": True, "temperature": 0,
        "system": [{"type": "text", "text": "You are a coding assistant.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello.",
                                                   "cache_control": {"type": "ephemeral"}}]}],
        "tools": [{"name": "Read", "description": "Read a file", "input_schema": READ}],
        "metadata": {"user_id": "user_abc"},
    }
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"}
    with httpx.stream("POST", server.url + "/messages", json=body, headers=headers, timeout=120) as reply:
        assert reply.status_code == 200
        kinds = [line.removeprefix("event: ") for line in reply.iter_lines() if line.startswith("event: ")]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert "content_block_delta" in kinds


def test_errors_are_in_anthropics_shape(server):
    from anthropic import AuthenticationError, BadRequestError

    with pytest.raises(BadRequestError) as missing:
        httpx_reply = httpx.post(server.url + "/messages", headers={"x-api-key": KEY},
                                 json={"model": "x", "messages": [{"role": "user", "content": "Hi"}]}, timeout=30)
        assert httpx_reply.status_code == 400
        assert httpx_reply.json()["type"] == "error" and "max_tokens" in httpx_reply.json()["error"]["message"]
        client(server).messages.create(model="x", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}])
    assert "image" in str(missing.value)
    from anthropic import Anthropic

    with pytest.raises(AuthenticationError):
        Anthropic(base_url=server.url.removesuffix("/v1"), api_key="wrong", max_retries=0).messages.create(
            model="x", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
