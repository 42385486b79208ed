"""--exact with drafting writes --exact --draft none's ids on generated cases and on the public
extraction prompts with their schemas (Gemma 3 270M).

hypothesis draws small JSON schemas (strings, integers, booleans, enums, objects nested one
level) and prompts of 250-600 tokens, which start where verify batches leave the KV cache's
first 256 cells (where, on a CPU build, a batch of rows rounds otherwise than one-token
decodes do: --exact caps batches by position). The same for a tool call under exact (a
served request's tools constraint: calls only, in the Hermes format). Each example is two
real generations, so the counts stay small and shrinking is off.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import generated
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from specli.decode.constraint import Constraint
from specli.decode.request import AUTO, DraftKind, GenerationRequest
from specli.prompt import prompt_tokens
from specli.tools.formats import Hermes
from specli.tools.plan import ToolPlan

pytestmark = pytest.mark.slow  # real generations

GENERATED = settings(max_examples=4, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
                     suppress_health_check=[HealthCheck.function_scoped_fixture])

NAMES = ["id", "name", "city", "count", "active", "status", "owner", "level", "note", "year"]
LEAVES = st.one_of(
    st.just({"type": "string", "maxLength": 24}),
    st.just({"type": "integer", "minimum": 0, "maximum": 9999}),
    st.just({"type": "boolean"}),
    st.lists(st.sampled_from(["open", "closed", "Berlin", "New York", "n/a", "42"]), min_size=1, max_size=4,
             unique=True).map(lambda values: {"type": "string", "enum": values}),
)


def _object(children) -> st.SearchStrategy[dict]:
    return st.dictionaries(st.sampled_from(NAMES), children, min_size=1, max_size=4).map(lambda properties: {
        "type": "object", "properties": properties, "required": sorted(properties), "additionalProperties": False})


SCHEMAS = _object(st.one_of(LEAVES, _object(LEAVES)))  # nested one level at most

# Prose the prompt is made of, in the order drawn, until it holds the number of tokens drawn.
SENTENCES = [
    "Ticket 7781 was opened by Dana Reyes in Berlin after the nightly build failed for the third time.",
    "The build runs on four workers, and the failing step is the integration suite for the billing service.",
    "Marco Silva in New York owns the billing service and was asked to look at the failure before noon.",
    "The status page still shows every system as operational, which confused two customers this morning.",
    "Level 2 support escalated the ticket at 09:40 after a customer reported a duplicated invoice.",
    "The duplicated invoice had the id 5531 and was sent to a customer whose account is closed.",
    "A note in the runbook says that invoices are never sent twice, since the queue removes duplicates.",
    "The queue was upgraded last week, in the same release that changed the retry count from 3 to 5.",
    "Nobody has checked whether the retries and the duplicate invoices started on the same day.",
    "The owner of the queue, Priya Nair, is on leave until Monday and left no note about the upgrade.",
    "In 2024 a similar failure was fixed by pinning the queue's client library to an older version.",
    "The team agreed that the ticket stays open until the duplicated invoices have been refunded.",
]
PROMPTS = st.tuples(st.integers(min_value=250, max_value=560), st.permutations(SENTENCES))
DRAFT_TOKENS = st.sampled_from([AUTO, 2, 4])


def prompt_of(session, drawn: tuple[int, list[str]], ask: str) -> list[int]:
    """The drawn sentences, repeated in their order until the prompt holds the drawn number of
    tokens, then `ask`."""
    length, sentences = drawn
    text, i = "", 0
    while len(tokens := session.target.tokenize(text + ask)) < length:
        text += sentences[i % len(sentences)] + " "
        i += 1
    assert 250 <= len(tokens) <= 600
    return tokens


def drafted_and_plain(session, tokens: list[int], request: GenerationRequest) -> tuple[list[int], list[int]]:
    """The ids of the request with n-gram drafting and with --draft none, each from an empty
    cache (as `run --exact` starts)."""
    ids = []
    for draft in (DraftKind.NGRAM, DraftKind.NONE):
        session.clear_cache()
        ids.append(generated(session.engine_for(replace(request, draft=draft)), tokens)[0])
    return ids[0], ids[1]


@GENERATED
@given(schema=SCHEMAS, drawn=PROMPTS, draft_tokens=DRAFT_TOKENS)
def test_exact_under_a_generated_schema_writes_plain_decodings_ids(gemma_exact_session, schema, drawn, draft_tokens):
    session = gemma_exact_session
    ask = f"\nThe ticket above as JSON, with the fields {', '.join(schema['properties'])}:\n"
    tokens = prompt_of(session, drawn, ask)
    request = GenerationRequest(max_tokens=48, exact=True, draft_tokens=draft_tokens,
                                constraint=Constraint.json_schema(schema))
    drafted, plain = drafted_and_plain(session, tokens, request)
    assert drafted == plain
    assert plain


@GENERATED
@given(parameters=st.lists(SCHEMAS, min_size=1, max_size=2), drawn=PROMPTS, draft_tokens=DRAFT_TOKENS)
def test_exact_tool_call_under_generated_parameters_writes_plain_decodings_ids(gemma_exact_session, parameters,
                                                                                drawn, draft_tokens):
    """tool_choice "required": the call's frame (<tool_call>, the name's key, "arguments") is
    forced by the grammar, the rest is the model's."""
    session = gemma_exact_session
    functions = [(name, schema) for name, schema in zip(("file_ticket", "update_ticket"), parameters)]
    plan = ToolPlan(Hermes(), functions, "required", parallel=False)
    ask = f"\nTools: {', '.join(name for name, _ in functions)}. Call one with the ticket above.\n"
    tokens = prompt_of(session, drawn, ask)
    request = GenerationRequest(max_tokens=48, exact=True, draft_tokens=draft_tokens,
                                constraint=plan.constraint(session.target.special_token))
    drafted, plain = drafted_and_plain(session, tokens, request)
    assert drafted == plain
    assert len(plain) > 8, "the call's frame and more"


EXTRACTION = Path(__file__).parent.parent / "benchmarks" / "prompts" / "extraction.toml"


def extraction_prompts() -> list[dict]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads(EXTRACTION.read_text(encoding="utf-8"))["prompt"]


def test_exact_writes_plain_decodings_ids_on_every_public_extraction_prompt(gemma_exact_session):
    """benchmarks/prompts/extraction.toml: 20 prompts of 60-300 tokens (some cross 256), each
    with its schema (or any JSON object), as structured.py runs them, -k auto."""
    session = gemma_exact_session
    parted = []
    for entry in extraction_prompts():
        schema = {"type": "object"} if entry.get("json_object") else json.loads(entry["schema"])
        tokens = prompt_tokens(session.target, entry["prompt"], chat=False)
        request = GenerationRequest(max_tokens=160, exact=True, constraint=Constraint.json_schema(schema))
        drafted, plain = drafted_and_plain(session, tokens, request)
        if drafted != plain:
            parted.append(entry["name"])
    assert not parted, parted
