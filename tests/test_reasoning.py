"""Reasoning models' think blocks: split off as reasoning_content, whole and streamed alike, and
kept out of the answer's constraint (tests/data/templates: Qwen3's and DeepSeek-R1-Distill's)."""

from __future__ import annotations

import pytest
from helpers import TEMPLATES

from specli.decode.constraint import Constraint, Matcher, Vocabulary
from specli.tools.formats import detect
from specli.tools.grammar import tool_constraint
from specli.tools.reasoning import Reasoning, ReasoningStream, after_prompt, thinks

QWEN3 = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
R1 = (TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text()
HERMES = (TEMPLATES / "smollm2-hermes-tools.jinja").read_text()
CITY = Constraint.json_schema({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


def test_the_reasoning_templates_think_and_others_do_not():
    assert thinks(QWEN3) and thinks(R1)
    assert not thinks(HERMES) and not thinks(None)
    assert after_prompt("<｜Assistant｜><think>\n") == Reasoning(True), "R1-Distill's generation prompt opens the block"
    assert after_prompt("<|im_start|>assistant\n") == Reasoning(False), "Qwen3's leaves it to the model"
    assert after_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n") is None, "enable_thinking false closes it"
    assert after_prompt("<｜Assistant｜><think>\n</think>") is None


@pytest.mark.parametrize(("reasoning", "text", "split"), [
    (Reasoning(False), "<think>\nParis is in France.\n</think>\n\nParis", ("Paris is in France.", "Paris")),
    (Reasoning(False), "Paris", ("", "Paris")),
    (Reasoning(False), "  <think>cut short", ("cut short", "")),
    (Reasoning(False), "a <think>b</think>", ("", "a <think>b</think>")),
    (Reasoning(True), "Paris is in France.\n</think>\n\nParis", ("Paris is in France.", "Paris")),
    (Reasoning(True), "never closed\n", ("never closed\n", "")),
])
def test_split(reasoning, text, split):
    assert reasoning.split(text) == split


@pytest.mark.parametrize("opened_by_prompt", [False, True])
@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_a_stream_joins_to_the_whole_answers_split(opened_by_prompt, size):
    reasoning = Reasoning(opened_by_prompt)
    texts = ["\n<think>\nstep one\n\nstep two\n</think>\n\n{\"city\": \"Paris\"}", "<thin", "<b>bold</b>",
             "thinking < and </ and </thin\n\n", "x\n</think>\n", "\n\n"]
    for text in texts:
        stream = ReasoningStream(reasoning)
        parts = [stream.feed(text[i:i + size]) for i in range(0, len(text), size)] + [stream.finish()]
        assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == reasoning.split(text), text


def walk(model, vocabulary, constraint: Constraint, text: str) -> bool | None:
    """Whether the constraint admits `text` token by token (None: refused), and then whether it is complete."""
    matcher = Matcher(vocabulary, constraint)
    for token in model.tokenize(text, add_special=False, parse_special=True):
        if not matcher.allows(token):
            return None
        matcher.consume(token)
    return matcher.stopped


def test_a_constraint_applies_after_the_thinking(smollm_model):
    """JSON, a grammar or tool calls after the think block; inside it, any text (even what
    looks like JSON or a call), to its first </think>."""
    model, vocabulary = smollm_model, Vocabulary(smollm_model)
    thought = '<think>\nmaybe {"town" or <tool_call> then\n</think>\n\n'
    for reasoning in (Reasoning(False), Reasoning(True)):
        constrained = reasoning.constraint(CITY)
        prompt_opened = thought.removeprefix("<think>") if reasoning.opened else thought
        assert walk(model, vocabulary, constrained, prompt_opened + '{"city": "Paris"}') is True
        assert walk(model, vocabulary, constrained, prompt_opened + "Paris") is None, "the answer is still held"
    assert walk(model, vocabulary, Reasoning(False).constraint(CITY), '{"city": "Paris"}') is True, "no thinking"
    assert walk(model, vocabulary, Reasoning(False).constraint(CITY), "Paris") is None
    assert Reasoning(False).constraint(None) is None
    grammar = Reasoning(False).constraint(Constraint.gbnf('root ::= "yes" | "no"'))
    assert walk(model, vocabulary, grammar, thought + "yes") is True
    hermes = detect(HERMES)
    call = '<tool_call>\n{"name": "f", "arguments": {"x": "y"}}\n</tool_call>'
    for lazy in (False, True):
        tools = tool_constraint(hermes, [("f", {"type": "object", "properties": {"x": {"type": "string"}}})],
                                lazy=lazy, parallel=False, special=model.special_token)
        assert walk(model, vocabulary, Reasoning(False).constraint(tools), thought + call) is not None
