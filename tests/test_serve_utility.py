"""llama-server's utility routes on `specli serve`, in its names and shapes: /tokenize and
/detokenize (the target's own tokens), /props, /slots, /metrics (only with --metrics), the
context size in /v1/models, and a 404 that names the routes there are. A real server on
127.0.0.1 with SmolLM2; the route table on a stand-in worker."""

from __future__ import annotations

import io

import httpx
import pytest
from fastapi.testclient import TestClient
from helpers import serving

from specli.decode.request import GenerationRequest
from specli.serve.app import Backend, ServerInfo, create_app


def test_an_unknown_route_is_a_404_that_names_the_routes_there_are():
    info = ServerInfo("m", "m.gguf", "ngram", None, GenerationRequest(max_tokens=4), 0)
    client = TestClient(create_app(Backend(), info, io.StringIO()), base_url="http://127.0.0.1:8080")
    reply = client.post("/v1/embeddings", json={"input": "hi"})
    assert reply.status_code == 404
    error = reply.json()["error"]
    assert error["type"] == "not_found_error" and error["message"].startswith("no route POST /v1/embeddings")
    for route in ("POST /v1/chat/completions", "POST /v1/responses", "POST /v1/messages", "POST /v1/completions",
                  "GET /v1/models", "GET /health",
                  "POST /tokenize", "GET /props"):
        assert route in error["message"]
    # /metrics is off unless the server was started with --metrics, as llama-server's
    off = client.get("/metrics")
    assert off.status_code == 501 and "--metrics" in off.json()["error"]["message"]


@pytest.fixture(scope="module")
def server(smollm_path):
    with serving("--target", smollm_path, "--metrics", "--parallel", "2") as server:
        yield server


def _root(server) -> str:
    return server.url.removesuffix("/v1")


@pytest.mark.slow
def test_tokenize_and_detokenize_are_the_targets_own(server, smollm_model):
    root = _root(server)
    text = "Hello, world <|im_start|> café"
    tokens = httpx.post(root + "/tokenize", json={"content": text}, timeout=30).json()["tokens"]
    assert tokens == smollm_model.tokenize(text, add_special=False, parse_special=True)
    with_bos = httpx.post(root + "/tokenize", json={"content": text, "add_special": True}, timeout=30).json()
    assert with_bos["tokens"] == smollm_model.tokenize(text, add_special=True, parse_special=True)
    pieces = httpx.post(root + "/tokenize", json={"content": text, "with_pieces": True}, timeout=30).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens and "".join(p["piece"] for p in pieces) == text
    back = httpx.post(root + "/detokenize", json={"tokens": tokens}, timeout=30).json()
    assert back == {"content": text}
    bad = httpx.post(root + "/detokenize", json={"tokens": [1, 10**9]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens.1"
    assert httpx.post(root + "/tokenize", json={"text": "no content field"}, timeout=30).status_code == 400


@pytest.mark.slow
def test_props_slots_models_and_metrics_say_what_the_server_is_and_did(server):
    root = _root(server)
    props = httpx.get(root + "/props", timeout=30).json()
    assert props["default_generation_settings"]["n_ctx"] == 1024 and props["total_slots"] == 2
    assert "im_start" in props["chat_template"] and props["drafts"][0] == "ngram"
    assert props["build_info"].startswith("specli ")
    assert httpx.get(root + "/slots", timeout=30).json() == [
        {"id": 0, "n_ctx": 1024, "is_processing": False}, {"id": 1, "n_ctx": 1024, "is_processing": False}]
    card = server.client().models.list().data[0]
    assert card.model_extra["meta"] == {"n_ctx": 1024, "n_vocab": 49152, "slots": 2}

    def counters() -> dict[str, float]:
        reply = httpx.get(root + "/metrics", timeout=30)
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
        return {line.split()[0]: float(line.split()[1]) for line in reply.text.splitlines()
                if line.startswith("llamacpp:")}

    before = counters()
    reply = server.client().completions.create(model="x", prompt="1, 2, 3, 4, 5, 6,", max_tokens=16, temperature=0)
    after = counters()
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] \
        == reply.usage.completion_tokens
    drafted = after["llamacpp:spec_decode_num_draft_tokens_total"] - before["llamacpp:spec_decode_num_draft_tokens_total"]
    assert drafted == reply.model_extra["timings"]["draft_n"]
    assert after["llamacpp:requests_processing"] == 0
