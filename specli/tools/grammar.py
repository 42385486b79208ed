"""The constraint of a request with tools, as a Lark grammar for llguidance.

- tool_choice "required", or a named function: the answer is calls (one, or several where
  parallel calls are allowed) whose arguments meet their function's schema.
- "auto": free text, until the text opens a call (the format's trigger); from there the call
  is constrained as above. This is llguidance's lazy lexeme, as llama.cpp's lazy grammars do:
  even a small model then writes calls that parse.
- "auto" beside a typed answer (a response format's JSON schema): calls as above, or that
  answer, from the first token.
"""

from __future__ import annotations

import json
from typing import Callable

from specli.decode.constraint import Constraint, json_lark
from specli.tools.formats import Arguments, Maybe, Piece, Special, ToolFormat, Until

TEXT = r"TEXT: /(.|\n)*/"


class _Writer:
    """Lark for pieces; `special` gives a special token's id, or None where the vocabulary
    has no such single token (its text is then written as text)."""

    def __init__(self, special: Callable[[str], int | None]) -> None:
        self.special = special
        self.rules: list[str] = []

    def pieces(self, pieces: tuple[Piece, ...] | list[Piece]) -> str:
        return " ".join(part for part in (self.piece(piece) for piece in pieces) if part)

    def piece(self, piece: Piece) -> str:
        if isinstance(piece, str):
            return json.dumps(piece, ensure_ascii=False) if piece else ""
        if isinstance(piece, Special):
            token = self.special(piece.text)
            return f"<[{token}]>" if token is not None else json.dumps(piece.text, ensure_ascii=False)
        if isinstance(piece, Arguments):
            return json_lark(piece.schema)
        if isinstance(piece, Until):
            name = f"until_{len(self.rules)}"
            self.rules.append(f"{name}[lazy]: TEXT {json.dumps(piece.end, ensure_ascii=False)}")
            return name
        if isinstance(piece, Maybe):
            return f"({self.pieces(piece.pieces)})?"
        raise TypeError(f"not a piece: {piece!r}")


def _without_trigger(pieces: list[Piece], trigger: str | Special) -> list[Piece]:
    """The pieces after the trigger that opens them."""
    first, rest = pieces[0], pieces[1:]
    if isinstance(trigger, Special):
        assert first == trigger, "a special trigger is the first piece"
        return rest
    assert isinstance(first, str) and first.startswith(trigger), "a text trigger starts the first piece"
    return [first[len(trigger):], *rest]


def tool_grammar(format: ToolFormat, tools: list[tuple[str, dict]], *, lazy: bool, parallel: bool,
                 special: Callable[[str], int | None], answer: str | None = None) -> str:
    """The Lark grammar for calls to `tools` ((name, parameters schema) pairs) in `format`.
    lazy: free text until the format's trigger (tool_choice "auto"); else calls only, or
    `answer` (a Lark expression) instead of them where one is given."""
    writer = _Writer(special)
    calls = [format.call(name, schema) for name, schema in tools]
    lines = ["%llguidance {}"]
    for i, pieces in enumerate(calls):
        lines.append(f"call_{i}: {writer.pieces(pieces)}")
    lines.append("call: " + " | ".join(f"call_{i}" for i in range(len(calls))))
    separator = writer.piece(format.separator)
    more = f"({separator} call)*" if parallel else ""
    before, after = list(format.before), writer.pieces(format.after)
    if not lazy:
        lines.append(f"calls: {writer.pieces(before)} call {more} {after}")
        lines.append("start: calls" + (" | answer" if answer else ""))
        if answer:
            lines.append(f"answer: {answer}")
    else:
        trigger = format.trigger
        assert trigger is not None, "a format without a trigger has no lazy grammar"
        if before:
            first = f"{writer.pieces(_without_trigger(before, trigger))} call"
        else:
            for i, pieces in enumerate(calls):
                lines.append(f"rest_{i}: {writer.pieces(_without_trigger(pieces, trigger))}")
            first = "(" + " | ".join(f"rest_{i}" for i in range(len(calls))) + ")"
        if isinstance(trigger, Special):
            opener = f"TEXT {writer.piece(trigger)}"
        else:
            lines.append(f"trigger[lazy]: TEXT {json.dumps(trigger, ensure_ascii=False)}")
            opener = "trigger"
        lines.append(f"tag: {opener} {first} {more} {after}")
        lines.append("start: " + ("tag* TEXT" if parallel else "tag? TEXT"))
    lines += writer.rules
    lines.append(TEXT)
    return "\n".join(lines) + "\n"


def tool_constraint(format: ToolFormat, tools: list[tuple[str, dict]], *, lazy: bool, parallel: bool,
                    special: Callable[[str], int | None], answer: Constraint | None = None) -> Constraint:
    """tool_grammar's constraint; `answer`: a JSON schema constraint the answer may meet instead of calls."""
    grammar = tool_grammar(format, tools, lazy=lazy, parallel=parallel, special=special,
                           answer=answer.lark_part() if answer is not None else None)
    return Constraint.lark(grammar, "tool-call grammar")
