"""The OpenAI request bodies `specli serve` reads, as pydantic models.

Requests keep OpenAI's names (`response_format`, `tools` included) and add llama.cpp's
sampling extensions (`top_k`, `min_p`, `repeat_penalty`), llama-server's constraints
(`json_schema`, `grammar`) and specli's drafting fields (`draft`, `draft_tokens`, `exact`).
Fields are read strictly: a number given as a string, a boolean as a number, is a 400. A
field that would change what is generated but that specli cannot honour is refused by name
(`refused`); a field that changes nothing (`user`, `store`, `metadata`...) is ignored.
A body's constraint sources (`response_format`, `json_schema`, `grammar`, and a chat's tools)
become one constraint in `generation_request`, by the rule of decode.constraint_sources.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Callable, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specli import drafts
from specli.decode.constraint import Constraint, ConstraintError
from specli.decode.constraint_sources import ConstraintSource, SourceKind, write_constraint
from specli.decode.logprobs import MAX_TOP
from specli.decode.request import GenerationRequest, parse_draft_tokens
from specli.errors import UsageError
from specli.llama.template import TEMPLATE_VARIABLES
from specli.llama.vision import MARKER


class RequestError(ValueError):
    """A request specli cannot serve as asked: 400, naming the field (`param`)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


STRICT = ConfigDict(extra="ignore", strict=True)  # "10" is not a number, nor true a number


class ImageUrl(BaseModel):
    model_config = STRICT
    url: str
    detail: Optional[str] = None  # (OpenAI's resolution hint: the projector sets its own)


class TextPart(BaseModel):
    model_config = STRICT
    type: str
    text: Optional[str] = None
    image_url: Optional[ImageUrl] = None


Content = Union[str, list[TextPart], None]
# (an image part's URL, the part's place: "messages[1].content[0]"), in the prompt's order
ImageRefs = list[tuple[str, str]]


def content_text(content: Content, param: str, images: ImageRefs | None = None) -> str:
    """A message's content as text: a string, or text parts joined; an image part is the
    image marker where `images` collects them (else refused, as any other part)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    pieces = []
    for i, part in enumerate(content):
        if part.type == "image_url" and part.image_url is not None and images is not None:
            images.append((part.image_url.url, f"{param}[{i}]"))
            pieces.append(MARKER)
            continue
        if part.type != "text" or part.text is None:
            raise RequestError(f"{param}[{i}] is a {part.type!r} part; specli serves text and images",
                               f"{param}[{i}]")
        pieces.append(part.text)
    return "".join(pieces)


class FunctionCall(BaseModel):
    model_config = STRICT
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    """A call in an assistant message of the history, or of an answer."""

    model_config = STRICT
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # read by ChatRequest.refused: function_call
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Content = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None  # an assistant's
    tool_call_id: Optional[str] = None  # a tool message's: the call it answers

    @model_validator(mode="after")
    def _content(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content (only an assistant's calls may go without)")
        return self


class FunctionDefinition(BaseModel):
    model_config = STRICT
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None  # a JSON schema; none: no arguments
    strict: Optional[bool] = None


class Tool(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = STRICT
    name: str


class NamedToolChoice(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class Prediction(BaseModel):
    """OpenAI's Predicted Outputs: text the answer is expected to repeat much of."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["content"]
    content: Union[str, list[TextPart]]


# Fields other servers take (OpenAI's newer ones, llama-server's sampling and grammar
# extensions) that would change what is generated: refused by name, never ignored. The
# settings of a sampler that one of these switches on (mirostat_tau, dry_base, xtc_threshold...)
# change nothing while it is off, so they are ignored like any other field.
REFUSED_EXTRAS = {
    "reasoning_effort", "verbosity", "web_search_options",
    "ignore_eos", "n_predict", "n_probs", "mirostat", "typical_p", "top_n_sigma", "dynatemp_range",
    "dry_multiplier", "xtc_probability", "samplers", "penalty_last_n", "repeat_last_n", "logit_bias_eog",
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "min_tokens",
}
# The values of those that leave generation as it is (llama-server's defaults): clients that
# send every field with its default are served.
NEUTRAL_EXTRAS = {
    "ignore_eos": False, "n_probs": 0, "mirostat": 0, "typical_p": 1.0, "top_n_sigma": -1.0, "dynatemp_range": 0.0,
    "dry_multiplier": 0.0, "xtc_probability": 0.0, "min_tokens": 0,
}


def _check_text(value: Any, where: str) -> None:
    """Every string in the body must be Unicode text: JSON's escapes can write a lone surrogate
    ("\\ud800"), which no tokenizer can read."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise RequestError(f"{where or 'the body'} holds a lone surrogate (character {error.start}): "
                               "not Unicode text", where or None) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_text(item, f"{where}[{i}]")


RESPONSE_SCHEMA = "response_format.json_schema.schema"
MAX_ID_DIGITS = 9  # no vocabulary has a billion tokens


class _Generation(BaseModel):
    """What both completion endpoints take. Other fields are kept aside (extra="allow") for
    `refused`: a field in REFUSED_EXTRAS is refused, any other (user, store, metadata,
    cache_prompt...) changes nothing and is ignored."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: Optional[str] = None  # any name: the loaded pair answers
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(default=None, ge=0)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    repeat_penalty: Optional[float] = Field(default=None, gt=0.0)
    seed: Optional[int] = Field(default=None, ge=0)
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    prediction: Optional[Prediction] = None
    # specli's own: which proposer drafts, how many tokens a step, and --exact.
    draft: Optional[str] = None  # a draft kind's name (specli/drafts.py)
    draft_tokens: Union[int, Literal["auto"], None] = None
    exact: Optional[bool] = None
    # Fields that change what is generated; `refused` says which specli cannot honour.
    n: Optional[int] = None
    logit_bias: Optional[dict[str, float]] = None  # token id (as text) to a bias from -100 to 100
    logprobs: Union[bool, int, None] = None
    top_logprobs: Optional[int] = None
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    response_format: Optional[dict[str, Any]] = None
    # llama-server's constraints: a JSON schema, or a GBNF grammar.
    json_schema: Any = None  # an object (or its JSON text); Constraint.json_schema says what is wrong with it
    grammar: Optional[str] = None

    @field_validator("draft")
    @classmethod
    def _draft(cls, value):
        try:
            return None if value is None else drafts.get(value).name
        except UsageError as error:
            raise ValueError(f"{error.message}: {error.hint}") from None

    @field_validator("draft_tokens")
    @classmethod
    def _draft_tokens(cls, value):
        try:
            return None if value is None else parse_draft_tokens(value)
        except UsageError as error:
            raise ValueError(error.message) from None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        if isinstance(value, list) and len(value) > 4:
            raise ValueError("at most 4 stop sequences")
        if value == "" or isinstance(value, list) and "" in value:
            raise ValueError("a stop sequence must not be empty")
        return value

    def refused(self) -> None:
        """Raise RequestError for the first field that would change the output in a way
        specli does not do, or that holds text that is not Unicode."""
        _check_text(self.model_dump(), "")
        extras = self.model_extra or {}
        for name in sorted(set(extras) & REFUSED_EXTRAS):
            value = extras[name]
            if value is not None and not (name in NEUTRAL_EXTRAS and value == NEUTRAL_EXTRAS[name]):
                raise RequestError(f"{name} is not supported by specli serve", name)
        if self.n not in (None, 1):
            raise RequestError("n > 1 is not supported: one choice per request", "n")
        self.logprobs_asked()
        self.token_biases()

    def logprobs_asked(self) -> int | None:
        """How many alternatives each token's logprob comes with (None: no logprobs asked for),
        read from each route's own form (ChatRequest, CompletionRequest)."""
        raise NotImplementedError

    def token_biases(self) -> tuple[tuple[int, float], ...]:
        """logit_bias as (token id, bias) pairs, each checked (the ids' range against the
        vocabulary is the generation's to check)."""
        biases = []
        for key, bias in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit() and len(key) <= MAX_ID_DIGITS):
                shown = key if len(key) <= 20 else key[:20] + "…"
                raise RequestError(f"logit_bias: {shown!r} is not a token id (a token id is written in the digits "
                                   "0-9, as \"1234\")", "logit_bias")
            if not -100.0 <= bias <= 100.0:
                raise RequestError(f"logit_bias[{key}]: a bias runs from -100 to 100", "logit_bias")
            biases.append((int(key), float(bias)))
        return tuple(biases)

    def constraint_sources(self) -> list[ConstraintSource]:
        """The constraint sources the body gives, in order: response_format (json_object, with
        llama-server's `schema` or without; json_schema with its `schema`; "text" constrains
        nothing), then llama-server's json_schema and grammar. Nothing is read until a source
        is made."""
        sources = []
        if self.response_format:
            kind = self.response_format.get("type", "text")
            if kind == "json_schema":
                sources.append(ConstraintSource(RESPONSE_SCHEMA, SourceKind.JSON,
                                                for_field(RESPONSE_SCHEMA, self._response_schema)))
            elif kind == "json_object" and "schema" in self.response_format:  # llama-server's form
                sources.append(ConstraintSource("response_format.schema", SourceKind.JSON, for_field(
                    "response_format.schema", lambda: Constraint.json_schema(
                        (self.response_format or {})["schema"], "response_format.schema"))))
            elif kind == "json_object":
                sources.append(ConstraintSource("response_format", SourceKind.JSON, Constraint.json_object))
            else:
                sources.append(ConstraintSource("response_format", SourceKind.TEXT, lambda: _text_format(kind)))
        if self.json_schema is not None:
            sources.append(ConstraintSource("json_schema", SourceKind.JSON, for_field("json_schema", lambda: (
                Constraint.json_schema(self.json_schema, "json_schema")))))  # type: ignore[arg-type]
        if self.grammar is not None:
            sources.append(ConstraintSource("grammar", SourceKind.GRAMMAR, for_field("grammar", lambda: (
                Constraint.gbnf(self.grammar or "", "grammar")))))
        return sources

    def _response_schema(self) -> Constraint:
        """response_format's JSON schema: its `schema`, or any object where it gives none."""
        schema = (self.response_format or {}).get("json_schema")
        if not isinstance(schema, dict):
            raise RequestError("response_format.json_schema must be an object with a `schema`",
                               "response_format.json_schema")
        return Constraint.json_schema(schema.get("schema", {"type": "object"}), RESPONSE_SCHEMA)

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def prediction_text(self) -> str | None:
        if self.prediction is None:
            return None
        return content_text(self.prediction.content, "prediction.content")

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens

    def generation_request(self, defaults: GenerationRequest,
                           tools: ConstraintSource | None = None) -> GenerationRequest:
        """The generation this body asks for: its own fields over the server's defaults (its
        options), its constraint written from its sources (`tools` first: a chat's tools). No
        seed: a fresh one; no token limit: the server's (until the end)."""
        sampling = {name: getattr(self, name) for name in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty",
                                                           "frequency_penalty", "presence_penalty")
                    if getattr(self, name) is not None}
        if self.logit_bias:
            sampling["logit_bias"] = self.token_biases()
        return replace(defaults,
                       max_tokens=self.token_limit or defaults.max_tokens,
                       sampling=replace(defaults.sampling, **sampling),
                       stop=tuple(self.stops),
                       seed=self.seed,
                       draft=self.draft or defaults.draft,
                       draft_tokens=self.draft_tokens or defaults.draft_tokens,
                       exact=defaults.exact if self.exact is None else self.exact,
                       prediction=self.prediction_text(),
                       logprobs=self.logprobs_asked(),
                       constraint=write_constraint([*([tools] if tools else []), *self.constraint_sources()]))


class ChatRequest(_Generation):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    tools: Optional[list[Tool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: Optional[bool] = None
    functions: Optional[list[Any]] = None
    function_call: Union[str, dict[str, Any], None] = None
    audio: Optional[dict[str, Any]] = None
    modalities: Optional[list[str]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None  # the template's own variables (enable_thinking)

    def logprobs_asked(self) -> int | None:
        """OpenAI's chat form: `logprobs: true`, with `top_logprobs` alternatives (0 to 20)."""
        if self.logprobs is not None and not isinstance(self.logprobs, bool):
            raise RequestError("logprobs: true or false (top_logprobs says how many alternatives)", "logprobs")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_TOP:
            raise RequestError(f"top_logprobs: from 0 to {MAX_TOP}", "top_logprobs")
        if not self.logprobs:
            if self.top_logprobs:
                raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
            return None
        return self.top_logprobs or 0

    def refused(self) -> None:
        super().refused()
        if self.functions:
            raise RequestError("functions are not supported (tools are)", "functions")
        if self.audio:
            raise RequestError("audio is not supported: specli serves text only", "audio")
        if self.function_call not in (None, "none", "auto"):
            raise RequestError("function_call is not supported (tool_choice is)", "function_call")
        if self.modalities and set(self.modalities) != {"text"}:
            raise RequestError("only the text modality is supported", "modalities")
        taken = sorted(set(self.chat_template_kwargs or {}) & TEMPLATE_VARIABLES)
        if taken:
            raise RequestError(f"chat_template_kwargs: {taken[0]!r} is the server's to set", "chat_template_kwargs")
        self._check_tools()

    def _check_tools(self) -> None:
        names = [tool.function.name for tool in self.tools or ()]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise RequestError(f"tools[{i}]: a second function named {name!r}", f"tools[{i}].function.name")
        if self.tool_choice is not None and not self.tools:
            raise RequestError("tool_choice needs tools", "tool_choice")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise RequestError(f"tool_choice names {self.tool_choice.function.name!r}, which is not among the tools",
                               "tool_choice.function.name")
        calls: set[str] = set()
        for i, message in enumerate(self.messages):
            if message.role == "function" or (message.model_extra or {}).get("function_call"):
                raise RequestError(f"messages[{i}]: function messages are not supported (tool messages are)",
                                   f"messages[{i}].role")
            for j, call in enumerate(message.tool_calls or ()):
                if message.role != "assistant":
                    raise RequestError(f"messages[{i}]: only an assistant message has tool_calls",
                                       f"messages[{i}].tool_calls")
                _arguments(call.function.arguments, f"messages[{i}].tool_calls[{j}].function.arguments")
                calls.add(call.id)
            if message.role == "tool":
                if message.tool_call_id is None:
                    raise RequestError(f"messages[{i}]: a tool message needs the tool_call_id it answers",
                                       f"messages[{i}].tool_call_id")
                if message.tool_call_id not in calls:
                    raise RequestError(f"messages[{i}].tool_call_id {message.tool_call_id!r} answers no earlier "
                                       "assistant tool call", f"messages[{i}].tool_call_id")

    def functions_called(self) -> list[tuple[str, dict]]:
        """The tools as (name, parameters schema) pairs, each schema checked for the
        constraint (a RequestError names the tool and the place)."""
        functions = []
        for i, tool in enumerate(self.tools or ()):
            schema = tool.function.parameters or {"type": "object", "properties": {}}
            try:
                Constraint.json_schema(schema, f"schema of tools[{i}] ({tool.function.name})")
            except ConstraintError as error:
                raise RequestError(error.message, f"tools[{i}].function.parameters") from None
            functions.append((tool.function.name, schema))
        return functions

    @property
    def choice(self) -> str:
        """ "none", "auto", "required", or the one function's name that must be called."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        return self.tool_choice or ("auto" if self.tools else "none")

    def template_tools(self) -> list[dict] | None:
        """The tools as the chat template's `tools` variable takes them (none for "none")."""
        if not self.tools or self.choice == "none":
            return None
        return [tool.model_dump(exclude_none=True) for tool in self.tools]

    def conversation(self, images: ImageRefs | None = None) -> list[dict[str, Any]]:
        """The messages as the chat template takes them: a developer message is a system one,
        and a call's arguments are an object (templates write them with `tojson`). `images`
        collects the image parts, each a marker in its message's text (else they are refused)."""
        messages = []
        for i, m in enumerate(self.messages):
            message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                                       "content": content_text(m.content, f"messages[{i}].content", images)}
            if m.tool_calls:
                message["tool_calls"] = [
                    {"id": call.id, "type": "function",
                     "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments, "")}}
                    for call in m.tool_calls]
            if m.tool_call_id is not None:
                message["tool_call_id"] = m.tool_call_id
            if m.name is not None:
                message["name"] = m.name
            messages.append(message)
        return messages

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def _text_format(kind: Any) -> None:
    """A response_format of type "text" constrains nothing; any other type is not one we know."""
    if kind != "text":
        raise RequestError(f"response_format.type {kind!r} is not one of text, json_object, json_schema",
                           "response_format.type")


def for_field(field: str, make: Callable[..., Constraint | None]) -> Callable[..., Constraint | None]:
    """`make`, with a schema or grammar it cannot use answered as a RequestError naming the field."""

    def made(*answer: Constraint | None) -> Constraint | None:
        try:
            return make(*answer)
        except ConstraintError as error:
            raise RequestError(error.message, field) from None

    return made


def _arguments(text: str, param: str) -> dict:
    """A history call's arguments: a JSON object, as templates need."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise RequestError(f"{param} must be a JSON object", param)
    return value


class CompletionRequest(_Generation):
    prompt: Union[str, list[str], list[int]]
    echo: bool = False
    best_of: Optional[int] = None
    suffix: Optional[str] = None

    def logprobs_asked(self) -> int | None:
        """The completions form: `logprobs: N`, the chosen token's logprob and N alternatives (0 to 20)."""
        if self.top_logprobs is not None:
            raise RequestError("top_logprobs is a chat field: a completion takes logprobs: N", "top_logprobs")
        if self.logprobs is None or self.logprobs is False:
            return None
        if self.logprobs is True or not 0 <= self.logprobs <= MAX_TOP:
            raise RequestError(f"logprobs: a number of alternatives, from 0 to {MAX_TOP}", "logprobs")
        return self.logprobs

    def refused(self) -> None:
        super().refused()
        if self.echo:
            raise RequestError("echo is not supported", "echo")
        if self.best_of not in (None, 1):
            raise RequestError("best_of > 1 is not supported", "best_of")
        if self.suffix:
            raise RequestError("suffix (fill-in-the-middle) is not supported", "suffix")
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) != 1:
            raise RequestError("one prompt per request", "prompt")
