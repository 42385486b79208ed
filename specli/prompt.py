"""The prompt: read from the user (an argument, -f FILE or stdin), then built into the
target's tokens, through its chat template when it has one."""

from __future__ import annotations

from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from specli.errors import PromptError
from specli.llama.template import apply_chat_template, check_jinja_template

if TYPE_CHECKING:
    from specli.llama.backend import Model
    from specli.llama.vision import Image, Images, Projector


def read_prompt(prompt: str | None, prompt_file: Path | None, stdin: IO[str]) -> str:
    """The prompt from the argument, `-`, -f FILE, or piped stdin — exactly one of them.
    Refused here, before any model loads, when it is empty."""
    text = _read_prompt(prompt, prompt_file, stdin)
    if not text.strip():
        raise PromptError("the prompt is empty", "give a prompt as an argument, with -f FILE, or on stdin")
    return text


def read_prediction(path: Path) -> str:
    """--prediction FILE: text the answer is expected to repeat (a Predicted Output)."""
    return _read_file(path, "prediction file")


def read_constraint_file(path: Path, what: str) -> str:
    """--grammar-file or --json-schema-file (`what` names it in errors)."""
    return _read_file(path, what)


def read_chat_template(path: Path) -> str:
    """--chat-template-file: a Jinja chat template, used in place of the target's own (its
    syntax checked now, before any model loads)."""
    text = _read_file(path, "chat template file")
    check_jinja_template(text, f"chat template {path}")
    return text


def _read_file(path: Path, what: str) -> str:
    """A prompt-like file's text (`what`: "prompt file", "prediction file"), decoded as prompts are."""
    try:
        data = path.read_bytes()
    except FileNotFoundError as error:
        folder = path.parent.resolve()
        hint = (f"{folder} holds no file of that name" if folder.is_dir() else
                f"there is no folder {folder} (a relative path starts at {Path.cwd()})")
        raise PromptError(f"{what} not found: {path}", hint) from error
    except IsADirectoryError as error:
        raise PromptError(f"{what} {path} is a directory", "give the path of a file in it") from error
    except OSError as error:
        raise PromptError(f"cannot read {what} {path}: {error.strerror or error}") from error
    return _decode_prompt(data, f"{what} {path}")


def _read_prompt(prompt: str | None, prompt_file: Path | None, stdin: IO[str]) -> str:
    if prompt_file is not None:
        if prompt not in (None, "-"):
            raise PromptError("give the prompt either as an argument or with -f, not both")
        return _read_file(prompt_file, "prompt file")
    if prompt == "-" or (prompt is None and not _isatty(stdin)):
        buffer = getattr(stdin, "buffer", None)
        if buffer is None:  # a text stream without bytes underneath (tests)
            text = _check_text(stdin.read(), "the prompt on stdin")
        else:
            text = _decode_prompt(buffer.read(), "the prompt on stdin")
        # `echo "$P" | specli run` prompts with "$P", as `specli run "$P"` does (llm and Ollama alike).
        return text[:-1] if text.endswith("\n") else text
    if prompt is None:
        raise PromptError("no prompt given", 'specli run "your prompt", or pipe it on stdin')
    return _check_text(prompt, "the prompt")


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


def _decode_prompt(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PromptError(
            f"{what} is not UTF-8 text (byte {data[error.start]:#04x} at offset {error.start})",
            "convert it first, e.g. iconv -f latin1 -t utf-8",
        ) from None


def _check_text(text: str, what: str) -> str:
    """Arguments and text streams carry undecodable bytes as surrogates: refuse them here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        try:
            return _decode_prompt(text.encode("utf-8", "surrogateescape"), what)
        except UnicodeEncodeError:
            raise PromptError(f"{what} is not UTF-8 text (character {error.start})") from None
    return text


def prompt_tokens(model: Model, prompt: str, *, system: str | None = None, chat: bool | None = None) -> list[int]:
    """Tokens for the prompt; through the model's chat template when it has one (or chat=True).
    (An empty prompt is refused where it is read, before any model loads: read_prompt.)"""
    if chat is None:
        chat = model.chat_template() is not None
    if not chat:
        if system:
            raise PromptError("--system needs a chat template", "drop --no-chat, or put the instructions in the prompt")
        return model.tokenize(prompt, add_special=True, parse_special=False)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return chat_tokens(model, messages)


def prompt_with_images(projector: Projector, model: Model, prompt: str, images: list[Image], *,
                       system: str | None = None, chat: bool | None = None) -> tuple[list[int], Images]:
    """As prompt_tokens, with images: each goes where the prompt has the marker (MARKER),
    the rest before the prompt's text (inside the user's turn, through a chat template). The
    tokens hold a placeholder at each image position (specli.decode.media)."""
    from specli.llama.vision import MARKER

    if chat is None:
        chat = model.chat_template() is not None
    text = MARKER * max(0, len(images) - prompt.count(MARKER)) + prompt
    if not chat:
        if system:
            raise PromptError("--system needs a chat template", "drop --no-chat, or put the instructions in the prompt")
        return projector.prompt(text, images, add_special=True, parse_special=False)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return projector.prompt(apply_chat_template(model, messages), images, add_special=True, parse_special=True)


def chat_with_images(projector: Projector, model: Model, messages: list[dict[str, Any]], images: list[Image],
                     tools: list[dict] | None = None, variables: dict[str, Any] | None = None) -> tuple[list[int], Images]:
    """As chat_tokens, for messages whose text holds an image marker where each image goes."""
    text = apply_chat_template(model, messages, tools, variables)
    return projector.prompt(text, images, add_special=True, parse_special=True)


def chat_tokens(model: Model, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                variables: dict[str, Any] | None = None) -> list[int]:
    """A conversation through the model's chat template, ready for the assistant's turn
    (`tools`: the functions it may call, in OpenAI's shape; `variables`: the template's own)."""
    return model.tokenize(apply_chat_template(model, messages, tools, variables), add_special=True, parse_special=True)
