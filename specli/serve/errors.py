"""Every error `specli serve` answers, in OpenAI's shape {"error": {"message", "type", "param",
"code"}}: one table (`ERRORS`) turns what a request raised into an ApiError, and the app
answers every type in it with one handler, as `commands.app.ERRORS` does for the CLI.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specli.decode.constraint_sources import SourceConflict
from specli.decode.engine import ContextLengthError
from specli.errors import PromptError, SpecliError
from specli.llama.template import NO_CHAT_HINT
from specli.serve.requests import RequestError
from specli.serve.responses import ErrorBody, ErrorResponse
from specli.serve.worker import Busy, Closing, Gone
from specli.tools.plan import ToolsUnsupported

RETRY_AFTER_SECONDS = 1
CLIENT_LEFT = 499  # nginx's "client closed request": logged, never read by the client
PROMPT_FIELDS = {"/v1/chat/completions": "messages", "/v1/completions": "prompt"}  # by route


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.body = status, ErrorBody(message=message, type=kind, param=param, code=code)
        self.headers = headers


class GenerationFailed(Exception):
    """An error inside a generation (llama.cpp failing a decode): that request's own, a 500,
    and the next request is served."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


# pydantic names a union's member in an error's place ("NamedToolChoice", "literal['none',...]",
# "list[TextPart]", "str"): not a field of the body.
_MEMBER_TAGS = {"str", "int", "float", "bool", "none", "dict", "list"}


def _field_path(location: tuple) -> str | None:
    """An error's place in the body as the client wrote it: fields and indices, no union members."""
    where = [str(part) for part in location[1:] if isinstance(part, int) or not (
        part[:1].isupper() or "[" in part or part in _MEMBER_TAGS)]
    return ".".join(part if len(part) <= SHOWN_KEY else part[:SHOWN_KEY] + "…" for part in where) or None


SHOWN_KEY = 24  # a longer key in an error's place (a logit_bias key of 5,000 digits) is cut


def _invalid(error: RequestValidationError, path: str) -> ApiError:
    """pydantic's complaint about the body, naming the field: of a union's members, the one
    the body got furthest into (an object given for tool_choice: its missing `function`)."""
    errors = error.errors()
    unreadable = next((e for e in errors if e.get("type") == "json_invalid"), None)
    if unreadable is not None:
        return ApiError(400, f"the body is not valid JSON: {unreadable.get('ctx', {}).get('error', unreadable.get('msg'))}")
    first = max(errors, key=lambda e: len(e.get("loc", ())), default={})
    param = _field_path(tuple(first.get("loc", ())))
    message = f"{param}: {first.get('msg', 'invalid')}" if param else str(first.get("msg", "invalid request"))
    return ApiError(400, message, param=param)


def _http(error: StarletteHTTPException, path: str) -> ApiError:
    kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    code = "request_too_large" if error.status_code == 413 else None
    return ApiError(error.status_code, str(error.detail), kind, code=code)


def _failed(error: GenerationFailed, path: str) -> ApiError:
    if isinstance(error.error, SpecliError):
        return ApiError(500, error.error.message, "server_error")
    return ApiError(500, f"internal error: {type(error.error).__name__}: {error.error}", "server_error")


def _prompt(error: PromptError, path: str) -> ApiError:
    """No chat template, or a template that fails: the server's remedies, not the CLI's."""
    hint = SERVE_TEMPLATE_HINT if error.hint == NO_CHAT_HINT else error.hint
    return ApiError(400, error.message + (f" ({hint})" if hint else ""), param="messages")


SERVE_TEMPLATE_HINT = "start specli serve with --chat-template-file FILE, or send the prompt as is to /v1/completions"


# (exception type, its ApiError given the request's path), the first match wins. A type not
# here is a bug: the app's last resort answers it as a 500.
ERRORS: tuple[tuple[type[Exception], Callable[[Any, str], ApiError]], ...] = (
    (ApiError, lambda error, path: error),
    (RequestValidationError, _invalid),
    (StarletteHTTPException, _http),
    (RequestError, lambda error, path: ApiError(400, error.message, param=error.param, code=error.code)),
    (SourceConflict, lambda error, path: ApiError(400, error.message, param=error.name)),
    (ToolsUnsupported, lambda error, path: ApiError(400, f"{error.message}: tools are not supported ({error.hint})",
                                                    param="tools")),
    (ContextLengthError, lambda error, path: ApiError(400, error.message, param=PROMPT_FIELDS.get(path),
                                                      code="context_length_exceeded")),
    (PromptError, _prompt),
    (Gone, lambda error, path: ApiError(CLIENT_LEFT, "the client left while the request waited for its turn")),
    (Busy, lambda error, path: ApiError(503, f"the server is busy: {error.waiting} requests are already waiting",
                                        "server_error", code="queue_full",
                                        headers={"Retry-After": str(RETRY_AFTER_SECONDS)})),
    (Closing, lambda error, path: ApiError(503, "the server is shutting down", "server_error")),
    (GenerationFailed, _failed),
)


def api_error(error: Exception, path: str = "") -> ApiError:
    """`error` as ERRORS answers it; raises it again where the table has no entry."""
    for kind, describe in ERRORS:
        if isinstance(error, kind):
            return describe(error, path)
    raise error


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(ErrorResponse(error=error.body).model_dump(), status_code=error.status, headers=error.headers)
