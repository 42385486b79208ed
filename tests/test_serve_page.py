"""The page `specli serve` shows at `/`, in a real browser: headless Chromium driven by
selenium, against real server processes on 127.0.0.1 with the real models.

Chromium and its driver come from Debian's packages (`chromium`, `chromium-driver`), which
`.ci/run` installs; where they are missing these tests are skipped, unless
SPECLI_BROWSER_REQUIRED=1 (CI sets it) makes that a failure. Screenshots are kept in
`test-artifacts/` (or $SPECLI_TEST_ARTIFACTS) for a person to look at.

Where the behaviour under test is the page's own (Markdown, following the answer, keys,
layout), a scripted stream stands in for the server's: the page is served without a model,
and `Scripted` replaces its `fetch` before its scripts run and pushes chunks in the API's
shape, so each step can be checked as it arrives. Real servers and models check the rest,
and that both agree.

Every wait here is bounded in time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest
from helpers import CODE, serving

pytestmark = pytest.mark.slow  # real models, real processes, a real browser

STATIC = Path(__file__).parent.parent / "specli" / "serve" / "static"
ARTIFACTS = Path(os.environ.get("SPECLI_TEST_ARTIFACTS", Path(__file__).parent.parent / "test-artifacts"))
COPY_PROMPT = CODE + "\n\n" + CODE + "\n\ndef area(width, height):"
HOSTILE = 'Row: <script>alert(1)</script> <img src=x onerror="window.pwned=1"> [click](javascript:alert(1))\n'
KEY = "page-test-key"
CODE_ASK = "Write a Python function that adds two numbers."
MARKUP = set("`*_~#>-+|:.)0123456789 \t\n\\")  # what Markdown may leave out of the page
WAIT = 120  # seconds an answer may take


def _browser_paths() -> tuple[str, str] | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (chromium, driver) if chromium and driver else None


@pytest.fixture(scope="module")
def browser():
    paths = _browser_paths()
    if paths is None:
        message = "headless Chromium is not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("SPECLI_BROWSER_REQUIRED") == "1":
            pytest.fail(message)
        pytest.skip(message)
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,860", "--lang=en-GB"):
        options.add_argument(argument)
    options.binary_location = paths[0]
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(paths[1]))  # no Selenium Manager: no download
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def embedded_server():
    """`specli serve` with no model named: the embedded default, Gemma 3 270M (a base model)."""
    with serving("--no-memory") as server:
        yield server


@pytest.fixture(scope="module")
def chat_server(smollm_path):
    # No memory of earlier answers: the API's repeat of the page's request must draft as the page's did.
    with serving("--target", smollm_path, "--api-key", KEY, "--no-memory") as server:
        yield server


@pytest.fixture(scope="module")
def page_server():
    """The page's own routes, as `specli serve` adds them, without a model: for the tests whose
    stream is scripted. Its `url` is where the API would be."""
    import threading
    from types import SimpleNamespace

    import uvicorn
    from fastapi import FastAPI

    from specli.serve.page import add_page

    app = FastAPI()
    add_page(app)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 30, "the page's server")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}/v1")
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def page_url(server) -> str:
    return server.url.removesuffix("/v1") + "/"


def find(driver, selector: str):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def wait_for(condition, seconds: float = WAIT, what: str = "the page"):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what}: not done within {seconds} s")


def open_page(driver, server) -> None:
    driver.get(page_url(server))
    driver.execute_script("window.alerts = 0; window.alert = () => { window.alerts += 1; };")
    wait_for(lambda: find(driver, "#compose:not([hidden])") or find(driver, "#key:not([hidden])"), 30,
             "the page connecting")


def settle(driver) -> None:
    wait_for(lambda: driver.execute_script("return document.getElementById('send').disabled === false && "
                                           "document.getElementById('stop').disabled === true"),
             what="the answer")


def set_field(driver, element_id: str, value: str) -> None:
    element = find(driver, "#" + element_id)[0]
    element.clear()
    element.send_keys(value)


def ask(driver, prompt: str, max_tokens: int, draft: str | None = None, enter: bool = False) -> None:
    """Fills the settings and the prompt, sends (with the button, or typed and Enter), and
    waits for the answer to end."""
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    set_field(driver, "max-tokens", str(max_tokens))
    set_field(driver, "temperature", "0")
    if draft is not None:
        Select(find(driver, "#draft")[0]).select_by_value(draft)
    if enter:
        find(driver, "#prompt")[0].send_keys(prompt + Keys.ENTER)
    else:
        driver.execute_script("document.getElementById('prompt').value = arguments[0];", prompt)
        find(driver, "#send")[0].click()
    wait_for(lambda: find(driver, "#stop:enabled") or find(driver, "#send:enabled"), 10, "sending")
    settle(driver)


def answer_spans(driver) -> list[tuple[str, str]]:
    """The last answer's (source, text) runs, in order."""
    return driver.execute_script("""
        const answers = document.querySelectorAll('#conversation .message.assistant');
        const last = answers[answers.length - 1];
        return Array.from(last.querySelectorAll('span.draft, span.target'))
            .map((span) => [span.className, span.textContent]);""")


def stat(driver, name: str) -> str:
    return find(driver, "#stat-" + name)[0].text


def screenshot(driver, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000, "a screenshot of the page, not an empty one"
    return path


def streamed_runs(server, body: dict, route: str, headers: dict | None = None) -> tuple[list[tuple[str, str]], dict]:
    """The API's own stream for a request: its (source, text) runs and its usage chunk."""
    import json

    runs: list[tuple[str, str]] = []
    usage: dict = {}
    with httpx.stream("POST", server.url + route, json={**body, "stream": True,
                                                        "stream_options": {"include_usage": True}},
                      headers=headers or {}, timeout=WAIT) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[len("data: "):])
            usage = data.get("usage") or usage
            for choice in data["choices"]:
                text = choice["delta"].get("content") if "delta" in choice else choice["text"]
                if text:
                    runs.append((choice["source"], text))
    return runs, usage


def joined(runs: list[tuple[str, str]]) -> str:
    return "".join(text for _, text in runs)


def assert_shown_with_provenance(spans: list[tuple[str, str]], runs: list[tuple[str, str]]) -> None:
    """Each span the page shows is a piece of the API's text, in order, inside one run of its
    own source; what the page leaves out of the text is Markdown's markup and white space."""
    text = joined(runs)
    owner = "".join(source[0] * len(piece) for source, piece in runs)
    at, left_out = 0, []
    for source, piece in spans:
        found = text.find(piece, at)
        assert found >= 0, f"{piece!r} is not in the API's text after {text[:at]!r}"
        assert set(owner[found:found + len(piece)]) == {source[0]}, f"{piece!r} is shown as {source}'s"
        left_out.append(text[at:found])
        at = found + len(piece)
    left_out.append(text[at:])
    assert set("".join(left_out)) <= MARKUP, f"text the page does not show: {left_out}"


class Scripted:
    """The page with its `fetch` replaced before its scripts run: `GET v1/models` answers
    `card`, and an answer's stream is whatever the test pushes, in the API's shape. The
    requests the page sent are kept."""

    STUB = """
        window.scriptedRequests = [];
        const card = %s;
        window.fetch = async (path, init) => {
            if (String(path).endsWith("v1/models")) {
                return new Response(JSON.stringify({object: "list", data: [card]}),
                                    {headers: {"Content-Type": "application/json"}});
            }
            window.scriptedRequests.push(JSON.parse(init.body));
            const stream = new ReadableStream({start(controller) { window.scriptedStream = controller; }});
            return new Response(stream, {headers: {"Content-Type": "text/event-stream"}});
        };
        window.scriptedPush = (text) => window.scriptedStream.enqueue(new TextEncoder().encode(text));
    """

    def __init__(self, driver, server, chat: bool = True) -> None:
        self.driver, self.chat = driver, chat
        card = {"id": "scripted.gguf", "object": "model", "created": 0, "owned_by": "specli",
                "target": "scripted.gguf", "draft": "ngram", "chat": chat, "drafts": ["ngram", "none"]}
        stub = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": self.STUB % json.dumps(card)})
        try:
            open_page(driver, server)
        finally:
            driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": stub["identifier"]})
        self.steps: list[tuple[str, int]] = []  # (source, tokens) of the answer's chunks so far

    def send(self, prompt: str = "Go.") -> None:
        self.driver.execute_script("document.getElementById('prompt').value = arguments[0];", prompt)
        find(self.driver, "#send")[0].click()
        wait_for(lambda: self.driver.execute_script("return window.scriptedStream !== undefined && "
                                                    "document.getElementById('stop').disabled === false"),
                 10, "the page's request")

    def push(self, text: str, source: str, tokens: int = 1, drafted: int | None = None,
             proposer: str = "ngram") -> None:
        choice: dict = {"index": 0, "source": source, "proposer": proposer if source == "draft" else None,
                        "tokens": tokens, "finish_reason": None, "drafted": drafted}
        choice.update({"delta": {"content": text}} if self.chat else {"text": text, "logprobs": None})
        self._event({"id": "x", "created": 0, "model": "scripted.gguf", "choices": [choice]})
        self.steps.append((source, tokens))

    def end(self, drafted: int, finish: str = "stop") -> None:
        """The last chunk, the usage chunk with `timings`, then [DONE]."""
        tokens = sum(count for _, count in self.steps)
        accepted = sum(count for source, count in self.steps if source == "draft")
        last = {"index": 0, "finish_reason": finish, **({"delta": {}} if self.chat else {"text": ""})}
        self._event({"id": "x", "created": 0, "model": "scripted.gguf", "choices": [last]})
        timings = {"prompt_n": 3, "prompt_ms": 1.0, "predicted_n": tokens, "predicted_ms": 100.0,
                   "predicted_per_second": 10.0 * tokens, "draft_n": drafted, "draft_n_accepted": accepted}
        self._event({"id": "x", "created": 0, "model": "scripted.gguf", "choices": [], "timings": timings})
        self.driver.execute_script("window.scriptedPush('data: [DONE]\\n\\n'); window.scriptedStream.close();")
        settle(self.driver)
        self.steps = []

    def fail(self, message: str) -> None:
        """An error event in place of the answer (the server's shape), then the stream's end."""
        self._event({"error": {"message": message, "type": "server_error", "param": None, "code": None}})
        self.driver.execute_script("window.scriptedStream.close();")
        settle(self.driver)

    def _event(self, data: dict) -> None:
        self.driver.execute_script("window.scriptedPush(arguments[0]);", f"data: {json.dumps(data)}\n\n")

    def requests(self) -> list[dict]:
        return self.driver.execute_script("return window.scriptedRequests")

    def shown(self, script: str):
        """What `script` (run in the page, with the last answer as `answer`) returns, once the
        page has shown what was pushed (it writes once a frame)."""
        self.driver.execute_async_script("requestAnimationFrame(() => requestAnimationFrame(arguments[0]));")
        return self.driver.execute_script(
            "const answers = document.querySelectorAll('#conversation .message.assistant');"
            "const answer = answers[answers.length - 1];" + script)


# --- served as it should be ----------------------------------------------------------------


def test_the_page_is_four_files_with_a_policy_that_allows_only_this_origin(embedded_server):
    base = page_url(embedded_server)
    page = httpx.get(base, timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert "unsafe" not in policy and "http" not in policy, "no inline code, no other host"
    assert page.headers["x-content-type-options"] == "nosniff"
    for asset, kind in (("markdown.js", "text/javascript"), ("page.js", "text/javascript"), ("page.css", "text/css")):
        response = httpx.get(base + asset, timeout=10)
        assert response.status_code == 200 and response.headers["content-type"].startswith(kind)
        assert response.content == (STATIC / asset).read_bytes()
    assert httpx.head(base, timeout=10).status_code == 200
    html = page.text
    scripts = ['<script src="markdown.js" defer>', '<script src="page.js" defer>']
    assert re.findall(r"<script\b[^>]*>", html) == scripts, "two scripts, from files, in order"
    assert not re.search(r"\son[a-z]+\s*=", html) and "style=" not in html, "no inline handlers or styles"
    assert not re.search(r"(src|href)=\"(https?:)?//", html), "nothing from another host"
    for name in ("markdown.js", "page.js"):
        script = (STATIC / name).read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in script, f"{name} must put model output in as text, not through {sink}"


# --- a base model: the completion box ------------------------------------------------------------


def test_a_copy_heavy_answer_shows_both_sources_and_joins_to_the_apis_text(browser, embedded_server):
    open_page(browser, embedded_server)
    assert find(browser, "#compose:not([hidden])"), "no key asked for: the server has none"
    assert "base model" in find(browser, "#prompt-label")[0].text, "Gemma has no chat template: a completion box"
    options = [option.get_attribute("value") for option in find(browser, "#draft option")]
    assert options == ["ngram", "none"], "the server's own draft first; no draft model loaded"
    ask(browser, COPY_PROMPT, 64)
    spans = answer_spans(browser)
    sources = {source for source, _ in spans}
    assert sources == {"draft", "target"}, spans
    runs, usage = streamed_runs(embedded_server, {"prompt": COPY_PROMPT, "max_tokens": 64, "temperature": 0,
                                                  "draft": "ngram", "draft_tokens": "auto"}, "/completions")
    assert joined(spans) == joined(runs), "the page shows the text the API returns"
    titles = {span.get_attribute("title") for span in find(browser, "#conversation span.draft")}
    assert titles == {"drafted by n-gram lookup"}, "who drafted, in /v1/models' words"
    accepted = int(stat(browser, "accepted"))
    assert accepted > 0 and int(stat(browser, "drafted")) >= accepted
    assert int(stat(browser, "tokens")) == usage["completion_tokens"] == 64
    assert stat(browser, "finish") == "length" and stat(browser, "rate").endswith("%")
    assert float(stat(browser, "speed")) > 0 and stat(browser, "first").endswith(" ms")
    assert int(stat(browser, "steps").split()[0]) < 64, "drafted steps write several tokens each"
    bars = browser.execute_script("""
        const canvas = document.getElementById('chart');
        const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
        let painted = 0;
        for (let i = 3; i < pixels.length; i += 4) if (pixels[i] > 0) painted += 1;
        return painted;""")
    assert bars > 0, "the chart drew the steps"
    draft_style = browser.execute_script("""
        const style = getComputedStyle(document.querySelector('#conversation span.draft'));
        const other = getComputedStyle(document.querySelector('#conversation span.target'));
        return [style.textDecorationLine, style.color, other.textDecorationLine, other.color];""")
    assert draft_style[0] == "underline" and draft_style[2] == "none", "a cue besides colour"
    assert draft_style[1] != draft_style[3], "two colours"
    screenshot(browser, "serve-page.png")


def test_the_page_follows_a_dark_scheme(browser, embedded_server):
    open_page(browser, embedded_server)
    light = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia",
                            {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    try:
        dark = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
        assert light == "rgb(255, 255, 255)" and dark != light
        ask(browser, COPY_PROMPT, 48)
        screenshot(browser, "serve-page-dark.png")
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})


def test_an_answer_holding_html_is_shown_as_text_and_never_runs(browser, embedded_server):
    open_page(browser, embedded_server)
    ask(browser, HOSTILE * 3 + "Row:", 48)
    answer = joined(answer_spans(browser))
    assert "<script>alert(1)</script>" in answer and "onerror=" in answer, "the model copied the markup: " + answer
    assert browser.execute_script("return window.alerts") == 0
    assert browser.execute_script("return window.pwned") is None
    assert not find(browser, "#conversation script, #conversation img, #conversation a, #conversation iframe")
    shown = find(browser, "#conversation .message.assistant")[-1].text
    assert "<script>alert(1)</script>" in shown, "shown as the characters it is"


def test_stop_closes_the_stream_and_the_server_cancels_the_generation(browser, embedded_server):
    open_page(browser, embedded_server)
    set_field(browser, "max-tokens", "100000")  # to the end of the context: far longer than the wait below
    set_field(browser, "temperature", "0")
    browser.execute_script("document.getElementById('prompt').value = arguments[0];", "Once upon a time")
    before = len(embedded_server.log)
    find(browser, "#send")[0].click()
    wait_for(lambda: len(answer_spans(browser)) >= 3, 60, "the first tokens")
    find(browser, "#stop")[0].click()
    settle(browser)
    assert stat(browser, "finish") == "stopped"
    notes = find(browser, "#conversation .message.assistant .note")
    assert notes and notes[-1].text == "stopped"
    wait_for(lambda: any(" 499 " in line for line in embedded_server.log[before:]), 30, "the server's cancel")
    ask(browser, COPY_PROMPT, 8)  # the server is free for the next request
    assert stat(browser, "finish") == "length"


# --- a chat model behind a key ---------------------------------------------------------------


def test_a_chat_behind_a_key_asks_for_it_and_keeps_it_in_memory_only(browser, chat_server):
    open_page(browser, chat_server)
    assert find(browser, "#key:not([hidden])") and find(browser, "#compose[hidden]")
    set_field(browser, "key-input", "wrong")
    find(browser, "#key button")[0].click()
    wait_for(lambda: "refused" in find(browser, "#error")[0].text, 10, "the wrong key's message")
    set_field(browser, "key-input", KEY)
    find(browser, "#key button")[0].click()
    wait_for(lambda: find(browser, "#compose:not([hidden])"), 10, "the chat")
    assert find(browser, "#prompt-label")[0].text == "Message"
    set_field(browser, "system", "You are a painter.")
    ask(browser, "Name three colours.", 24)
    headers = {"Authorization": f"Bearer {KEY}"}
    system = {"role": "system", "content": "You are a painter."}
    messages = [system, {"role": "user", "content": "Name three colours."}]
    first, _ = streamed_runs(chat_server, {"messages": messages, "max_tokens": 24, "temperature": 0,
                                           "draft": "ngram", "draft_tokens": "auto"}, "/chat/completions", headers)
    assert_shown_with_provenance(answer_spans(browser), first)
    ask(browser, "And three more.", 24, enter=True)
    messages += [{"role": "assistant", "content": joined(first)}, {"role": "user", "content": "And three more."}]
    runs, _ = streamed_runs(chat_server, {"messages": messages, "max_tokens": 24, "temperature": 0,
                                          "draft": "ngram", "draft_tokens": "auto"}, "/chat/completions", headers)
    assert_shown_with_provenance(answer_spans(browser), runs)  # sent with the system prompt and the first turn
    assert [element.text for element in find(browser, "#conversation .message.user")] == \
        ["you\nName three colours.", "you\nAnd three more."]
    kept = browser.execute_script("return [localStorage.length, sessionStorage.length, document.cookie]")
    assert kept == [0, 0, ""], "the key is kept nowhere but in memory"
    screenshot(browser, "serve-page-chat.png")
    browser.refresh()
    wait_for(lambda: find(browser, "#key:not([hidden])"), 10, "a reloaded page asking again")


def test_a_chat_answer_with_code_is_rendered_with_its_provenance(browser, chat_server):
    open_page(browser, chat_server)
    set_field(browser, "key-input", KEY)
    find(browser, "#key button")[0].click()
    wait_for(lambda: find(browser, "#compose:not([hidden])"), 10, "the chat")
    ask(browser, CODE_ASK, 120, enter=True)
    runs, _ = streamed_runs(chat_server, {"messages": [{"role": "user", "content": CODE_ASK}], "max_tokens": 120,
                                          "temperature": 0, "draft": "ngram", "draft_tokens": "auto"},
                            "/chat/completions", {"Authorization": f"Bearer {KEY}"})
    fenced = re.search(r"```(\w*)\n(.*?)\n```", joined(runs), re.S)
    assert fenced, "SmolLM2 answers this with a fenced block: " + joined(runs)
    code = browser.execute_script("""
        const answers = document.querySelectorAll('#conversation .message.assistant');
        const code = answers[answers.length - 1].querySelector('pre code');
        return code && [code.textContent, code.dataset.language || ''];""")
    assert code == [fenced.group(2), fenced.group(1)], "the block's text, as code, without its fences"
    spans = answer_spans(browser)
    assert_shown_with_provenance(spans, runs)
    assert {source for source, _ in spans} == {"draft", "target"}, spans
    screenshot(browser, "serve-page-code.png")


def test_the_header_follows_the_draft_settings_and_enter_adds_a_line_to_a_completion(browser, embedded_server):
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    open_page(browser, embedded_server)
    assert find(browser, "#drafting")[0].text == "draft: ngram · draft tokens: auto"
    set_field(browser, "draft-tokens", "4")
    assert find(browser, "#drafting")[0].text == "draft: ngram · draft tokens: 4"
    Select(find(browser, "#draft")[0]).select_by_value("none")
    assert find(browser, "#drafting")[0].text == "draft: none"
    assert not find(browser, "#draft-tokens")[0].is_enabled()
    prompt = find(browser, "#prompt")[0]
    prompt.send_keys("def area(width, height):" + Keys.ENTER + "    return")
    assert prompt.get_attribute("value") == "def area(width, height):\n    return", "Enter adds a line here"
    assert not find(browser, "#conversation .message") and find(browser, "#send:enabled")
    assert not find(browser, "#system-field")[0].is_displayed(), "a completion takes no system prompt"
    ask(browser, COPY_PROMPT, 16, draft="none")
    assert {source for source, _ in answer_spans(browser)} == {"target"}, "sent as the header says: no draft"
    assert stat(browser, "drafted") == "0" and stat(browser, "accepted") == "0"


def test_a_lost_server_is_named_and_the_panel_does_not_stay_busy(browser):
    with serving("--no-memory") as server:
        open_page(browser, server)
        set_field(browser, "max-tokens", "100000")
        set_field(browser, "temperature", "0")
        browser.execute_script("document.getElementById('prompt').value = arguments[0];", "Once upon a time")
        find(browser, "#send")[0].click()
        wait_for(lambda: len(answer_spans(browser)) >= 3, 60, "the first tokens")
        server.process.kill()
        server.process.wait(timeout=30)
        settle(browser)
    assert find(browser, "#error")[0].text == "lost the server mid-answer: the connection closed before the answer's end"
    assert stat(browser, "finish") == "lost"
    shown = [find(browser, "#stat-" + name)[0].text for name in ("speed", "tokens", "drafted", "rate", "steps")]
    assert "…" not in shown, "nothing in the panel waits for an answer that will not come: " + str(shown)
    assert find(browser, "#conversation .message.assistant .note")[-1].text == "the server was lost here"
    assert answer_spans(browser), "what was written stays"
    browser.execute_script("document.getElementById('prompt').value = arguments[0];", "Hello")
    find(browser, "#send")[0].click()
    wait_for(lambda: "cannot reach" in find(browser, "#error")[0].text, 30, "the next request's message")
    assert find(browser, "#error")[0].text == "cannot reach the server: is specli serve still running?"
    settle(browser)


# --- the page's own behaviour, on a scripted stream --------------------------------------------


def test_markdown_and_code_are_built_as_elements_span_by_span(browser, page_server):
    page = Scripted(browser, page_server)
    page.send()
    pushed = [("target", "Here is **bold", 1), ("draft", "** text and `co", 3), ("target", "de` too.\n\n```py", 1),
              ("draft", "thon\ndef f(x):\n    return x", 6)]
    for source, text, tokens in pushed:
        page.push(text, source, tokens)
    streaming = page.shown("return Array.from(answer.querySelectorAll('pre code span'))"
                           ".map((span) => [span.className, span.textContent]);")
    assert streaming == [["draft", "def f(x):\n    return x"]], "code shows as code before its fence closes"
    assert [stat(browser, name) for name in ("tokens", "accepted", "share", "drafted")] == ["11", "9", "82%", "…"]
    hostile = ' + 1\n```\n- one\n- <b>two</b> <img src=x onerror="window.pwned=1">\n'
    page.push(hostile, "target")
    pushed.append(("target", hostile, 1))
    page.end(drafted=12)
    built = page.shown("""
        const spans = (selector) => Array.from(answer.querySelectorAll(selector))
            .map((span) => [span.className, span.textContent]);
        return {
            strong: spans('p strong span'), code: spans('p code span'), pre: spans('pre code span'),
            language: answer.querySelector('pre code').dataset.language,
            items: Array.from(answer.querySelectorAll('ul > li')).map((item) => item.textContent),
            shown: answer.querySelector('.body').textContent,
            elements: answer.querySelectorAll('.body b, .body img, .body script, .body a').length,
        };""")
    assert built["strong"] == [["target", "bold"]]
    assert built["code"] == [["draft", "co"], ["target", "de"]], "one code span, written by two sources"
    assert built["pre"] == [["draft", "def f(x):\n    return x"], ["target", " + 1"]]
    assert built["language"] == "python"
    assert built["items"] == ["one", '<b>two</b> <img src=x onerror="window.pwned=1">'], "HTML stays text"
    assert built["elements"] == 0 and browser.execute_script("return window.pwned") is None
    in_code = page.shown("""
        const look = (selector) => { const style = getComputedStyle(answer.querySelector(selector));
            return [style.textDecorationLine, style.backgroundColor]; };
        return [look('pre code span.draft'), look('p code span.draft'), look('p span.draft')];""")
    # Code keeps its underscores and indentation: a tint, no underline; prose keeps the underline.
    assert [line for line, _ in in_code] == ["none", "none", "underline"], in_code
    assert in_code[0][1] not in ("rgba(0, 0, 0, 0)", "transparent"), "drafted code is tinted"
    assert not any(mark in built["shown"] for mark in ("```", "**", "`", "- one")), built["shown"]
    assert_shown_with_provenance(answer_spans(browser), [(source, text) for source, text, _ in pushed])
    assert [stat(browser, name) for name in ("tokens", "accepted", "drafted", "rate")] == ["12", "9", "12", "75%"]


def test_drafted_and_acceptance_count_live_from_the_chunks(browser, page_server):
    """Each step's first chunk says how many tokens it drafted: the page counts drafted and the
    acceptance while the answer streams (forced tokens are no drafts), then takes the timings."""
    page = Scripted(browser, page_server)
    page.send()

    def stats(*names):
        page.shown("return 0;")  # once the page has shown what was pushed
        return [stat(browser, name) for name in names]

    page.push("The", "target")
    assert stats("drafted", "rate") == ["…", "…"], "nothing drafted yet"
    page.push(" three primary", "draft", 2, drafted=3)
    page.push(" colours", "target")
    page.push(": {", "draft", 2, proposer="grammar")
    page.push("red", "target")
    assert stats("accepted", "drafted", "rate") == ["4", "3", "67%"]
    page.push(", blue", "draft", 2, drafted=4)
    page.push(" and", "target")
    assert stats("drafted", "rate") == ["7", "57%"]
    assert stats("steps")[0].split()[0] == "4", "a forced run and the token after it are one step"
    page.end(drafted=7)
    assert stats("drafted", "rate") == ["7", "86%"], "at the end, the timings' figures"


def test_enter_sends_in_a_chat_and_shift_enter_adds_a_line(browser, page_server):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    page = Scripted(browser, page_server)
    assert find(browser, "#hint")[0].text == "Enter sends, Shift+Enter adds a line"
    prompt = find(browser, "#prompt")[0]
    prompt.send_keys("first line")
    ActionChains(browser).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
    prompt.send_keys("second line")
    assert prompt.get_attribute("value") == "first line\nsecond line" and page.requests() == []
    set_field(browser, "system", "Answer in French.")
    set_field(browser, "seed", "7")
    prompt.send_keys(Keys.ENTER)
    wait_for(page.requests, 10, "the request Enter sends")
    body = page.requests()[0]
    assert body["messages"] == [{"role": "system", "content": "Answer in French."},
                                {"role": "user", "content": "first line\nsecond line"}]
    assert body["seed"] == 7 and body["draft"] == "ngram" and body["draft_tokens"] == "auto"
    assert prompt.get_attribute("value") == ""
    page.push("Bonjour.", "target")
    page.end(drafted=0)
    assert [element.text for element in find(browser, "#conversation .message.user")] == \
        ["you\nfirst line\nsecond line"]


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completion"])
def test_the_answer_is_followed_unless_the_reader_scrolls_up(browser, page_server, chat):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.actions.wheel_input import ScrollOrigin

    page = Scripted(browser, page_server, chat=chat)
    view = find(browser, "#conversation")[0]
    position = "const view = document.getElementById('conversation'); " \
               "return [view.scrollTop, view.scrollHeight - view.scrollTop - view.clientHeight];"

    def lines(count: int) -> None:
        for _ in range(count):
            page.push("a line of the answer, then another\n", "draft" if len(page.steps) % 3 else "target")

    def wheel(pixels: int) -> None:
        ActionChains(browser).scroll_from_origin(ScrollOrigin.from_element(view), 0, pixels).perform()
        page.shown("return 0")  # the scroll lands

    page.send("Write.")
    lines(60)
    assert page.shown(position)[1] < 2, "the end of the answer is in view as it streams"
    assert page.shown("return document.getElementById('conversation').scrollTop") > 300, "it overflowed"
    wheel(-300)
    kept = page.shown(position)[0]
    lines(30)
    top, below = page.shown(position)
    assert top == kept and below > 300, "the reader scrolled up: the page leaves the view where it is"
    wheel(100_000)
    lines(10)
    assert page.shown(position)[1] < 2, "back at the end: followed again"
    page.end(drafted=80)
    wheel(-300)
    page.send("Again.")
    lines(40)
    assert page.shown(position)[1] < 2, "a new turn is followed, wherever the reader was"
    page.end(drafted=40)


def test_a_token_limit_is_noted_and_a_failed_send_leaves_no_counts_beside_the_dashes(browser, page_server):
    page = Scripted(browser, page_server)
    page.send()
    page.push("Once upon a time", "target", 4)
    page.end(drafted=0, finish="length")
    notes = [note.text for note in find(browser, "#conversation .message.assistant .note")]
    assert notes == ["cut at the token limit (Settings: Token limit)"]
    assert stat(browser, "finish") == "length"
    page.send("Again.")
    page.fail("the generation failed")
    shown = {name: stat(browser, name) for name in ("speed", "tokens", "accepted", "share", "drafted", "rate", "steps")}
    assert set(shown.values()) == {"–"}, shown
    assert stat(browser, "finish") == "error" and find(browser, "#error")[0].text == "the generation failed"


def test_at_420_px_the_stats_and_the_message_box_stay_in_view(browser, page_server):
    browser.set_window_size(420, 860)
    try:
        page = Scripted(browser, page_server)
        page.send()
        for line in range(80):
            page.push(f"Line {line} of a long answer.\n", "draft" if line % 3 else "target")
        page.end(drafted=60)
        seen = browser.execute_script("""
            const inView = (id) => {
                const box = document.getElementById(id).getBoundingClientRect();
                return box.height > 0 && box.top >= 0 && box.bottom <= window.innerHeight;
            };
            const ids = ['stats', 'stat-speed', 'stat-rate', 'stat-finish', 'prompt', 'send', 'conversation'];
            return [window.innerWidth, ids.filter((id) => !inView(id)),
                    document.scrollingElement.scrollHeight <= window.innerHeight];""")
        assert seen[0] <= 420 and seen[1] == [] and seen[2], seen
        heights = browser.execute_script("""
            const h = (selector) => Math.round(document.querySelector(selector).getBoundingClientRect().height);
            return {conversation: h('#conversation'), header: h('header'), stats: h('#stats'), compose: h('#compose'),
                    settings: h('#settings'), error: h('#error'), window: window.innerHeight};""")
        assert heights["conversation"] >= 0.5 * heights["window"], f"the conversation keeps most of the height: {heights}"
        assert stat(browser, "rate") == "88%", "53 of the 60 drafted, kept"
        assert stat(browser, "steps") == "28", "one line: the tokens per step are left out"
        screenshot(browser, "serve-page-420.png")
    finally:
        browser.set_window_size(1280, 860)


@pytest.fixture(scope="module")
def vision_server(smollm_path, tmp_path_factory):
    """SmolLM2 with a projector written in the test: a red image reads as " red", blue as " blue"."""
    from tests.support import synthetic_vision as sv

    folder = tmp_path_factory.mktemp("page-vision")
    projector = sv.write_projector(folder / "mmproj-smol.gguf", smollm_path)
    images = {colour: sv.write_image(folder / f"{colour}.png", sv.png_bytes(rgb))
              for colour, rgb in (("red", sv.RED), ("blue", sv.BLUE))}
    with serving("--target", smollm_path, "--mmproj", projector, "--no-memory") as server:
        yield server, images


def test_an_image_attached_by_the_picker_or_dropped_goes_with_the_message(browser, vision_server):
    server, images = vision_server
    question = "\nWhat colour is the image? Answer in one word."
    open_page(browser, server)
    wait_for(lambda: find(browser, "#attach:not([hidden])"), 10, "the image button of a model that takes images")
    browser.execute_script("document.getElementById('image').hidden = false;")  # a file input takes keys shown
    find(browser, "#image")[0].send_keys(str(images["red"]))
    wait_for(lambda: len(find(browser, "#attached img")) == 1, 10, "the attached image under the message box")
    ask(browser, question, 12)
    asked = find(browser, "#conversation .message.user")[-1]
    assert asked.find_elements("css selector", "img"), "the image is shown in the conversation"
    answer = joined(answer_spans(browser))
    assert "red" in answer.lower() and "blue" not in answer.lower(), answer
    assert not find(browser, "#attached img"), "sent: nothing stays attached"
    screenshot(browser, "serve-page-image.png")
    # A dropped file, as a browser hands it over: a DataTransfer on the drop event.
    data = images["red"].read_bytes().hex()  # (without an image this model says blue: red shows the image read)
    browser.execute_script("""
        const bytes = new Uint8Array(arguments[0].match(/../g).map((h) => parseInt(h, 16)));
        const transfer = new DataTransfer();
        transfer.items.add(new File([bytes], "red.png", { type: "image/png" }));
        document.getElementById('compose').dispatchEvent(new DragEvent('drop', { dataTransfer: transfer, bubbles: true }));
    """, data)
    wait_for(lambda: len(find(browser, "#attached img")) == 1, 10, "the dropped image")
    ask(browser, question, 12)
    answer = joined(answer_spans(browser))
    assert "red" in answer.lower(), answer
    history = browser.execute_script("return state.messages.map((m) => typeof m.content === 'string' ? 'text' : "
                                     "m.content.map((part) => part.type).join('+'))")
    assert history == ["image_url+text", "text", "image_url+text", "text"], "each turn keeps its image"


def test_a_model_without_a_projector_shows_no_image_button(browser, embedded_server):
    open_page(browser, embedded_server)
    wait_for(lambda: find(browser, "#compose:not([hidden])"), 10, "the page")
    assert find(browser, "#attach[hidden]")
