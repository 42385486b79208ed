"""What every route reads of the server: its facts (`ServerInfo`) and its worker once the pair
has loaded (`Backend`). Here, not in app.py, so that the routes' modules can name them
without importing the app that imports them."""

from __future__ import annotations

from dataclasses import dataclass

from specli.decode.request import GenerationRequest
from specli.serve.errors import RETRY_AFTER_SECONDS, ApiError
from specli.serve.worker import Worker


@dataclass(frozen=True)
class ServerInfo:
    name: str  # what responses call the model: the pair, or the target file
    target: str
    draft: str
    api_key: str | None
    defaults: GenerationRequest  # what a request's own fields override (serve's options)
    started: int
    metrics: bool = False  # /metrics answers (serve --metrics)
    build: str = ""  # specli's and llama-cpp-python's versions (/props' build_info)
    image_urls: bool = False  # fetch the http(s) image URLs requests name (serve --allow-image-urls)


class Backend:
    """The server's worker, once the pair has loaded and its costs are read; None until then."""

    def __init__(self, worker: Worker | None = None) -> None:
        self.worker = worker

    def ready(self) -> Worker:
        """The worker; while loading, a 503 with Retry-After."""
        if self.worker is None:
            raise ApiError(503, "the model is still loading: retry in a moment", "server_error", code="loading",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        return self.worker
