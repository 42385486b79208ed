"""Tool-call formats: how a chat template's model writes a call, recognised from the template.

Each format says two things about its calls:
- `call(name)`: the pieces of one call to `name`, around its arguments (text, special tokens,
  and `Arguments` where JSON under a schema goes), from which grammar.py builds the constraint;
- `parse(text, final)`: the model's text (special tokens written out) split into the content
  and the calls. With `final=False` the text is a prefix of an answer still being written:
  content that might yet open a call is held back, and a call's arguments are the part of them
  already written, so that what a stream sends joins to what the whole answer holds.

Formats, by the templates that write them:
- hermes: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (Qwen2.5, Qwen3, Hermes);
- qwen3-coder: `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>...` (Qwen3-Coder);
- llama3: `{"name": ..., "parameters": {...}}`, maybe after `<|python_tag|>` (Llama 3.1 to 3.3);
- mistral: `[TOOL_CALLS]NAME[ARGS]{...}` (Mistral Small 3.2) or `[TOOL_CALLS][{"name": ..., "arguments": ...}]`;
- gpt-oss: harmony, `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Union

from specli.tools.scan import json_end


@dataclass(frozen=True)
class Special:
    """A special (control) token written by name, such as `[TOOL_CALLS]`."""

    text: str


@dataclass(frozen=True)
class Until:
    """Free text up to and including `end` (a string parameter of a qwen3-coder call)."""

    end: str


@dataclass(frozen=True)
class Arguments:
    """JSON that meets `schema` (a call's arguments, or one of them)."""

    schema: dict


@dataclass(frozen=True)
class Maybe:
    """Pieces that may be left out (an optional parameter)."""

    pieces: tuple


Piece = Union[str, Special, Until, Arguments, Maybe]


@dataclass(frozen=True)
class Call:
    """A call as parsed: its function's name and its arguments as JSON text (a prefix of them,
    for a call still being written)."""

    name: str
    arguments: str
    complete: bool = True


@dataclass(frozen=True)
class Parsed:
    content: str
    calls: list[Call] = field(default_factory=list)


class ToolFormat:
    name = ""
    # What opens a call in running text: the first piece of `before`, or of every call. None:
    # the text before a call holds special tokens, and "auto" gets no lazy grammar.
    trigger: str | Special | None = None
    separator: str = "\n"  # between parallel calls
    before: tuple[Piece, ...] = ()  # around an answer's calls, where they are wrapped
    after: tuple[Piece, ...] = ()

    def call(self, name: str, schema: dict) -> list[Piece]:
        raise NotImplementedError

    def parse(self, text: str, final: bool = True) -> Parsed:
        raise NotImplementedError


def held_back(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def _content_before(text: str, marker: str, final: bool) -> tuple[str, int]:
    """(the content before the first `marker`, where the marker starts: -1 if none yet)."""
    start = text.find(marker)
    if start >= 0:
        return text[:start], start
    return (text if final else text[: len(text) - held_back(text, marker)]), -1


_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


def _json_calls(text: str, start: int, final: bool, opener: str = "", closer: str = "") -> list[Call]:
    """Calls written as {"name": ..., "arguments"|"parameters": {...}} from `start`, each after
    `opener` (and before `closer`) when given."""
    calls: list[Call] = []
    position = start
    while True:
        if opener:
            found = text.find(opener, position)
            if found < 0:
                break
            position = found + len(opener)
        match = _NAME.match(text, position)
        if match is None:
            break
        name = json.loads(f'"{match.group(1)}"')
        begin = match.end()
        end = json_end(text, begin)
        if end is None:
            if not final:
                calls.append(Call(name, text[begin:], complete=False))
            break
        calls.append(Call(name, text[begin:end]))
        close = text.find("}", end)
        if close < 0:
            break
        position = close + 1
        if closer and text.startswith(closer, position):
            position += len(closer)
        if not opener:
            position = _skip(text, position, ";, \n")
    return calls


def _skip(text: str, position: int, characters: str) -> int:
    while position < len(text) and text[position] in characters:
        position += 1
    return position


class Hermes(ToolFormat):
    name = "hermes"
    trigger = "<tool_call>"

    def call(self, name: str, schema: dict) -> list[Piece]:
        return [f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": ', Arguments(schema), "}\n</tool_call>"]

    def parse(self, text: str, final: bool = True) -> Parsed:
        content, start = _content_before(text, "<tool_call>", final)
        calls = _json_calls(text, start, final, opener="<tool_call>") if start >= 0 else []
        return Parsed(content, calls)


class Llama3(ToolFormat):
    name = "llama3"
    trigger = '{"name": '
    separator = "; "

    def call(self, name: str, schema: dict) -> list[Piece]:
        return [f'{{"name": {json.dumps(name)}, "parameters": ', Arguments(schema), "}"]

    def parse(self, text: str, final: bool = True) -> Parsed:
        body = text.replace("<|python_tag|>", "")
        match = re.search(r'\{\s*"name"', body)
        start = match.start() if match else -1
        if start < 0:
            content = body if final else body[: len(body) - held_back(body, '{"name"')]
            return Parsed(content)
        content = body[:start]
        return Parsed(content, _json_calls(body, start, final))


class Mistral(ToolFormat):
    """Mistral's `[TOOL_CALLS]`: NAME[ARGS]{...} per call (tokenizer v11, Small 3.2), or one
    JSON list of calls (earlier tokenizers)."""

    name = "mistral"
    trigger = Special("[TOOL_CALLS]")
    separator = ""

    def __init__(self, named: bool) -> None:
        self.named = named
        if not named:
            self.before, self.after, self.separator = (Special("[TOOL_CALLS]"), "["), ("]",), ", "

    def call(self, name: str, schema: dict) -> list[Piece]:
        if self.named:
            return [Special("[TOOL_CALLS]"), name, Special("[ARGS]"), Arguments(schema)]
        return [f'{{"name": {json.dumps(name)}, "arguments": ', Arguments(schema), "}"]

    def parse(self, text: str, final: bool = True) -> Parsed:
        content, start = _content_before(text, "[TOOL_CALLS]", final)
        calls: list[Call] = []
        if start >= 0:
            rest = start + len("[TOOL_CALLS]")
            if text[rest: rest + 1] == "[":
                calls = _json_calls(text, rest + 1, final)
            else:
                calls = self._named_calls(text, start, final)
        return Parsed(content, calls)

    @staticmethod
    def _named_calls(text: str, start: int, final: bool) -> list[Call]:
        calls = []
        for match in re.finditer(r"\[TOOL_CALLS\]([^\[]+?)(?:\[CALL_ID\][^\[]*)?\[ARGS\]", text[start:]):
            begin = start + match.end()
            end = json_end(text, begin)
            if end is None:
                if not final:
                    calls.append(Call(match.group(1).strip(), text[begin:], False))
                break
            calls.append(Call(match.group(1).strip(), text[begin:end]))
        return calls


class Qwen3Coder(ToolFormat):
    """XML-like calls whose string parameters are written raw and others as JSON. The arguments
    are rebuilt as one JSON object once the call is complete (a stream sends them whole)."""

    name = "qwen3-coder"
    trigger = "<tool_call>"

    def call(self, name: str, schema: dict) -> list[Piece]:
        pieces: list[Piece] = [f"<tool_call>\n<function={name}>\n"]
        properties = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        for key, subschema in properties.items():
            value: tuple[Piece, ...] = (f"<parameter={key}>\n",)
            if isinstance(subschema, dict) and subschema.get("type") == "string" and len(subschema) <= 2:
                value += (Until("\n</parameter>\n"),)  # a plain string (with at most a description)
            else:
                value += (Arguments(subschema if isinstance(subschema, dict) else {}), "\n</parameter>\n")
            pieces += list(value) if key in required else [Maybe(value)]
        pieces.append("</function>\n</tool_call>")
        return pieces

    def parse(self, text: str, final: bool = True) -> Parsed:
        content, start = _content_before(text, "<tool_call>", final)
        calls = []
        pattern = re.compile(r"<tool_call>\s*<function=([^>\n]+)>(.*?)</function>\s*</tool_call>", re.S)
        for match in pattern.finditer(text, max(start, 0)) if start >= 0 else ():
            arguments = {}
            for key, value in re.findall(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", match.group(2), re.S):
                try:
                    arguments[key] = json.loads(value)
                except ValueError:
                    arguments[key] = value
            calls.append(Call(match.group(1).strip(), json.dumps(arguments, ensure_ascii=False)))
        return Parsed(content, calls)


class GptOss(ToolFormat):
    """OpenAI's harmony: the final channel is the content, `commentary to=functions.NAME`
    messages are calls, the analysis channel is left out."""

    name = "gpt-oss"
    trigger = None  # the text before a call holds special tokens: no lazy grammar

    def call(self, name: str, schema: dict) -> list[Piece]:
        return [Special("<|channel|>"), f"commentary to=functions.{name} ", Special("<|constrain|>"), "json",
                Special("<|message|>"), Arguments(schema)]

    def parse(self, text: str, final: bool = True) -> Parsed:
        content, calls = [], []
        messages = re.split(r"<\|start\|>", text)
        for message in messages:
            header, _, body = message.partition("<|message|>")
            body = re.split(r"<\|(?:end|call|return)\|>", body)[0]
            recipient = re.search(r"to=functions\.([\w.\-]+)", header)
            if recipient:
                begin = message.index("<|message|>") + len("<|message|>") if "<|message|>" in message else None
                if begin is None:
                    continue
                end = json_end(message, begin)
                if end is None:
                    if not final:
                        calls.append(Call(recipient.group(1), message[begin:], False))
                    continue
                calls.append(Call(recipient.group(1), message[begin:end]))
            elif "<|channel|>final" in header or ("<|channel|>" not in header and "<|message|>" in message):
                content.append(body)
        return Parsed("".join(content), calls)


def detect(template: str) -> ToolFormat | None:
    """The format a chat template's model writes calls in; None where the template takes no
    tools (it never reads the `tools` variable)."""
    if not re.search(r"\btools\b", template):
        return None
    if "<function=" in template and "<parameter=" in template:
        return Qwen3Coder()
    if "<tool_call>" in template:
        return Hermes()
    if "[TOOL_CALLS]" in template:
        return Mistral(named="[ARGS]" in template)
    if "to=functions." in template or "<|channel|>" in template:
        return GptOss()
    if "<|python_tag|>" in template or '"parameters"' in template:
        return Llama3()
    return None

