"""A reasoning model's thinking, served: `reasoning_content` beside the content, whole and
streamed alike, and a response format that holds only the answer after the thinking. SmolLM2
with DeepSeek-R1-Distill's and Qwen3's templates (tests/data/templates), greedy."""

from __future__ import annotations

import json

import jsonschema
from openai import OpenAI

THINKING = {"chat_template_kwargs": {"enable_thinking": True}}
NOT_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
AS_CITY = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
MESSAGES = [{"role": "system", "content": "Write one sentence of thought, then </think>, then the answer."},
            {"role": "user", "content": "Hello! Which city is the capital of France?"}]


def client(server) -> OpenAI:
    return OpenAI(base_url=server.url, api_key="none", max_retries=0)


def reasoning(message) -> str | None:
    return (message.model_extra or {}).get("reasoning_content")


def ask(server, **fields):
    return client(server).chat.completions.create(model="m", messages=MESSAGES, temperature=0, max_tokens=40,
                                                  **fields)


def streamed(server, **fields) -> tuple[str, str]:
    """The reasoning and the content a stream's deltas join to."""
    thought, content = "", ""
    for chunk in ask(server, stream=True, **fields):
        for choice in chunk.choices:
            thought += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            content += choice.delta.content or ""
    return thought, content


def test_the_thinking_is_reasoning_content_whole_and_streamed(smol_r1):
    """The generation prompt opens the think block: what the model writes up to </think> is
    reasoning, never content, and a stream's deltas join to the whole answer's."""
    for fields in ({"extra_body": THINKING}, {"extra_body": THINKING, "response_format": AS_CITY}):
        message = ask(smol_r1, **fields).choices[0].message
        thought = reasoning(message)
        assert thought and "think>" not in thought and "think>" not in (message.content or ""), message
        assert streamed(smol_r1, **fields) == (thought, message.content)


def test_a_schema_holds_the_answer_after_the_thinking_not_the_thinking(smol_r1):
    """Under a JSON schema the thinking is free prose (a schema from the first token would
    have cut it to JSON); the answer after it, if the model gets there, meets the schema."""
    choice = ask(smol_r1, response_format=AS_CITY, extra_body=THINKING).choices[0]
    assert not reasoning(choice.message).lstrip().startswith("{"), choice.message
    if choice.message.content:
        jsonschema.validate(json.loads(choice.message.content), CITY)
    else:
        assert choice.finish_reason == "length", "the thinking ends before the answer only at the token limit"
    closed = ask(smol_r1, response_format=AS_CITY, extra_body=NOT_THINKING).choices[0].message
    assert reasoning(closed) is None, "enable_thinking false: the prompt closes the block"
    jsonschema.validate(json.loads(closed.content), CITY)


def test_qwen3_leaves_the_block_to_the_model_and_reads_it_where_it_opens_one(smol_qwen3):
    """Qwen3's generation prompt leaves the think block to the model: under the schema this one
    opens it (the schema holds only the answer after it); without, it answers at once. Either
    way a stream's deltas join to the whole answer's."""
    choice = ask(smol_qwen3, response_format=AS_CITY).choices[0]
    thought = reasoning(choice.message)
    assert thought and "think>" not in thought and "think>" not in (choice.message.content or ""), choice
    if choice.message.content:
        jsonschema.validate(json.loads(choice.message.content), CITY)
    assert streamed(smol_qwen3, response_format=AS_CITY) == (thought, choice.message.content)
    plain = ask(smol_qwen3).choices[0].message
    assert reasoning(plain) is None and "Paris" in plain.content, plain
    assert streamed(smol_qwen3) == ("", plain.content)


def test_qwen3_calls_read_after_the_thinking(smol_qwen3):
    tool = {"type": "function", "function": {"name": "capital", "parameters": {
        "type": "object", "properties": {"country": {"type": "string"}}, "required": ["country"]}}}
    choice = client(smol_qwen3).chat.completions.create(
        model="m", messages=MESSAGES[1:], temperature=0, max_tokens=80, tools=[tool], tool_choice="required").choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "capital", choice
    assert "country" in json.loads(choice.message.tool_calls[0].function.arguments)
    assert "think>" not in (choice.message.content or "") + (reasoning(choice.message) or "")
