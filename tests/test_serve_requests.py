"""How `specli serve` reads a request, without a server: which fields are refused by name,
which are ignored, and what a request that names no draft gets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specli.serve.app import _default_draft
from specli.serve.schema import ChatRequest, CompletionRequest, RequestError

MESSAGES = [{"role": "user", "content": "hi"}]


def refused_param(request) -> str | None:
    try:
        request.refused()
    except RequestError as error:
        return error.param
    return None


@pytest.mark.parametrize("field, value", [
    ("reasoning_effort", "high"), ("grammar", "root ::= \"a\""), ("json_schema", {"type": "object"}),
    ("ignore_eos", True), ("mirostat", 2), ("typical_p", 0.5), ("dry_multiplier", 0.8), ("xtc_probability", 0.5),
    ("n_predict", 12), ("chat_template_kwargs", {"enable_thinking": False}),
])
def test_fields_other_servers_honour_are_refused_by_name(field, value):
    assert refused_param(ChatRequest(messages=MESSAGES, **{field: value})) == field
    assert refused_param(CompletionRequest(prompt="hi", **{field: value})) == field


def test_fields_that_change_nothing_are_ignored():
    request = ChatRequest(messages=MESSAGES, user="me", store=False, metadata={"a": "b"}, cache_prompt=True,
                          reasoning_effort=None, parallel_tool_calls=False, service_tier="auto")
    assert refused_param(request) is None


def test_an_assistant_message_with_tool_calls_is_refused():
    messages = [*MESSAGES, {"role": "assistant", "content": None,
                            "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
    assert refused_param(ChatRequest(messages=messages)) == "messages[1].tool_calls"


def test_logprobs_zero_asks_for_the_chosen_tokens_logprob_on_completions():
    assert refused_param(CompletionRequest(prompt="hi", logprobs=0)) == "logprobs"
    assert refused_param(CompletionRequest(prompt="hi", logprobs=False)) is None
    assert refused_param(ChatRequest(messages=MESSAGES, logprobs=False)) is None
    assert refused_param(ChatRequest(messages=MESSAGES, logprobs=True)) == "logprobs"


@pytest.mark.parametrize("proposer, draft_model, expected", [
    ("draft+ngram", object(), "model"),  # a draft model with lookup in front (the default)
    ("draft", object(), "model"),  # --no-ngram
    ("ngram", None, "ngram"),
    ("none", None, "none"),
])
def test_a_request_that_names_no_draft_gets_the_servers_own(proposer, draft_model, expected):
    worker = SimpleNamespace(draft_model=draft_model, session=SimpleNamespace(proposer=SimpleNamespace(name=proposer)))
    assert _default_draft(worker) == expected
