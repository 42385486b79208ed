"""Chat templates: messages as the text a model was trained to read, through llama.cpp's
built-in copy of the model's template where it has one, else the template's Jinja source."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specli.errors import PromptError, UsageError

if TYPE_CHECKING:
    from specli.llama.backend import Model

NO_CHAT_HINT = "use --no-chat to send the prompt as is"


# The variables a chat template is rendered with: a request's own template variables
# (chat_template_kwargs) may not replace them.
TEMPLATE_VARIABLES = frozenset({"messages", "eos_token", "bos_token", "raise_exception", "add_generation_prompt",
                                "functions", "function_call", "tools", "tool_choice", "strftime_now"})


def apply_chat_template(model: Model, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                        variables: dict[str, Any] | None = None) -> str:
    """Format messages with the model's own template, ready for the assistant's turn.

    llama.cpp's built-in copy of the template is used where it recognises it, for text
    messages without tools or other `variables`; any other conversation is rendered from the
    template's Jinja source, with `tools` in its `tools` variable and `variables` beside
    (Qwen3's `enable_thinking`), as Transformers' apply_chat_template does.
    """
    template = model.chat_template()
    if template is None:
        raise PromptError(f"{model.path.name} has no chat template", NO_CHAT_HINT)
    plain = not tools and not variables and all(set(m) <= {"role", "content"} and isinstance(m["content"], str) for m in messages)
    formatted = model.apply_builtin_chat_template(messages) if plain else None
    if formatted is not None:
        return formatted
    bos = _special_text(model, model.bos)
    try:
        prompt = render_jinja_template(template, messages, bos_token=bos, eos_token=_special_text(model, model.eos),
                                       tools=tools, variables=variables)
    except (jinja2.TemplateError, ValueError, TypeError) as error:
        raise PromptError(f"the chat template of {model.path.name} failed: {error}", NO_CHAT_HINT) from None
    # The BOS token is added by tokenization; a template that writes it would double it.
    return prompt[len(bos) :] if bos and prompt.startswith(bos) else prompt


def _special_text(model: Model, token: int) -> str:
    return model.piece(token, special=True).decode("utf-8", "replace") if token >= 0 else ""


# --- Jinja chat templates -----------------------------------------------------------
# Rendered as llama-cpp-python's Jinja2ChatFormatter renders them (itself aligned with
# Hugging Face Transformers): a sandbox that trims block whitespace, the `{% generation %}`
# tag passed through, `tojson` without ASCII escapes, and the same variables.


class _IgnoreGenerationTags(jinja2.ext.Extension):
    """Transformers' `{% generation %}...{% endgeneration %}` marks training targets: render its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise ValueError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        loader=jinja2.BaseLoader(),
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_IgnoreGenerationTags, jinja2.ext.loopcontrols],
    )
    environment.filters["tojson"] = _tojson
    return environment


def check_jinja_template(template: str, what: str) -> None:
    """UsageError (exit 2) naming the line where a template's Jinja syntax fails."""
    try:
        _environment().parse(template)
    except jinja2.TemplateSyntaxError as error:
        raise UsageError(f"the {what} is not valid Jinja: {error.message} (line {error.lineno})") from None


def render_jinja_template(template: str, messages: list[dict[str, Any]], *, bos_token: str, eos_token: str,
                          tools: list[dict] | None = None, variables: dict[str, Any] | None = None) -> str:
    """The template's text for `messages`, ending with the assistant's turn opened; `variables`:
    more of the template's own (none of TEMPLATE_VARIABLES)."""
    assert not set(variables or {}) & TEMPLATE_VARIABLES, "the renderer's variables are its own"
    return _environment().from_string(template).render(
        **(variables or {}),
        messages=messages,
        eos_token=eos_token,
        bos_token=bos_token,
        raise_exception=_raise_exception,
        add_generation_prompt=True,
        functions=None,
        function_call=None,
        tools=tools or None,
        tool_choice=None,
        strftime_now=_strftime_now,
    )
