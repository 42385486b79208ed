"""`specli list --local` and `ollama:` references, against fake stores made in the test: a
Hugging Face cache, an Ollama store, an LM Studio folder and a llama.cpp cache, holding small
GGUFs written here with SmolLM2's real vocabulary (49152 tokens, BPE) and another family's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
from typer.testing import CliRunner

from specli.commands.cli import app
from specli.llama.gguf_header import read_header
from specli.models.local import catalog as catalog_module
from specli.models.local import local_models, pairs
from specli.models.local.stores import find_files, resolve_ollama, stores


@pytest.fixture(scope="module")
def smol_tokens(smollm_path) -> list[bytes]:
    return list(read_header(smollm_path).metadata["tokenizer.ggml.tokens"].values)


def write_model(path: Path, tokens: list[bytes], *, values: int, eos: int = 2, add_eos: bool = False,
                file_type: int = 15) -> Path:
    """A GGUF with a tokenizer and one tensor of `values` floats (its size orders the models)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_file_type(file_type)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(eos)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(add_eos)
    writer.add_tensor("weights", np.zeros(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def ollama_model(root: Path, name: str, tag: str, layers: list[dict], blob: Path | None = None) -> None:
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    if blob is not None:
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        digest = next(layer["digest"] for layer in layers if layer["mediaType"].endswith(".model"))
        blob.rename(root / "blobs" / digest.replace(":", "-"))


@pytest.fixture
def machine(tmp_path, smol_tokens):
    """Four stores: the same family at three sizes (one with another EOS, added), another
    family, and a few things that are wrong."""
    home = tmp_path / "home"
    hf, ollama, llama = tmp_path / "hf", tmp_path / "ollama", tmp_path / "llama"
    other = [f"tok{i}".encode() for i in range(len(smol_tokens))]
    # Hugging Face cache: a blob, linked from a snapshot.
    blob = write_model(hf / "models--org--big-GGUF" / "blobs" / "b1", smol_tokens, values=40_000)
    snapshot = hf / "models--org--big-GGUF" / "snapshots" / "c0ffee" / "big-q4_k_m.gguf"
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(blob)
    # Ollama: a GGUF tag, a safetensors tag, a manifest whose blob is missing.
    digest = "sha256:" + "a" * 64
    ollama_model(ollama, "smol", "small", [{"mediaType": "application/vnd.ollama.image.model", "digest": digest}],
                 write_model(tmp_path / "blob", smol_tokens, values=2_000))
    ollama_model(ollama, "st", "latest", [{"mediaType": "application/vnd.ollama.image.safetensors",
                                          "digest": "sha256:" + "b" * 64}])
    ollama_model(ollama, "gone", "latest", [{"mediaType": "application/vnd.ollama.image.model",
                                            "digest": "sha256:" + "c" * 64}])
    # LM Studio: the same family with another EOS that the tokenizer adds; another family.
    write_model(home / ".lmstudio" / "models" / "pub" / "repo" / "eos.gguf", smol_tokens, values=1_000, eos=7,
                add_eos=True)
    write_model(home / ".lmstudio" / "models" / "pub" / "other" / "other.gguf", other, values=500)
    # llama.cpp's cache: a truncated file and a symlink loop.
    llama.mkdir()
    (llama / "cut.gguf").write_bytes(blob.read_bytes()[:5000])
    (llama / "loop.gguf").symlink_to(llama / "loop.gguf")
    env = {"HF_HUB_CACHE": str(hf), "OLLAMA_MODELS": str(ollama), "LLAMA_CACHE": str(llama), "HOME": str(home),
           "SPECLI_CACHE": str(tmp_path / "cache")}
    return env, home


def test_list_local_finds_every_store_and_pairs_one_family(machine):
    env, home = machine
    result = CliRunner().invoke(app, ["list", "--local", "--json"], env=env)
    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    names = {model["name"]: model for model in listing["models"]}
    assert set(names) == {"org/big-GGUF/big-q4_k_m.gguf", "ollama:smol:small", "pub/repo/eos.gguf",
                          "pub/other/other.gguf"}
    assert names["ollama:smol:small"]["quantisation"] == "Q4_K_M" and names["ollama:smol:small"]["architecture"] == "llama"
    assert names["ollama:smol:small"]["vocabulary"] == names["org/big-GGUF/big-q4_k_m.gguf"]["vocabulary"]
    found = {(pair["target"], pair["draft"]): pair["through_text"] for pair in listing["pairs"]}
    assert found == {
        ("org/big-GGUF/big-q4_k_m.gguf", "ollama:smol:small"): False,  # llama.cpp's rule passes
        ("org/big-GGUF/big-q4_k_m.gguf", "pub/repo/eos.gguf"): True,  # another EOS, added: through text
        ("ollama:smol:small", "pub/repo/eos.gguf"): True,
    }
    problems = "\n".join(listing["problems"])
    assert "st:latest is not a GGUF model" in problems and "safetensors" in problems
    assert "gone:latest: its manifest names blob sha256:ccc" in problems
    assert "cut.gguf" in problems and "truncated" in problems
    assert "loop.gguf" in problems


def test_the_table_marks_through_text_drafts_and_problems_go_to_stderr(machine):
    env, _ = machine
    result = CliRunner().invoke(app, ["list", "--local"], env={**env, "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "pub/repo/eos.gguf*" in result.stdout and "drafts through text" in result.stdout
    assert "could not be read (-v says which)" in result.stderr
    verbose = CliRunner().invoke(app, ["list", "--local", "-v"], env={**env, "COLUMNS": "200"})
    assert "specli: ollama:gone:latest: its manifest names blob" in verbose.stderr
    assert "org/big-GGUF/big-q4_k_m.gguf" in verbose.stdout, "the rest of the list still prints"


def test_a_second_listing_reads_no_header(machine, monkeypatch):
    env, home = machine
    found = stores(env, home)
    summaries, _ = local_models(found, Path(env["SPECLI_CACHE"]) / "local.json")

    def no_reading(path):
        raise AssertionError(f"read {path} again")

    monkeypatch.setattr(catalog_module, "read_metadata", no_reading)
    again, _ = local_models(found, Path(env["SPECLI_CACHE"]) / "local.json")
    assert [s.name for s in again] == [s.name for s in summaries] and pairs(again) == pairs(summaries)


def test_an_ollama_reference_is_its_blob_in_place(machine):
    env, home = machine
    blob = resolve_ollama("ollama:smol:small", env, home)
    assert blob.parent.name == "blobs" and blob.name.startswith("sha256-")
    from specli.errors import ModelFileError

    with pytest.raises(ModelFileError, match="safetensors"):
        resolve_ollama("ollama:st", env, home)
    with pytest.raises(ModelFileError, match="no such model"):
        resolve_ollama("ollama:nothing:7b", env, home)


def test_an_unreadable_folder_is_one_line(machine, monkeypatch):
    """(Tests may run as root, whom permissions do not stop: the folder fails to list.)"""
    env, home = machine
    real_scandir = os.scandir
    unreadable = str(home / ".lmstudio" / "models" / "pub")

    def scandir(path="."):
        if os.fspath(path) == unreadable:
            raise PermissionError(13, "Permission denied", unreadable)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    files, problems = find_files(stores(env, home))
    assert any(f"cannot read {unreadable}: Permission denied" in line for line in problems)
    assert "org/big-GGUF/big-q4_k_m.gguf" in {file.name for file in files}


def test_draft_auto_picks_the_smallest_draft_that_passes_the_rule(machine, monkeypatch, capsys):
    from specli.decode.request import DraftKind
    from specli.drafts import resolve_models

    env, home = machine
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(Path, "home", lambda: home)
    big = Path(env["HF_HUB_CACHE"]) / "models--org--big-GGUF" / "snapshots" / "c0ffee" / "big-q4_k_m.gguf"
    models = resolve_models(None, str(big), "auto")
    assert models.draft == DraftKind.MODEL
    assert models.draft_model == resolve_ollama("ollama:smol:small", env, home), \
        "the direct draft, though eos.gguf is smaller (it drafts through text)"
    assert "--draft auto: drafting with ollama:smol:small" in capsys.readouterr().err
    other = home / ".lmstudio" / "models" / "pub" / "other" / "other.gguf"
    models = resolve_models(None, str(other), "auto")
    assert models.draft == DraftKind.NGRAM and models.draft_model is None
    assert "drafting with n-gram lookup" in capsys.readouterr().err


def test_headers_read_on_every_core_give_what_one_reader_gives(machine, monkeypatch):
    env, home = machine
    found = stores(env, home)
    serial, serial_problems = local_models(found, Path(env["SPECLI_CACHE"]) / "serial.json")
    monkeypatch.setattr(catalog_module, "PARALLEL_FROM", 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    parallel, parallel_problems = local_models(found, Path(env["SPECLI_CACHE"]) / "parallel.json")
    assert parallel == serial and parallel_problems == serial_problems


def test_drafts_lists_the_candidates_best_first(machine):
    env, home = machine
    big = Path(env["HF_HUB_CACHE"]) / "models--org--big-GGUF" / "snapshots" / "c0ffee" / "big-q4_k_m.gguf"
    result = CliRunner().invoke(app, ["drafts", str(big), "--json"], env=env)
    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    assert [(d["name"], d["through_text"]) for d in listing["drafts"]] == [
        ("ollama:smol:small", False), ("pub/repo/eos.gguf", True)]
    assert 0 < listing["drafts"][0]["size_ratio"] < 1
    table = CliRunner().invoke(app, ["drafts", "ollama:smol:small"], env={**env, "COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "pub/repo/eos.gguf" in table.stdout and "through text" in table.stdout
    other = CliRunner().invoke(app, ["drafts", str(home / ".lmstudio" / "models" / "pub" / "other" / "other.gguf")],
                               env=env)
    assert other.exit_code == 0 and "no model on this machine shares" in other.stderr
    missing = CliRunner().invoke(app, ["drafts", "no-such-model"], env=env)
    assert missing.exit_code == 1 and "no such pair, file or Ollama model" in missing.output


def test_drafts_hub_checks_candidates_from_their_first_bytes(machine, tmp_path, smol_tokens, monkeypatch):
    """A fake Hub on 127.0.0.1: two GGUFs of the target's vocabulary (one served by a server
    that ignores Range and sends the whole file) and one of another family. Each is judged from
    its first bytes; the reads stop at the header, well before the weights."""
    from tests.fakehub import FakeHub

    env, home = machine
    target = write_model(tmp_path / "target.gguf", smol_tokens, values=6_000_000)  # 24 MB of weights
    files = {
        "org/smol-small-GGUF": (write_model(tmp_path / "a.gguf", smol_tokens, values=1_500_000), False),
        "org/smol-tiny-GGUF": (write_model(tmp_path / "b.gguf", smol_tokens, values=1_000_000), True),
        "org/smol-other-GGUF": (write_model(tmp_path / "c.gguf", [f"x{i}".encode() for i in range(3000)],
                                            values=500_000), False),
    }
    with FakeHub() as hub:
        for repo, (path, ignores_range) in files.items():
            hub.add_file(repo, "model-q4_k_m.gguf", path.read_bytes(), ignores_range=ignores_range)
        result = CliRunner().invoke(app, ["drafts", str(target), "--hub", "--search", "smol", "--json"],
                                    env={**env, "HF_ENDPOINT": hub.url})
    assert result.exit_code == 0, result.output
    found = {entry["name"]: entry for entry in json.loads(result.stdout)["hub"]}
    assert set(found) == {"org/smol-small-GGUF/model-q4_k_m.gguf", "org/smol-tiny-GGUF/model-q4_k_m.gguf"}
    header = len(read_header(files["org/smol-tiny-GGUF"][0]).metadata["tokenizer.ggml.tokens"].values) * 8
    for name, entry in found.items():
        assert entry["through_text"] is False
        assert entry["header_bytes_fetched"] < 2 << 20, "the header, not the 4-6 MB of weights"
        assert entry["header_bytes_fetched"] > header


def test_drafts_of_a_hub_target_read_its_header_only(machine, tmp_path, smol_tokens):
    from tests.fakehub import FakeHub

    env, _ = machine
    target = write_model(tmp_path / "target.gguf", smol_tokens, values=6_000_000)
    with FakeHub() as hub:
        hub.add_file("org/smol-big-GGUF", "smol-big-Q4_K_M.gguf", target.read_bytes())
        served = {**env, "HF_ENDPOINT": hub.url}
        result = CliRunner().invoke(app, ["drafts", "org/smol-big-GGUF:Q4_K_M", "--json"], env=served)
        measured = CliRunner().invoke(app, ["drafts", "org/smol-big-GGUF:Q4_K_M", "--measure"], env=served)
        ranges = [request.range for request in hub.gets("smol-big-Q4_K_M.gguf")]
    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    assert listing["target"]["size_bytes"] == target.stat().st_size
    assert [d["name"] for d in listing["drafts"]][:1] == ["ollama:smol:small"], "local drafts for a remote target"
    assert measured.exit_code == 2 and "--measure loads the target" in measured.output
    assert ranges and all(r is not None and r.startswith("bytes=0-") for r in ranges), "range requests only"
    assert not (Path(env["HF_HUB_CACHE"]) / "models--org--smol-big-GGUF").exists(), "nothing downloaded"


@pytest.mark.slow  # loads a synthetic pair and measures it
def test_drafts_measure_stores_a_speedup_that_ranks_the_drafts(tmp_path, quiet_calibration):
    """A synthetic prefix pair (the draft is the target's first layers, SmolLM2's vocabulary)
    in a fake LM Studio folder: --measure loads it, times it against plain decoding, stores the
    speed-up, and the list shows it, as a later listing does without measuring."""
    from tests.support.synthetic import write_tiny_pair

    home = tmp_path / "home"
    folder = home / ".lmstudio" / "models" / "synthetic" / "tiny"
    folder.mkdir(parents=True)
    target, draft = write_tiny_pair(folder)
    env = {"HOME": str(home), "SPECLI_CACHE": str(tmp_path / "cache"), "HF_HUB_CACHE": str(tmp_path / "none"),
           "OLLAMA_MODELS": str(tmp_path / "none"), "LLAMA_CACHE": str(tmp_path / "none")}
    before = CliRunner().invoke(app, ["drafts", str(target), "--json"], env=env)
    assert before.exit_code == 0, before.output
    assert [d["speedup"] for d in json.loads(before.stdout)["drafts"]] == [None]
    measured = CliRunner().invoke(app, ["drafts", str(target), "--measure", "--json"], env=env)
    assert measured.exit_code == 0, measured.output
    gain = json.loads(measured.stdout)["drafts"][0]["speedup"]
    assert gain is not None and gain > 0
    again = CliRunner().invoke(app, ["drafts", str(target), "--json"], env=env)
    assert json.loads(again.stdout)["drafts"][0]["speedup"] == gain, "stored: read without loading"


def test_draft_auto_follows_measured_speedups(machine, monkeypatch, capsys):
    """A stored speed-up ranks first where it wins, and n-gram lookup drafts where the best
    measured draft would lose."""
    from specli.decode.request import DraftKind
    from specli.drafts import resolve_models

    env, home = machine
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    big = Path(env["HF_HUB_CACHE"]) / "models--org--big-GGUF" / "snapshots" / "c0ffee" / "big-q4_k_m.gguf"
    eos = home / ".lmstudio" / "models" / "pub" / "repo" / "eos.gguf"
    measured = {eos.resolve(): 1.6}
    models = resolve_models(None, str(big), "auto", speedup=lambda target, draft: measured.get(draft.resolve()))
    assert models.draft_model is not None and models.draft_model.resolve() == eos.resolve(), \
        "measured at 1.6x, it goes before the unmeasured direct draft"
    assert "measured 1.60x" in capsys.readouterr().err
    models = resolve_models(None, str(big), "auto", speedup=lambda target, draft: 0.8)
    assert models.draft == DraftKind.NGRAM
    assert "would lose (0.80x)" in capsys.readouterr().err


@pytest.mark.slow  # a subprocess that loads a synthetic pair
def test_the_stats_name_the_draft_model(tmp_path):
    import subprocess
    import sys

    from tests.support.synthetic import write_tiny_pair

    target, draft = write_tiny_pair(tmp_path)
    result = subprocess.run([sys.executable, "-m", "specli", "run", "--target", str(target), "--draft", str(draft),
                             "-c", "256", "-n", "4", "--json", "hello"], capture_output=True, text=True, timeout=300,
                            stdin=subprocess.DEVNULL, env={**os.environ, "SPECLI_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["draft_model"] == draft.name
    plain = subprocess.run([sys.executable, "-m", "specli", "run", "--target", str(target), "--draft", str(draft),
                            "-c", "256", "-n", "4", "hello"], capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL, env={**os.environ, "SPECLI_CACHE": str(tmp_path / "cache")})
    assert f"draft model {draft.name}" in plain.stderr


def test_an_ollama_blob_with_vision_tensors_is_refused_in_one_line(tmp_path, smol_tokens):
    root = tmp_path / "ollama"
    blob = tmp_path / "vision-blob"
    writer = gguf.GGUFWriter(str(blob), "gemma3")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(smol_tokens[:300])
    writer.add_tensor("token_embd.weight", np.zeros(64, dtype=np.float32))
    writer.add_tensor("v.patch_embd.weight", np.zeros(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ollama_model(root, "gemma3v", "4b", [{"mediaType": "application/vnd.ollama.image.model",
                                         "digest": "sha256:" + "e" * 64}], blob)
    result = CliRunner().invoke(app, ["run", "--target", "ollama:gemma3v:4b", "hello"],
                                env={"OLLAMA_MODELS": str(root)})
    assert result.exit_code == 1
    assert "ollama:gemma3v:4b bundles vision tensors in its blob (1, such as v.patch_embd.weight)" in result.output


def test_a_projector_beside_a_model_marks_it_and_is_never_a_model(machine):
    """An mmproj GGUF (`general.architecture` clip) in a model's folder: the model takes images
    (`projector` in --json, "(img)" in the table); the projector is neither listed nor paired."""
    env, home = machine
    projector = home / ".lmstudio" / "models" / "pub" / "repo" / "mmproj-eos-f16.gguf"
    writer = gguf.GGUFWriter(str(projector), "clip")
    writer.add_tensor("mm.0.weight", np.zeros(16, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    listing = json.loads(CliRunner().invoke(app, ["list", "--local", "--json"], env=env).stdout)
    names = {model["name"]: model for model in listing["models"]}
    assert "pub/repo/mmproj-eos-f16.gguf" not in names
    assert names["pub/repo/eos.gguf"]["projector"] == str(projector)
    assert names["ollama:smol:small"]["projector"] is None
    assert all("mmproj" not in pair["target"] + pair["draft"] for pair in listing["pairs"])
    table = CliRunner().invoke(app, ["list", "--local"], env={**env, "COLUMNS": "200"}).stdout
    assert "pub/repo/eos.gguf (img)" in table and "takes images" in table, table
