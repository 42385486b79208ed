"""`specli chat` (and `specli run` with no prompt on a terminal): a conversation, turn by turn.

The whole conversation goes through the target's chat template at every turn; the engine
keeps what the KV caches of target and draft already hold, so a turn decodes only its own
new tokens. N-gram drafting looks up the whole conversation. A model without a template (a
base model) gets completion turns: each line is appended to the text so far, and the model
continues it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO

from specli.decode.request import GenerationRequest
from specli.errors import PromptError
from specli.llama.vision import MARKER, Image, ImageError, Images, read_image_file
from specli.prompt import chat_tokens, chat_with_images
from specli.render import Output, TextRenderer, notifier, use_colour
from specli.session import Session, SessionSpec, open_session
from specli.stream import stream

PROMPT = ">>> "
LEAVE = ("/bye", "/exit", "/quit")
HELP = "Type a message; /bye or Ctrl-D leaves; Ctrl-C stops an answer; /clear starts over."
IMAGE = "/image "  # /image FILE: an image for the next message (with a projector: --mmproj)


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
        stderr.write(HELP + (" /image FILE attaches an image." if session.projector is not None else "") + "\n")
        first = True
        attached: list[Image] = []  # for the next message
        while True:
            line = _read_line(stdin, stdout)
            if line is None or line.strip() in LEAVE:
                break
            if line.strip() == "/clear":
                conversation, attached = Conversation(session, system), []
                continue
            if line.startswith(IMAGE):
                image = _attach(session, line[len(IMAGE):].strip(), notice)
                attached += [image] if image is not None else []
                continue
            if not line.strip():
                continue
            if attached and not conversation.images:  # from now on the prompt holds images
                engine = session.engine_for(request, images=True)
            tokens, media = conversation.tokens_with(line, attached)
            renderer = TextRenderer(stdout, stderr, colour=colour, quiet=output.quiet, legend=first)
            reply = stream(engine, tokens, renderer, media=media)  # Ctrl-C stops the answer only
            session.pricing.review(reply.stats)
            conversation.add(line, reply.text, attached)
            attached, first = [], False
    return 0


def _attach(session: Session, path: str, notice) -> Image | None:
    """/image FILE: the image, checked; one line where it cannot be attached."""
    if session.projector is None:
        notice(f"{session.target.name} takes no images here: start the chat with --mmproj FILE (its projector)")
        return None
    try:
        image = read_image_file(Path(path).expanduser())
    except ImageError as error:
        notice(str(error))
        return None
    notice(f"{image.name} ({image.width}x{image.height}) goes with your next message")
    return image


class Conversation:
    """The messages so far, and the tokens the target reads for the next turn."""

    def __init__(self, session: Session, system: str | None) -> None:
        self._session = session
        self.templated = session.target.chat_template() is not None
        if system and not self.templated:
            raise PromptError("--system needs a chat template", "use a chat model, or put the instructions in the text")
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        self.text = ""  # a completion model's text so far
        self.images: list[Image] = []  # every image so far, in order: each a marker in its message

    def tokens_with(self, line: str, attached: list[Image] = ()) -> tuple[list[int], Images | None]:
        """The next turn's tokens (and their images, where the conversation has any)."""
        target, projector = self._session.target, self._session.projector
        line = MARKER * len(attached) + line
        images = self.images + list(attached)
        if not self.templated:
            if images:
                return projector.prompt(self.text + line, images, add_special=True, parse_special=False)
            return target.tokenize(self.text + line, add_special=True), None
        messages = self.messages + [{"role": "user", "content": line}]
        if images:
            return chat_with_images(projector, target, messages, images)
        return chat_tokens(target, messages), None

    def add(self, line: str, reply: str, attached: list[Image] = ()) -> None:
        line = MARKER * len(attached) + line
        self.images += attached
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
