"""The page `specli serve` shows at `/`, in a real browser: headless Chromium driven by
selenium, against real server processes on 127.0.0.1 with the real models.

Chromium and its driver come from Debian's packages (`chromium`, `chromium-driver`), which
`.ci/run` installs; where they are missing these tests are skipped, unless
SPECLI_BROWSER_REQUIRED=1 (CI sets it) makes that a failure. Screenshots are kept in
`test-artifacts/` (or $SPECLI_TEST_ARTIFACTS) for a person to look at.

Every wait here is bounded in time.
"""

from __future__ import annotations

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
    with serving("--target", smollm_path, "--api-key", KEY) as server:
        yield server


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


def ask(driver, prompt: str, max_tokens: int, draft: str | None = None) -> None:
    """Fills the settings and the prompt, sends, and waits for the answer to end."""
    from selenium.webdriver.support.ui import Select

    set_field(driver, "max-tokens", str(max_tokens))
    set_field(driver, "temperature", "0")
    if draft is not None:
        Select(find(driver, "#draft")[0]).select_by_value(draft)
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


# --- served as it should be ----------------------------------------------------------------


def test_the_page_is_three_files_with_a_policy_that_allows_only_this_origin(embedded_server):
    base = page_url(embedded_server)
    page = httpx.get(base, timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert "unsafe" not in policy and "http" not in policy, "no inline code, no other host"
    assert page.headers["x-content-type-options"] == "nosniff"
    for asset, kind in (("page.js", "text/javascript"), ("page.css", "text/css")):
        response = httpx.get(base + asset, timeout=10)
        assert response.status_code == 200 and response.headers["content-type"].startswith(kind)
        assert response.content == (STATIC / asset).read_bytes()
    assert httpx.head(base, timeout=10).status_code == 200
    html = page.text
    assert re.findall(r"<script\b[^>]*>", html) == ['<script src="page.js" defer>'], "one script, from a file"
    assert not re.search(r"\son[a-z]+\s*=", html) and "style=" not in html, "no inline handlers or styles"
    assert not re.search(r"(src|href)=\"(https?:)?//", html), "nothing from another host"
    script = (STATIC / "page.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script, f"page.js must put model output in as text, not through {sink}"


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
    ask(browser, "Name three colours.", 24)
    first = answer_spans(browser)
    assert first, "an answer"
    ask(browser, "And three more.", 24)
    headers = {"Authorization": f"Bearer {KEY}"}
    messages = [{"role": "user", "content": "Name three colours."}, {"role": "assistant", "content": joined(first)},
                {"role": "user", "content": "And three more."}]
    runs, _ = streamed_runs(chat_server, {"messages": messages, "max_tokens": 24, "temperature": 0,
                                          "draft": "ngram", "draft_tokens": "auto"}, "/chat/completions", headers)
    assert joined(answer_spans(browser)) == joined(runs), "the second turn was sent with the first in its history"
    assert [element.text for element in find(browser, "#conversation .message.user")] == \
        ["you\nName three colours.", "you\nAnd three more."]
    kept = browser.execute_script("return [localStorage.length, sessionStorage.length, document.cookie]")
    assert kept == [0, 0, ""], "the key is kept nowhere but in memory"
    screenshot(browser, "serve-page-chat.png")
    browser.refresh()
    wait_for(lambda: find(browser, "#key:not([hidden])"), 10, "a reloaded page asking again")
