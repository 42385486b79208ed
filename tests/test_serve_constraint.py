"""`specli serve` under a constraint, through the official `openai` client: OpenAI's
`response_format` (json_object, json_schema, and the client's `parse` with a pydantic model),
llama-server's `json_schema` and `grammar` fields, provenance that names the grammar's forced
tokens, and bad schemas answered with a 400 that names the field and the place."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from helpers import specli_run
from openai import BadRequestError
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow  # real models, real processes

INVOICE = {
    "type": "object",
    "properties": {
        "invoice": {"type": "string"},
        "customer": {"type": "string"},
        "amount": {"type": "number"},
        "currency": {"type": "string", "enum": ["EUR", "USD", "GBP"]},
        "paid": {"type": "boolean"},
    },
    "required": ["invoice", "customer", "amount", "currency", "paid"],
    "additionalProperties": False,
}
INVOICE_TEXT = "Invoice INV-2291 for Northwind Traders: 1,250.00 EUR, paid on 2026-10-02."
GEMMA_PROMPT = INVOICE_TEXT + "\nThe invoice as JSON:\n"


# SmolLM2-135M, left free inside a string, may copy the whole text into it: the chat tests
# bound strings, as a schema for a small model should.
SHORT_INVOICE = {**INVOICE, "properties": {
    name: {**value, "maxLength": 32} if value.get("type") == "string" and "enum" not in value else value
    for name, value in INVOICE["properties"].items()}}


class Invoice(BaseModel):
    invoice: str = Field(max_length=32)
    customer: str = Field(max_length=32)
    amount: float
    currency: str
    paid: bool


def test_llama_servers_json_schema_field_gives_run_json_schemas_text_with_grammar_provenance(gemma_server, gemma_path,
                                                                                              tmp_path):
    schema_file = tmp_path / "invoice.json"
    schema_file.write_text(json.dumps(INVOICE))
    expected = specli_run("--target", gemma_path, "-n", 120, "--exact", "-jf", schema_file, GEMMA_PROMPT)
    client = gemma_server.client()
    whole = client.completions.create(model="x", prompt=GEMMA_PROMPT, max_tokens=120,
                                      extra_body={"json_schema": INVOICE, "exact": True})
    text = whole.choices[0].text
    assert text == expected.rstrip("\n")
    jsonschema.validate(json.loads(text), INVOICE)
    assert whole.choices[0].finish_reason == "stop"
    spans = whole.choices[0].spans
    assert "".join(span["text"] for span in spans) == text
    forced = "".join(span["text"] for span in spans if span["proposer"] == "grammar")
    assert all(span["source"] == "draft" for span in spans if span["proposer"] == "grammar")
    # A key's name is forced, unless the target wrote it right after a draft it accepted (a step's
    # own token is always the target's; the n-gram may draft the `, "` before a key).
    assert forced.startswith('invoice"'), spans
    assert sum(name in forced for name in INVOICE["properties"]) >= 3, spans
    # Streamed: the chunks join to the same text, and name the grammar's.
    chunks = list(client.completions.create(model="x", prompt=GEMMA_PROMPT, max_tokens=120, stream=True,
                                            extra_body={"json_schema": INVOICE, "exact": True}))
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == text
    assert any(chunk.choices[0].proposer == "grammar" for chunk in chunks if chunk.choices)


def test_a_grammar_field_constrains_a_completion(gemma_server):
    reply = gemma_server.client().completions.create(
        model="x", prompt="Is the sky green? Answer yes or no:", max_tokens=10,
        extra_body={"grammar": 'root ::= " yes" | " no"'})
    assert reply.choices[0].text in (" yes", " no") and reply.choices[0].finish_reason == "stop"


def test_a_token_limit_inside_the_structure_gives_length_and_the_partial_text(gemma_server):
    reply = gemma_server.client().completions.create(model="x", prompt=GEMMA_PROMPT, max_tokens=6,
                                                     extra_body={"json_schema": INVOICE})
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].text.startswith('{"invoice": ')


def test_response_format_json_schema_and_json_object_on_chat(smol_server):
    client = smol_server.client()
    messages = [{"role": "user", "content": f"{INVOICE_TEXT}\nGive the invoice as JSON."}]
    reply = client.chat.completions.create(model="x", messages=messages, max_tokens=120, response_format={
        "type": "json_schema", "json_schema": {"name": "invoice", "schema": SHORT_INVOICE, "strict": True}})
    jsonschema.validate(json.loads(reply.choices[0].message.content), SHORT_INVOICE)
    assert reply.choices[0].finish_reason == "stop"
    reply = client.chat.completions.create(model="x", messages=messages, max_tokens=120,
                                           response_format={"type": "json_object"})
    content = reply.choices[0].message.content
    assert content.startswith("{")
    if reply.choices[0].finish_reason == "stop":  # JSON mode bounds nothing: SmolLM2 may run to the limit
        assert isinstance(json.loads(content), dict)
    streamed = client.chat.completions.create(model="x", messages=messages, max_tokens=120, stream=True,
                                              response_format={"type": "json_object"})
    text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
    assert text == reply.choices[0].message.content


def test_the_openai_clients_parse_gets_a_pydantic_object(smol_server):
    client = smol_server.client()
    messages = [{"role": "user", "content": f"{INVOICE_TEXT}\nGive the invoice as JSON."}]
    completion = client.chat.completions.parse(model="x", messages=messages, max_tokens=120, response_format=Invoice)
    invoice = completion.choices[0].message.parsed
    assert isinstance(invoice, Invoice), completion.choices[0].message.content
    assert len(invoice.customer) <= 32 and completion.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("body, param, fragment", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "strin"}}}}}},
     "response_format.json_schema.schema", "at /properties/a"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}}}},
     "response_format.json_schema.schema", "uniqueItems"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "yaml"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "schema"),
    ({"json_schema": {"type": "object"}, "grammar": 'root ::= "a"'}, "grammar", "give one of"),
    ({"grammar": 'root ::= "a" b'}, "grammar", "Rule 'b' not found"),
    ({"json_schema": "not a schema"}, "json_schema", "not JSON"),
])
def test_a_bad_constraint_is_a_400_naming_the_field(gemma_server, body, param, fragment):
    client = gemma_server.client()
    with pytest.raises(BadRequestError) as raised:
        client.completions.create(model="x", prompt="hi", max_tokens=4, extra_body=body)
    error = raised.value.body
    assert raised.value.status_code == 400
    assert error["param"] == param and fragment in error["message"], error
    # And with curl's bytes: the same 400 on the chat route.
    reply = httpx.post(gemma_server.url + "/chat/completions", timeout=30, json={
        "model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param
