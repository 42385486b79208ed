"""benchmarks/structured.py's own logic: the workload loads and every schema compiles for
specli, and its validator and text comparison say what they claim."""

from __future__ import annotations

from benchmarks import structured
from specli.decode.constraint import Constraint


def test_the_extraction_workload_loads_and_every_schema_compiles():
    entries = structured.load_prompts(structured.DEFAULT_PROMPTS)
    assert len(entries) >= 12 and len({entry["name"] for entry in entries}) == len(entries)
    assert any(entry.get("heldout") for entry in entries) and any(entry.get("json_object") for entry in entries)
    for entry in entries:
        Constraint.json_schema(entry["schema_json"])
        if not entry.get("json_object"):
            assert 4 <= len(entry["schema_json"]["properties"]) <= 12, entry["name"]


def test_the_validator_finds_each_kind_of_error():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "enum": ["x", "y"]},
                                               "c": {"type": "array", "items": {"type": "string"}, "maxItems": 1}},
              "required": ["a", "b", "c"], "additionalProperties": False}
    assert structured.check_output('{"a": 1, "b": "x", "c": ["q"]}', schema) == []
    assert structured.check_output('{"a": 1, "b": "x"', schema)[0].startswith("not JSON")
    assert any("missing 'c'" in e for e in structured.check_output('{"a": 1, "b": "x"}', schema))
    assert any("extra 'd'" in e for e in structured.check_output('{"a": 1, "b": "x", "c": [], "d": 0}', schema))
    assert any("not in enum" in e for e in structured.check_output('{"a": 1, "b": "z", "c": []}', schema))
    assert any("maxItems" in e for e in structured.check_output('{"a": 1, "b": "x", "c": ["q", "r"]}', schema))
    assert any("not integer" in e for e in structured.check_output('{"a": true, "b": "x", "c": []}', schema))


def test_texts_agree_over_the_shorter_one_only():
    assert structured.agrees('{"a": 1}', '{"a": 1} and more')
    assert not structured.agrees('{"a": 1}', '{"a": 2}')
    assert not structured.agrees("", "x")
