"""A request's tools, in the format of the model that answers it: the constraint its answer
is written under, and the calls read back out of that answer, whole or streamed.

The model's text is read with its special tokens written out (`[TOOL_CALLS]`, `<|channel|>`):
they mark where calls begin.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field
from typing import Callable, Union

from specli.decode.constraint import Constraint
from specli.decode.text import TextStream
from specli.errors import SpecliError
from specli.tools.formats import Parsed, ToolFormat, detect
from specli.tools.grammar import tool_constraint


class ToolsUnsupported(SpecliError):
    """The chat template takes no tools: they are refused, never dropped."""


def tool_format(template: str | None, model_name: str) -> ToolFormat:
    """The format the template's model writes calls in, or ToolsUnsupported."""
    hint = "start specli serve with --chat-template-file FILE, a template that takes tools"
    if not template:
        raise ToolsUnsupported(f"{model_name} has no chat template", hint)
    format = detect(template)
    if format is None:
        raise ToolsUnsupported(f"the chat template of {model_name} takes no tools", hint)
    return format


@dataclass(frozen=True)
class ToolPlan:
    format: ToolFormat
    functions: list[tuple[str, dict]]  # (name, parameters schema)
    choice: str  # "none", "auto", "required", or the name of the function that must be called
    parallel: bool = True  # an answer may hold several calls

    def constraint(self, special: Callable[[str], int | None], answer: Constraint | None = None) -> Constraint | None:
        """What the answer is written under: exactly one call (a named function), calls only
        ("required"), free text until a call opens ("auto"), or nothing ("none", or "auto" in
        a format whose text before a call holds special tokens). With a typed `answer` (a
        response format's JSON schema), "auto" is calls or that answer, and "none" that answer.
        `special`: a special token's id by name."""
        if self.choice == "none" or (self.choice == "auto" and answer is None and self.format.trigger is None):
            return answer
        named = self.choice not in ("auto", "required")
        functions = [(name, schema) for name, schema in self.functions if not named or name == self.choice]
        lazy = self.choice == "auto" and answer is None
        return tool_constraint(self.format, functions, lazy=lazy, parallel=self.parallel and not named,
                               special=special, answer=answer if self.choice == "auto" else None)

    def read(self, text: str) -> Parsed:
        """The whole answer's content and calls (none where the choice was "none")."""
        if self.choice == "none":
            return Parsed(text)
        return self.format.parse(text, final=True)

    def new_id(self) -> str:
        """A call's id: Mistral's templates take 9 letters and digits, others OpenAI's `call_...`."""
        alphabet = string.ascii_letters + string.digits
        if self.format.name == "mistral":
            return "".join(secrets.choice(alphabet) for _ in range(9))
        return "call_" + "".join(secrets.choice(alphabet) for _ in range(24))


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class CallDelta:
    """A call's first delta carries its id and name; later ones pieces of its arguments."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


Delta = Union[ContentDelta, CallDelta]


@dataclass
class ToolStream:
    """Reads a streamed answer: text in as it is written (special tokens written out), deltas
    out that join to what `ToolPlan.read` finds in the whole. Content that is only blank
    before a call is never sent (the whole answer's content is then empty)."""

    plan: ToolPlan
    ids: list[str] = field(default_factory=list)  # the ids given, one per call
    text: str = ""
    _content: int = 0  # characters of content sent
    _arguments: list[int] = field(default_factory=list)  # characters of each call's arguments sent
    cut: bool = False  # the text so far ends inside a call's arguments

    def feed(self, text: str, final: bool = False) -> list[Delta]:
        self.text += text
        if self.plan.choice == "none":
            parsed = Parsed(self.text)
        else:
            parsed = self.plan.format.parse(self.text, final)
            if not final:
                self.cut = any(not call.complete for call in parsed.calls)
        deltas: list[Delta] = []
        if len(parsed.content) > self._content and (self._content or parsed.content.strip()):
            deltas.append(ContentDelta(parsed.content[self._content:]))
            self._content = len(parsed.content)
        for index, call in enumerate(parsed.calls):
            if index == len(self.ids):
                self.ids.append(self.plan.new_id())
                self._arguments.append(len(call.arguments))
                deltas.append(CallDelta(index, call.arguments, self.ids[index], call.name))
            elif len(call.arguments) > self._arguments[index]:
                deltas.append(CallDelta(index, call.arguments[self._arguments[index]:]))
                self._arguments[index] = len(call.arguments)
        return deltas

    def finish(self) -> list[Delta]:
        return self.feed("", final=True)


def answer_content(parsed: Parsed) -> str | None:
    """The whole answer's content: None where only calls were written (as OpenAI answers)."""
    return parsed.content if parsed.content.strip() or not parsed.calls else None


class SpecialText:
    """Token ids to text with special tokens written out, released as the answer's own text
    is: UTF-8 split across tokens joined, and the request's stop strings cut (TextStream)."""

    def __init__(self, piece: Callable[[int], bytes], stops: tuple[str, ...] = ()) -> None:
        self._piece = piece
        self._text = TextStream(stops)

    def __call__(self, token: int) -> str:
        return self._text.push(self._piece(token))

    def flush(self) -> str:
        return self._text.flush()

    def all(self, tokens: list[int]) -> str:
        return "".join(self(token) for token in tokens) + self.flush()
