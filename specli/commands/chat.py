"""`specli chat` (and `specli run` with no prompt on a terminal): a conversation, turn by turn.

The whole conversation goes through the target's chat template at every turn; the engine
keeps what the KV caches of target and draft already hold, so a turn decodes only its own
new tokens. N-gram drafting looks up the whole conversation. A model without a template (a
base model) gets completion turns: each line is appended to the text so far, and the model
continues it.
"""

from __future__ import annotations

import sys
from typing import IO

from specli.decode.request import GenerationRequest
from specli.errors import PromptError
from specli.prompt import chat_tokens
from specli.render import Output, TextRenderer, notifier, use_colour
from specli.session import Session, SessionSpec, open_session
from specli.stream import stream

PROMPT = ">>> "
LEAVE = ("/bye", "/exit", "/quit")
HELP = "Type a message; /bye or Ctrl-D leaves; Ctrl-C stops an answer; /clear starts over."


def chat(spec: SessionSpec, request: GenerationRequest, output: Output, system: str | None = None,
         stdin: IO[str] | None = None, stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> int:
    """Converse until /bye or the end of input; returns the exit code. Every turn runs the same
    request (one engine: one seed, and the draft-length policy's record of the whole chat)."""
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    notice = notifier(stderr)
    with open_session(spec, notice) as session:
        conversation = Conversation(session, system)
        if not conversation.templated:
            notice(f"{spec.target.name} has no chat template (a completion model): "
                   "each turn continues the text so far")
        reason = session.plain_reason(request)
        if reason is not None:
            notice(reason)
        engine = session.engine_for(request)
        colour = use_colour(output.colour, stdout)
        _enable_line_editing(stdin)
        stderr.write(HELP + "\n")
        first = True
        while True:
            line = _read_line(stdin, stdout)
            if line is None or line.strip() in LEAVE:
                break
            if line.strip() == "/clear":
                conversation = Conversation(session, system)
                continue
            if not line.strip():
                continue
            renderer = TextRenderer(stdout, stderr, colour=colour, quiet=output.quiet, legend=first)
            reply = stream(engine, conversation.tokens_with(line), renderer)  # Ctrl-C stops the answer only
            session.pricing.review(reply.stats)
            conversation.add(line, reply.text)
            first = False
    return 0


class Conversation:
    """The messages so far, and the tokens the target reads for the next turn."""

    def __init__(self, session: Session, system: str | None) -> None:
        self._session = session
        self.templated = session.target.chat_template() is not None
        if system and not self.templated:
            raise PromptError("--system needs a chat template", "use a chat model, or put the instructions in the text")
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        self.text = ""  # a completion model's text so far

    def tokens_with(self, line: str) -> list[int]:
        target = self._session.target
        if not self.templated:
            return target.tokenize(self.text + line, add_special=True)
        return chat_tokens(target, self.messages + [{"role": "user", "content": line}])

    def add(self, line: str, reply: str) -> None:
        if self.templated:
            self.messages += [{"role": "user", "content": line}, {"role": "assistant", "content": reply}]
        else:
            self.text += line + reply


def _read_line(stdin: IO[str], stdout: IO[str]) -> str | None:
    """The next message; None at end of input. Ctrl-C at the prompt starts the line over."""
    while True:
        try:
            if stdin is sys.stdin:
                return input(PROMPT)
            stdout.write(PROMPT)
            stdout.flush()
            line = stdin.readline()
            return line.rstrip("\n") if line else None
        except EOFError:
            stdout.write("\n")
            return None
        except KeyboardInterrupt:
            stdout.write("\n")


def _enable_line_editing(stdin: IO[str]) -> None:
    """Arrow keys, editing and history for input() on a terminal (the standard readline)."""
    if stdin is not sys.stdin or not stdin.isatty():
        return
    try:
        import readline
    except ImportError:  # not on every platform; input() still works
        return
    from specli.config import cache_dir

    history = cache_dir() / "chat_history"
    try:
        readline.read_history_file(history)
    except OSError:
        pass
    readline.set_history_length(1000)
    import atexit

    def save() -> None:
        try:
            history.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(history)
        except OSError:
            pass

    atexit.register(save)
