"""Draft kinds are records (specli/drafts.py). A kind declared in one record, here in the
test and in no product file, runs through `run`, `serve` and /v1/models: what the session
loads for it (closed with the session), its proposer, its provenance and the page's label."""

from __future__ import annotations

import io
import json

import pytest
from fastapi.testclient import TestClient
from helpers import assert_one_line_error
from typer.testing import CliRunner

from specli import drafts
from specli.commands.cli import app
from specli.decode.proposers import Proposal
from specli.decode.request import GenerationRequest
from specli.errors import UsageError
from specli.llama.backend import LoadSettings
from specli.serve.app import ServerInfo, create_app
from specli.serve.worker import Worker
from specli.session import SessionSpec, open_session

pytestmark = pytest.mark.slow  # the embedded model, loaded

PROMPT = "1 1 1 1 1 1 1 1 1 1 1 1"  # the target goes on with " 1": the last two tokens again are kept


class Echo:
    """Proposes the last two committed tokens again, over and over, as many as it may."""

    name = "echo"
    cheap = False
    translated = False
    prior = None
    depth = None

    def prepare(self, prompt: list[int]) -> None:
        pass

    def lookup(self, tokens: list[int], most: int) -> Proposal:
        return Proposal()

    def propose(self, tokens: list[int], most: int) -> Proposal:
        return Proposal(tokens=[tokens[-2 + i % 2] for i in range(most)], key="echo", proposer="echo")

    def behind(self, tokens: list[int]) -> int:
        return 0


class Loaded:
    """What the session loads for the kind: counts the proposers built on it, and its closing."""

    def __init__(self) -> None:
        self.built, self.closed = 0, False

    def echo(self) -> Echo:
        self.built += 1
        return Echo()

    def close(self) -> None:
        self.closed = True


OPENED: list[Loaded] = []


def _load(spec, target, notice) -> Loaded:
    OPENED.append(Loaded())
    return OPENED[-1]


ECHO = drafts.Kind("echo", "echo: the last two tokens again", build=lambda loaded, target, request, matcher, lookup:
                   loaded.echo(), provenance="echo", label="the last tokens, again", load=_load)


@pytest.fixture
def echo_kind():
    OPENED.clear()
    drafts.register(ECHO)
    yield ECHO
    del drafts.KINDS[ECHO.name]


def _run(*args: str) -> dict:
    result = CliRunner().invoke(app, ["run", "-n", "24", "-c", "256", "--json", *args, PROMPT])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return {"text": "".join(line.get("text", "") for line in lines if line.get("type") == "token"), **lines[-1]}


def test_a_kind_declared_in_one_record_runs_through_run(gemma_path, echo_kind):
    plain = _run("--draft", "none")
    echoed = _run("--draft", "echo", "-k", "3")
    assert echoed["text"] == plain["text"] and echoed["proposer"] == "echo", "greedy drafted equals plain"
    assert echoed["accepted_by"].get("echo", 0) > 0 and echoed["drafted_by"]["echo"] >= echoed["accepted_by"]["echo"]
    assert len(OPENED) == 1 and OPENED[0].built == 1 and OPENED[0].closed, "loaded once, built once, closed"


def test_a_kind_declared_in_one_record_is_served_and_listed(gemma_path, echo_kind):
    spec = SessionSpec(gemma_path, target_load=LoadSettings(ctx_size=256, threads=1), loads=("echo",))
    with open_session(spec) as session:
        worker = Worker(session, queue=2, memory=False, measure=False)
        info = ServerInfo("gemma", gemma_path.name, "ngram", None, GenerationRequest(max_tokens=24), 0)
        with TestClient(create_app(worker, info, io.StringIO()), base_url="http://127.0.0.1:8080") as client:
            card = client.get("/v1/models").json()["data"][0]
            assert card["drafts"] == ["ngram", "echo", "none"], "the server's own first, plain decoding last"
            assert card["proposers"]["echo"] == "the last tokens, again", "the page's label, from the record"
            body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "draft_tokens": 3}
            plain = client.post("/v1/completions", json={**body, "draft": "none"}).json()
            echoed = client.post("/v1/completions", json={**body, "draft": "echo"}).json()
            assert echoed["choices"][0]["text"] == plain["choices"][0]["text"]
            spans = echoed["choices"][0]["spans"]
            assert any(span["source"] == "draft" and span["proposer"] == "echo" for span in spans), spans
            misspelt = client.post("/v1/completions", json={**body, "draft": "ecko"})
            assert misspelt.status_code == 400 and misspelt.json()["error"]["param"] == "draft"
            assert "no such draft kind" in misspelt.json()["error"]["message"] and "echo" in misspelt.text
    assert OPENED[0].closed, "closed with the session"


def test_a_kind_that_loads_something_is_offered_only_where_it_was_loaded(gemma_path, echo_kind):
    spec = SessionSpec(gemma_path, target_load=LoadSettings(ctx_size=256, threads=1))  # echo not asked for
    with open_session(spec) as session:
        worker = Worker(session, queue=2, memory=False, measure=False)
        info = ServerInfo("gemma", gemma_path.name, "ngram", None, GenerationRequest(max_tokens=4), 0)
        with TestClient(create_app(worker, info, io.StringIO()), base_url="http://127.0.0.1:8080") as client:
            assert client.get("/v1/models").json()["data"][0]["drafts"] == ["ngram", "none"]
            refused = client.post("/v1/completions", json={"prompt": PROMPT, "draft": "echo"})
            assert refused.status_code == 400 and "draft 'echo': not loaded" in refused.json()["error"]["message"]
    assert OPENED == [], "nothing loaded for it"


def test_the_word_model_is_the_pairs_draft_model_or_one_line(gemma_path):
    assert_one_line_error(CliRunner().invoke(app, ["run", "--draft", "model", "hi"]), 2, "--draft model", "--draft FILE")


def test_a_misspelt_or_unknown_kind_is_one_line(gemma_path):
    assert_one_line_error(CliRunner().invoke(app, ["run", "--draft", "ngrm", "hi"]), 2, "did you mean --draft ngram?")
    with pytest.raises(UsageError) as raised:
        drafts.get("echo")
    assert "no such draft kind" in raised.value.message and "ngram" in str(raised.value.hint)
    assert_one_line_error(CliRunner().invoke(app, ["run", "--draft", "auto", "-m", "no-pair", "hi"]), "no-pair")
