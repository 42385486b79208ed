"""specli pairs a draft with a target exactly when llama.cpp would.

The rule is llama.cpp's `common_speculative_are_compatible` (common/speculative.cpp, as vendored
by llama-cpp-python 0.3.36), checked in this order:

1. the same vocabulary type (SPM, BPE, ...);
2. the same add_bos flag, and the same BOS id when BOS is added;
3. the same add_eos flag, and the same EOS id when EOS is added;
4. vocabulary sizes at most 128 tokens apart;
5. the same text for every token id from 5 up to the smaller size.

Each case writes two tiny one-layer llama GGUFs (a few hundred tokens, about 100 kB) with
`tests.support.synthetic.write_model` and a vocabulary built here, loads both through llama.cpp,
and checks that specli refuses where llama.cpp refuses and accepts where it accepts. The verdicts
were checked against the vendored function itself, compiled and linked to the same libllama, on
these same files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specli.errors import VocabMismatchError
from specli.llama.backend import LoadSettings, Model
from specli.llama.vocab import VOCAB_CHECK_START_TOKEN_ID, VOCAB_MAX_SIZE_DIFFERENCE, check_vocab_compatible

gguf = pytest.importorskip("gguf")
synthetic = pytest.importorskip("tests.support.synthetic")

pytestmark = pytest.mark.slow

ARRAY, STRING, BOOL = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING, gguf.GGUFValueType.BOOL
UINT32, INT32, FLOAT32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.INT32, gguf.GGUFValueType.FLOAT32
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6  # llama.cpp token types

# SentencePiece layout: ids 0-4 are special or plain words (below the compared range), then the
# 256 byte tokens, then words. Id 3 is a second end-of-turn token, as Gemma's <end_of_turn>.
HEAD = [(b"<unk>", UNKNOWN), (b"<s>", CONTROL), (b"</s>", CONTROL), (b"<eot>", CONTROL), ("\u2581a".encode(), NORMAL)]
WORDS = [f"\u2581w{i}".encode() for i in range(40)]


def gpt2_byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet: the 256 characters its BPE tokens are spelled in."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = [], 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def vocabulary(
    *,
    model: str = "llama",
    bos: int = 1,
    eos: int = 2,
    add_bos: bool = True,
    add_eos: bool = False,
    extra_tokens: int = 0,
    texts: dict[int, bytes] | None = None,
):
    """A tiny tokenizer: SentencePiece ("llama") or byte-level BPE ("gpt2"), with explicit flags."""
    if model == "llama":
        head = HEAD + [(f"<0x{byte:02X}>".encode(), BYTE) for byte in range(256)]
    else:
        head = HEAD + [(char.encode(), NORMAL) for char in gpt2_byte_chars()]
    tokens = [text for text, _ in head] + WORDS + [f"<extra_{i}>".encode() for i in range(extra_tokens)]
    types = [kind for _, kind in head] + [NORMAL] * len(WORDS) + [CONTROL] * extra_tokens
    for token, text in (texts or {}).items():
        tokens[token] = text
    fields = {
        "tokenizer.ggml.model": synthetic.MetadataValue(model.encode(), STRING),
        "tokenizer.ggml.tokens": synthetic.MetadataValue(tokens, ARRAY, STRING),
        "tokenizer.ggml.token_type": synthetic.MetadataValue(types, ARRAY, INT32),
        "tokenizer.ggml.bos_token_id": synthetic.MetadataValue(bos, UINT32),
        "tokenizer.ggml.eos_token_id": synthetic.MetadataValue(eos, UINT32),
        "tokenizer.ggml.unknown_token_id": synthetic.MetadataValue(0, UINT32),
        "tokenizer.ggml.add_bos_token": synthetic.MetadataValue(add_bos, BOOL),
        "tokenizer.ggml.add_eos_token": synthetic.MetadataValue(add_eos, BOOL),
    }
    if model == "llama":
        fields["tokenizer.ggml.scores"] = synthetic.MetadataValue([-float(i) for i in range(len(tokens))], ARRAY, FLOAT32)
    else:
        fields["tokenizer.ggml.pre"] = synthetic.MetadataValue(b"default", STRING)
        fields["tokenizer.ggml.merges"] = synthetic.MetadataValue(["\u0120 w".encode()], ARRAY, STRING)
    return synthetic.Vocabulary(Path("synthetic"), fields)


def write(path: Path, **vocab) -> Path:
    return synthetic.write_model(path, n_layer=1, n_embd=16, n_head=2, n_head_kv=1, n_ff=32, context_length=64, vocab=vocabulary(**vocab))


def check(tmp_path: Path, target: dict, draft: dict) -> None:
    """specli's verdict on a target and a draft written with these vocabulary settings."""
    settings = LoadSettings(ctx_size=64, gpu_layers=0)
    target_path, draft_path = write(tmp_path / "target.gguf", **target), write(tmp_path / "draft.gguf", **draft)
    with Model(target_path, settings) as target_model, Model(draft_path, settings) as draft_model:
        check_vocab_compatible(target_model, draft_model)


def refused(tmp_path: Path, target: dict, draft: dict) -> str:
    with pytest.raises(VocabMismatchError) as caught:
        check(tmp_path, target, draft)
    assert "draft draft.gguf and target target.gguf" in caught.value.message
    return caught.value.message


def test_the_synthetic_vocabularies_load_with_the_flags_they_declare(tmp_path):
    settings = LoadSettings(ctx_size=64, gpu_layers=0)
    spm = write(tmp_path / "spm.gguf", bos=3, eos=1, add_bos=False, add_eos=True, extra_tokens=2)
    bpe = write(tmp_path / "bpe.gguf", model="gpt2")
    with Model(spm, settings) as model:
        assert (model.vocab_type, model.bos, model.eos, model.add_bos, model.add_eos) == (1, 3, 1, False, True)
        assert model.n_vocab == len(HEAD) + 256 + len(WORDS) + 2
        assert model.token_text(4) == "\u2581a".encode()
    with Model(bpe, settings) as model:
        assert (model.vocab_type, model.bos, model.eos, model.add_bos, model.add_eos) == (2, 1, 2, True, False)


def test_identical_vocabularies_are_accepted(tmp_path):
    check(tmp_path, {}, {})


# --- 1. vocabulary type -------------------------------------------------------------------------


def test_a_different_vocabulary_type_is_refused(tmp_path):
    message = refused(tmp_path, {"model": "llama"}, {"model": "gpt2"})
    assert "different tokenizers (BPE vs SPM)" in message


def test_the_same_byte_level_bpe_type_is_accepted(tmp_path):
    check(tmp_path, {"model": "gpt2"}, {"model": "gpt2"})


# --- 2. BOS -------------------------------------------------------------------------------------


def test_a_different_add_bos_flag_is_refused(tmp_path):
    message = refused(tmp_path, {"add_bos": True}, {"add_bos": False})
    assert "disagree on the BOS token (draft 1, add=False; target 1, add=True)" in message


def test_a_different_bos_id_is_refused_when_bos_is_added(tmp_path):
    message = refused(tmp_path, {"bos": 1, "add_bos": True}, {"bos": 3, "add_bos": True})
    assert "disagree on the BOS token (draft 3, add=True; target 1, add=True)" in message


def test_a_different_bos_id_is_accepted_when_bos_is_not_added(tmp_path):
    check(tmp_path, {"bos": 1, "add_bos": False}, {"bos": 3, "add_bos": False})


# --- 3. EOS -------------------------------------------------------------------------------------


def test_a_different_add_eos_flag_is_refused(tmp_path):
    message = refused(tmp_path, {"add_eos": True}, {"add_eos": False})
    assert "disagree on the EOS token (draft 2, add=False; target 2, add=True)" in message


def test_a_different_eos_id_is_refused_when_eos_is_added(tmp_path):
    message = refused(tmp_path, {"eos": 2, "add_eos": True}, {"eos": 3, "add_eos": True})
    assert "disagree on the EOS token (draft 3, add=True; target 2, add=True)" in message


def test_gemma_like_eos_ids_are_accepted_when_eos_is_not_added(tmp_path):
    """Gemma 3 GGUFs add BOS, not EOS, and their converters set EOS to 106 or to 1."""
    check(tmp_path, {"eos": 3, "add_eos": False}, {"eos": 2, "add_eos": False})


# --- 4. size --------------------------------------------------------------------------------------


def test_sizes_more_than_128_apart_are_refused(tmp_path):
    message = refused(tmp_path, {"extra_tokens": VOCAB_MAX_SIZE_DIFFERENCE + 1}, {})
    assert f"(more than {VOCAB_MAX_SIZE_DIFFERENCE} apart)" in message


def test_sizes_128_apart_are_accepted(tmp_path):
    """As Qwen2.5 0.5B (151936 tokens) drafting Qwen2.5 7B (152064)."""
    check(tmp_path, {"extra_tokens": VOCAB_MAX_SIZE_DIFFERENCE}, {})
    check(tmp_path, {}, {"extra_tokens": VOCAB_MAX_SIZE_DIFFERENCE})


# --- 5. token texts -------------------------------------------------------------------------------

LAST_WORD = len(HEAD) + 256 + len(WORDS) - 1


def test_a_different_token_text_from_id_5_is_refused(tmp_path):
    message = refused(tmp_path, {}, {"texts": {LAST_WORD: "\u2581other".encode()}})
    assert f"differ at token id {LAST_WORD}" in message


def test_the_first_compared_id_is_5(tmp_path):
    assert VOCAB_CHECK_START_TOKEN_ID == 5
    message = refused(tmp_path, {}, {"texts": {5: b"<0x01>", 6: b"<0x00>"}})  # two byte tokens swapped
    assert "differ at token id 5" in message


def test_a_different_token_text_below_id_5_is_accepted(tmp_path):
    check(tmp_path, {}, {"texts": {4: "\u2581z".encode(), 3: b"<end_of_turn>"}})


def test_texts_past_the_smaller_vocabulary_are_not_compared(tmp_path):
    check(tmp_path, {"extra_tokens": 3}, {"extra_tokens": 5, "texts": {LAST_WORD + 4: b"<other>"}})
