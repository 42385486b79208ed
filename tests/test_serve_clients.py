"""Agent frameworks, unmodified, against `specli serve`: openai-agents, pydantic-ai, instructor
and simonw's `llm`, each at the version the test extras pin, on a real server process on
127.0.0.1 with SmolLM2 and the Hermes test template (tests/data/templates).

Each test runs offline: openai-agents' tracing is off, and `loopback_only` fails a test that
connects anywhere but loopback (a client's telemetry, a tokenizer's download).
"""

from __future__ import annotations

import json
import os

import pytest
from pydantic import BaseModel

pytestmark = pytest.mark.slow  # real models, real processes


class Weather(BaseModel):
    city: str
    summary: str


class User(BaseModel):
    name: str
    age: int


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"The weather in {city} is sunny, 21 degrees."


@pytest.fixture(autouse=True)
def offline(monkeypatch, loopback_only):
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    monkeypatch.setenv("OPENAI_API_KEY", "none")


def test_openai_agents_with_a_tool_and_an_output_type(smol_tools):
    """Agent(tools=..., output_type=...): the first turn's request has both (once refused).
    The tool is offered until it has been called: SmolLM2 135M would call it at every turn."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    called: list[str] = []

    def get_weather_once(city: str) -> str:
        """Get the current weather in a city."""
        called.append(city)
        return get_weather(city)

    get_weather_once.__name__ = "get_weather"
    client = AsyncOpenAI(base_url=smol_tools.url, api_key="none", max_retries=0)
    agent = Agent(name="weather", instructions="Answer with the weather in the city the user names.",
                  tools=[function_tool(get_weather_once, is_enabled=lambda context, agent: not called)],
                  output_type=Weather,
                  model=OpenAIChatCompletionsModel(model="smollm2", openai_client=client),
                  model_settings=ModelSettings(temperature=0, max_tokens=80))
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    assert called and isinstance(result.final_output, Weather), (called, result.final_output)


def test_openai_agents_with_top_logprobs(smol_tools):
    """ModelSettings(top_logprobs=...) sends logprobs and top_logprobs (once refused); the SDK
    attaches them to the answer's text."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=smol_tools.url, api_key="none", max_retries=0)
    agent = Agent(name="colours", instructions="Answer in one short sentence.",
                  model=OpenAIChatCompletionsModel(model="smollm2", openai_client=client),
                  model_settings=ModelSettings(temperature=0, max_tokens=16, top_logprobs=2))
    result = Runner.run_sync(agent, "Name a colour.", max_turns=1)
    texts = [part for item in result.raw_responses[-1].output if item.type == "message" for part in item.content]
    assert texts and texts[0].logprobs, texts
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in texts[0].logprobs)


def test_pydantic_ai_with_a_tool_and_native_output(smol_tools):
    """NativeOutput: response_format json_schema beside the agent's tools (once refused). The
    tool is offered at the first step only: SmolLM2 135M would call it at every step."""
    from pydantic_ai import Agent, NativeOutput, Tool
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("smollm2", provider=OpenAIProvider(base_url=smol_tools.url, api_key="none"))
    async def first_step_only(context, definition):
        return definition if context.run_step <= 1 else None

    agent = Agent(model, output_type=NativeOutput(Weather), tools=[Tool(get_weather, prepare=first_step_only)],
                  model_settings={"temperature": 0, "max_tokens": 80})
    result = agent.run_sync("What is the weather in Paris?")
    called = [part for message in result.all_messages() for part in message.parts
              if getattr(part, "part_kind", "") == "tool-call"]
    assert called and isinstance(result.output, Weather), (called, result.output)


def test_instructor_tools_mode_at_a_tight_token_limit(smol_tools):
    """instructor names its function in tool_choice: exactly one call, finished well inside
    max_tokens (a second call once ran into the limit: finish_reason "length")."""
    import instructor
    from openai import OpenAI

    client = instructor.from_openai(OpenAI(base_url=smol_tools.url, api_key="none", max_retries=0),
                                    mode=instructor.Mode.TOOLS)
    user = client.chat.completions.create(
        model="smollm2", response_model=User, max_retries=0, temperature=0, max_tokens=48,
        messages=[{"role": "user", "content": "Jason is 25 years old. Extract the user."}])
    assert isinstance(user, User)


def test_llm_schema_gets_only_its_keys(smol_tools, tmp_path):
    """`llm --schema 'name str, age int'`: a schema without additionalProperties admits no
    other keys (the model once added gender, occupation and location)."""
    from click.testing import CliRunner
    from llm.cli import cli

    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: specli\n  model_name: smollm2\n  api_base: {smol_tools.url}\n  supports_schema: true\n")
    result = CliRunner().invoke(cli, ["-m", "specli", "--schema", "name str, age int", "-o", "temperature", "0",
                                      "-o", "max_tokens", "60", "--no-log", "Invent a person."],
                                env={**os.environ, "LLM_USER_PATH": str(tmp_path)}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    person = json.loads(result.output)
    assert set(person) == {"name", "age"}, person
