"""Constrained generation on the real models: JSON schemas and GBNF grammars through
llguidance. Every output that ends meets its schema; speculative output is plain decoding's
under the same constraint (greedy, seeded, --exact; n-gram lookup, a draft model, a draft
model of another vocabulary); forced tokens come from the grammar and need no verify row;
bad schemas and grammars are refused naming the place."""

from __future__ import annotations

import json
from dataclasses import replace

import jsonschema
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from helpers import assert_one_line_error, traced

from specli.decode.constraint import Constraint, ConstraintError, Matcher
from specli.decode.draft_model import DraftModel, DraftModelProposer
from specli.decode.request import DraftKind, GenerationRequest
from specli.decode.sampling import SamplingSettings
from specli.llama.backend import LoadSettings
from specli.prompt import prompt_tokens
from specli.session import SessionSpec, open_session

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string", "enum": ["Paris", "London", "New York"]},
        "email": {"type": "string"},
        "vip": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "email", "vip"],
    "additionalProperties": False,
}
PERSON_PROMPT = ("Customer record: Alice Smith, 31 years old, lives in New York, email alice.smith@example.com, "
                 "VIP customer since 2019.\nThe record as JSON:\n")
ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "items": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "total": {"type": "number"},
        "shipping": {"type": "object", "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
                     "required": ["street", "zip"], "additionalProperties": False},
    },
    "required": ["order_id", "items", "total", "shipping"],
    "additionalProperties": False,
}
ORDER_PROMPT = ("Order A-1042 from 2026-03-14: 2x blue mug, 1x teapot. Total 37.50 EUR. Ship to 12 Rue Cler, "
                "75007 Paris.\nThe order as JSON:\n")
LOAD = LoadSettings(ctx_size=1024)




def tokens_of(session, prompt: str) -> list[int]:
    return prompt_tokens(session.target, prompt, chat=False)


# --- bad input: refused naming the place, before any model is loaded ---------------------


@pytest.mark.parametrize("schema, fragments", [
    ('{"type": "object",', ["not JSON", "line 1 column 19"]),
    ('["a list"]', ["must be a JSON object", "list"]),
    ({"type": "object", "properties": {"a": {"type": "strin"}}}, ["at /properties/a", "Invalid type: strin"]),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string", "uniqueItems": True}}}},
     ["at /properties/a/items", "uniqueItems"]),
    ({"type": "object", "properties": {"a/b": {"not": {"type": "string"}}}}, ["at /properties/a~1b", '"not"']),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, ["at /properties/a", "/$defs/missing"]),
])
def test_a_schema_llguidance_cannot_use_is_refused_naming_the_place(schema, fragments):
    with pytest.raises(ConstraintError) as raised:
        Constraint.json_schema(schema if isinstance(schema, (str, dict)) else json.dumps(schema))
    for fragment in fragments:
        assert fragment in raised.value.message, raised.value.message
    assert "\n" not in raised.value.message
    assert raised.value.exit_code == 2


@pytest.mark.parametrize("grammar, fragment", [
    ('root ::= "a" b', "Rule 'b' not found"),
    ('root ::= "a" (', "GBNF"),
    ("", "empty"),
])
def test_a_grammar_that_does_not_parse_is_refused(grammar, fragment):
    with pytest.raises(ConstraintError) as raised:
        Constraint.gbnf(grammar)
    assert fragment in raised.value.message


def test_the_cli_refuses_a_bad_schema_with_one_line_and_exit_2(tmp_path):
    from typer.testing import CliRunner

    from specli.commands.cli import app

    schema_file = tmp_path / "schema.json"
    schema_file.write_text('{"type": "object", "properties": {"a": {"type": "array", "contains": {}}}}')
    result = CliRunner().invoke(app, ["run", "-jf", str(schema_file), "hello"])
    assert_one_line_error(result, 2, "at /properties/a", "contains", str(schema_file))
    result = CliRunner().invoke(app, ["run", "--grammar", 'root ::= "a" b', "hello"])
    assert_one_line_error(result, 2, "--grammar", "Rule 'b' not found")
    result = CliRunner().invoke(app, ["run", "-j", "{}", "--grammar", 'root ::= "a"', "hello"])
    assert_one_line_error(result, 2, "give one of --grammar, --json-schema, not several")


# --- the real models --------------------------------------------------------------------



@pytest.mark.slow
@pytest.mark.parametrize("schema, prompt", [(PERSON, PERSON_PROMPT), (ORDER, ORDER_PROMPT)])
def test_lookup_under_a_schema_writes_valid_json_in_fewer_steps(gemma_session, schema, prompt):
    tokens = tokens_of(gemma_session, prompt)
    request = GenerationRequest(max_tokens=160, constraint=Constraint.json_schema(schema))
    plain = traced(gemma_session, tokens, replace(request, draft=DraftKind.NONE))
    assert plain[3] == "eog", plain[1]
    jsonschema.validate(json.loads(plain[1]), schema)
    assert set(plain[2]) == {"target"}, "plain decoding forces nothing: one token a step"
    for draft_tokens in (1, 4, 16):
        ids, text, who, reason, stats = traced(gemma_session, tokens, replace(request, draft=DraftKind.NGRAM,
                                                                     draft_tokens=draft_tokens))
        assert reason == "eog"
        jsonschema.validate(json.loads(text), schema)
        assert stats.forced == who.count("grammar") > 0
        assert stats.steps < plain[4].steps


@pytest.mark.slow
def test_lookup_under_a_schema_writes_plain_decodings_text(gemma_session):
    """Greedy, at three draft lengths. The text, not the ids: where the schema forces a
    space, " false" and " " + "false" are both allowed, 0.02 apart in Gemma's logits, and a
    batch of another size may round either way. Gemma 3 270M's answers under a schema hold
    many such near-ties (ORDER_PROMPT has one of 0.07 at "A" against "1"): --exact, below,
    compares the ids on both prompts."""
    tokens = tokens_of(gemma_session, PERSON_PROMPT)
    request = GenerationRequest(max_tokens=160, constraint=Constraint.json_schema(PERSON))
    plain = traced(gemma_session, tokens, replace(request, draft=DraftKind.NONE))
    for draft_tokens in (1, 4, 16):
        text = traced(gemma_session, tokens, replace(request, draft=DraftKind.NGRAM, draft_tokens=draft_tokens))[1]
        assert text == plain[1], draft_tokens


@pytest.mark.slow
def test_forced_tokens_are_the_keys_and_punctuation(gemma_session):
    tokens = tokens_of(gemma_session, PERSON_PROMPT)
    ids, text, who, reason, stats = traced(gemma_session, tokens, GenerationRequest(
        max_tokens=160, constraint=Constraint.json_schema(PERSON), draft=DraftKind.NGRAM, draft_tokens=4))
    forced = "".join(gemma_session.target.piece(token).decode() for token, w in zip(ids, who) if w == "grammar")
    for key in PERSON["properties"]:
        assert key in forced, (key, forced)
    # The rest of an enum value once its first token is chosen: "New" is the target's, " York" is forced.
    assert "York" in forced


@pytest.mark.slow
def test_a_token_limit_inside_the_structure_ends_with_length_and_the_partial_text(gemma_session):
    tokens = tokens_of(gemma_session, PERSON_PROMPT)
    request = GenerationRequest(max_tokens=9, constraint=Constraint.json_schema(PERSON), draft=DraftKind.NGRAM)
    ids, text, who, reason, stats = traced(gemma_session, tokens, request)
    assert reason == "length" and len(ids) == 9
    whole = traced(gemma_session, tokens, replace(request, max_tokens=160))[1]
    assert whole.startswith(text) and text != whole
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


@pytest.mark.slow
def test_a_gbnf_grammar_constrains_and_ends_the_answer(gemma_session):
    tokens = tokens_of(gemma_session, "Is the sky green? Answer yes or no:")
    request = GenerationRequest(max_tokens=20, constraint=Constraint.gbnf('root ::= " yes" | " no"'))
    for draft in (DraftKind.NONE, DraftKind.NGRAM):
        ids, text, who, reason, stats = traced(gemma_session, tokens, replace(request, draft=draft))
        assert text in (" yes", " no") and reason == "eog"


@pytest.mark.slow
def test_a_seed_writes_one_text_under_a_schema_whatever_drafts_it(gemma_path):
    """Sampling keyed by (seed, position) from the masked row: the same text from plain
    decoding, lookup at several lengths and -k auto. --exact, so that batch shapes cannot
    round a near-tie otherwise."""
    spec = SessionSpec(gemma_path, None, LOAD, LOAD, exact=True)
    request = GenerationRequest(max_tokens=120, sampling=SamplingSettings.for_temperature(0.9), seed=11, exact=True,
                                constraint=Constraint.json_schema(ORDER))
    with open_session(spec) as session:
        tokens = tokens_of(session, ORDER_PROMPT)
        texts = {}
        for draft, draft_tokens in ((DraftKind.NONE, "auto"), (DraftKind.NGRAM, 2), (DraftKind.NGRAM, "auto")):
            ids, text, who, reason, stats = traced(session, tokens, replace(request, draft=draft, draft_tokens=draft_tokens))
            texts[(draft, draft_tokens)] = ids
            if reason == "eog":
                jsonschema.validate(json.loads(text), ORDER)
        greedy = traced(session, tokens, replace(request, sampling=SamplingSettings(), draft=DraftKind.NONE))[0]
    assert len({tuple(ids) for ids in texts.values()}) == 1, texts
    assert texts[(DraftKind.NONE, "auto")] != greedy, "the seed was used"


@pytest.mark.slow
@pytest.mark.parametrize("schema, prompt", [(PERSON, PERSON_PROMPT), (ORDER, ORDER_PROMPT)])
def test_exact_under_a_schema_is_plain_decoding_at_every_draft_length(gemma_path, schema, prompt):
    """Rows without logits (before forced tokens) count toward the exact batch; the ids are
    plain decoding's, near-ties included."""
    spec = SessionSpec(gemma_path, None, LOAD, LOAD, exact=True)
    request = GenerationRequest(max_tokens=120, exact=True, constraint=Constraint.json_schema(schema))
    with open_session(spec) as session:
        tokens = tokens_of(session, prompt)
        plain = traced(session, tokens, replace(request, draft=DraftKind.NONE))[0]
        for draft_tokens in (*range(1, session.exact().largest), "auto"):
            ids, text, who, reason, stats = traced(session, tokens, replace(request, draft=DraftKind.NGRAM,
                                                                           draft_tokens=draft_tokens))
            assert ids == plain, draft_tokens
            assert stats.forced > 0 or session.exact().largest == 1


@pytest.mark.slow
def test_a_draft_model_drafts_under_the_mask_and_writes_plain_decodings_text(smollm_path):
    """SmolLM2 drafting for itself under a schema: what it proposes, the constraint allows
    (its rows are masked as the target's are), and the output is plain decoding's."""
    with open_session(SessionSpec(smollm_path, smollm_path, LOAD, LOAD)) as session:
        tokens = prompt_tokens(session.target, PERSON_PROMPT + "Reply with the JSON only.", chat=True)
        request = GenerationRequest(max_tokens=120, constraint=Constraint.json_schema(PERSON), lookup=False)
        plain = traced(session, tokens, replace(request, draft=DraftKind.NONE))
        assert plain[3] == "eog"
        jsonschema.validate(json.loads(plain[1]), PERSON)
        ids, text, who, reason, stats = traced(session, tokens, replace(request, draft=DraftKind.MODEL, draft_tokens=6))
        assert ids == plain[0]
        assert stats.accepted_by.get("draft", 0) > 0 and stats.forced > 0

        matcher = Matcher(session.vocabulary(), Constraint.json_schema(PERSON))
        matcher.consume(session.target.tokenize('{"', add_special=False)[0])
        proposer = DraftModelProposer(DraftModel(session.loaded[DraftKind.MODEL].model), SamplingSettings(), constraint=matcher)
        proposal = proposer.propose(tokens + session.target.tokenize('{"', add_special=False), 12).tokens
        assert len(proposal) == 12 and matcher.valid_prefix(proposal) == 12
        assert matcher.forced() == session.target.tokenize('name', add_special=False)[0], "left where it was"


@pytest.mark.slow
def test_a_draft_model_of_another_vocabulary_drafts_through_text_under_a_schema(gemma_path, smollm_path):
    with open_session(SessionSpec(gemma_path, smollm_path, LOAD, LOAD)) as session:
        assert session.loaded[DraftKind.MODEL].through_text
        tokens = tokens_of(session, ORDER_PROMPT)
        request = GenerationRequest(max_tokens=120, constraint=Constraint.json_schema(ORDER), draft_tokens=4)
        plain = traced(session, tokens, replace(request, draft=DraftKind.NONE))
        ids, text, who, reason, stats = traced(session, tokens, replace(request, draft=DraftKind.MODEL))
        assert ids == plain[0]
        assert stats.forced > 0


# --- hypothesis: schemas of every shape the workload uses -------------------------------


def _leaf():
    return st.one_of(
        st.just({"type": "string", "maxLength": 24}),
        st.just({"type": "integer", "minimum": 0, "maximum": 9999}),
        st.just({"type": "number", "minimum": 0, "maximum": 100, "multipleOf": 0.25}),  # (unbounded decimals: zeros to the limit)
        st.just({"type": "boolean"}),
        st.lists(st.sampled_from(["red", "green", "blue", "New York", "n/a", "42"]), min_size=1, max_size=4,
                 unique=True).map(lambda values: {"type": "string", "enum": values}),
        st.just({"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}),
    )


def _object(children):
    names = st.sampled_from(["id", "name", "city", "count", "tags", "status", "owner", "level", "note"])
    return st.dictionaries(names, children, min_size=1, max_size=4).map(lambda properties: {
        "type": "object", "properties": properties, "required": sorted(properties), "additionalProperties": False})


SCHEMAS = _object(st.recursive(_leaf(), lambda inner: _object(inner), max_leaves=6))


@pytest.mark.slow
@settings(max_examples=12, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=SCHEMAS)
def test_every_generated_schema_gets_valid_json(gemma_session, schema):
    """Objects, arrays, enums, numbers, nesting, additionalProperties false: the answer
    parses and validates. (Shrinking is off: each example is a real generation.)"""
    tokens = tokens_of(gemma_session, "Ticket 7781 opened by Dana Reyes (Berlin): the red build is failing again.\nJSON:\n")
    request = GenerationRequest(max_tokens=200, constraint=Constraint.json_schema(schema), draft_tokens=6)
    ids, text, who, reason, stats = traced(gemma_session, tokens, request)
    assert reason == "eog", text
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.slow
def test_where_bytes_are_forced_only_their_canonical_token_is_allowed(gemma_session):
    """After '{"' the schema forces "name": llguidance's grammar admits "n" or "na" as well, but
    its mask allows only the canonical token, and plain decoding's check (`allows`) must agree
    with the mask, or plain and speculative decoding would write different tokens."""
    target = gemma_session.target
    matcher = Matcher(gemma_session.vocabulary(), Constraint.json_schema(PERSON))
    matcher.consume(target.tokenize('{"', add_special=False)[0])
    forced = matcher.forced()
    assert target.piece(forced) == b"name"
    mask = matcher.mask()
    assert mask.sum() == 1 and mask[forced] and matcher.allows(forced)
    spellings = [target.tokenize(prefix, add_special=False) for prefix in ("n", "na", "nam")]
    prefixes = [tokens[0] for tokens in spellings if len(tokens) == 1]
    assert prefixes and all(matcher.valid_prefix([token]) == 1 for token in prefixes), "the grammar admits them"
    assert not any(matcher.allows(token) for token in prefixes), "the mask does not"


@pytest.mark.slow
def test_an_integer_without_bounds_ends_within_the_safe_range(gemma_session):
    """As llama.cpp's schema grammars hold an integer to 16 digits: without a bound, Gemma
    wrote "timeout_ms": 1000... until the token limit on the extraction workload."""
    matcher = Matcher(gemma_session.vocabulary(), Constraint.json_schema(
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}))
    for digits, allowed in ((16, True), (17, False)):
        matcher.reset()
        tokens = gemma_session.target.tokenize('{"n": 1' + "0" * (digits - 1), add_special=False)
        assert (matcher.valid_prefix(tokens) == len(tokens)) is allowed, digits
    bounded = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}
    matcher = Matcher(gemma_session.vocabulary(), Constraint.json_schema(bounded))
    tokens = gemma_session.target.tokenize('{"n": 1' + "0" * 20, add_special=False)
    assert matcher.valid_prefix(tokens) == len(tokens), "a schema's own bound is left as it is"


@pytest.mark.slow
@pytest.mark.parametrize("schema, closed", [
    ({"type": "object", "properties": {"name": {"type": "string"}}}, True),
    ({"type": "object", "properties": {}}, True),  # a tool without parameters takes no argument
    ({"type": "object", "properties": {"name": {"type": "string"}}, "additionalProperties": True}, False),
    ({"type": "object"}, False),  # JSON mode without a schema stays open
    ({"type": "object", "properties": {"person": {"$ref": "#/$defs/P"}}, "required": ["person"],
      "$defs": {"P": {"type": "object", "properties": {"name": {"type": "string"}}}}}, True),
])
def test_an_object_that_lists_properties_admits_no_other_key(gemma_session, schema, closed):
    """As llama.cpp's schema grammars and OpenAI's strict mode read a schema: listed
    `properties` without `additionalProperties` close the object, at every depth."""
    listed = schema.get("properties") or {}
    text = ('{"person": {"name": "A", "gender": "f"}}' if "person" in listed else
            '{"name": "A", "gender": "f"}' if listed else '{"gender": "f"}')
    matcher = Matcher(gemma_session.vocabulary(), Constraint.json_schema(schema))
    tokens = gemma_session.target.tokenize(text, add_special=False)
    assert (matcher.valid_prefix(tokens) == len(tokens)) is not closed, text


def test_an_allof_member_does_not_close_its_object():
    """allOf members list the properties their siblings do not: closing one would refuse the others' keys."""
    from specli.decode.constraint import _prepared

    schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}},
                        {"type": "object", "properties": {"b": {"type": "string"}}}]}
    assert all("additionalProperties" not in member for member in _prepared(schema)["allOf"])
