"""What a client sends cannot crash `specli serve`, a web page elsewhere cannot use it, and it
is honest while it starts: never-ending constraints, odd logit_bias keys, bodies that are
not JSON objects, spoofed Host and Origin headers, /health while loading and while a large
body is read, Ctrl-C while loading, and the line that keeps a retrying client's place.
Processes and clients stay on loopback, with every loop bounded in count and time."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient
from helpers import generated, serving

from tests.support.harness import free_port
from specli.decode.constraint import Constraint, ConstraintError
from specli.decode.events import Stats
from specli.decode.request import DraftKind, GenerationRequest
from specli.serve.app import ServerInfo, create_app
from specli.serve.guard import Access
from specli.serve.worker import Busy, Job, Line, Worker
from specli.stream import Outcome

ENDLESS_GRAMMAR = 'root ::= "a" root'
SELF_REQUIRING = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
                  "$ref": "#/$defs/n"}


class WritingWorker:
    """Stands in for serve.worker.Worker: every generation writes "fine"."""

    queue = 2
    parallel = 1

    def __init__(self) -> None:
        target = SimpleNamespace(n_ctx=64, n_vocab=100, tokenize=lambda text, **_: [1, 2, 3],
                                 chat_template=lambda: None)
        self.session = SimpleNamespace(target=target, unavailable=lambda kind: kind.load and "not loaded",
                                       projector=None)

    async def start(self, job, on_event, gone=None, key=""):
        future = asyncio.get_running_loop().create_future()
        future.set_result(Outcome(Stats(proposer="ngram", prompt_tokens=3, tokens=1, finish_reason="length"), [5],
                                  "fine", [("fine", "target", "")]))
        return future, threading.Event()


def client_for(access: Access | None = None, base_url: str = "http://127.0.0.1:8080", log=None) -> TestClient:
    info = ServerInfo("m", "m.gguf", "ngram", None, GenerationRequest(max_tokens=4), 0)
    return TestClient(create_app(WritingWorker(), info, log or io.StringIO(), access), base_url=base_url)


# --- constraints that never end, or admit nothing -------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("constraint", [Constraint.gbnf(ENDLESS_GRAMMAR), Constraint.json_schema(SELF_REQUIRING)],
                         ids=["grammar", "schema"])
def test_a_constraint_whose_forced_text_never_ends_writes_to_the_token_limit_as_plain_decoding(gemma_session,
                                                                                               constraint):
    """Gemma's 262k vocabulary is where llguidance's parser ran out of items and the request
    crashed; now it writes what plain masked decoding writes, to the limit (finish "length")."""
    prompt = gemma_session.target.tokenize("x")
    written = {}
    for draft in (DraftKind.NGRAM, DraftKind.NONE):
        request = GenerationRequest(max_tokens=24, draft=draft, constraint=constraint)
        tokens, stats = generated(gemma_session.engine_for(request), prompt)
        assert (len(tokens), stats.finish_reason) == (24, "length")
        written[draft] = tokens
    assert written[DraftKind.NGRAM] == written[DraftKind.NONE], "forced and plain write the same tokens"
    text = b"".join(gemma_session.target.piece(token) for token in written[DraftKind.NONE]).decode()
    assert text.startswith("aaaa" if constraint.kind == "grammar" else '{"c": {"c": ')


@pytest.mark.parametrize("grammar", ["root ::= ", 'root ::= ""', 'root ::= "" ""'])
def test_a_grammar_that_admits_only_the_empty_text_is_refused(grammar):
    with pytest.raises(ConstraintError, match="admits only the empty text"):
        Constraint.gbnf(grammar)
    Constraint.gbnf('root ::= "a" | ""')  # the empty text among others: taken


def test_a_deep_schema_is_refused_in_one_short_line():
    schema: object = {"type": "integer", "minimum": "x"}
    for i in range(60):
        schema = {"type": "object", "properties": {f"field_number_{i}": schema}}
    with pytest.raises(ConstraintError) as refused:
        Constraint.json_schema(schema)
    assert "field_number_59" in refused.value.message and "…" in refused.value.message
    assert len(refused.value.message) < 200, refused.value.message
    with pytest.raises(ConstraintError, match="nests deeper than 128 levels"):
        Constraint.json_schema("[" * 5000 + "]" * 5000)


# --- bodies -------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["²", "٣", "1" * 5000, "-1", " 1", "1.0", "0x10"])
def test_odd_logit_bias_keys_are_a_400_naming_the_field(key):
    with client_for() as client:
        answer = client.post("/v1/completions", json={"prompt": "hi", "logit_bias": {key: 1}})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "logit_bias", answer.text
    assert len(answer.json()["error"]["message"]) < 200


@pytest.mark.parametrize("content, message", [
    (b"", "the body is empty: send a JSON object, e.g. {\"prompt\""),
    (b"  \n", "the body is empty"),
    (b"\xff\xfe{}", "the body is not UTF-8 text"),
    (b"{\"prompt\": ", "the body is not valid JSON: Expecting value at line 1 column 12"),
    (b"[1, 2]", "the body is a JSON array, not an object"),
    (b"\"hi\"", "the body is a JSON string, not an object"),
    (b"[" * 10000 + b"]" * 10000, "deeper than 64 levels"),
    (b"{\"prompt\": \"hi\", \"x\": " + b"[" * 100 + b"]" * 100 + b"}", "deeper than 64 levels"),
    (b"{\"prompt\": \"hi\", \"temperature\": NaN}", "the body holds NaN, which is not JSON"),
    (b"{\"prompt\": \"hi\", \"temperature\": Infinity}", "the body holds Infinity"),
])
def test_a_body_that_is_no_json_object_gets_a_400_that_says_what_to_send(content, message):
    with client_for() as client:
        answer = client.post("/v1/completions", content=content, headers={"content-type": "application/json"})
    assert answer.status_code == 400 and message in answer.json()["error"]["message"], answer.text


def test_a_json_body_is_read_whatever_its_content_type_says():
    """`curl -d` sends application/x-www-form-urlencoded, as llama-server and Ollama accept."""
    body = json.dumps({"prompt": "hi"}).encode()
    with client_for() as client:
        for kind in ("application/x-www-form-urlencoded", "text/plain", None):
            headers = {"content-type": kind} if kind else {}
            answer = client.post("/v1/completions", content=body, headers=headers)
            assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == "fine", (kind, answer.text)


# --- Host and Origin --------------------------------------------------------------------------


def test_a_spoofed_host_is_refused_unless_allowed():
    for url in ("http://evil.example:8080", "http://127.0.0.1.nip.io:8080"):
        with client_for(base_url=url) as client:
            for answer in (client.get("/health"), client.get("/v1/models"),
                           client.post("/v1/completions", json={"prompt": "hi"})):
                error = answer.json()["error"]
                assert answer.status_code == 403 and error["code"] == "host_not_allowed", answer.text
                assert "--allow-host" in error["message"]
    with client_for(Access(hosts=("evil.example",)), base_url="http://evil.example:8080") as client:
        assert client.get("/v1/models").status_code == 200
    for url in ("http://localhost:8080", "http://[::1]:8080", "http://192.168.1.20:8080", "http://app.localhost"):
        with client_for(base_url=url) as client:
            assert client.get("/v1/models").status_code == 200, url


def test_a_page_from_another_origin_is_refused_and_the_servers_own_page_is_not():
    with client_for() as client:
        own = client.post("/v1/completions", json={"prompt": "hi"}, headers={"origin": "http://127.0.0.1:8080"})
        assert own.status_code == 200
        for origin in ("http://evil.example", "null", "http://127.0.0.1.evil.example"):
            answer = client.post("/v1/completions", json={"prompt": "hi"}, headers={"origin": origin})
            assert answer.status_code == 403 and answer.json()["error"]["code"] == "origin_not_allowed", origin
            assert "access-control-allow-origin" not in answer.headers
            preflight = client.options("/v1/completions", headers={
                "origin": origin, "access-control-request-method": "POST"})
            assert preflight.status_code == 403, origin
        # A simple cross-origin POST (no preflight: text/plain) is refused before it runs.
        sneaky = client.post("/v1/completions", content=b'{"prompt": "hi"}',
                             headers={"origin": "http://evil.example", "content-type": "text/plain"})
        assert sneaky.status_code == 403


def test_pages_on_this_machine_and_allowed_origins_get_cors_headers():
    with client_for(Access(origins=("https://app.example",))) as client:
        for origin in ("http://localhost:3000", "http://127.0.0.1:5173", "https://app.example"):
            preflight = client.options("/v1/chat/completions", headers={
                "origin": origin, "access-control-request-method": "POST",
                "access-control-request-headers": "authorization, content-type"})
            assert preflight.status_code == 204
            assert preflight.headers["access-control-allow-origin"] == origin
            assert "POST" in preflight.headers["access-control-allow-methods"]
            assert "authorization" in preflight.headers["access-control-allow-headers"]
            answer = client.post("/v1/completions", json={"prompt": "hi"}, headers={"origin": origin})
            assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == origin
        assert client.get("/v1/models", headers={"origin": "https://other.example"}).status_code == 403
    with client_for(Access(origins=("*",))) as client:
        assert client.get("/v1/models", headers={"origin": "https://other.example"}).status_code == 200


# --- the line: a retrying client keeps its place ------------------------------------------------


def test_the_line_hands_a_freed_place_to_the_first_refused():
    now = [0.0]
    line = Line(hold=10.0, clock=lambda: now[0])
    for key in "abc":
        assert line.ahead(key) == len(line)
        line.refuse(key)
    assert [line.ahead(key) for key in "abcz"] == [0, 1, 2, 3]
    line.admit("a")
    assert [line.ahead(key) for key in "bcz"] == [0, 1, 2]
    now[0] = 8.0
    line.refuse("c")  # c retried; b did not
    now[0] = 12.0
    assert [line.ahead(key) for key in "bcz"] == [1, 0, 1], "b left the line: not heard of for 10 s"


def test_a_client_that_keeps_retrying_gets_its_turn_before_those_refused_after_it():
    """--queue 0: one generates, none waits. Clients refused in the order a, b, c are started
    in that order, however the others' retries fall; a newcomer waits behind them all."""
    session = SimpleNamespace(pricing=SimpleNamespace(costs=lambda **_: None, drafters={}), slots=[])
    worker = Worker(session, queue=0, memory=False)  # type: ignore[arg-type]
    release = threading.Event()
    worker._generate = lambda job, sink, cancel: release.wait(5)  # type: ignore[method-assign]
    started: list[str] = []

    async def attempt(key: str) -> bool:
        try:
            future, _ = await worker.start(Job([1], GenerationRequest()), None, key=key)
        except Busy:
            return False
        started.append(key)
        future.add_done_callback(lambda _: release.clear())
        return True

    async def scenario() -> None:
        assert await attempt("first")
        for key in "abc":
            assert not await attempt(key)
        for round_ in range(6):  # each round: everyone retries, newcomers first, then one place frees
            for key in ["new", "c", "b", "a"][round_ % 2:] + ["new", "c", "b", "a"][: round_ % 2]:
                if key not in started:
                    await attempt(key)
            release.set()
            for _ in range(100):
                await asyncio.sleep(0.01)
                if worker._admitted == 0:
                    break
        assert started == ["first", "a", "b", "c", "new"], started

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        worker.close()


# --- a real server: /health while loading and during a large body, Ctrl-C while loading ------


def _poll_health(url: str, until: float, seen: list[tuple[float, int, dict]], stop: threading.Event) -> None:
    with httpx.Client(timeout=5) as client:
        while time.monotonic() < until and not stop.is_set():
            began = time.monotonic()
            try:
                answer = client.get(url)
                seen.append((time.monotonic() - began, answer.status_code, answer.json()))
            except httpx.TransportError:
                pass  # not listening yet: the process is still starting Python
            time.sleep(0.02)


@pytest.mark.slow
def test_health_says_loading_at_once_and_ctrl_c_while_loading_exits_130(gemma_path, tmp_path):
    """--exact on a fresh cache measures the exact batches before serving: seconds of loading."""
    port = free_port()
    env = {**os.environ, "SPECLI_CACHE": str(tmp_path / "cache")}
    process = subprocess.Popen([sys.executable, "-m", "specli", "serve", "--target", str(gemma_path), "--port",
                                str(port), "-c", "1024", "--exact"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    seen: list[tuple[float, int, dict]] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(code == 503 for _, code, _ in seen):
            _poll_health(f"http://127.0.0.1:{port}/health", time.monotonic() + 0.5, seen, threading.Event())
        assert seen and all((code, body) == (503, {"status": "loading"}) for _, code, body in seen), seen
        assert max(seconds for seconds, _, _ in seen) < 1.0, "answered at once, not after the load"
        process.send_signal(signal.SIGINT)
        err = process.communicate(timeout=60)[1]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert err.splitlines()[-1] == f"specli: error: interrupted while loading {gemma_path.name}", err
    assert "Traceback" not in err




@pytest.mark.slow
def test_health_answers_at_once_while_a_large_body_is_read(smollm_path):
    """A 5 MB chat body is parsed, templated and tokenised in a reader thread: /health and
    the event loop go on (it took 3.5 s when the handler read it on the loop)."""
    with serving("--target", smollm_path) as server:
        base = server.url.removesuffix("/v1")
        seen: list[tuple[float, int, dict]] = []
        stop = threading.Event()
        poller = threading.Thread(target=_poll_health, args=(f"{base}/health", time.monotonic() + 60, seen, stop))
        big = {"messages": [{"role": "user", "content": "lorem ipsum dolor sit amet " * 190_000}], "max_tokens": 1}
        poller.start()
        try:
            time.sleep(0.3)
            began = time.monotonic()
            answer = httpx.post(f"{server.url}/chat/completions", json=big, timeout=120)
            took = time.monotonic() - began
        finally:
            stop.set()
            poller.join()
    assert len(json.dumps(big)) > 5_000_000
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "context_length_exceeded", answer.text
    during = [seconds for seconds, code, _ in seen if code == 200]
    assert len(during) >= 5, seen
    assert max(during) < 0.5, f"/health took {max(during):.2f} s while the body ({took:.1f} s) was read"
