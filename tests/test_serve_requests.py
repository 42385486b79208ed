"""How `specli serve` reads a request, without a server process: which fields are refused by
name, which are ignored, what a request that names no draft gets, and an error inside a
generation answered as that request's own (the next is served)."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from specli.decode.constraint_sources import ConstraintSource, SourceConflict, SourceKind, write_constraint
from specli.decode.events import Stats
from specli.decode.request import DraftKind, GenerationRequest
from specli.decode.sampling import SamplingSettings
from specli.errors import SpecliError
from specli.serve import generation
from specli.serve.app import ServerInfo, create_app
from specli.serve.errors import GenerationFailed, api_error
from specli.serve.requests import ChatRequest, CompletionRequest, RequestError
from specli.serve.worker import Busy
from specli.stream import Outcome

MESSAGES = [{"role": "user", "content": "hi"}]


def refused_param(request) -> str | None:
    try:
        request.refused()
    except RequestError as error:
        return error.param
    return None


@pytest.mark.parametrize("field, value", [
    ("reasoning_effort", "high"), ("guided_json", {"type": "object"}), ("guided_regex", "a+"),
    ("ignore_eos", True), ("mirostat", 2), ("typical_p", 0.5), ("dry_multiplier", 0.8), ("xtc_probability", 0.5),
    ("n_predict", 12),
])
def test_fields_other_servers_honour_are_refused_by_name(field, value):
    assert refused_param(ChatRequest(messages=MESSAGES, **{field: value})) == field
    assert refused_param(CompletionRequest(prompt="hi", **{field: value})) == field


def test_constraints_are_read_from_response_format_json_schema_and_grammar():
    defaults = GenerationRequest()
    for fields, kind in [({"response_format": {"type": "json_object"}}, "json_schema"),
                         ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
                             "type": "object", "properties": {"a": {"type": "integer"}}}}}}, "json_schema"),
                         ({"json_schema": {"type": "object"}}, "json_schema"),
                         ({"grammar": 'root ::= "a"'}, "grammar")]:
        for request in (ChatRequest(messages=MESSAGES, **fields), CompletionRequest(prompt="hi", **fields)):
            assert refused_param(request) is None
            assert request.generation_request(defaults).constraint.kind == kind
    text = ChatRequest(messages=MESSAGES, response_format={"type": "text"})
    assert text.generation_request(defaults).constraint is None


def test_fields_that_change_nothing_are_ignored():
    request = ChatRequest(messages=MESSAGES, user="me", store=False, metadata={"a": "b"}, cache_prompt=True,
                          reasoning_effort=None, parallel_tool_calls=False, service_tier="auto")
    assert refused_param(request) is None


def test_llama_server_fields_at_their_defaults_are_served():
    """A client that sends every llama-server field with its default value changes nothing:
    a sampler switched off, and that sampler's own settings."""
    defaults = dict(ignore_eos=False, n_probs=0, mirostat=0, mirostat_tau=5.0, mirostat_eta=0.1, typical_p=1.0,
                    top_n_sigma=-1.0, dynatemp_range=0.0, dynatemp_exponent=1.0, dry_multiplier=0.0, dry_base=1.75,
                    dry_allowed_length=2, xtc_probability=0.0, xtc_threshold=0.1, min_tokens=0)
    assert refused_param(ChatRequest(messages=MESSAGES, **defaults)) is None
    assert refused_param(CompletionRequest(prompt="hi", **{**defaults, "mirostat": 1})) == "mirostat"


def test_a_tool_call_history_is_read_and_a_tool_message_without_its_call_refused():
    messages = [*MESSAGES, {"role": "assistant", "content": None,
                            "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "1", "content": "done"}]
    assert refused_param(ChatRequest(messages=messages)) is None
    call = ChatRequest(messages=messages).conversation()[1]["tool_calls"][0]
    assert call["function"] == {"name": "f", "arguments": {}}, "arguments as an object, as templates write them"
    orphan = [*MESSAGES, {"role": "tool", "tool_call_id": "9", "content": "done"}]
    assert refused_param(ChatRequest(messages=orphan)) == "messages[1].tool_call_id"


def test_logprobs_are_read_in_each_routes_own_form():
    """Completions: logprobs N (0: the chosen token's only). Chat: logprobs true, with
    top_logprobs alternatives; top_logprobs alone is an error, as OpenAI's."""
    def asked(body):
        return body.generation_request(GenerationRequest()).logprobs

    assert asked(CompletionRequest(prompt="hi", logprobs=0)) == 0
    assert asked(CompletionRequest(prompt="hi", logprobs=5)) == 5
    assert asked(CompletionRequest(prompt="hi", logprobs=False)) is None
    assert asked(CompletionRequest(prompt="hi")) is None
    assert asked(ChatRequest(messages=MESSAGES, logprobs=True)) == 0
    assert asked(ChatRequest(messages=MESSAGES, logprobs=True, top_logprobs=3)) == 3
    assert asked(ChatRequest(messages=MESSAGES, logprobs=False)) is None
    for body, param in [(CompletionRequest(prompt="hi", logprobs=21), "logprobs"),
                        (CompletionRequest(prompt="hi", logprobs=True), "logprobs"),
                        (CompletionRequest(prompt="hi", top_logprobs=2), "top_logprobs"),
                        (ChatRequest(messages=MESSAGES, logprobs=2), "logprobs"),
                        (ChatRequest(messages=MESSAGES, top_logprobs=2), "top_logprobs"),
                        (ChatRequest(messages=MESSAGES, logprobs=True, top_logprobs=21), "top_logprobs")]:
        assert refused_param(body) == param, body


def nothing_loaded(kind):  # a fake session's: the kinds that load nothing draft
    return kind.load and "not loaded"


@pytest.mark.parametrize("servers", [DraftKind.NONE, DraftKind.NGRAM, DraftKind.MODEL, DraftKind.MTP])
def test_a_request_that_names_no_draft_gets_the_servers_own(servers):
    """The server's own --draft (a draft model, with lookup in front of it unless --no-ngram,
    ngram or none) is what a request gets when it names no draft; one that names it gets its own."""
    defaults = GenerationRequest(max_tokens=1 << 30, draft=servers, draft_tokens=3, lookup=False)
    request = ChatRequest(messages=MESSAGES).generation_request(defaults)
    assert (request.draft, request.draft_tokens, request.lookup) == (servers, 3, False)
    named = CompletionRequest(prompt="hi", draft="none", draft_tokens="auto").generation_request(defaults)
    assert (named.draft, named.draft_tokens) == (DraftKind.NONE, "auto")


def test_a_requests_sampling_fields_override_the_servers():
    defaults = GenerationRequest(sampling=SamplingSettings(temperature=0.7, top_k=40, top_p=0.9))
    request = ChatRequest(messages=MESSAGES, top_k=5, seed=3, max_tokens=9).generation_request(defaults)
    assert request.sampling == SamplingSettings(temperature=0.7, top_k=5, top_p=0.9)
    assert (request.seed, request.max_tokens) == (3, 9)
    assert ChatRequest(messages=MESSAGES).generation_request(defaults).seed is None, "a fresh seed when it runs"


# --- an error inside a generation ends that request only ---------------------------------

class FailingOnceWorker:
    """Stands in for serve.worker.Worker: its first generation fails inside (as a failed decode
    would), every later one writes "fine"."""

    queue = 2
    parallel = 1

    def __init__(self) -> None:
        target = SimpleNamespace(n_ctx=64, n_vocab=100, tokenize=lambda text, **_: [1, 2, 3])
        self.session = SimpleNamespace(target=target, unavailable=nothing_loaded)
        self.started = 0

    async def start(self, job, on_event, gone=None, key=""):
        future = asyncio.get_running_loop().create_future()
        self.started += 1
        if self.started in (1, 3):
            future.set_exception(SpecliError("llama_decode failed (-3)"))
        else:
            stats = Stats(proposer="ngram", prompt_tokens=3, tokens=1, finish_reason="length")
            future.set_result(Outcome(stats, [5], "fine", [("fine", "target", "")]))
        return future, threading.Event()


def test_an_error_inside_a_generation_ends_that_request_only():
    log = io.StringIO()
    worker = FailingOnceWorker()
    info = ServerInfo("m", "m.gguf", "ngram", None, GenerationRequest(), 0)
    with TestClient(create_app(worker, info, log), base_url="http://localhost") as client:
        failed = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
        served = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
        streamed = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1, "stream": True})
    assert failed.status_code == 500
    assert failed.json()["error"] == {"message": "llama_decode failed (-3)", "type": "server_error", "param": None,
                                      "code": None}
    assert served.status_code == 200 and served.json()["choices"][0]["text"] == "fine", "the next request is served"
    events = [line.removeprefix("data: ") for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["message"] == "llama_decode failed (-3)"
    lines = log.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["specli: POST /v1/completions 500",
                                                         "specli: POST /v1/completions 200",
                                                         "specli: POST /v1/completions 500"], lines


# --- one writer per constraint ------------------------------------------------------------

HERMES = Path(__file__).parent / "data" / "templates" / "smollm2-hermes-tools.jinja"
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


def tool_session(monkeypatch) -> SimpleNamespace:
    """A session whose target takes Hermes tool calls; its chat prompt is three tokens."""
    monkeypatch.setattr(generation, "chat_tokens", lambda target, messages, tools, variables=None: [1, 2, 3])
    target = SimpleNamespace(n_ctx=64, path=Path("m.gguf"), chat_template=lambda: HERMES.read_text(),
                             special_token=lambda name: None)
    return SimpleNamespace(target=target, unavailable=nothing_loaded)


def test_the_request_builder_writes_the_tools_constraint_and_checks_the_body_once(monkeypatch):
    checked = []
    refused = ChatRequest.refused
    monkeypatch.setattr(ChatRequest, "refused", lambda self: checked.append(self) or refused(self))
    body = ChatRequest(messages=MESSAGES, tools=TOOLS, tool_choice="required")
    asked = generation.read(body, tool_session(monkeypatch), GenerationRequest())
    assert asked.job.request.constraint.kind == "grammar" and "read_file" in asked.job.request.constraint.source
    assert asked.plan is not None and asked.plan.choice == "required"
    assert len(checked) == 1, "refused() runs once per request"
    none = generation.read(ChatRequest(messages=MESSAGES, tools=TOOLS, tool_choice="none"),
                           tool_session(monkeypatch), GenerationRequest())
    assert none.job.request.constraint is None and none.plan is None, "tool_choice none: no constraint, no plan"


@pytest.mark.parametrize("fields, param, message", [
    ({"tools": TOOLS, "grammar": 'root ::= "a"'}, "grammar",
     "tools do not combine with grammar (a grammar); a JSON schema or json_object response format does"),
    ({"response_format": {"type": "json_object"}, "json_schema": {}, "grammar": 'root ::= "a"'}, "json_schema",
     "give one of response_format, json_schema, grammar, not several"),
    ({"response_format": {"type": "text"}, "json_schema": {}, "grammar": 'root ::= "a"'}, "grammar",
     "give one of json_schema, grammar, not several"),
])
def test_sources_that_do_not_combine_are_refused_in_one_message(monkeypatch, fields, param, message):
    with pytest.raises(SourceConflict) as refused:
        generation.read(ChatRequest(messages=MESSAGES, **fields), tool_session(monkeypatch), GenerationRequest())
    assert refused.value.name == param and message in refused.value.message
    answer = api_error(refused.value)
    assert (answer.status, answer.body.param) == (400, param)


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.mark.parametrize("fields, calls, answer", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}}}, True, True),
    ({"response_format": {"type": "json_object"}}, True, True),
    ({"response_format": {"type": "json_object", "schema": WEATHER}}, True, True),  # llama-server's form
    ({"json_schema": WEATHER}, True, True),
    ({"response_format": {"type": "text"}}, True, False),
    ({"response_format": {"type": "json_object"}, "tool_choice": "none"}, False, True),
    ({"response_format": {"type": "text"}, "tool_choice": "none"}, False, False),
    ({"response_format": {"type": "json_object"}, "tool_choice": "required"}, True, False),
])
def test_tools_combine_with_a_typed_answer(monkeypatch, fields, calls, answer):
    """Tools beside a JSON response format: "auto" answers with calls or that JSON from the
    first token; "none" with the JSON alone; "required" with calls only; "text" adds nothing."""
    asked = generation.read(ChatRequest(messages=MESSAGES, tools=TOOLS, **fields), tool_session(monkeypatch),
                            GenerationRequest())
    constraint = asked.job.request.constraint
    if not calls:
        assert (constraint is not None) is answer and asked.plan is None
        return
    assert constraint.kind == "grammar" and "read_file" in constraint.source
    assert ("%json" in constraint.source.split("start:")[1]) is answer, constraint.source
    assert ("[lazy]" in constraint.source) is (fields.get("tool_choice") is None and not answer)
    if "schema" in str(fields):
        assert '"city"' in constraint.source, "the answer's schema, not any JSON"


def test_a_json_object_response_format_honours_llama_servers_schema():
    request = ChatRequest(messages=MESSAGES, response_format={"type": "json_object", "schema": WEATHER})
    constraint = request.generation_request(GenerationRequest()).constraint
    assert constraint.kind == "json_schema" and json.loads(constraint.source) == WEATHER


def test_a_named_tool_choice_writes_exactly_one_call(monkeypatch):
    """OpenAI's named tool_choice is one call; "required" keeps parallel calls unless told not to."""
    def grammar(**fields):
        body = ChatRequest(messages=MESSAGES, tools=TOOLS, **fields)
        return generation.read(body, tool_session(monkeypatch), GenerationRequest()).job.request.constraint.source

    name = TOOLS[0]["function"]["name"]
    assert "call)*" not in grammar(tool_choice={"type": "function", "function": {"name": name}})
    assert "call)*" in grammar(tool_choice="required")
    assert "call)*" not in grammar(tool_choice="required", parallel_tool_calls=False)


def test_a_text_response_format_combines_with_a_schema_or_a_grammar():
    for fields, kind in [({"json_schema": {"type": "object"}}, "json_schema"), ({"grammar": 'root ::= "a"'}, "grammar")]:
        request = ChatRequest(messages=MESSAGES, response_format={"type": "text"}, **fields)
        assert request.generation_request(GenerationRequest()).constraint.kind == kind


def test_the_cli_and_serve_share_the_rule():
    sources = [ConstraintSource("--grammar", SourceKind.GRAMMAR, lambda: None),
               ConstraintSource("--json-schema-file", SourceKind.JSON, lambda: None)]
    with pytest.raises(SourceConflict) as refused:
        write_constraint(sources)
    assert refused.value.message == "give one of --grammar, --json-schema-file, not several"
    assert refused.value.exit_code == 2
    assert write_constraint(sources[:1]) is None


# --- the error table ----------------------------------------------------------------------

def test_the_error_table_answers_the_workers_refusals_and_leaves_bugs_alone():
    busy = api_error(Busy(3))
    assert (busy.status, busy.body.code, busy.headers) == (503, "queue_full", {"Retry-After": "1"})
    assert "3 requests are already waiting" in busy.body.message
    failed = api_error(GenerationFailed(RuntimeError("boom")))
    assert (failed.status, failed.body.message) == (500, "internal error: RuntimeError: boom")
    with pytest.raises(KeyError):
        api_error(KeyError("a bug"))


@pytest.mark.parametrize("body, param, message", [
    ({"tool_choice": {"type": "function"}, "tools": TOOLS}, "tool_choice.function", "tool_choice.function: Field required"),
    ({"tool_choice": "any", "tools": TOOLS}, "tool_choice", "Input should be 'none', 'auto' or 'required'"),
    ({"stop": 3}, "stop", "stop: Input should be a valid string"),
    ({"audio": {"voice": "alloy"}}, "audio", "audio is not supported: specli serves text only"),
    ({"functions": [{"name": "f"}]}, "functions", "functions are not supported (tools are)"),
])
def test_every_400_names_the_field_as_sent_and_logs_its_reason_in_one_line(body, param, message):
    """No union member's name in a param, no plural for audio, and the reason on the server's
    stderr, not only in the body."""
    log = io.StringIO()
    info = ServerInfo("m", "m.gguf", "ngram", None, GenerationRequest(), 0)
    with TestClient(create_app(FailingOnceWorker(), info, log), base_url="http://localhost") as client:
        answer = client.post("/v1/chat/completions", json={"messages": MESSAGES, **body})
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] == param and message in error["message"], error
    assert log.getvalue().splitlines() == [f"specli: POST /v1/chat/completions 400 | {error['message']}"]


def test_template_errors_give_the_servers_remedies_not_the_clis():
    from specli.errors import PromptError
    from specli.llama.template import NO_CHAT_HINT
    from specli.tools.plan import ToolsUnsupported, tool_format

    answer = api_error(PromptError("m.gguf has no chat template", NO_CHAT_HINT))
    assert "--no-chat" not in answer.body.message and "--chat-template-file" in answer.body.message
    with pytest.raises(ToolsUnsupported) as refused:
        tool_format(None, "m.gguf")
    assert refused.value.message == "m.gguf has no chat template", "not a template that takes no tools"
    assert "takes no tools" in str(pytest.raises(ToolsUnsupported, tool_format, "{{ messages }}", "m.gguf").value)


def test_openais_penalties_and_logit_bias_reach_the_sampler(monkeypatch):
    body = ChatRequest(messages=MESSAGES, frequency_penalty=0.5, presence_penalty=-1.0, logit_bias={"7": -100, "3": 2.5})
    sampling = body.generation_request(GenerationRequest()).sampling
    assert (sampling.frequency_penalty, sampling.presence_penalty) == (0.5, -1.0)
    assert sampling.logit_bias == ((7, -100.0), (3, 2.5))
    for bias, message in [({"x": 1}, "'x' is not a token id"), ({"1": 101}, "a bias runs from -100 to 100")]:
        with pytest.raises(RequestError) as refused:
            ChatRequest(messages=MESSAGES, logit_bias=bias).refused()
        assert refused.value.param == "logit_bias" and message in refused.value.message
    session = SimpleNamespace(target=SimpleNamespace(n_ctx=64, n_vocab=100, tokenize=lambda text, **_: [1]), unavailable=nothing_loaded)
    with pytest.raises(RequestError) as refused:
        generation.read(CompletionRequest(prompt="hi", logit_bias={"100": 1}), session, GenerationRequest())
    assert refused.value.message == "logit_bias: token ids run from 0 to 99"


def test_chat_template_kwargs_reach_the_template(monkeypatch):
    """Qwen3's enable_thinking travels in chat_template_kwargs: false closes an empty think block."""
    from specli.llama.template import render_jinja_template

    qwen3 = (Path(__file__).parent / "data" / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text()
    seen = []
    monkeypatch.setattr(generation, "chat_tokens", lambda target, messages, tools, variables=None: (
        seen.append(variables) or [1, 2, 3]))
    session = SimpleNamespace(target=SimpleNamespace(n_ctx=64, chat_template=lambda: None), unavailable=nothing_loaded)
    generation.read(ChatRequest(messages=MESSAGES, chat_template_kwargs={"enable_thinking": False}), session,
                    GenerationRequest())
    assert seen == [{"enable_thinking": False}]
    thinking, not_thinking = (render_jinja_template(qwen3, MESSAGES, bos_token="", eos_token="", variables=variables)
                              for variables in ({}, seen[0]))
    assert not_thinking == thinking + "<think>\n\n</think>\n\n"
    with pytest.raises(RequestError) as refused:
        ChatRequest(messages=MESSAGES, chat_template_kwargs={"messages": []}).refused()
    assert refused.value.param == "chat_template_kwargs" and "'messages' is the server's to set" in refused.value.message
