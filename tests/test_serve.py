"""`specli serve` through the official `openai` client, against real server processes on
127.0.0.1 with the real models: the same text as `specli run`, provenance, Predicted
Outputs, the KV cache across requests, and every fault a client can cause.

Every request loop here is bounded in count and time, and every server is stopped by its
fixture.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from helpers import CODE, Server, serving, specli_run
from openai import APIStatusError

pytestmark = pytest.mark.slow  # real models, real processes

GEMMA_PROMPT = "The three primary colours are red, yellow and blue. The three primary colours are"
EDIT = "Rewrite this Python code, renaming width to w:\n\n" + CODE + "\nThe rewritten code:\n\n"
CHAT_PROMPT = "Name three colours."
N = 24


def same_text(served: str, run_stdout: str) -> bool:
    """`specli run` ends its text with exactly one newline (trailing newlines folded)."""
    return served.rstrip("\n") == run_stdout.rstrip("\n")


# --- the same text ---------------------------------------------------------------


def test_completions_whole_and_streamed_equal_specli_run(gemma_server, gemma_path):
    """The server's first request decodes its prompt as `specli run` does: the same text. After
    that the cache holds part of the prompt, and only an exact request is bit for bit a fresh
    run's (otherwise the same up to a near-tie, as for speculative runs)."""
    expected = specli_run("--target", gemma_path, "-n", N, "-k", 4, GEMMA_PROMPT)
    client = gemma_server.client()
    whole = client.completions.create(model="anything", prompt=GEMMA_PROMPT, max_tokens=N, temperature=0,
                                      extra_body={"draft_tokens": 4})
    assert same_text(whole.choices[0].text, expected)
    assert whole.model == gemma_path.name, "the response names the loaded model"
    assert whole.usage.completion_tokens == N and whole.choices[0].finish_reason == "length"
    exact = specli_run("--target", gemma_path, "-n", N, "--exact", GEMMA_PROMPT)
    chunks = list(client.completions.create(model="x", prompt=GEMMA_PROMPT, max_tokens=N, stream=True,
                                            extra_body={"exact": True}, stream_options={"include_usage": True}))
    streamed = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    assert same_text(streamed, exact)
    assert chunks[-1].usage.completion_tokens == N, "include_usage: the last chunk has the usage"


def test_chat_whole_and_streamed_equal_specli_run(smol_server, smollm_path):
    expected = specli_run("--target", smollm_path, "-n", N, "-k", 3, CHAT_PROMPT)
    client = smol_server.client()
    messages = [{"role": "user", "content": CHAT_PROMPT}]
    whole = client.chat.completions.create(model="x", messages=messages, max_tokens=N, extra_body={"draft_tokens": 3})
    assert same_text(whole.choices[0].message.content, expected)
    with serving("--target", smollm_path) as fresh:  # an empty cache: the prompt is decoded as run decodes it
        stream = fresh.client().chat.completions.create(model="x", messages=messages, max_tokens=N, stream=True,
                                                        extra_body={"draft_tokens": 3})
        chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert same_text("".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices), expected)


def test_an_exact_request_writes_what_run_exact_writes_again_and_again(gemma_server, gemma_path):
    """exact: decoded as a fresh `specli run --exact` decodes, whatever the cache or the memory holds."""
    expected = specli_run("--target", gemma_path, "-n", 40, "--exact", CODE)
    client = gemma_server.client()
    texts = {client.completions.create(model="x", prompt=CODE, max_tokens=40, extra_body={"exact": True}).choices[0].text
             for _ in range(2)}
    assert len(texts) == 1 and same_text(texts.pop(), expected)


def test_the_same_greedy_request_sent_again_writes_the_same_text(gemma_server):
    """Not exact: the second time, the prompt's KV entries are all cached, and its last row is
    the one kept from the first time (a one-row decode of it rounds otherwise, and at a
    near-tie, here "return" against "print", the first token could flip)."""
    client = gemma_server.client()
    replies = [client.completions.create(model="x", prompt="def add(a, b):", max_tokens=16) for _ in range(3)]
    assert len({reply.choices[0].text for reply in replies}) == 1, [reply.choices[0].text for reply in replies]
    assert replies[-1].usage.prompt_tokens_details.cached_tokens == replies[-1].usage.prompt_tokens


def test_a_seeded_request_repeats(gemma_server):
    client = gemma_server.client()
    texts = {client.completions.create(model="x", prompt="Once upon a time", max_tokens=20, temperature=0.9,
                                       seed=11, extra_body={"exact": True}).choices[0].text for _ in range(2)}
    assert len(texts) == 1


def test_a_draft_with_another_vocabulary_drafts_through_text_for_requests(gemma_path, smollm_path):
    """Gemma 3 (262k tokens) drafting for SmolLM2 (49k): a request's `"draft": "model"` drafts
    through text, never with Gemma's own token ids; exact, it writes run --draft none --exact's text."""
    prompt = "The three primary colours are red, yellow and blue. Mixing red and yellow gives orange. The three primary colours are"
    expected = specli_run("--target", smollm_path, "--draft", "none", "--exact", "--no-chat", "-n", N, prompt)
    with serving("--target", smollm_path, "--draft", gemma_path, "--no-memory") as server:
        assert any("drafting through text" in line for line in server.log), server.log
        card = server.client().models.list().data[0].model_extra
        assert card["chat"] is True and card["drafts"] == ["model", "ngram", "none"], "the page offers all three"
        whole = server.client().completions.create(model="x", prompt=prompt, max_tokens=N, extra_body={
            "draft": "model", "exact": True, "draft_tokens": 4})
    assert same_text(whole.choices[0].text, expected)
    assert whole.timings["draft_n"] > 0 and whole.timings["draft_n_accepted"] > 0, whole.timings


# --- provenance ----------------------------------------------------------------------


def test_spans_join_to_the_content_and_chunks_carry_their_source(gemma_server):
    client = gemma_server.client()
    # A fixed draft length: whether -k auto drafts here depends on the costs this machine
    # measured (on a busy box it may find that no draft pays), and provenance is the subject.
    whole = client.completions.create(model="x", prompt=CODE + "\n" + CODE[:40], max_tokens=30,
                                      extra_body={"draft_tokens": 4})
    spans = whole.choices[0].spans
    assert "".join(span["text"] for span in spans) == whole.choices[0].text
    assert {span["source"] for span in spans} == {"draft", "target"}, "a copy is drafted"
    assert whole.usage.completion_tokens_details.accepted_prediction_tokens > 0
    assert whole.timings["draft_n_accepted"] == whole.usage.completion_tokens_details.accepted_prediction_tokens
    # The copy under way from the prompt's first token: the first step drafts and keeps several.
    every = list(client.completions.create(model="x", prompt=CODE + "\n\n" + CODE[:9], max_tokens=30, stream=True,
                                           extra_body={"draft_tokens": 8}, stream_options={"include_usage": True}))
    chunks = [c for c in every if c.choices and c.choices[0].text]
    # Each chunk says how many tokens its text holds: they add up to the answer's.
    assert sum(chunk.choices[0].tokens or 0 for chunk in every if chunk.choices) == every[-1].usage.completion_tokens
    assert all(chunk.choices[0].tokens >= 1 for chunk in chunks)
    sources = [chunk.choices[0].source for chunk in chunks]
    assert set(sources) == {"draft", "target"}
    # One chunk per run of a source: a step's kept draft tokens together (every step ends with
    # the target's token), the first step's too.
    assert all(not (a == b == "draft") for a, b in zip(sources, sources[1:])), sources


# --- Predicted Outputs and the caches --------------------------------------------------


def test_a_prediction_raises_accepted_tokens_and_leaves_the_text(gemma_server):
    client = gemma_server.client()
    prompt = "Once upon a time, in a small village by the sea,"
    # exact: bit for bit the same text whatever is drafted; a fixed draft length, as -k auto
    # may find that no draft pays within the exact batch (3 rows on some CPUs).
    steer = {"exact": True, "draft_tokens": 8}
    plain = client.completions.create(model="x", prompt=prompt, max_tokens=48, extra_body=steer)
    predicted = client.completions.create(model="x", prompt=prompt, max_tokens=48, extra_body={
        **steer, "prediction": {"type": "content", "content": plain.choices[0].text}})
    assert predicted.choices[0].text == plain.choices[0].text
    accepted = predicted.usage.completion_tokens_details.accepted_prediction_tokens
    assert accepted > plain.usage.completion_tokens_details.accepted_prediction_tokens
    assert accepted >= 20, accepted


def test_a_resent_conversation_prefills_only_its_new_tokens(smol_server):
    client = smol_server.client()
    messages = [{"role": "user", "content": "Say hello."}]
    first = client.chat.completions.create(model="x", messages=messages, max_tokens=12)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And goodbye?"}]
    second = client.chat.completions.create(model="x", messages=messages, max_tokens=12)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens, (cached, first.usage.prompt_tokens)
    assert second.timings["prompt_n"] == second.usage.prompt_tokens - cached


def test_a_served_exact_conversation_is_plain_decodings_turn_by_turn(smol_server):
    """Three turns with `exact`, drafted and with draft "none": each answer is the same, the
    conversation passing 256 tokens (where this CPU's exact batch changes)."""
    client = smol_server.client()
    asks = ["List the days of the week, one per line.", "Repeat that list exactly.", "Now list them backwards."]
    conversations: dict[str, list[str]] = {}
    for draft in ("ngram", "none"):
        messages: list[dict] = [{"role": "system", "content": "Answer exactly what is asked. " * 12}]
        for ask in asks:
            messages.append({"role": "user", "content": ask})
            response = client.chat.completions.create(model="x", messages=messages, max_tokens=64, temperature=0,
                                                      extra_body={"exact": True, "draft": draft})
            messages.append({"role": "assistant", "content": response.choices[0].message.content})
        conversations[draft] = [m["content"] for m in messages if m["role"] == "assistant"]
        assert response.usage.prompt_tokens > 256
    assert conversations["ngram"] == conversations["none"]


# --- faults ------------------------------------------------------------------------


def error_of(call) -> tuple[int, dict]:
    with pytest.raises(APIStatusError) as raised:
        call()
    return raised.value.status_code, raised.value.body or {}


def test_fields_specli_cannot_honour_are_refused_by_name(gemma_server):
    client = gemma_server.client()
    for extra, param in [({"n": 2}, "n"), ({"logit_bias": {"999999": 5}}, "logit_bias"), ({"logprobs": 21}, "logprobs"),
                         ({"response_format": {"type": "yaml"}}, "response_format.type"),
                         ({"frequency_penalty": 2.5}, "frequency_penalty")]:
        status, body = error_of(lambda: client.completions.create(model="x", prompt="hi", max_tokens=2, extra_body=extra))
        assert status == 400 and body["param"] == param, (extra, body)
    status, body = error_of(lambda: gemma_server.client().chat.completions.create(
        model="x", messages=[{"role": "user", "content": "hi"}], tools=[{"type": "function", "function": {"name": "f"}}]))
    assert status == 400 and body["param"] == "tools"
    status, body = error_of(lambda: client.completions.create(model="x", prompt="hi", extra_body={"draft": "model"}))
    assert status == 400 and body["param"] == "draft" and "no draft model" in body["message"]


def test_malformed_bodies_and_wrong_types_are_400(gemma_server):
    url = gemma_server.url + "/completions"
    response = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
    response = httpx.post(url, json={"prompt": "hi", "max_tokens": "many"}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens"
    response = httpx.post(url, json={"prompt": "hi", "temperature": -1}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "temperature"
    response = httpx.post(url, content=b"x" * (9 << 20), headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 413
    chunked = (b"x" * (1 << 20) for _ in range(9))  # no Content-Length: refused as it arrives
    response = httpx.post(url, content=chunked, headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    for prompt in ([], [10**7], [-1]):
        response = httpx.post(url, json={"prompt": prompt, "max_tokens": 2}, timeout=30)
        assert response.status_code == 400 and response.json()["error"]["param"] == "prompt", prompt


def test_a_prompt_longer_than_the_context_is_400_context_length_exceeded(gemma_server):
    status, body = error_of(lambda: gemma_server.client().completions.create(
        model="x", prompt="word " * 2000, max_tokens=2))
    assert status == 400 and body["code"] == "context_length_exceeded"


def test_a_base_model_has_no_chat_endpoint_to_offer(gemma_server):
    status, body = error_of(lambda: gemma_server.client().chat.completions.create(
        model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=2))
    assert status == 400 and "no chat template" in body["message"]


def test_an_api_key_is_required_when_set(gemma_path):
    with serving("--target", gemma_path, env={"SPECLI_API_KEY": "sesame"}) as server:
        status, body = error_of(lambda: server.client("wrong").models.list())
        assert status == 401 and body["code"] == "invalid_api_key"
        assert httpx.get(server.url + "/models", timeout=30).status_code == 401, "no key at all"
        card = server.client("sesame").models.list().data[0]
        assert card.id == gemma_path.name
        assert card.model_extra["chat"] is False and card.model_extra["drafts"] == ["ngram", "none"]
        assert httpx.get(server.url.removesuffix("/v1") + "/health", timeout=30).status_code == 200


def hold(server: Server, max_tokens: int = 300) -> threading.Thread:
    """A streamed generation that holds the server's turn; returns once its first chunk came."""
    first = threading.Event()

    def stream() -> None:
        for _ in server.client().completions.create(model="x", prompt="Once upon a time", max_tokens=max_tokens,
                                                     stream=True):
            first.set()
        first.set()

    thread = threading.Thread(target=stream)
    thread.start()
    assert first.wait(60), "the holding generation started"
    return thread


def test_eight_concurrent_clients_each_get_their_own_answer_or_503(gemma_path):
    """--parallel 1 --queue 2: while one generates, two wait and the rest are told to come back
    (503, Retry-After). Exact requests: each answer is bit for bit its solo run's, whatever ran
    before it."""
    subjects = ["cats", "rivers", "bread", "trains", "maps", "bells", "snow", "glass"]
    ask = lambda subject: dict(model="x", prompt=f"A short poem about {subject}:\n",  # noqa: E731
                               max_tokens=24, extra_body={"exact": True})
    answers: dict[str, object] = {}
    with serving("--target", gemma_path, "--parallel", "1", "--queue", "2") as server:
        client = server.client()
        solo = {s: client.completions.create(**ask(s)).choices[0].text for s in subjects}
        holder = hold(server)

        def request(subject: str) -> None:
            try:
                answers[subject] = client.completions.create(**ask(subject)).choices[0].text
            except APIStatusError as error:
                answers[subject] = (error.status_code, error.response.headers.get("retry-after"))

        threads = [threading.Thread(target=request, args=(s,)) for s in subjects]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        holder.join(timeout=300)
    assert set(answers) == set(subjects), "every client got an answer"
    refused = [s for s, a in answers.items() if isinstance(a, tuple)]
    assert all(answers[s] == (503, "1") for s in refused)
    served = [s for s in subjects if s not in refused]
    assert len(served) == 2 and len(refused) == 6, answers  # the two that fit in the queue
    for subject in served:
        assert answers[subject] == solo[subject], subject


def test_a_client_that_disconnects_mid_stream_frees_the_server_at_once(gemma_server):
    url = gemma_server.url + "/completions"
    # Plain decoding, so what is left of it takes ~10 s whatever drafting would gain on this machine.
    with httpx.stream("POST", url, json={"prompt": "Once upon a time", "stream": True, "draft": "none"},
                      timeout=60) as response:
        for i, _ in enumerate(response.iter_lines()):
            if i >= 6:
                break  # leave with the generation under way (to the end of the context: 1000 tokens)
    started = time.monotonic()
    reply = gemma_server.client().completions.create(model="x", prompt="Hello", max_tokens=4)
    assert reply.usage.completion_tokens == 4
    assert time.monotonic() - started < 4, "the abandoned generation did not hold the server"
    # It was cancelled, not run to its end: the line is written as the worker is let go.
    deadline = time.monotonic() + 10
    while not any("client went away" in line for line in gemma_server.log) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert any("client went away" in line for line in gemma_server.log)


def test_a_client_that_leaves_while_queued_gives_up_its_place(gemma_path):
    """--parallel 1 --queue 1: a request that waits, then leaves, frees the queue: the next one
    waits in its place instead of being refused."""
    with serving("--target", gemma_path, "--parallel", "1", "--queue", "1") as server:
        holder = hold(server)
        with pytest.raises(httpx.TimeoutException):
            httpx.post(server.url + "/completions", json={"prompt": "Hi", "max_tokens": 4}, timeout=0.5)
        # The server asks a waiting request's client every 0.2 s; on a busy box, when it gets to
        # ask is not a fixed time: wait for it to say the place was given up (at most 30 s).
        deadline = time.monotonic() + 30
        while not any(" 499 " in line and "waited" in line for line in server.log) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert any(" 499 " in line and "waited" in line for line in server.log), server.log
        reply = server.client().completions.create(model="x", prompt="Hello", max_tokens=4)
        assert reply.usage.completion_tokens == 4, "queued, not refused"
        holder.join(timeout=120)


def test_parallel_requests_generate_at_once_and_the_queue_holds_the_rest(gemma_path):
    """--parallel 2 --queue 1: two generate side by side (/health says so), one waits, more get 503."""
    with serving("--target", gemma_path, "--parallel", "2", "--queue", "1") as server:
        holders = [hold(server), hold(server)]  # both streaming at once: neither waits for the other
        assert httpx.get(server.url.removesuffix("/v1") + "/health", timeout=30).json() == {
            "status": "ok", "slots_processing": 2, "slots_idle": 0, "requests_waiting": 0}
        waiting = threading.Thread(target=lambda: server.client().completions.create(model="x", prompt="Hi", max_tokens=2))
        waiting.start()
        deadline = time.monotonic() + 30
        while httpx.get(server.url.removesuffix("/v1") + "/health", timeout=30).json()["requests_waiting"] != 1:
            assert time.monotonic() < deadline, "the third request waits"
            time.sleep(0.05)
        status, _ = error_of(lambda: server.client().completions.create(model="x", prompt="Hi", max_tokens=2))
        assert status == 503
        for thread in (*holders, waiting):
            thread.join(timeout=120)


def test_sigterm_cancels_the_request_in_flight_and_exits_0(gemma_path):
    with serving("--target", gemma_path) as server:
        url = server.url + "/completions"
        with httpx.stream("POST", url, json={"prompt": "Once upon a time", "max_tokens": 3000, "stream": True},
                          timeout=60) as response:
            lines = response.iter_lines()
            next(lines)
            server.process.send_signal(signal.SIGTERM)
            started = time.monotonic()
            rest = list(lines)  # the stream ends, finished early
        assert server.process.wait(timeout=30) == 0
        assert time.monotonic() - started < 15
        assert "data: [DONE]" in rest and any("shutting down" in line for line in rest)


def test_a_port_in_use_is_one_line_and_exit_1(gemma_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "specli", "serve", "--target", str(gemma_path), "--port",
                                 str(port)], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 1
    assert result.stderr.startswith("specli: error: cannot listen on 127.0.0.1:") and result.stderr.count("\n") == 1


def test_binding_beyond_loopback_without_a_key_warns(monkeypatch, gemma_path):
    """Checked in-process, opening nothing: listening fails right after the warning."""
    import io

    from specli.serve import server
    from specli.errors import SpecliError
    from specli.session import SessionSpec

    def refuse(host, port):
        raise SpecliError("not listening in this test")

    monkeypatch.setattr(server, "listen", refuse)
    err = io.StringIO()
    with pytest.raises(SpecliError):
        server.serve(SessionSpec(gemma_path), server.ServeSettings(host="0.0.0.0"), err)
    assert "warning: serving on 0.0.0.0 without --api-key" in err.getvalue()
    assert server.is_loopback("127.0.0.2") and server.is_loopback("::1") and not server.is_loopback("10.1.2.3")
