"""`--draft mtp` wherever a draft kind goes: run (text, --json, --exact), bench's pricing with
-k auto, --draft auto, serve (the request field, /v1/models' drafts, spans' proposer), doctor,
the registry's `draft = "mtp"`, and the one-line refusals (exit 2). On tiny MiMo-2 and Qwen3.5
models written here (tests/support/synthetic_mtp.py); no downloads."""

from __future__ import annotations

import json

import httpx
import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from specli.commands.cli import app
from specli.decode.request import DraftKind, GenerationRequest
from specli.llama import mtp
from specli.llama.backend import LoadSettings
from specli.session import SessionSpec, open_session

pytestmark = pytest.mark.slow  # loads models

PROMPT = "The quick brown fox jumps over the lazy dog. Then"
SMALL = ("--no-chat", "-c", "256", "-t", "1", "--temp", "0", "-n", "32")


def invoke(*args: object):
    return CliRunner().invoke(app, [str(arg) for arg in args])


def run_json(target, *args: object) -> tuple[list[dict], dict, str]:
    result = invoke("run", "--target", target, *SMALL, "--json", *args, PROMPT)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return [r for r in records if r["type"] == "token"], records[-1], result.stderr


def texts(tokens: list[dict]) -> list[int]:
    return [t["id"] for t in tokens]


@pytest.mark.parametrize("k", ["1", "3"])
def test_greedy_run_with_mtp_writes_plain_decoding_s_tokens_and_names_its_proposer(mtp_files, k):
    plain, _, _ = run_json(mtp_files["chained"], "--draft", "none")
    tokens, stats, _ = run_json(mtp_files["chained"], "--draft", "mtp", "--no-ngram", "-k", k)
    assert texts(tokens) == texts(plain)
    assert stats["draft"] == "mtp" and stats["proposer"] == "mtp" and stats["accepted"] > 0
    assert {t.get("proposer") for t in tokens if t["source"] == "draft"} == {"mtp"}


def test_exact_mtp_writes_what_exact_plain_decoding_writes(mtp_files):
    plain, _, _ = run_json(mtp_files["chained"], "--draft", "none", "--exact")
    tokens, stats, _ = run_json(mtp_files["chained"], "--draft", "mtp", "-k", "2", "--exact")
    assert texts(tokens) == texts(plain) and stats["exact"] is True
    # Equal because drafts were verified, or because no batch above one row is exact on this
    # build and it decoded plainly, as its stats say (the tiny MiMo on this CPU: one row, with
    # or without its NextN layers loaded).
    assert stats["accepted"] > 0 or (stats["proposer"] == "none" and stats["drafted"] == 0), stats


def test_seeded_sampling_with_mtp_writes_plain_sampling_s_tokens(mtp_files):
    args = ("--temp", "0.8", "--seed", "7")
    plain, _, _ = run_json(mtp_files["chained"], "--draft", "none", *args)
    tokens, stats, _ = run_json(mtp_files["chained"], "--draft", "mtp", "-k", "2", *args)
    assert texts(tokens) == texts(plain)
    assert stats["drafted"] > 0 and stats["accepted"] > 0, "equal because drafts were verified, not skipped"


@pytest.mark.parametrize("k", ["2", "6"])
def test_a_hybrid_target_drafts_within_its_snapshots_and_greedy_equals_plain(mtp_files, k):
    plain, _, _ = run_json(mtp_files["hybrid"], "--draft", "none")
    tokens, stats, _ = run_json(mtp_files["hybrid"], "--draft", "mtp", "--no-ngram", "-k", k)
    assert texts(tokens) == texts(plain)
    assert 0 < stats["accepted"] < stats["drafted"], "drafts were kept and rejected ones taken back"


def test_a_target_llama_cpp_cannot_roll_back_decodes_plainly_saying_why(mtp_files):
    plain, _, _ = run_json(mtp_files["next"], "--draft", "none")
    result = invoke("run", "--target", mtp_files["next"], *SMALL, "--draft", "ngram", PROMPT)
    assert result.exit_code == 0, result.output
    said = [line for line in result.stderr.splitlines() if "roll back" in line]
    assert len(said) == 1 and "decoding plainly" in said[0]
    assert result.stdout.strip() == "".join(t["text"] for t in plain).strip()


def test_mtp_on_a_target_without_nextn_layers_is_one_line_exit_2(smollm_path):
    assert_one_line_error(invoke("run", "--target", smollm_path, "--draft", "mtp", "hi"), 2, "NextN")


def test_a_build_without_the_mtp_api_is_refused_in_one_line_and_doctor_says_so(mtp_files, monkeypatch):
    monkeypatch.setattr(mtp, "unsupported_reason", lambda: "this llama.cpp lacks llama_model_load_mtp")
    monkeypatch.setattr(mtp, "supports_mtp", lambda: False)
    result = invoke("run", "--target", mtp_files["chained"], *SMALL, "--draft", "mtp", PROMPT)
    assert_one_line_error(result, 2, "llama_model_load_mtp")
    from specli.diagnostics import check_backend

    assert "llama_model_load_mtp" in check_backend().mtp_unsupported


def test_doctor_names_a_target_s_nextn_layers(mtp_files, smollm_path):
    from specli.diagnostics import check_backend, check_model

    assert check_backend().mtp_unsupported is None
    spec = SessionSpec(target=mtp_files["chained"], target_load=LoadSettings(ctx_size=256, threads=1))
    assert check_model(spec).nextn_layers == 3
    assert check_model(SessionSpec(target=smollm_path, target_load=LoadSettings(ctx_size=256))).nextn_layers == 0
    state = check_model(SessionSpec(target=mtp_files["next"], target_load=LoadSettings(ctx_size=256, threads=1)))
    assert "roll back" in state.rewind_problem


def test_k_auto_prices_mtp_by_its_layers_and_measures_them(mtp_files, quiet_calibration):
    spec = SessionSpec(target=mtp_files["chained"], target_load=LoadSettings(ctx_size=256, threads=1), loads=("mtp",))
    with open_session(spec) as session:
        session.pricing.costs(measure=True)  # the target's curve first: seconds, not the prior's units
        priced = session.pricing.costs(measure=True, kind="mtp")
        # Measured and stored (a timing, so no ordering against the verify's is asserted: under load it flips).
        stored = session.pricing.store.get(session.pricing.drafter("mtp").key)
        assert priced.draft_per_token is not None and 0 < priced.draft_per_token == stored
        assert priced.draft_acceptance is not None and priced.draft_acceptance > 0.5
        # Agreement by depth, one per chained layer, as a run drafts (each layer fed its own states).
        assert len(priced.draft_depths) == 3 and all(0 <= a <= 1 for a in priced.draft_depths)
        assert priced.draft_depths[0] > 0.5
        engine = session.engine_for(GenerationRequest(max_tokens=24, draft=DraftKind.MTP))
        assert engine.proposer.name == "mtp+ngram"
        tokens = [e for e in engine.generate(session.target.tokenize(PROMPT)) if getattr(e, "id", -1) >= 0]
        assert tokens


def test_draft_auto_takes_mtp_unless_a_measured_draft_beats_it(mtp_files, tmp_path):
    from specli.drafts import MTP

    said: list[str] = []
    chosen = MTP.choose(mtp_files["chained"], lambda target, draft: None, said.append)
    assert chosen is not None and chosen.draft == "mtp" and chosen.draft_model is None
    assert "NextN" in said[-1]
    assert MTP.choose(mtp_files["chained"], lambda target, draft: 0.9 if draft is None else None, said.append) is None
    assert "lose" in said[-1]


def test_draft_auto_takes_a_measured_draft_model_over_unmeasured_mtp(mtp_files, smollm_path, monkeypatch):
    from types import SimpleNamespace

    from specli.drafts import MTP

    candidate = SimpleNamespace(draft=SimpleNamespace(name="small.gguf", path=str(smollm_path)))
    monkeypatch.setattr("specli.models.local.draft_candidates", lambda target, speedup=None: (None, [candidate]))
    said: list[str] = []
    gains = {None: None, smollm_path: 1.4}
    assert MTP.choose(mtp_files["chained"], lambda target, draft: gains[draft], said.append) is None
    assert "small.gguf measured 1.40x" in said[-1] and "not measured" in said[-1]
    gains[None] = 1.6  # measured, and better: MTP
    chosen = MTP.choose(mtp_files["chained"], lambda target, draft: gains[draft], said.append)
    assert chosen is not None and chosen.draft == "mtp"


def test_the_registry_takes_draft_mtp(tmp_path):
    from specli.models.registry import read_pairs

    toml = tmp_path / "models.toml"
    toml.write_text('[pairs.x]\ntarget = { path = "x.gguf" }\ndraft = "mtp"\n')
    pair = read_pairs(toml)["x"]
    assert pair.draft_kind == DraftKind.MTP and pair.models() == [("target", pair.target)]


def test_serve_drafts_with_mtp_on_request_and_lists_it(mtp_files):
    from tests.test_serve import serving, specli_run

    plain = specli_run("--target", mtp_files["chained"], "--no-chat", "--temp", "0", "-n", "24", "--draft", "none", PROMPT)
    with serving("--target", mtp_files["chained"], "--draft", "ngram") as server:
        client = server.client()
        card = client.models.list().data[0]
        assert card.model_extra["drafts"] == ["ngram", "mtp", "none"]
        whole = client.completions.create(model="x", prompt=PROMPT, max_tokens=24, temperature=0,
                                          extra_body={"draft": "mtp", "draft_tokens": 2})
        assert whole.choices[0].text.rstrip("\n") == plain.rstrip("\n")
        assert "mtp" in {span.get("proposer") for span in whole.choices[0].spans}


def test_drafts_lists_the_target_s_own_layers(mtp_files, smollm_path):
    listing = json.loads(invoke("drafts", mtp_files["chained"], "--json").stdout)
    assert listing["mtp"] == {"nextn_layers": 3, "speedup": None}
    assert "mtp" not in json.loads(invoke("drafts", smollm_path, "--json").stdout)


# --- NextN layers llama.cpp has no graph for: decided from the header, before anything opens ---


def test_the_table_says_which_architectures_draft_with_how_many_layers():
    assert mtp.graph_problem("mimo2", 3) is None and mtp.graph_problem("qwen35", 1) is None
    assert "takes one NextN layer" in mtp.graph_problem("qwen35", 2)
    assert "skips their tensors" in mtp.graph_problem("glm4", 1)
    assert "only the trunk" in mtp.graph_problem("nemotron_h", 1)
    assert "no MTP graph for llama" in mtp.graph_problem("llama", 1)  # not listed: refused


def _glm4_header_only(path):
    """A GLM-4 (dense) header with one NextN layer's tensor: llama.cpp skips such tensors and has
    no MTP graph for glm4. Its tensors are too few to load: nothing may try before refusing."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(path, "glm4")
    writer.add_block_count(3)
    writer.add_uint32("glm4.nextn_predict_layers", 1)
    writer.add_tensor("blk.2.nextn.eh_proj.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_mtp_on_an_architecture_without_an_mtp_graph_is_refused_before_loading(tmp_path):
    path = _glm4_header_only(tmp_path / "glm4-nextn.gguf")
    assert mtp.nextn_layers(path) == 0 and "glm4" in mtp.nextn_problem(path)
    assert_one_line_error(invoke("run", "--target", path, "--draft", "mtp", "hi"), 2, "no MTP graph")


def test_more_nextn_layers_than_the_graph_takes_never_reach_llama_cpp(mtp_files):
    """llama.cpp asserts one NextN layer on qwen35 and aborts the process (exit 134, tried
    with the guard lifted); specli decides from its table first."""
    path = mtp_files["two_on_one"]
    assert mtp.nextn_layers(path) == 0
    result = invoke("run", "--target", path, *SMALL, "--draft", "mtp", PROMPT)
    assert_one_line_error(result, 2, "takes one NextN layer")
    auto = invoke("run", "--target", path, *SMALL, "--draft", "auto", PROMPT)
    assert auto.exit_code == 0, auto.output
    said = [line for line in auto.stderr.splitlines() if "NextN" in line]
    assert len(said) == 1 and "takes one NextN layer" in said[0] and auto.stdout.strip()
    doctor = invoke("doctor", "--target", path)
    assert doctor.exit_code == 0 and "not usable" in doctor.stdout


def test_serve_on_a_file_whose_nextn_layers_cannot_draft_starts_and_answers(mtp_files):
    from helpers import serving

    from concurrent.futures import ThreadPoolExecutor

    with serving("--target", mtp_files["two_on_one"], "-c", "256") as server:
        client = server.client()
        with ThreadPoolExecutor(2) as pool:  # side by side in two of its sequences
            replies = list(pool.map(lambda prompt: client.completions.create(
                model="x", prompt=prompt, max_tokens=8, temperature=0), (PROMPT, PROMPT + " And")))
        health = httpx.get(server.url.removesuffix("/v1") + "/health", timeout=30).json()
    assert all(reply.choices[0].text for reply in replies)
    assert health["slots_idle"] == 4  # a hybrid target: llama-server's four slots by default
    assert any("requests cannot draft with 'mtp'" in line for line in server.log)
    assert any("has recurrent layers: KV" in line and "recurrent state" in line and "for 4 sequences" in line
               for line in server.log), server.log


def test_exact_sizes_are_measured_on_the_target_as_loaded_with_its_nextn_layers(mtp_files, monkeypatch):
    """The session loads such a target with its NextN layers (its trunk then runs otherwise):
    --exact's sizes are measured on that load, under a key of their own."""
    from specli import pricing
    from specli.pricing.keys import build_key, cost_store, exact_key

    opened = []
    load_target = mtp.load_target
    monkeypatch.setattr(mtp, "load_target", lambda path, *args, **kw: opened.append(path) or load_target(path, *args, **kw))
    load = LoadSettings(ctx_size=256, threads=1)
    caps = pricing.exact_caps(SessionSpec(target=mtp_files["one"], target_load=load), repacks=(True,), again=True)
    assert opened == [mtp_files["one"]] and caps[True].largest >= 1
    key = exact_key(mtp_files["one"], load, build_key())
    assert cost_store().get(key.beside("nextn")) == caps[True].to_json() and cost_store().get(key) is None


def test_an_mtp_file_named_as_the_draft_drafts_for_its_trunk_wherever_it_lies(tmp_path):
    """As llama.cpp's `-md mtp-*.gguf --spec-type draft-mtp`: `--draft FILE` naming an MTP file
    (NextN layers, no trunk) drafts with it for a trunk-only target in another folder; another
    model's MTP file, and a trunk without one, are refused in one line, exit 2."""
    import dataclasses

    from tests.support.synthetic_mtp import TINY_MTP, write_mtp_model

    trunk = write_mtp_model(tmp_path / "trunk" / "model.gguf", TINY_MTP, trunk_only=True)
    sidecar = write_mtp_model(tmp_path / "heads" / "mtp-model.gguf", TINY_MTP, sidecar=True)
    wider = write_mtp_model(tmp_path / "other" / "mtp-other.gguf", dataclasses.replace(TINY_MTP, n_embd=128),
                            sidecar=True)
    assert mtp.is_sidecar(sidecar) and not mtp.is_sidecar(trunk) and mtp.sidecar_for(trunk) is None
    plain, _, _ = run_json(trunk, "--draft", "none")
    tokens, stats, _ = run_json(trunk, "--draft", sidecar, "--no-ngram", "-k", "2")
    assert texts(tokens) == texts(plain)
    assert stats["draft"] == "mtp" and stats["proposer"] == "mtp" and stats["accepted"] > 0
    refused = invoke("run", "--target", trunk, *SMALL, "--draft", wider, PROMPT)
    assert_one_line_error(refused, 2, "mtp-other.gguf", "is not the MTP file of model.gguf")
    assert_one_line_error(invoke("run", "--target", trunk, *SMALL, "--draft", "mtp", PROMPT), 2,
                          "holds none of their tensors")


def test_k_auto_drafts_with_mtp_where_its_head_costs_less_than_the_trunk(tmp_path, quiet_calibration):
    """On a target whose plain step (16 trunk blocks) costs well over a NextN decode (one block
    and the output head), -k auto, priced on costs stored as a quiet machine measures them,
    drafts with the MTP layer and keeps drafts (the tiny files' head costs nearly a step: there
    auto rightly does not draft)."""
    from tests.support.synthetic_mtp import MtpSpec, write_mtp_model
    from helpers import generated

    path = write_mtp_model(tmp_path / "deep-mtp.gguf", MtpSpec(n_layer=16, n_nextn=1, n_embd=256, n_head=4,
                                                               n_head_kv=2, n_ff=1024, trunk_scale=0.25, dtype="f16"))
    spec = SessionSpec(target=path, target_load=LoadSettings(ctx_size=512, threads=1), loads=("mtp",))
    with open_session(spec) as session:
        verify = session.pricing.costs(measure=True)
        priced = session.pricing.costs(measure=True, kind="mtp")
        assert priced.draft_per_token is not None and priced.draft_per_token < 0.7 * verify.verify[1], \
            (priced.draft_per_token, verify.verify)
        engine = session.engine_for(GenerationRequest(max_tokens=64, draft=DraftKind.MTP, lookup=False))
        assert engine.proposer.name == "mtp"
        _, stats = generated(engine, session.target.tokenize(PROMPT))
    assert stats.drafted > 0 and stats.accepted > 0, stats
