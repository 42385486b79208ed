"""MTP on files laid out as llama.cpp's converter writes them and as people download them:
Qwen3.5 (tests/support/synthetic_mtp.py's QWEN35_CONVERTED: more value than key heads in the
linear attention, a tied output, the MTP block's own output norm) and a GLM-4.5 mixture of
experts with its NextN block (write_tiny_glm4moe):

- the names are the converter's (tests/data/converter_tensor_names.json, from the vendored
  gguf-py the converter writes with);
- the whole file in F32, and quantized by llama.cpp's own llama_model_quantize to Q8_0 (the
  converter's --outtype) and Q4_K_M (every matrix Q4_K or Q6_K, no fallback);
- the converter's split: the `--no-mtp` trunk (which declares no NextN layers) with its
  `--mtp` file, found beside it or named as the draft.

Each drafts with its MTP layer, keeps drafts, and writes plain decoding's text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from tests.support.quantize import quantize
from tests.support.synthetic_mtp import QWEN35_CONVERTED, write_tiny_glm4moe, write_tiny_hybrid
from specli.commands.cli import app
from specli.llama import mtp
from specli.llama.gguf_header import read_header

pytestmark = pytest.mark.slow  # loads models

PROMPT = "The quick brown fox jumps over the lazy dog. Then"
SMALL = ("--no-chat", "-c", "256", "-t", "1", "--temp", "0", "-n", "32")
NAMES = json.loads((Path(__file__).parent / "data" / "converter_tensor_names.json").read_text())
GGML_Q8_0, GGML_Q4_K, GGML_Q6_K = 8, 12, 14  # ggml_type


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("converted")
    whole = write_tiny_hybrid(folder, QWEN35_CONVERTED, name="Qwen3.5-tiny-F32.gguf")
    files = {"F32": whole}
    for kind in ("Q8_0", "Q4_K_M"):
        files[kind] = quantize(whole, folder / f"Qwen3.5-tiny-{kind}.gguf", kind)
    files["trunk"] = write_tiny_hybrid(folder / "split", QWEN35_CONVERTED, name="Qwen3.5-tiny.gguf", trunk_only=True)
    files["sidecar"] = write_tiny_hybrid(folder / "split", QWEN35_CONVERTED, name="mtp-Qwen3.5-tiny.gguf", sidecar=True)
    files["alone"] = folder / "alone" / "Qwen3.5-tiny.gguf"
    files["alone"].parent.mkdir()
    files["alone"].write_bytes(files["trunk"].read_bytes())
    files["glm"] = write_tiny_glm4moe(folder / "glm")
    files["glm Q8_0"] = quantize(files["glm"], folder / "glm" / "tiny-glm4moe-Q8_0.gguf", "Q8_0")
    return files


def invoke(*args: object):
    return CliRunner().invoke(app, [str(arg) for arg in args])


def run_json(target, *args: object) -> tuple[list[int], dict]:
    result = invoke("run", "--target", target, *SMALL, "--json", *args, PROMPT)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return [r["id"] for r in records if r["type"] == "token"], records[-1]


def strangers(path: Path, arch: str) -> list[str]:
    """The tensors of the file at `path` whose names the converter does not write for `arch`."""
    patterns = [re.compile("^" + re.escape(name).replace(r"\{bid\}", r"\d+") + r"(\.(weight|bias))?$")
                for name in NAMES["architectures"][arch]]
    return sorted(t.name for t in read_header(path).tensors if not any(p.match(t.name) for p in patterns))


def test_the_files_are_laid_out_with_the_converters_names_and_quantized_as_named(converted):
    for name, arch in (("F32", "qwen35"), ("sidecar", "qwen35"), ("trunk", "qwen35"), ("glm", "glm4moe")):
        assert strangers(converted[name], arch) == [], name
    header = read_header(converted["F32"])
    names = {tensor.name for tensor in header.tensors}
    assert "blk.4.nextn.shared_head_norm.weight" in names and "output.weight" not in names  # tied
    meta = header.metadata
    assert meta["qwen35.ssm.time_step_rank"] == 2 * meta["qwen35.ssm.group_count"]  # value heads, key heads
    assert meta["qwen35.nextn_predict_layers"] == 1 and meta["qwen35.block_count"] == 5
    trunk = read_header(converted["trunk"]).metadata
    assert "qwen35.nextn_predict_layers" not in trunk and trunk["qwen35.block_count"] == 4  # as --no-mtp writes it
    assert mtp.is_sidecar(converted["sidecar"]) and not mtp.is_sidecar(converted["trunk"])
    for kind, types in (("Q8_0", {GGML_Q8_0}), ("Q4_K_M", {GGML_Q4_K, GGML_Q6_K})):
        matrices = {t.name: int(t.type) for t in read_header(converted[kind]).tensors if len(t.shape) == 2
                    and "conv1d" not in t.name}
        found = set(matrices.values())
        assert found and found <= types, (kind, found)
    assert GGML_Q4_K in found, "Q4_K_M's matrices are mostly Q4_K"


@pytest.mark.parametrize("kind", ["F32", "Q8_0", "Q4_K_M"])
def test_each_quantization_drafts_with_its_mtp_layer_and_writes_plain_text(converted, kind):
    assert mtp.nextn_layers(converted[kind]) == 1 and mtp.nextn_problem(converted[kind]) is None
    plain, _ = run_json(converted[kind], "--draft", "none")
    tokens, stats = run_json(converted[kind], "--draft", "mtp", "--no-ngram", "-k", "2")
    assert tokens == plain
    assert stats["proposer"] == "mtp" and stats["accepted"] > 0, stats
    assert stats["memory"]["recurrent_snapshots"] == 2


def test_the_converters_split_drafts_with_its_mtp_file_beside_it_or_named(converted):
    """The --no-mtp trunk declares no NextN layers: its MTP file is found by architecture,
    trunk depth and width (beside it, as llama.cpp's -hf downloads it), or named as the draft
    from elsewhere; it drafts as the whole file does. Alone, the trunk decodes plainly, and
    `--draft mtp` says what to do in one line."""
    trunk, alone = converted["trunk"], converted["alone"]
    assert mtp.sidecar_for(trunk) == converted["sidecar"] and mtp.nextn_layers(trunk) == 1
    plain, _ = run_json(trunk, "--draft", "none")
    whole, _ = run_json(converted["F32"], "--draft", "none")
    assert plain == whole, "the split's trunk is the whole file's"
    for draft in ("mtp", converted["sidecar"]):
        tokens, stats = run_json(alone if draft != "mtp" else trunk, "--draft", draft, "--no-ngram", "-k", "2")
        assert tokens == plain and stats["proposer"] == "mtp" and stats["accepted"] > 0, draft
    assert mtp.nextn_layers(alone) == 0
    assert run_json(alone, "--draft", "none")[0] == plain
    assert_one_line_error(invoke("run", "--target", alone, *SMALL, "--draft", "mtp", PROMPT), 2,
                          "has no NextN (MTP) layers", "mtp-*.gguf beside it")


def test_a_glm_mixture_of_experts_drafts_with_its_nextn_block_and_writes_plain_text(converted):
    """GLM-4.5's layout: a dense block, then routed and shared experts (sigmoid gating), q, k
    and v with biases, and one NextN block with its own output norm; in F32 and in Q8_0."""
    for name in ("glm", "glm Q8_0"):
        assert mtp.nextn_layers(converted[name]) == 1 and mtp.nextn_problem(converted[name]) is None
        plain, _ = run_json(converted[name], "--draft", "none")
        tokens, stats = run_json(converted[name], "--draft", "mtp", "--no-ngram", "-k", "2")
        assert tokens == plain, name
        assert 0 < stats["accepted"] < stats["drafted"], (name, stats)
