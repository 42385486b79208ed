"""Images in, speculation on: a projector written in the test (tests/support/synthetic_vision.py:
a red image embeds as " red", a blue one as " blue") over the real SmolLM2, so the answer
depends on the image and a test fails where the image is dropped."""

from __future__ import annotations

import base64
import json
import struct
import zlib

import pytest
from helpers import assert_one_line_error, serving
from typer.testing import CliRunner

from specli.commands.cli import app
from specli.decode.request import DraftKind, GenerationRequest
from specli.llama import vision
from specli.llama.backend import LoadSettings
from specli.models.resolve import projector_beside
from specli.prompt import prompt_with_images
from specli.session import SessionSpec, open_session
from specli.stream import stream
from tests.support import synthetic_vision as sv

pytestmark = pytest.mark.slow

QUESTION = "\nWhat colour is the image? Answer in one word."
# Text after the image that the answer copies: n-gram lookup drafts it.
COPY = ("\nCopy this line exactly, then stop: The red fox and the blue bird met at the old mill by the river "
        "every morning in spring.")


class Quiet:
    def start(self) -> None: ...
    def token(self, event) -> None: ...
    def step(self, record) -> None: ...
    def finish(self, stats) -> None: ...


@pytest.fixture(scope="module")
def files(smollm_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("vision")
    projector = sv.write_projector(folder / "mmproj-smol.gguf", smollm_path)
    red = sv.write_image(folder / "red.png", sv.png_bytes(sv.RED))
    blue = sv.write_image(folder / "blue.png", sv.png_bytes(sv.BLUE))
    return {"folder": folder, "projector": projector, "red": red, "blue": blue}


def _run(smollm_path, files, *args: str):
    return CliRunner().invoke(app, ["run", "--target", str(smollm_path), "--mmproj", str(files["projector"]),
                                    "-c", "1024", *args])


def _json(result) -> tuple[str, dict]:
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return "".join(line["text"] for line in lines if line["type"] == "token"), lines[-1]


def test_the_image_decides_the_answer(smollm_path, files):
    answers = {}
    for colour in ("red", "blue"):
        text, stats = _json(_run(smollm_path, files, "--image", str(files[colour]), "-n", "12", "--json", QUESTION))
        answers[colour] = text
        assert stats["images"] == 1 and stats["encode_seconds"] > 0
        assert stats["prompt_tokens"] == 25  # the 4 image positions among the prompt's
    assert "red" in answers["red"].lower() and "blue" not in answers["red"].lower(), answers
    assert "blue" in answers["blue"].lower() and "red" not in answers["blue"].lower(), answers


def test_greedy_with_an_image_is_plain_decodings_text_and_drafts_are_kept_after_it(smollm_path, files):
    image = ["--image", str(files["blue"]), "-n", "40", "--json", COPY]
    plain, plain_stats = _json(_run(smollm_path, files, "--draft", "none", *image))
    drafted, stats = _json(_run(smollm_path, files, "--draft", "ngram", "-k", "4", *image))
    assert drafted == plain and "old mill" in plain
    assert plain_stats["drafted"] == 0
    assert stats["accepted"] >= 10, stats  # lookup copies the text after the image


def test_a_kept_cache_holds_an_image_only_where_the_same_image_was(smollm_path, files):
    """A second prompt with the same image reuses what the cache holds past the image; one with
    another image decodes from that image on (a cached prefix never reaches into another image)."""
    spec = SessionSpec(smollm_path, target_load=LoadSettings(ctx_size=1024), projector=files["projector"])
    request = GenerationRequest(max_tokens=12, draft=DraftKind.NGRAM)
    with open_session(spec) as session:
        def answer(colour: str, question: str = QUESTION):
            image = vision.read_image_file(files[colour])
            tokens, media = prompt_with_images(session.projector, session.target, question, [image])
            engine = session.engine_for(request, images=True)
            outcome = stream(engine, tokens, Quiet(), media=media)
            first = tokens.index(next(t for t in tokens if t < 0))
            return outcome, first

        red, first = answer("red")
        assert red.stats.prompt_cached == 0 and "red" in red.text.lower()
        again, _ = answer("red", QUESTION + " ")
        assert again.stats.prompt_cached > first + 4 and again.stats.encode_seconds == 0  # nothing encoded again
        blue, _ = answer("blue")
        assert blue.stats.prompt_cached == first and blue.stats.encode_seconds > 0
        assert "blue" in blue.text.lower() and "red" not in blue.text.lower(), blue.text


def test_an_image_on_m_rope_takes_fewer_positions_than_embeddings_and_drafting_keeps_the_text(tmp_path):
    text_model, projector = sv.write_mrope_pair(tmp_path)
    image = vision.read_image(sv.png_bytes(sv.RED, 56, 56), "red.png")
    outputs = {}
    for draft in (DraftKind.NONE, DraftKind.NGRAM):
        spec = SessionSpec(text_model, target_load=LoadSettings(ctx_size=512), projector=projector)
        with open_session(spec) as session:
            assert session.projector.mrope
            tokens, media = prompt_with_images(session.projector, session.target, "the the the the", [image],
                                               chat=False)
            positions = sum(1 for token in tokens if token < 0)
            assert positions < media.cells - (len(tokens) - positions), "an image's positions are fewer than its cells"
            engine = session.engine_for(GenerationRequest(max_tokens=24, draft=draft, draft_tokens=3), images=True)
            outcome = stream(engine, tokens, Quiet(), media=media)
            assert session.target.n_past == len(tokens) + len(outcome.tokens) - 1  # positions, not cells
            outputs[draft] = outcome.tokens
    assert outputs[DraftKind.NGRAM] == outputs[DraftKind.NONE]


def _png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk + struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))


@pytest.mark.parametrize("name, data, fragment", [
    ("empty.png", b"", "is empty"),
    ("notes.png", b"these are notes, not pixels\n", "is not an image"),
    ("cut.png", sv.truncated_png_bytes(), "cut short"),
    ("huge.png", _png_header(20000, 20000), "20000x20000"),
])
def test_a_bad_image_is_one_line_before_any_model_loads(tmp_path, name, data, fragment):
    path = tmp_path / name
    path.write_bytes(data)
    result = CliRunner().invoke(app, ["run", "--target", str(tmp_path / "missing.gguf"), "--image", str(path), "hi"])
    assert_one_line_error(result, fragment)


def test_an_image_for_a_model_without_a_projector_or_with_another_models(smollm_path, gemma_path, files, tmp_path):
    result = CliRunner().invoke(app, ["run", "--target", str(smollm_path), "--image", str(files["red"]), "hi"])
    assert_one_line_error(result, 2, "no projector", "--mmproj")
    gemma_projector = sv.write_projector(tmp_path / "mmproj-gemma.gguf", gemma_path)  # 640 wide, not 576
    result = CliRunner().invoke(app, ["run", "--target", str(smollm_path), "--mmproj", str(gemma_projector),
                                      "--image", str(files["red"]), "hi"])
    assert_one_line_error(result, "could not load the projector")
    result = CliRunner().invoke(app, ["run", "--target", str(smollm_path), "--mmproj", str(smollm_path),
                                      "--image", str(files["red"]), "hi"])
    assert_one_line_error(result, "is not a projector")


def test_more_images_than_the_context_holds(smollm_path, files):
    many = [arg for _ in range(40) for arg in ("--image", str(files["red"]))]
    result = CliRunner().invoke(app, ["run", "--target", str(smollm_path), "--mmproj", str(files["projector"]),
                                      "-c", "128", *many, QUESTION])
    assert_one_line_error(result, "context holds 128")


def test_the_projector_beside_the_model_is_found(smollm_path, files, tmp_path):
    (tmp_path / "SmolLM2.gguf").symlink_to(smollm_path)
    (tmp_path / "mmproj-SmolLM2.gguf").symlink_to(files["projector"])
    (tmp_path / "mmproj-other-model.gguf").symlink_to(files["projector"])
    assert projector_beside(tmp_path / "SmolLM2.gguf") == tmp_path / "mmproj-SmolLM2.gguf"
    result = CliRunner().invoke(app, ["run", "--target", str(tmp_path / "SmolLM2.gguf"), "-n", "12",
                                      "--image", str(files["red"]), QUESTION])
    assert result.exit_code == 0, result.output
    assert "red" in result.stdout.lower()  # (without the image: blue)


def _data_url(path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def test_served_image_url_parts_whole_and_streamed(smollm_path, files):
    import openai

    with serving("--target", smollm_path, "--mmproj", files["projector"]) as server:
        client = server.client()
        assert "multimodal" in client.models.list().data[0].model_dump()["capabilities"]

        def ask(colour: str, **extra):
            return dict(model="x", max_tokens=12, temperature=0, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": _data_url(files[colour])}},
                {"type": "text", "text": QUESTION}]}], **extra)

        whole = {colour: client.chat.completions.create(**ask(colour)).choices[0].message.content
                 for colour in ("red", "blue")}
        assert "red" in whole["red"].lower() and "blue" in whole["blue"].lower(), whole
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in
                           client.chat.completions.create(**ask("blue", stream=True)) if chunk.choices)
        assert streamed == whole["blue"]
        for url_given, fragment in (("https://example.com/cat.png", "does not fetch image URLs"),
                                    ("data:image/png;base64,bm90IGFuIGltYWdl", "not an image"),
                                    ("/etc/hostname", "data: URL")):
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(model="x", max_tokens=4, messages=[{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": url_given}}, {"type": "text", "text": "hi"}]}])
            assert fragment in refused.value.body["message"]
            assert refused.value.body["param"] == "messages[0].content[0]"
        # the server still answers after the refusals
        assert client.chat.completions.create(**ask("red")).choices[0].message.content == whole["red"]


def test_a_server_without_a_projector_refuses_images_by_name(smol_server):
    import httpx

    body = {"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(sv.png_bytes()).decode()}},
        {"type": "text", "text": "hi"}]}]}
    answer = httpx.post(f"{smol_server.url}/chat/completions", json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    assert "--mmproj" in answer.json()["error"]["message"]
    assert answer.json()["error"]["param"] == "messages[0].content[0]"


def test_a_draft_model_without_vision_drafts_from_the_text_alone(smollm_path, files):
    """SmolLM2 drafting for itself, as a model with no projector: it never sees the image's
    positions, its tokens are kept after the image, and the text is plain decoding's."""
    image = ["--image", str(files["red"]), "-n", "40", "--json", COPY]
    plain, _ = _json(_run(smollm_path, files, "--draft", "none", *image))
    drafted, stats = _json(_run(smollm_path, files, "--draft", str(smollm_path), "--no-ngram", "-k", "3", *image))
    assert drafted == plain
    assert stats["accepted_by"].get("draft", 0) >= 10, stats


def test_exact_and_seeded_runs_with_an_image(smollm_path, files, quiet_calibration):
    image = ["--image", str(files["blue"]), "-n", "24", "--json", COPY]
    exact_plain, _ = _json(_run(smollm_path, files, "--draft", "none", "--exact", *image))
    exact, stats = _json(_run(smollm_path, files, "--exact", "-k", "4", *image))
    assert exact == exact_plain
    assert stats["accepted"] > 0 or all(span["rows"] == 1 for span in stats["exact_batch"]), stats
    seeded = [_json(_run(smollm_path, files, "--temp", "0.8", "--seed", "7", *image))[0] for _ in range(2)]
    assert seeded[0] == seeded[1]
    other = _json(_run(smollm_path, files, "--temp", "0.8", "--seed", "7", "--image", str(files["red"]), "-n", "24",
                       "--json", COPY))[0]
    assert other != seeded[0], "the image is part of what a seed's draws follow"


def test_images_through_the_other_dialects_routes(smollm_path, files):
    """Ollama's `images`, Anthropic's image blocks and the Responses API's input_image become
    the chat route's image_url parts: each answers as chat does."""
    import httpx

    # (red: without its image this model answers blue, so each route's red says it read the image)
    red = base64.b64encode(files["red"].read_bytes()).decode()
    with serving("--target", smollm_path, "--mmproj", files["projector"]) as server:
        root = server.url.removesuffix("/v1")
        chat = server.client().chat.completions.create(model="x", max_tokens=12, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + red}},
            {"type": "text", "text": QUESTION}]}]).choices[0].message.content
        assert "red" in chat.lower(), chat
        ollama = httpx.post(f"{root}/api/chat", timeout=120, json={
            "model": "x", "stream": False, "options": {"num_predict": 12},
            "messages": [{"role": "user", "content": QUESTION, "images": [red]}]}).json()
        assert ollama["message"]["content"] == chat
        assert "vision" in httpx.post(f"{root}/api/show", json={"model": "x"}, timeout=30).json()["capabilities"]
        messages = httpx.post(f"{server.url}/messages", timeout=120, json={
            "model": "x", "max_tokens": 12, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": red}},
                {"type": "text", "text": QUESTION}]}]}).json()
        assert messages["content"][0]["text"] == chat
        responses = httpx.post(f"{server.url}/responses", timeout=120, json={
            "model": "x", "max_output_tokens": 12, "input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": "data:image/png;base64," + red},
                {"type": "input_text", "text": QUESTION}]}]}).json()
        assert responses["output"][0]["content"][0]["text"] == chat


def test_a_chat_attaches_an_image_to_a_turn_and_keeps_the_earlier_ones(smollm_path, files):
    lines = [f"/image {files['red']}", "Which word does the image show?", "/image /no/such.png",
             f"/image {files['blue']}", "And this one: which word does it show?", "/bye"]
    result = CliRunner().invoke(app, ["chat", "--target", str(smollm_path), "--mmproj", str(files["projector"]),
                                      "-n", "16", "-c", "1024", "--color", "never"], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    answers = [line for line in result.stdout.split(">>> ") if line.strip().startswith("The image")]
    assert len(answers) == 2 and "red" in answers[0] and "blue" in answers[1], result.stdout
    assert "image not found: /no/such.png" in result.stderr
    assert "new tokens" in result.stderr, "the second turn decodes only what is new (the first image stays cached)"


def test_a_prompt_that_ends_with_its_image_is_one_line(smollm_path, files):
    result = _run(smollm_path, files, "--no-chat", "--image", str(files["red"]), "The image: <__media__>")
    assert_one_line_error(result, "ends with an image")


def test_a_server_started_to_allow_image_urls_fetches_them_bounded(smollm_path, files):
    """--allow-image-urls: an http image URL (here a server on 127.0.0.1) is fetched; a missing
    one, or one that is not an image, is a 400 naming the part; the server answers on after."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(files["folder"]))
    handler.log_message = lambda *args: None
    images = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=images.serve_forever, daemon=True).start()
    (files["folder"] / "notes.png").write_text("not an image")
    base = f"http://127.0.0.1:{images.server_address[1]}"
    try:
        with serving("--target", smollm_path, "--mmproj", files["projector"], "--allow-image-urls") as server:
            client = server.client()

            def ask(url: str):
                return client.chat.completions.create(model="x", max_tokens=12, messages=[{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]}])

            assert "red" in ask(f"{base}/red.png").choices[0].message.content.lower()
            import openai

            for url, fragment in ((f"{base}/missing.png", "answered 404"), (f"{base}/notes.png", "not an image"),
                                  ("http://127.0.0.1:9/x.png", "could not be fetched")):
                with pytest.raises(openai.BadRequestError) as refused:
                    ask(url)
                assert fragment in refused.value.body["message"] and refused.value.body["param"] == "messages[0].content[0]"
            assert "red" in ask(f"{base}/red.png").choices[0].message.content.lower()
    finally:
        images.shutdown()
