"""Random bodies against both completion routes of a real server app (SmolLM2, its chat
template, a real Worker): whatever JSON object a client sends, the answer is never a 5xx,
and every 400 names the field it is about (`param`).

The bodies mix the fields specli reads, with values of every JSON type, with values that are
nearly right (grammars and schemas that never end, admit nothing or do not parse; logit_bias
keys in other digits). Token limits stay small (the server's default is 4 and a body's own
is at most 6) and `exact` is left out (its first use measures for seconds), so each example
generates a few tokens at most."""

from __future__ import annotations

import io
import re

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specli.decode.request import GenerationRequest
from specli.serve.app import ServerInfo, create_app
from specli.serve.worker import Worker

pytestmark = pytest.mark.slow

SCALARS = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) \
    | st.text(max_size=12)
ANY_JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)

GRAMMARS = st.sampled_from(['root ::= "a" root', "root ::= ", 'root ::= "yes" | "no"', 'root ::= "a', "root ::= x",
                            'root ::= [a-z]+', 'root ::= "" ""', "%%%", ""]) | st.text(max_size=20)
SCHEMAS = st.sampled_from([
    {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
     "$ref": "#/$defs/n"},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "string", "enum": []}, {"type": "array", "minItems": 3, "maxItems": 1}, {"$ref": "#/nowhere"},
    {"type": "integer", "minimum": "x"}, {"not": {}}, False, True, "{", "{}",
]) | ANY_JSON
BIAS_KEYS = st.sampled_from(["²", "٣", "1" * 5000, "-1", "0", "49151", "99999999", "1e3", " 7"]) | st.text(max_size=6)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "user", "assistant", "tool", "x"]),
                                 "content": st.text(max_size=30) | st.text(max_size=30) | ANY_JSON},
                                optional={"name": SCALARS, "tool_call_id": SCALARS, "tool_calls": ANY_JSON})
TOOL = st.fixed_dictionaries({"type": st.sampled_from(["function", "x"]), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["f", "get_weather", "", "bad name"])}, optional={"parameters": SCHEMAS})})

# Each field: a value it takes (most bodies are served), or any JSON at all.
VALID = {
    "temperature": st.floats(0, 2), "top_p": st.floats(0.05, 1), "top_k": st.integers(0, 50),
    "min_p": st.floats(0, 1), "repeat_penalty": st.floats(0.5, 2), "seed": st.integers(0, 2**40),
    "stop": st.text(min_size=1, max_size=3) | st.lists(st.text(min_size=1, max_size=3), max_size=4),
    "stream": st.booleans(), "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "logit_bias": st.dictionaries(BIAS_KEYS | st.integers(0, 49151).map(str), st.floats(-100, 100), max_size=3),
    "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2), "n": st.just(1),
    "response_format": st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema"])},
                                             optional={"json_schema": st.fixed_dictionaries(
                                                 {"name": st.just("a")}, optional={"schema": SCHEMAS})}),
    "json_schema": SCHEMAS, "grammar": GRAMMARS,
    "draft": st.sampled_from(["ngram", "none", "model", "mtp"]),
    "draft_tokens": st.sampled_from(["auto", 1, 3, 8]),
    "prediction": st.fixed_dictionaries({"type": st.just("content"), "content": st.text(max_size=40)}),
    "model": st.text(max_size=8), "user": st.text(max_size=8), "mirostat": st.sampled_from([0, 2]),
}
CHAT_VALID = {**VALID, "logprobs": st.booleans(), "top_logprobs": st.integers(0, 20),
              "tools": st.lists(TOOL, min_size=1, max_size=2),
              "tool_choice": st.sampled_from(["auto", "none", "required"]),
              "max_completion_tokens": st.integers(1, 6), "parallel_tool_calls": st.booleans(),
              "chat_template_kwargs": st.dictionaries(st.sampled_from(["enable_thinking", "x", "messages"]), SCALARS)}
COMPLETION_VALID = {**VALID, "logprobs": st.integers(0, 20), "echo": st.just(False), "best_of": st.just(1)}
PROMPTS = st.text(max_size=40) | st.lists(st.integers(-3, 60000), max_size=4) | st.lists(st.text(max_size=9), max_size=2)


@st.composite
def bodies(draw, valid: dict, start: dict):
    """A body of the route's required fields, a few others with values they take, and now and
    then one field with any JSON at all."""
    body = {name: draw(strategy) for name, strategy in start.items()}
    chosen = draw(st.lists(st.sampled_from(sorted(valid)), max_size=3, unique=True))
    body.update({name: draw(valid[name]) for name in chosen})
    if draw(st.booleans()):
        body[draw(st.sampled_from(sorted(valid)))] = draw(ANY_JSON)
    return body


TOKEN_LIMIT = st.sampled_from([1, 2, 6]) | st.sampled_from([-1, 0, "3", 2.5, None])
CHAT = bodies(CHAT_VALID, {"messages": st.lists(MESSAGE, min_size=1, max_size=3) | ANY_JSON,
                           "max_tokens": TOKEN_LIMIT})
COMPLETION = bodies(COMPLETION_VALID, {"prompt": PROMPTS | ANY_JSON, "max_tokens": TOKEN_LIMIT})


@pytest.fixture(scope="module")
def smol_client(smollm_path):
    from specli.llama.backend import LoadSettings
    from specli.session import SessionSpec, open_session

    load = LoadSettings(ctx_size=512)
    with open_session(SessionSpec(smollm_path, None, load, load)) as session:
        worker = Worker(session, queue=4, memory=True, measure=False)
        info = ServerInfo("smol", smollm_path.name, "ngram", None, GenerationRequest(max_tokens=4), 0)
        log = io.StringIO()
        try:
            with TestClient(create_app(worker, info, log), base_url="http://127.0.0.1:8080") as client:
                yield client, log
        finally:
            worker.close()


def _check(answer, body) -> None:
    assert answer.status_code < 500, (body, answer.text)
    # nor an error event inside a stream (by its type: a 400 may quote a body that holds the word)
    assert not re.search(r'"type"\s*:\s*"server_error"', answer.text), (body, answer.text)
    if answer.status_code == 400:
        error = answer.json()["error"]
        assert error["param"], (body, error)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(body=CHAT)
def test_no_chat_body_gets_a_5xx_and_every_400_names_its_field(smol_client, body):
    client, _ = smol_client
    _check(client.post("/v1/chat/completions", json=body), body)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(body=COMPLETION)
def test_no_completion_body_gets_a_5xx_and_every_400_names_its_field(smol_client, body):
    client, _ = smol_client
    _check(client.post("/v1/completions", json=body), body)



def test_the_bodies_reach_generation_and_many_kinds_of_400(smol_client):
    """Runs after the two below (file order): the fuzzing was not all refused at the door."""
    _, log = smol_client
    statuses = [line.split(" | ")[0].rsplit(" ", 1)[-1] for line in log.getvalue().splitlines()]
    messages = {line.split(" | ")[-1].split(":")[0] for line in log.getvalue().splitlines() if " 400 | " in line}
    assert statuses.count("200") >= 20 and len(messages) >= 10, (statuses.count("200"), sorted(messages))
