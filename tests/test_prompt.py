"""Prompt building: chat templates applied by llama.cpp or rendered from their Jinja source."""

from __future__ import annotations

from pathlib import Path

import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from specli.errors import PromptError
from specli.llama.template import apply_chat_template, render_jinja_template
from specli.prompt import prompt_tokens

SYSTEM_AND_USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
MULTI_TURN = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Name a colour. «Ünïcode» too."},
]


def llama_cpp_python_render(template: str, messages: list[dict[str, str]], bos: str, eos: str) -> str:
    """What backend.py rendered before: llama-cpp-python's own Jinja formatter."""
    formatter = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos, add_generation_prompt=True)
    return formatter(messages=messages).prompt


class TemplateOnly:
    """A model whose chat template llama.cpp does not know: specli renders the Jinja source."""

    path = Path("custom.gguf")
    bos, eos = 1, 2

    def __init__(self, template: str | None) -> None:
        self.template = template

    def chat_template(self) -> str | None:
        return self.template

    def apply_builtin_chat_template(self, messages: list[dict[str, str]]) -> str | None:
        return None

    def piece(self, token: int, special: bool = False) -> bytes:
        return {1: b"<s>", 2: b"</s>"}[token] if special else b""

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return [ord(c) for c in text]


# Exercises what llama-cpp-python's environment adds to plain Jinja: trimmed blocks, loop
# controls, the {% generation %} tag, tojson without ASCII escapes, raise_exception.
FEATURES = """{{ bos_token }}
{% for message in messages %}
  {% if message['role'] == 'system' %}{% continue %}{% endif %}
  <{{ message['role'] }}>{{ message['content'] | tojson }}
  {% if message['role'] == 'assistant' %}{% generation %}{{ eos_token }}{% endgeneration %}{% endif %}
{% endfor %}
{% if add_generation_prompt %}<assistant>{% endif %}"""


@pytest.mark.parametrize(
    "messages, fragment",
    [(SYSTEM_AND_USER, '<user>"What is 2+2?"\n'), (MULTI_TURN, '<user>"Name a colour. «Ünïcode» too."\n')],
    ids=["system-user", "multi-turn"],
)
def test_jinja_rendering_matches_llama_cpp_python(messages, fragment):
    rendered = render_jinja_template(FEATURES, messages, bos_token="<s>", eos_token="</s>")
    assert rendered == llama_cpp_python_render(FEATURES, messages, "<s>", "</s>")
    assert fragment in rendered and "Be brief" not in rendered and rendered.endswith("<assistant>")


def test_the_jinja_fallback_drops_the_bos_that_tokenization_adds():
    formatted = apply_chat_template(TemplateOnly(FEATURES), MULTI_TURN)
    assert formatted == llama_cpp_python_render(FEATURES, MULTI_TURN, "<s>", "</s>")[len("<s>") :]
    assert formatted.startswith("\n") and formatted.endswith("<assistant>")


def test_a_template_that_raises_is_a_prompt_error():
    model = TemplateOnly("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}")
    with pytest.raises(PromptError, match="the chat template of custom.gguf failed: user first"):
        apply_chat_template(model, SYSTEM_AND_USER)
    with pytest.raises(PromptError, match="custom.gguf failed"):
        apply_chat_template(TemplateOnly("{% for %}"), MULTI_TURN)


def test_a_model_without_a_template():
    with pytest.raises(PromptError, match="custom.gguf has no chat template"):
        prompt_tokens(TemplateOnly(None), "hi", chat=True)
    assert prompt_tokens(TemplateOnly(None), "hi") == [ord("h"), ord("i")]  # chat is off by default then


@pytest.mark.slow
@pytest.mark.parametrize(
    "messages, opening",
    [(SYSTEM_AND_USER, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"),
     (MULTI_TURN, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                  "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello! How can I help?<|im_end|>\n")],
    ids=["system-user", "multi-turn"],
)
def test_smollm2s_template_renders_as_llama_cpp_python_renders_it(smollm_path, messages, opening):
    from specli.llama.backend import LoadSettings, Model

    with Model(smollm_path, LoadSettings(ctx_size=64)) as smol:
        template = smol.chat_template()
        bos, eos = (smol.piece(token, special=True).decode() for token in (smol.bos, smol.eos))
        builtin = smol.apply_builtin_chat_template(messages)
    rendered = render_jinja_template(template, messages, bos_token=bos, eos_token=eos)
    assert rendered == llama_cpp_python_render(template, messages, bos, eos)
    assert rendered.startswith(opening) and rendered.endswith("<|im_end|>\n<|im_start|>assistant\n")
    # llama.cpp's built-in ChatML writes the same turns, without SmolLM2's default system turn.
    assert builtin is not None and rendered.endswith(builtin)
