"""The bodies `specli serve` answers with, as pydantic models: OpenAI's completions (whole and
streamed), llama-server's `timings`, the model list and OpenAI's error shape; and specli's
provenance, `spans` on a whole choice and `source`/`proposer` on a streamed one.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal, Optional

from pydantic import BaseModel, Field, model_serializer

from specli.decode.events import Stats
from specli.serve.requests import ToolCall

FINISH_REASONS = {"eog": "stop", "stop": "stop", "length": "length", "context": "length"}  # specli's: OpenAI's
# Who drafted a kept token: a draft kind's provenance name (specli/drafts.py: "ngram", "draft",
# "mtp"), or "grammar" (the constraint).
Proposer = str


class Span(BaseModel):
    """A run of text written by one source: the draft (proposed, and kept by the target) or
    the target itself."""

    text: str
    source: Literal["draft", "target"]
    proposer: Optional[Proposer] = None  # who drafted a draft span


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class CompletionTokensDetails(BaseModel):
    accepted_prediction_tokens: int
    rejected_prediction_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails


class Timings(BaseModel):
    """llama-server's names where it has them."""

    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float
    draft_n: int
    draft_n_accepted: int


class TopLogprob(BaseModel):
    """OpenAI's: a token's text, its log-probability and its UTF-8 bytes (a piece may hold part of a character)."""

    token: str
    logprob: float
    bytes: Optional[list[int]]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]  # the row's most likely tokens, most likely first


class ChatLogprobs(BaseModel):
    content: Optional[list[ChatTokenLogprob]]
    refusal: Optional[list[ChatTokenLogprob]] = None


class TextLogprobs(BaseModel):
    """The completions form: each token, its logprob, its row's alternatives by text, and
    where it starts in the prompt and completion's text."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str]  # None where the answer is only tool calls
    # A reasoning model's thinking (llama-server's name); left out where there is none.
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None

    @model_serializer(mode="wrap")
    def _thinking_where_there_is_some(self, write):
        data = write(self)
        if data.get("reasoning_content") is None:
            data.pop("reasoning_content", None)
        return data


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str
    logprobs: Optional[ChatLogprobs] = None
    spans: list[Span]


class TextChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str
    logprobs: Optional[TextLogprobs] = None
    spans: list[Span]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class ChatCompletion(BaseModel):
    id: str = Field(default_factory=lambda: new_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    timings: Timings


class Completion(BaseModel):
    id: str = Field(default_factory=lambda: new_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[TextChoice]
    usage: Usage
    timings: Timings


class FunctionCallDelta(BaseModel):
    name: Optional[str] = None
    arguments: Optional[str] = None


class ToolCallDelta(BaseModel):
    """A streamed call: its first delta has the index, id, type and name; later ones
    add pieces of its arguments."""

    index: int
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None
    function: FunctionCallDelta


class Delta(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[ToolCallDelta]] = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: Optional[str] = None
    logprobs: Optional[ChatLogprobs] = None
    source: Optional[Literal["draft", "target"]] = None
    proposer: Optional[Proposer] = None
    tokens: Optional[int] = None  # how many tokens this chunk's text holds
    drafted: Optional[int] = None  # draft tokens verified (kept or not) since the last chunk that said so


class TextChunkChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Optional[str] = None
    logprobs: Optional[TextLogprobs] = None
    source: Optional[Literal["draft", "target"]] = None
    proposer: Optional[Proposer] = None
    tokens: Optional[int] = None  # how many tokens this chunk's text holds
    drafted: Optional[int] = None  # draft tokens verified (kept or not) since the last chunk that said so


class ChatChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None
    timings: Optional[Timings] = None


class TextChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[TextChunkChoice]
    usage: Optional[Usage] = None
    timings: Optional[Timings] = None


class ModelMeta(BaseModel):
    """llama-server's `meta` names, where it has them."""

    n_ctx: int  # each request's context (tokens)
    n_vocab: int
    slots: int  # requests generated at once (--parallel)


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specli"
    target: str
    draft: str
    chat: bool  # the target has a chat template (else /v1/completions only)
    drafts: list[str]  # the `draft` values a request may give, the server's own first
    proposers: dict[str, str]  # who drafted a span, by its `proposer` name, in words (the page's tooltips)
    # llama-server's names: "multimodal" where it takes images (image_url parts)
    capabilities: list[str] = Field(default_factory=lambda: ["completion"])
    meta: Optional[ModelMeta] = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorBody


def usage(stats: Stats) -> Usage:
    return Usage(
        prompt_tokens=stats.prompt_tokens,
        completion_tokens=stats.tokens,
        total_tokens=stats.prompt_tokens + stats.tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=stats.prompt_cached),
        completion_tokens_details=CompletionTokensDetails(accepted_prediction_tokens=stats.accepted,
                                                          rejected_prediction_tokens=stats.drafted - stats.accepted),
    )


def timings(stats: Stats) -> Timings:
    decoded = stats.generated_after_first
    return Timings(prompt_n=stats.prompt_tokens - stats.prompt_cached, prompt_ms=1000 * stats.prefill_seconds,
                   predicted_n=stats.tokens, predicted_ms=1000 * stats.seconds,
                   predicted_per_second=decoded / stats.seconds if stats.seconds > 0 else 0.0,
                   draft_n=stats.drafted, draft_n_accepted=stats.accepted)


def finish_reason(stats: Stats) -> str:
    return FINISH_REASONS.get(stats.finish_reason, stats.finish_reason)
