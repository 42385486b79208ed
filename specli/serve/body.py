"""A request's body, read as JSON into its pydantic model, off the event loop (the routes hand
`parse` to a thread): a body of a few megabytes, a deep one or a large schema never holds up
`/health` or another request's stream.

Any body that JSON can read is taken, whatever its Content-Type says (`curl -d` sends
application/x-www-form-urlencoded), as llama-server and Ollama take it; a browser page from
another origin cannot use that to post without a preflight, since serve.guard refuses its
Origin first. Every refusal is a 400 that says what is wrong with the body and what to send:
an empty body, bytes that are not UTF-8, text that is not JSON, NaN or Infinity (which JSON
does not have), nesting deeper than MAX_DEPTH, a JSON value that is not an object.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from specli.serve.errors import ApiError

MAX_DEPTH = 64  # objects and lists within each other; an OpenAI body with a JSON schema nests far less

Body = TypeVar("Body", bound=BaseModel)


def parse(raw: bytes, model: type[Body]) -> Body:
    """`raw` as `model`: an ApiError (400) says what is wrong with the body, and pydantic's
    complaints about its fields are a RequestValidationError (serve.errors names the field)."""
    value = _json(raw, model)
    try:
        return model.model_validate(value)
    except ValidationError as error:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in error.errors()]) from None


def _json(raw: bytes, model: type[BaseModel]) -> dict:
    example = _EXAMPLES.get(model.__name__, "{...}")
    if not raw.strip():
        raise ApiError(400, f"the body is empty: send a JSON object, e.g. {example}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ApiError(400, f"the body is not UTF-8 text (byte {error.start} cannot be read): send JSON in UTF-8") \
            from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ApiError(400, f"the body nests objects and lists deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as error:
        raise ApiError(400, f"the body is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}"
                            f" (send a JSON object, e.g. {example})") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"the body is a JSON {_kind(value)}, not an object: send e.g. {example}")
    if _depth(value) > MAX_DEPTH:
        raise ApiError(400, f"the body nests objects and lists deeper than {MAX_DEPTH} levels")
    return value


_EXAMPLES = {
    "ChatRequest": '{"messages": [{"role": "user", "content": "Hello"}]}',
    "CompletionRequest": '{"prompt": "Once upon a time", "max_tokens": 32}',
}


def _no_constant(name: str) -> Any:
    """Python's json reads NaN, Infinity and -Infinity; JSON has none of them."""
    raise ApiError(400, f"the body holds {name}, which is not JSON: send a finite number")


def _kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _depth(value: Any) -> int:
    """How deeply objects and lists nest in `value` (an object of scalars: 1), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
