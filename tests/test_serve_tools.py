"""`specli serve` with tools, through the official `openai` client and simonw's `llm`, on real
models and real server processes on 127.0.0.1.

Neither model installable here has a template that takes tools: SmolLM2-135M-Instruct's takes
none and Gemma 3 270M (a base model) has no template. Both are given the **test template**
tests/data/templates/smollm2-hermes-tools.jinja (`--chat-template-file`): Qwen2.5's Hermes
format. SmolLM2 never opens a call by itself, so "auto" is tested on Gemma, which copies the
calls of the conversation before it.
"""

# ruff: noqa: F811
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import jsonschema
import pytest
from helpers import HERMES, serving
from openai import BadRequestError

pytestmark = pytest.mark.slow  # real models, real processes

READ = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 40}}, "required": ["path"],
        "additionalProperties": False}
GREP = {"type": "object", "properties": {"pattern": {"type": "string", "maxLength": 40},
                                         "path": {"type": "string", "maxLength": 40}},
        "required": ["pattern", "path"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": READ}},
    {"type": "function", "function": {"name": "grep", "description": "Search files for a pattern.", "parameters": GREP}},
]
SCHEMAS = {"read_file": READ, "grep": GREP}
ASK = [{"role": "user", "content": "Read the file src/app/main.py."}]


def few_shot(path: str) -> list[dict]:
    """A conversation whose assistant called read_file twice, then a third request."""
    messages: list[dict] = []
    for i, (name, body) in enumerate([("a.py", "print('a')"), ("b.py", "print('b')")]):
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": name})}}
        messages += [{"role": "user", "content": f"Read the file {name}."},
                     {"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{i}", "content": body}]
    return messages + [{"role": "user", "content": f"Read the file {path}."}]


@pytest.fixture(scope="module")
def gemma_tools(gemma_path):
    with serving("--target", gemma_path, "--chat-template-file", HERMES) as server:
        yield server


def assert_valid(calls) -> None:
    assert calls, "the answer holds a call"
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def streamed_calls(stream) -> tuple[list[dict], str | None, list]:
    """The calls a stream's deltas join to, its finish reason, and its tool-call deltas."""
    calls: list[dict] = []
    finish, deltas = None, []
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or ():
            deltas.append(delta)
            if delta.index == len(calls):
                assert delta.id and delta.function.name, "a call's first delta has its id and name"
                calls.append({"id": delta.id, "name": delta.function.name, "arguments": ""})
            calls[delta.index]["arguments"] += delta.function.arguments or ""
    return calls, finish, deltas


def test_required_call_parses_validates_and_streams_in_pieces_that_join(smol_tools):
    client = smol_tools.client()
    request = dict(model="x", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                   temperature=0, max_tokens=80, extra_body={"exact": True})
    whole = client.chat.completions.create(**request)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None, "an answer of calls only has no content"
    assert len(choice.message.tool_calls) == 1, "parallel_tool_calls false: one call"
    assert_valid(choice.message.tool_calls)
    # Past 256 tokens of context an exact verify batch has one row on a CPU, where no forced
    # token rides along: the frame's forcing is checked without exact.
    framed = client.chat.completions.create(**{**request, "extra_body": {}}).choices[0]
    spans = framed.model_extra["spans"]
    assert any(span.get("proposer") == "grammar" for span in spans), "the call's frame is forced by the grammar"
    chunks = list(client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    calls, finish, deltas = streamed_calls(chunks)
    assert finish == "tool_calls"
    counted = sum((chunk.choices[0].model_extra or {}).get("tokens") or 0 for chunk in chunks if chunk.choices)
    assert counted == chunks[-1].usage.completion_tokens, "tokens held back while a call is read are counted later"
    assert [(c["name"], c["arguments"]) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert len(deltas) > 2, "the arguments come in pieces"


def test_a_call_cut_by_the_token_limit_says_so_and_one_whose_frame_alone_was_cut_does_not(smol_tools):
    """OpenAI's semantics: the limit inside a call's arguments is "length", with the call as
    far as it was written (whole and streamed alike: instructor raises its incomplete-output
    error); the limit after complete arguments, inside the template's closing frame (which
    the grammar forces), is "tool_calls" with the call whole."""
    client = smol_tools.client()
    request = dict(model="x", messages=ASK, tools=TOOLS[:1], tool_choice="required", parallel_tool_calls=False,
                   temperature=0, extra_body={"exact": True})
    full = client.chat.completions.create(**request, max_tokens=80)
    arguments = full.choices[0].message.tool_calls[0].function.arguments
    finishes = {}
    for limit in range(full.usage.completion_tokens - 1, 2, -1):
        whole = client.chat.completions.create(**request, max_tokens=limit)
        choice = whole.choices[0]
        calls = choice.message.tool_calls
        assert calls is not None and calls[0].function.name == "read_file", limit
        written = calls[0].function.arguments
        if choice.finish_reason == "tool_calls":
            assert written == arguments and "length" not in finishes.values(), "complete only nearest the end"
        else:
            assert choice.finish_reason == "length" and arguments.startswith(written) and written != arguments
        finishes[limit] = choice.finish_reason
        streamed, finish, _ = streamed_calls(client.chat.completions.create(**request, max_tokens=limit, stream=True))
        assert finish == choice.finish_reason and [c["arguments"] for c in streamed] == [written], limit
        if choice.finish_reason == "length" and len(written) < len(arguments) // 2:
            break  # cut well inside the arguments: enough
    assert "tool_calls" in finishes.values() and "length" in finishes.values(), finishes


def test_named_function_is_the_one_called(smol_tools):
    whole = smol_tools.client().chat.completions.create(
        model="x", messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "grep"}},
        parallel_tool_calls=False, temperature=0, max_tokens=80)
    calls = whole.choices[0].message.tool_calls
    assert_valid(calls)
    assert [call.function.name for call in calls] == ["grep"]


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "seed": 11}], ids=["greedy", "seeded"])
def test_drafting_writes_what_plain_decoding_writes(smol_tools, sampling):
    """With `exact`, on a prompt past the KV cache's first 256 cells (where, on a CPU build, a
    batch of rows stops being bit for bit a one-token decode: --exact caps batches by position)."""
    client = smol_tools.client()

    def answer(draft: str):
        response = client.chat.completions.create(
            model="x", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=80, **sampling,
            extra_body={"draft": draft, "exact": True})
        assert response.usage.prompt_tokens > 256
        message = response.choices[0].message
        return message.content, [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]

    assert answer("ngram") == answer("none")


def test_auto_opens_a_call_where_the_model_does_and_drafts_it(gemma_tools):
    """"auto": free text until the model writes <tool_call>; from there the call is constrained
    (a lazy grammar), its frame forced by the grammar."""
    client = gemma_tools.client()
    request = dict(model="x", messages=few_shot("src/app/main.py"), tools=TOOLS[:1], tool_choice="auto",
                   parallel_tool_calls=False, temperature=0, max_tokens=60, stop=["<|im_end|>"])
    drafted = client.chat.completions.create(**request, extra_body={"exact": True})
    plain = client.chat.completions.create(**request, extra_body={"exact": True, "draft": "none"})
    calls = drafted.choices[0].message.tool_calls
    assert_valid(calls)
    assert json.loads(calls[0].function.arguments) == {"path": "src/app/main.py"}, "the path is copied"
    assert drafted.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in plain.choices[0].message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in calls]
    framed = client.chat.completions.create(**request)  # without exact: see the required call's test
    proposers = {span.get("proposer") for span in framed.choices[0].model_extra["spans"]}
    assert "grammar" in proposers, "the call's frame is forced"


def test_auto_without_a_call_is_plain_content(smol_tools):
    """SmolLM2 answers in prose: the lazy grammar leaves free text alone."""
    client = smol_tools.client()
    request = dict(model="x", messages=[{"role": "user", "content": "Name three colours."}], tools=TOOLS,
                   temperature=0, max_tokens=24)
    with_tools = client.chat.completions.create(**request, extra_body={"exact": True})
    plain = client.chat.completions.create(**request, extra_body={"exact": True, "draft": "none"})
    message = with_tools.choices[0].message
    assert message.tool_calls is None and message.content
    assert message.content == plain.choices[0].message.content


def test_two_round_agent_loop(smol_tools):
    """Call, the tool's result back in (the assistant message as the client returned it), then
    an answer in words."""
    client = smol_tools.client()
    messages = list(ASK)
    first = client.chat.completions.create(model="x", messages=messages, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, temperature=0, max_tokens=80)
    call = first.choices[0].message.tool_calls[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "def main():\n    print('hello')\n"})
    second = client.chat.completions.create(model="x", messages=messages, tools=TOOLS, tool_choice="none",
                                            temperature=0, max_tokens=40)
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.choices[0].message.content and second.choices[0].message.tool_calls is None


def test_llm_cli_calls_a_tool_through_specli(gemma_tools, tmp_path):
    """simonw's `llm`, configured for specli serve by its extra-openai-models.yaml, runs a
    Python function as a tool: the model's call, llm's run of it, the answer after."""
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: specli\n  model_name: gemma\n  api_base: {gemma_tools.url}\n  supports_tools: true\n")
    functions = 'def read_file(path: str) -> str:\n    "Read a file."\n    return "print(42)"\n'
    example = ("You read files with tools.<|im_end|>\n<|im_start|>user\nRead the file a.py.<|im_end|>\n"
               '<|im_start|>assistant\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n'
               "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nprint(1)\n</tool_response><|im_end|>\n"
               "<|im_start|>assistant\na.py prints 1.")
    llm = Path(sys.executable).parent / "llm"
    result = subprocess.run([str(llm), "-m", "specli", "--functions", functions, "--td", "-s", example,
                             "-o", "temperature", "0", "-o", "max_tokens", "40", "Read the file c.py."],
                            capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                            env={**os.environ, "LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "none"})
    assert result.returncode == 0, result.stderr
    assert "Tool call: read_file({'path': 'c.py'})" in result.stdout + result.stderr
    assert "print(42)" in result.stdout + result.stderr, "llm ran the function and showed its result"


# --- bad input ------------------------------------------------------------------------


def post(server, body: dict) -> httpx.Response:
    """The body as JSON with non-ASCII escaped: a lone surrogate travels as "\\ud800"."""
    return httpx.post(f"{server.url}/chat/completions", content=json.dumps(body),
                      headers={"content-type": "application/json"}, timeout=60)


def test_bad_tool_requests_are_400s_that_name_the_field(smol_tools):
    def error(body: dict) -> dict:
        response = post(smol_tools, {"messages": ASK, **body})
        assert response.status_code == 400, response.text
        return response.json()["error"]

    unknown = error({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "rm"}}})
    assert unknown["param"] == "tool_choice.function.name" and "'rm'" in unknown["message"]
    bad_schema = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}}}]
    malformed = error({"tools": bad_schema})
    assert malformed["param"] == "tools[0].function.parameters"
    assert "tools[0] (f)" in malformed["message"] and "uniqueItems" in malformed["message"]
    assert "/properties/a" in malformed["message"]
    orphan = error({"messages": ASK + [{"role": "tool", "tool_call_id": "call_9", "content": "x"}], "tools": TOOLS})
    assert orphan["param"] == "messages[1].tool_call_id"
    assert error({"tool_choice": "required"})["param"] == "tool_choice"
    assert error({"tools": TOOLS, "grammar": 'root ::= "a"'})["param"] == "grammar"
    history = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "not json"}}]}]
    assert error({"messages": ASK + history, "tools": TOOLS})["param"] == "messages[1].tool_calls[0].function.arguments"


def test_tools_refused_by_name_where_the_template_takes_none(smollm_path):
    with serving("--target", smollm_path) as server:
        response = post(server, {"messages": ASK, "tools": TOOLS})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "tools" and "takes no tools" in error["message"]
        assert "--chat-template-file" in error["message"]
        # tool_choice "none": the tools are not used, and the request is served.
        assert post(server, {"messages": ASK, "tools": TOOLS, "tool_choice": "none", "max_tokens": 4}).status_code == 200


def test_fields_are_read_strictly(smol_tools):
    """What OpenAI answers with 400, specli does too: no coercion, no empty stop, no lone
    surrogate (once a 500)."""
    cases = [
        ({"max_tokens": "10"}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"temperature": "0.5"}, "temperature"),
        ({"stop": [""]}, "stop"),
        ({"messages": [{"role": "user", "content": None}]}, "messages.0"),
        ({"messages": [{"role": "user", "content": "x \ud800 y"}]}, "messages[0].content"),
        ({"stop": "\udfff"}, "stop"),
    ]
    for body, param in cases:
        response = post(smol_tools, {"messages": ASK, "max_tokens": 4, **body})
        assert response.status_code == 400, (body, response.text)
        assert (response.json()["error"]["param"] or "").startswith(param), (body, response.json())
    assert post(smol_tools, {"messages": ASK, "max_tokens": 4, "temperature": 1}).status_code == 200, \
        "an integer is a number"


def test_openai_client_sees_a_bad_request(smol_tools):
    with pytest.raises(BadRequestError):
        smol_tools.client().chat.completions.create(model="x", messages=ASK, tool_choice="required")
