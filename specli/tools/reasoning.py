"""Reasoning models' thinking: `<think>…</think>` before the answer, as Qwen3's and
DeepSeek-R1-Distill's templates write it, split off as `reasoning_content` (as llama-server
returns it), and kept out of the answer's constraint.

A template thinks where it writes both markers. The model either opens the block itself
(Qwen3), or the generation prompt opens it (DeepSeek-R1-Distill's ends in `<think>\\n`): the
answer then starts inside the thinking. Where the prompt closes the block (`enable_thinking`
false), the answer has none: neither split nor let out of its constraint.
"""

from __future__ import annotations

from dataclasses import dataclass

from specli.decode.constraint import Constraint
from specli.tools.formats import held_back

OPEN, CLOSE = "<think>", "</think>"


def thinks(template: str | None) -> bool:
    """Whether a chat template writes a model's thinking in think blocks."""
    return bool(template) and OPEN in template and CLOSE in template  # type: ignore[operator]


def after_prompt(prompt_end: str) -> Reasoning | None:
    """How the answer to a prompt that ends in `prompt_end` thinks: inside the block the prompt
    opened, in one the model may open, or not at all (None) after a block the prompt closed
    (`enable_thinking` false)."""
    end = prompt_end.rstrip()
    return None if end.endswith(CLOSE) else Reasoning(opened=end.endswith(OPEN))


@dataclass(frozen=True)
class Reasoning:
    """How one answer is read: `opened` where its prompt left the think block open."""

    opened: bool

    def constraint(self, answer: Constraint | None) -> Constraint | None:
        """`answer`'s constraint, applied once the thinking has ended: the think block is free
        text up to its first `</think>` (and the newlines after it), never cut by a grammar."""
        if answer is None:
            return None
        # An opening marker ends its lexeme at once (lazy): an answer that starts with free
        # text (tools' "auto") would otherwise read the whole think block as its own text.
        thought = "thought" if self.opened else "(opening thought)?"
        grammar = ("%llguidance {}\n"
                   f"start: {thought} @answer\n"
                   f"opening[lazy]: {_lark(OPEN)}\n"
                   f"thought: thinking GAP?\n"
                   f"thinking[lazy]: TEXT {_lark(CLOSE)}\n"
                   "GAP: /\\n+/\n"
                   "TEXT: /(.|\\n)*/\n")
        return answer.after(grammar)

    def split(self, text: str, final: bool = True) -> tuple[str, str]:
        """(the reasoning, the answer's content) of `text`. With `final=False` the text is a
        prefix of an answer still being written: what might yet be a marker, or the newlines
        before `</think>`, is held back, so that what a stream sends joins to the whole's split."""
        body = text
        if not self.opened:
            start = text.lstrip()
            if not start.startswith(OPEN):
                return ("", "") if not final and OPEN.startswith(start) else ("", text)
            body = start[len(OPEN):]
        end = body.find(CLOSE)
        if end >= 0:
            return body[:end].strip("\n"), body[end + len(CLOSE):].lstrip("\n")
        if final:
            return body.lstrip("\n"), ""
        return body[: len(body) - held_back(body, CLOSE)].lstrip("\n").rstrip("\n"), ""


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass
class ReasoningStream:
    """Reads a streamed answer: text in as it is written, out the new reasoning and the new
    content, joining to what `Reasoning.split` finds in the whole."""

    reasoning: Reasoning
    text: str = ""
    _sent: tuple[int, int] = (0, 0)  # characters of reasoning and of content sent

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        self.text += text
        reasoning, content = self.reasoning.split(self.text, final)
        sent_reasoning, sent_content = self._sent
        self._sent = (max(sent_reasoning, len(reasoning)), max(sent_content, len(content)))
        return reasoning[sent_reasoning:], content[sent_content:]

    def finish(self) -> tuple[str, str]:
        return self.feed("", final=True)


def _lark(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
