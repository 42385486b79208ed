"""Tool-call formats, checked against the real chat templates of the pairs models.toml ships
(tests/data/templates, from llama.cpp's test templates): each template is recognised, a call
it writes into a conversation is read back as the same call, a stream of it joins to the whole,
and the constraint for the format admits what the template writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specli.decode.constraint import Matcher, Vocabulary
from specli.llama.backend import LoadSettings, Model
from specli.llama.template import render_jinja_template
from specli.tools.formats import Hermes, Llama3, Mistral, Qwen3Coder, detect
from specli.tools.grammar import tool_constraint, tool_grammar
from specli.tools.plan import ToolPlan, ToolStream

TEMPLATES = Path(__file__).parent / "data" / "templates"
READ = {"type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}},
        "required": ["path"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": READ}}]
ARGUMENTS = {"path": "src/app/main.py", "lines": 20}

# (template, the format it writes calls in; None: it takes no tools)
FORMATS = [
    ("Qwen-Qwen2.5-7B-Instruct", "hermes"),  # Qwen2.5 and Qwen2.5-Coder pairs
    ("Qwen-Qwen3-0.6B", "hermes"),  # Qwen3 pairs
    ("Qwen3-Coder", "qwen3-coder"),  # qwen3-coder-30b-a3b
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3"),
    ("meta-llama-Llama-3.3-70B-Instruct", "llama3"),
    ("Mistral-Small-3.2-24B-Instruct-2506", "mistral"),
    ("openai-gpt-oss-120b", "gpt-oss"),
    ("smollm2-hermes-tools", "hermes"),  # the tests' template for SmolLM2 and Gemma
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", None),  # renders calls in history, but takes no tools
    ("microsoft-Phi-3.5-mini-instruct", None),
]
WITH_TOOLS = [(name, format) for name, format in FORMATS if format is not None]


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def render(source: str, messages: list[dict]) -> str:
    return render_jinja_template(source, messages, bos_token="<s>", eos_token="</s>", tools=TOOLS)


def written_call(name: str) -> str:
    """The text the template writes for an assistant's call to read_file: the conversation
    with the call, past the point where the one without it opens the assistant's turn."""
    source = template(name)
    ask = [{"role": "user", "content": "Read the first lines of main.py."}]
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "abcdefghi", "type": "function", "function": {"name": "read_file", "arguments": ARGUMENTS}}]}
    before, after = render(source, ask), render(source, ask + [call])
    common = 0
    while common < min(len(before), len(after)) and before[common] == after[common]:
        common += 1
    return after[common:]


@pytest.mark.parametrize("name, format", FORMATS)
def test_each_template_is_recognised(name, format):
    found = detect(template(name))
    assert (found.name if found else None) == format


@pytest.mark.parametrize("name, format", WITH_TOOLS)
def test_a_call_the_template_writes_is_read_back(name, format):
    text = written_call(name)
    parsed = detect(template(name)).parse(text)
    assert [(call.name, json.loads(call.arguments)) for call in parsed.calls] == [("read_file", ARGUMENTS)], text
    assert all(call.complete for call in parsed.calls)


@pytest.mark.parametrize("name, format", WITH_TOOLS)
def test_a_streamed_call_joins_to_the_whole(name, format):
    """Fed a character at a time, the deltas join to what the whole text holds: content held
    back while it may still open a call, arguments in pieces."""
    text = "Let me look. " + written_call(name) if format != "gpt-oss" else written_call(name)
    plan = ToolPlan(detect(template(name)), [("read_file", READ)], "auto")
    stream = ToolStream(plan)
    content, calls = "", {}
    for i in range(len(text)):
        for delta in stream.feed(text[i]):
            if hasattr(delta, "index"):
                calls.setdefault(delta.index, {"name": delta.name, "arguments": ""})["arguments"] += delta.arguments
            else:
                content += delta.text
    for delta in stream.finish():
        if hasattr(delta, "index"):
            calls.setdefault(delta.index, {"name": delta.name, "arguments": ""})["arguments"] += delta.arguments
        else:
            content += delta.text
    whole = plan.read(text)
    assert content == (whole.content if whole.content.strip() else "")
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [(c.name, c.arguments) for c in whole.calls]
    assert len(stream.ids) == 1


def test_a_hermes_call_streams_its_arguments_in_pieces():
    plan = ToolPlan(Hermes(), [("read_file", READ)], "required")
    stream = ToolStream(plan)
    text = '<tool_call>\n{"name": "read_file", "arguments": {"path": "src/app/main.py", "lines": 20}}\n</tool_call>'
    pieces = [delta for i in range(0, len(text), 7) for delta in stream.feed(text[i:i + 7])] + stream.finish()
    assert pieces[0].name == "read_file" and pieces[0].id.startswith("call_")
    assert len(pieces) > 3
    assert "".join(piece.arguments for piece in pieces) == '{"path": "src/app/main.py", "lines": 20}'


def test_mistral_ids_are_nine_letters_and_digits():
    plan = ToolPlan(Mistral(named=True), [("read_file", READ)], "auto")
    assert len(plan.new_id()) == 9 and plan.new_id().isalnum()


@pytest.mark.parametrize("name, format", WITH_TOOLS)
@pytest.mark.parametrize("lazy", [False, True], ids=["required", "auto"])
def test_the_grammar_of_each_format_compiles(name, format, lazy):
    found = detect(template(name))
    if lazy and found.trigger is None:
        pytest.skip("gpt-oss: no lazy grammar (the text before a call holds special tokens)")
    grammar = tool_grammar(found, [("read_file", READ), ("grep", {"type": "object"})], lazy=lazy, parallel=True,
                           special=lambda text: None)
    assert "%json" in grammar
    tool_constraint(found, [("read_file", READ)], lazy=lazy, parallel=False, special=lambda text: None)


@pytest.mark.parametrize("name", ["Qwen-Qwen2.5-7B-Instruct", "Qwen3-Coder", "meta-llama-Llama-3.1-8B-Instruct"])
@pytest.mark.parametrize("lazy", [False, True], ids=["required", "auto"])
def test_the_constraint_admits_the_call_the_template_writes(smollm_model, name, lazy):
    """The model was trained on its template's calls: the constraint must admit them token by
    token (on SmolLM2's vocabulary, for the formats written in text)."""
    model, vocabulary = smollm_model, Vocabulary(smollm_model)
    format = detect(template(name))
    text = written_call(name)
    call = text[: text.index("}\n</tool_call>") + len("}\n</tool_call>")] if "<tool_call>\n{" in text else \
        text[: text.index("</tool_call>") + len("</tool_call>")] if "<function=" in text else \
        text[: text.index("}}") + 2]
    if lazy:
        call = "Let me look.\n" + call
    matcher = Matcher(vocabulary, tool_constraint(format, [("read_file", READ)], lazy=lazy, parallel=False,
                                                  special=model.special_token))
    for token in model.tokenize(call, add_special=False, parse_special=True):
        assert matcher.allows(token), (call, model.piece(token))
        matcher.consume(token)
    if not lazy:
        assert matcher.stopped, "one call, and nothing after it"


def test_formats_parse_what_small_models_get_wrong_as_no_call():
    assert Hermes().parse("<tool_call>\nnot json\n</tool_call>").calls == []
    assert Llama3().parse("The answer is 42.").calls == []
    assert Qwen3Coder().parse("<tool_call>\n<function=read_file>\n").calls == []


def test_a_chat_template_file_with_bad_jinja_exits_2_naming_the_line(tmp_path):
    from typer.testing import CliRunner

    from specli.commands.cli import app

    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}\n{{ m.content }\n")
    result = CliRunner().invoke(app, ["run", "--target", str(tmp_path / "missing.gguf"), "--chat-template-file",
                                      str(bad), "hello"])
    assert result.exit_code == 2, result.output
    assert "is not valid Jinja" in result.output and "(line 2)" in result.output


@pytest.mark.slow  # a subprocess that loads Gemma
def test_run_formats_the_prompt_with_the_chat_template_file(gemma_path, tmp_path):
    """Gemma 3 270M has no template of its own: the file's is used, so run chats."""
    import subprocess
    import sys

    template_file = tmp_path / "plain.jinja"
    template_file.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>")
    result = subprocess.run([sys.executable, "-m", "specli", "run", "--target", str(gemma_path), "-c", "256",
                             "--chat-template-file", str(template_file), "-n", "2", "--json", "Hi there"],
                            capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    with Model(gemma_path, LoadSettings(ctx_size=256)) as model:
        expected = model.tokenize("<user>Hi there\n<assistant>", add_special=True, parse_special=True)
    assert stats["prompt_tokens"] == len(expected)
