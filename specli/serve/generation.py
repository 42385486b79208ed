"""A request's body as a generation on the loaded models: the one place its fields become a
GenerationRequest (with the constraint written once, from response_format, json_schema,
grammar or tools), the ToolPlan its answer is read with, and its prompt's tokens.

What cannot be served is raised as the typed error serve.errors answers: a RequestError
naming the field, ToolsUnsupported, a ContextLengthError or a PromptError.
"""

from __future__ import annotations

import base64
import binascii
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from typing import Union

from specli import drafts
from specli.decode.constraint import Constraint
from specli.decode.constraint_sources import ConstraintSource, SourceKind
from specli.decode.engine import check_prompt_fits
from specli.decode.request import GenerationRequest
from specli.llama import vision
from specli.prompt import chat_tokens, chat_with_images, prompt_tokens
from specli.serve.requests import ChatRequest, CompletionRequest, ImageRefs, RequestError, for_field
from specli.serve.worker import Job
from specli.session import Session
from specli.tools.plan import ToolPlan, tool_format
from specli.tools.reasoning import Reasoning, after_prompt, thinks

Body = Union[ChatRequest, CompletionRequest]
REASONING_TAIL = 8  # the prompt's last tokens, read for a think block the generation prompt opens


@dataclass(frozen=True)
class Asked:
    """What one request asks for: its body, the generation, its tools' plan (None: no
    tools, or tool_choice "none"), how its thinking is read (None: the template does not
    think), and the key a client that retries it keeps its place in the line by (worker.Line)."""

    body: Body
    job: Job
    plan: ToolPlan | None = None
    reasoning: Reasoning | None = None
    key: str = ""

    @property
    def chat(self) -> bool:
        return isinstance(self.body, ChatRequest)


def read(body: Body, session: Session, defaults: GenerationRequest, *, fetch_images: bool = False) -> Asked:
    """The generation `body` asks for on the session's models, over the server's `defaults`
    (`fetch_images`: an image part may name an http(s) URL, fetched now: serve --allow-image-urls)."""
    body.refused()
    tools = _Tools(body, session) if isinstance(body, ChatRequest) else None
    request = body.generation_request(defaults, tools.source() if tools is not None else None)
    biased = [token for token, _ in request.sampling.logit_bias]
    if biased and not 0 <= min(biased) <= max(biased) < session.target.n_vocab:
        raise RequestError(f"logit_bias: token ids run from 0 to {session.target.n_vocab - 1}", "logit_bias")
    unavailable = session.unavailable(drafts.get(request.draft))
    if unavailable is not None:
        raise RequestError(f"draft '{request.draft}': {unavailable}", "draft")
    reasoning = None
    media = None
    if isinstance(body, ChatRequest):
        refs: ImageRefs = []
        messages = body.conversation(refs)
        if refs:
            prompt, media = chat_with_images(_projector(session, refs), session.target, messages,
                                             [_image(url, where, fetch_images) for url, where in refs], body.template_tools(),
                                             body.chat_template_kwargs)
        else:
            prompt = chat_tokens(session.target, messages, body.template_tools(), body.chat_template_kwargs)
        reasoning = _reasoning(session, prompt)
        if reasoning is not None:
            request = replace(request, constraint=reasoning.constraint(request.constraint))
    else:
        prompt = _prompt_tokens(body, session)
    check_prompt_fits(max(len(prompt), media.cells if media is not None else 0), session.target.n_ctx)
    return Asked(body, Job(prompt, request, media), tools.plan if tools is not None else None, reasoning)


def _projector(session: Session, refs: ImageRefs) -> vision.Projector:
    if session.projector is None:
        raise RequestError(f"{refs[0][1]}: this server's model takes no images (start it with --mmproj FILE, "
                           "the model's projector)", refs[0][1])
    return session.projector


def _image(url: str, where: str, fetch: bool) -> vision.Image:
    """An image part's image: a data: URL's bytes, or where the server allows it (`fetch`) an
    http(s) URL's (a request makes the server fetch what it names: off by default). A local
    path is never read."""
    if url.startswith(("http://", "https://")):
        if not fetch:
            raise RequestError(f"{where}: this server does not fetch image URLs; send the image itself as a "
                               "data: URL (data:image/png;base64,...), or start it with --allow-image-urls", where)
        data = fetched(url, where)
    elif not url.startswith("data:"):
        raise RequestError(f"{where}: an image is a data: URL (data:image/png;base64,...)", where)
    else:
        header, comma, payload = url.partition(",")
        if not comma or not header.endswith(";base64"):
            raise RequestError(f"{where}: a data: URL's image is base64 (data:image/png;base64,...)", where)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError(f"{where}: the data: URL is not valid base64", where) from None
    try:
        return vision.read_image(data, where)
    except vision.ImageError as error:
        raise RequestError(error.message, where) from None


FETCH_SECONDS = 20  # an image URL's whole fetch (connect, each read)
FETCH_BYTES = 20 * 1024 * 1024  # the most an image URL may send


def fetched(url: str, where: str) -> bytes:
    """An image URL's bytes, bounded in time and size; a failure is a RequestError naming the part."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "specli"}),
                                    timeout=FETCH_SECONDS) as response:
            if not response.geturl().startswith(("http://", "https://")):
                raise RequestError(f"{where}: the image URL led to {response.geturl()}", where)
            data = response.read(FETCH_BYTES + 1)
    except urllib.error.HTTPError as error:
        raise RequestError(f"{where}: fetching the image answered {error.code} {error.reason}", where) from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise RequestError(f"{where}: the image could not be fetched ({reason})", where) from None
    if len(data) > FETCH_BYTES:
        raise RequestError(f"{where}: the image is over {FETCH_BYTES // (1024 * 1024)} MiB", where)
    return data


def _reasoning(session: Session, prompt: list[int]) -> Reasoning | None:
    """How a chat's answer thinks: None where its template writes no think blocks, or its
    prompt closed one."""
    target = session.target
    if not thinks(target.chat_template()):
        return None
    end = b"".join(target.piece(token, special=True) for token in prompt[-REASONING_TAIL:])
    return after_prompt(end.decode("utf-8", "replace"))


class _Tools:
    """A chat's tools as a constraint source, read (each schema checked, the template's call
    format found) only once the sources are known to combine: `plan` is set then."""

    def __init__(self, body: ChatRequest, session: Session) -> None:
        self.body, self.session = body, session
        self.plan: ToolPlan | None = None

    def source(self) -> ConstraintSource | None:
        if not self.body.tools:
            return None
        return ConstraintSource("tools", SourceKind.TOOLS, for_field("tools", self._constraint))

    def _constraint(self, answer: Constraint | None) -> Constraint | None:
        """The calls' constraint beside the `answer`'s (a response format's JSON schema, or None)."""
        if self.body.choice == "none":
            return answer
        target = self.session.target
        functions = self.body.functions_called()
        format = tool_format(target.chat_template(), target.path.name)
        self.plan = ToolPlan(format, functions, self.body.choice, parallel=self.body.parallel_tool_calls is not False)
        return self.plan.constraint(target.special_token, answer)


def _prompt_tokens(body: CompletionRequest, session: Session) -> list[int]:
    """The prompt: text, one text in a list, or token ids (as OpenAI's API allows)."""
    prompt = body.prompt
    if isinstance(prompt, list) and not prompt:
        raise RequestError("the prompt is empty", "prompt")
    if isinstance(prompt, list) and isinstance(prompt[0], int):
        n_vocab = session.target.n_vocab
        if any(not 0 <= token < n_vocab for token in prompt):
            raise RequestError(f"prompt: token ids run from 0 to {n_vocab - 1}", "prompt")
        return list(prompt)
    text = prompt[0] if isinstance(prompt, list) else prompt
    if not text:
        raise RequestError("the prompt is empty", "prompt")
    return prompt_tokens(session.target, text, chat=False)
