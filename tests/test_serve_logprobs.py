"""Logprobs through the API, with the official `openai` client: a chat's `logprobs` and
`top_logprobs`, a completion's `logprobs: N`, whole and streamed (the streamed chunks' add up
to the whole answer's, bit for bit under `exact`), with tools too (tokens whose text a call
holds back keep their logprobs for the chunk that counts them)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # real models, real processes

ASK = [{"role": "user", "content": "Name three colours."}]
PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"


def test_a_chats_logprobs_are_its_tokens(smol_server):
    client = smol_server.client()
    answer = client.chat.completions.create(model="x", messages=ASK, max_tokens=24, temperature=0, logprobs=True,
                                            top_logprobs=3)
    choice = answer.choices[0]
    content = choice.logprobs.content
    assert len(content) == answer.usage.completion_tokens
    assert "".join(entry.token for entry in content) == choice.message.content
    for entry in content:
        values = [top.logprob for top in entry.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True) and values[0] <= 0
        assert entry.bytes == list(entry.token.encode())
        same = [top.logprob for top in entry.top_logprobs if top.token == entry.token]
        assert entry.logprob == (same[0] if same else entry.logprob) and entry.logprob <= values[0]


def streamed_chat(client, **body):
    entries, text = [], ""
    for chunk in client.chat.completions.create(model="x", stream=True, **body):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            entries += choice.logprobs.content if choice.logprobs and choice.logprobs.content else []
    return entries, text


def test_a_streamed_chats_logprobs_add_up_to_the_whole_answers(smol_server):
    client = smol_server.client()
    body = dict(messages=ASK, max_tokens=24, temperature=0, logprobs=True, top_logprobs=2,
                extra_body={"exact": True, "draft": "ngram"})
    whole = client.chat.completions.create(model="x", **body)
    entries, text = streamed_chat(client, **body)
    assert text == whole.choices[0].message.content
    assert [e.model_dump() for e in entries] == [e.model_dump() for e in whole.choices[0].logprobs.content]


def test_a_completions_logprobs_give_tokens_alternatives_and_offsets(gemma_server):
    client = gemma_server.client()
    body = dict(model="x", prompt=PROMPT, max_tokens=30, temperature=0, logprobs=2, extra_body={"exact": True})
    whole = client.completions.create(**body).choices[0]
    logprobs = whole.logprobs
    n = len(logprobs.tokens)
    assert n and len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == len(logprobs.text_offset) == n
    assert "".join(logprobs.tokens).startswith(whole.text)
    offsets = [len(PROMPT) + len("".join(logprobs.tokens[:i])) for i in range(n)]
    assert logprobs.text_offset == offsets, "from the prompt's end, as OpenAI's"
    assert all(0 < len(top) <= 2 and max(top.values()) <= 0 for top in logprobs.top_logprobs)
    streamed = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for chunk in client.completions.create(stream=True, **body):
        for choice in chunk.choices:
            for name in streamed:
                streamed[name] += getattr(choice.logprobs, name) if choice.logprobs else []
    assert streamed == {name: getattr(logprobs, name) for name in streamed}


def test_tool_call_tokens_keep_their_logprobs_when_streamed(smol_tools):
    """A named call: its frame is forced (grammar rows ask logits too, for their logprobs) and
    its text is held while the call is read; every token's logprob still goes out once."""
    client = smol_tools.client()
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    chunks = list(client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[tool], max_tokens=40,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=0, logprobs=True,
        stream=True, stream_options={"include_usage": True}))
    entries = [entry for chunk in chunks for choice in chunk.choices if choice.logprobs
               for entry in choice.logprobs.content or []]
    calls = [call for chunk in chunks for choice in chunk.choices for call in choice.delta.tool_calls or []]
    assert calls and calls[0].function.name == "get_weather"
    assert len(entries) == chunks[-1].usage.completion_tokens
    assert all(entry.logprob <= 0 for entry in entries)
