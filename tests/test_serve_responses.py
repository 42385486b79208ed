"""OpenAI's Responses API on `specli serve` (`POST /v1/responses`), through clients unmodified:
the `openai` client's `responses.create` (whole and streamed) and `responses.parse`, and
openai-agents on its default (Responses) path with a tool and a typed output. A real server on
127.0.0.1 with SmolLM2 and the Hermes test template. The same request writes the same text as
on /v1/chat/completions."""

from __future__ import annotations

import json

import httpx
import pytest
from helpers import HERMES, serving
from pydantic import BaseModel

pytestmark = pytest.mark.slow  # real models, real processes

READ = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 40}}, "required": ["path"],
        "additionalProperties": False}
TOOL = {"type": "function", "name": "read_file", "description": "Read a file.", "parameters": READ}


class User(BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def server(smollm_path):
    with serving("--target", smollm_path, "--chat-template-file", HERMES, "-c", "2048") as server:
        yield server


@pytest.fixture(autouse=True)
def offline(monkeypatch, loopback_only):
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    monkeypatch.setenv("OPENAI_API_KEY", "none")


def test_a_response_is_the_chat_routes_text_whole_and_streamed(server):
    client = server.client()
    asked = dict(model="x", instructions="Answer briefly.", input="Name three colours.", max_output_tokens=24,
                 temperature=0)
    whole = client.responses.create(**asked)
    chat = client.chat.completions.create(model="x", temperature=0, max_tokens=24, messages=[
        {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name three colours."}])
    assert whole.output_text == chat.choices[0].message.content
    assert whole.status in ("completed", "incomplete") and whole.usage.output_tokens == chat.usage.completion_tokens
    (message,) = [item for item in whole.output if item.type == "message"]
    spans = message.model_extra["spans"]
    assert "".join(span["text"] for span in spans) == whole.output_text  # provenance, as on chat
    events = list(client.responses.create(**asked, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in ("response.completed",
                                                                                       "response.incomplete")
    deltas = [event for event in events if event.type == "response.output_text.delta"]
    assert "".join(event.delta for event in deltas) == whole.output_text
    assert {event.model_extra["source"] for event in deltas} <= {"draft", "target"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[-1].response.output_text == whole.output_text


def test_a_tool_call_its_output_sent_back_and_a_conversation_continued_by_id(server):
    client = server.client()
    first = client.responses.create(model="x", input="Read the file src/app/main.py.", tools=[TOOL],
                                    tool_choice="required", parallel_tool_calls=False, temperature=0,
                                    max_output_tokens=60)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "read_file" and set(json.loads(call.arguments)) == {"path"}
    streamed = list(client.responses.create(model="x", input="Read the file src/app/main.py.", tools=[TOOL],
                                            tool_choice="required", parallel_tool_calls=False, temperature=0,
                                            max_output_tokens=60, stream=True))
    done = [event for event in streamed if event.type == "response.function_call_arguments.done"]
    assert [(event.name, event.arguments) for event in done] == [(call.name, call.arguments)]
    # The call's output back, continuing the kept conversation by its id.
    second = client.responses.create(model="x", previous_response_id=first.id, temperature=0, max_output_tokens=24,
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "print('hello')"}])
    assert second.output_text and second.previous_response_id == first.id
    with pytest.raises(Exception) as refused:
        client.responses.create(model="x", previous_response_id="resp_unknown", input="Hi.", max_output_tokens=4)
    assert "previous_response_id" in str(refused.value)


def test_responses_parse_writes_json_that_meets_the_schema(server):
    parsed = server.client().responses.parse(model="x", input="Ann is 31. Give her name and age.", text_format=User,
                                             temperature=0, max_output_tokens=40)
    assert isinstance(parsed.output_parsed, User)


def test_what_cannot_be_served_is_refused_by_name(server):
    url = server.url + "/responses"
    for body, where in (
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]}]}, "input.0.content"),
        ({"input": "Hi.", "tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"input": "Hi.", "background": True}, "background"),
        ({"input": "Hi.", "conversation": "conv_1"}, "conversation"),
    ):
        reply = httpx.post(url, json=body, timeout=30)
        assert reply.status_code == 400 and reply.json()["error"]["param"].startswith(where), reply.text
    # an image goes through the chat route, which says this model takes none (and names its part there)
    image = {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}
    reply = httpx.post(url, json=image, timeout=30)
    assert reply.status_code == 400 and "takes no images" in reply.json()["error"]["message"], reply.text


def test_openai_agents_on_its_default_responses_path_with_a_tool_and_an_output_type(server):
    """Agent(tools=..., output_type=...) with no model class named: the Responses API."""
    from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled
    from openai import AsyncOpenAI

    class Weather(BaseModel):
        city: str
        summary: str

    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=server.url, api_key="none", max_retries=0), use_for_tracing=False)
    called: list[str] = []

    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        called.append(city)
        return f"The weather in {city} is sunny, 21 degrees."

    agent = Agent(name="weather", instructions="Answer with the weather in the city the user names.",
                  tools=[function_tool(get_weather, is_enabled=lambda context, agent: not called)],
                  output_type=Weather, model="smollm2", model_settings=ModelSettings(temperature=0, max_tokens=80))
    before = len(server.log)
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    assert called and isinstance(result.final_output, Weather), (called, result.final_output)
    assert any("POST /v1/responses 200" in line for line in server.log[before:]), "the Responses path"
