"""llama-server's utility routes, in its names and shapes, for the scripts and UIs written
against it: `/tokenize` and `/detokenize` (the target's own tokens, as `logit_bias` takes
them), `/props` (the context size, the chat template, the draft kinds), `/slots` (each slot
busy or idle) and `/metrics` (Prometheus text; off unless `serve --metrics`, as llama-server's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from specli.serve.body import parse

if TYPE_CHECKING:
    from specli.serve.state import Backend, ServerInfo
    from specli.serve.worker import Worker


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    content: str
    add_special: bool = False  # the BOS a prompt gets
    parse_special: bool = True  # "<|im_start|>" as its control token
    with_pieces: bool = False  # each token with its text: [{"id", "piece"}]


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tokens: list[int] = Field(default_factory=list)


# (name, help, Totals field) as llama-server's to_metrics() names them.
COUNTERS = (
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", "prompt_tokens"),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", "prompt_tokens_cached"),
    ("prompt_seconds_total", "Total time spent processing prompts", "prompt_seconds"),
    ("tokens_predicted_total", "Number of generation tokens processed", "tokens_predicted"),
    ("tokens_predicted_seconds_total", "Total time spent generating tokens", "tokens_predicted_seconds"),
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)", "n_tokens_max"),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", "draft_tokens"),
    ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model",
     "draft_accepted"),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps", "drafts"),
)


def prometheus(totals: dict[str, float], processing: int, deferred: int) -> str:
    """The counters and gauges as Prometheus text (format 0.0.4)."""
    lines = []
    items = [(name, text, "counter", totals[key]) for name, text, key in COUNTERS]
    items += [("requests_processing", "Number of requests processing", "gauge", processing),
              ("requests_deferred", "Number of requests deferred", "gauge", deferred)]
    for name, text, kind, value in items:
        lines += [f"# HELP llamacpp:{name} {text}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value:g}"]
    return "\n".join(lines) + "\n"


def add_utility_routes(app: FastAPI, backend: Backend, info: ServerInfo, authorised,
                       readers: Callable) -> None:
    """The routes, behind the API key as the API is (`readers`: runs a function in a reader thread)."""

    @app.post("/tokenize", dependencies=[authorised])
    async def tokenize(request: Request) -> dict:
        asked = parse(await request.body(), TokenizeRequest)
        target = backend.ready().session.target
        tokens = await readers(lambda: target.tokenize(asked.content, add_special=asked.add_special,
                                                       parse_special=asked.parse_special))
        if not asked.with_pieces:
            return {"tokens": tokens}
        return {"tokens": [{"id": token, "piece": _piece(target.piece(token, special=True))} for token in tokens]}

    @app.post("/detokenize", dependencies=[authorised])
    async def detokenize(request: Request) -> dict:
        from specli.serve.errors import ApiError

        asked = parse(await request.body(), DetokenizeRequest)
        target = backend.ready().session.target
        for index, token in enumerate(asked.tokens):
            if not 0 <= token < target.n_vocab:
                raise ApiError(400, f"tokens.{index}: {token} is not a token of this model (0 to {target.n_vocab - 1})",
                               param=f"tokens.{index}")
        text = b"".join(target.piece(token, special=True) for token in asked.tokens)
        return {"content": text.decode("utf-8", "replace")}

    @app.get("/props", dependencies=[authorised])
    async def props() -> dict:
        worker = backend.ready()
        return _props(worker, info)

    @app.get("/slots", dependencies=[authorised])
    async def slots() -> list[dict]:
        worker = backend.ready()
        busy = worker.busy_slots()
        return [{"id": index, "n_ctx": worker.session.target.n_ctx, "is_processing": index in busy}
                for index in range(worker.parallel)]

    @app.get("/metrics", dependencies=[authorised])
    async def metrics() -> PlainTextResponse:
        from specli.serve.errors import ApiError

        if not info.metrics:
            raise ApiError(501, "this server does not serve metrics: start it with --metrics", "not_supported_error")
        worker = backend.ready()
        return PlainTextResponse(prometheus(worker.totals.read(), worker.generating, worker.waiting),
                                 media_type="text/plain; version=0.0.4")


def _piece(data: bytes) -> str | list[int]:
    """A token's text, or its bytes where they are not whole UTF-8 (as llama-server gives them)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def _props(worker: Worker, info: ServerInfo) -> dict:
    from specli import drafts

    target, defaults = worker.session.target, info.defaults
    sampling = defaults.sampling
    return {
        "default_generation_settings": {
            "n_ctx": target.n_ctx,
            "params": {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                       "min_p": sampling.min_p, "repeat_penalty": sampling.repeat_penalty,
                       "repeat_last_n": sampling.repeat_last_n, "draft": defaults.draft,
                       "draft_tokens": defaults.draft_tokens},
        },
        "total_slots": worker.parallel,
        "model_path": info.target,
        "model_alias": info.name,
        "chat_template": target.chat_template() or "",
        "modalities": {"vision": worker.session.projector is not None, "audio": False},
        "drafts": drafts.offered(defaults.draft, worker.session.unavailable),
        "build_info": info.build,
    }
