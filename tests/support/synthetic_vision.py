"""Tiny multimodal projector ("mmproj") GGUFs and test images, written in-process.

`write_projector` writes a LLaVA-1.5-type projector (`clip.projector_type`
"mlp") for an existing text GGUF: a CLIP vision tower with no transformer
blocks (`block_count` 0, so clip.cpp runs none), a 28x28 input cut into four
14x14 patches, and the two-layer MLP `mm.0` -> GELU -> `mm.2`. An image is
four image tokens, whatever its size (mtmd letterboxes it to 28x28); on a
CPU the first encode takes about 0.1 s, most of it graph set-up. Writing one
takes about 2 s for SmolLM2 (9 s for Gemma 3): gguf.GGUFReader parses the
vocabulary.

The weights are closed-form, not random, so that the image decides the answer:

* pixels are normalised to [-1, 1] (mean 0.5, std 0.5 per channel);
* the patch convolution averages each patch's red channel into feature 0 and
  its blue channel into feature 1 (features 2-3 are zero);
* with x = (R - B) / 2 averaged over the patch (1 for pure red, -1 for pure
  blue, 0.07 for clip.cpp's grey padding), `mm.0` computes u = G(x - t) and
  u - c for red and the same of -x for blue (G = 40, t = 0.2, c = 4);
* `mm.2` weighs (GELU(u) - GELU(u - c)) / c, a ramp that is exactly 1 once
  x >= t + c/G = 0.3 and about 0 below 0.15, into the text model's own input
  embedding of `red_word` (blue: `blue_word`), dequantized from
  `token_embd.weight`.

So every image token of a red image is the embedding of the token " red"
(to float32 rounding), and of a blue image that of " blue", even where the
image is letterboxed (a patch at least 30% red, or blue, saturates); a grey
image (R = B) gives zero vectors. For Gemma 3 (`gemma3` architecture)
llama.cpp scales text embeddings by sqrt(n_embd) but not image embeddings, so
the columns are scaled by sqrt(n_embd) there.

With SmolLM2-135M-Instruct and `CHAT_PROMPT` ("Which word does the image
show?") the greedy answers (llama-cpp-python 0.3.36, CPU) are
'The image shows the word "red" in the' and '... the word "blue" in the';
a grey image gives 'The image shows a person with a scar above their', and
the prompt without its marker '... a person with a scar across their'.
(The earlier "What colour is the image? Answer in one word." also works,
"The image is a shade of red." / "... blue.", but its no-image answer is
"blue" too.) Gemma 3 270M is a base model: after "<__media__> The colour of
the image is" it continues " a combination of red, yellow, and orange." and
" a combination of the blue and the green of the".

`write_mrope_pair` writes a synthetic Qwen2-VL (M-RoPE) text model and a
"qwen2vl_merger" projector, where an image chunk has fewer positions than
tokens. The image helpers write PNG and baseline JPEG bytes without Pillow,
and a truncated PNG for bad-input tests.
"""

from __future__ import annotations

import math
import os
import struct
import zlib
from pathlib import Path

import gguf
import numpy as np

from tests.support import synthetic

IMAGE_SIZE = 28
PATCH_SIZE = 14
RED = (255, 0, 0)
BLUE = (0, 0, 255)

# SmolLM2-Instruct's ChatML turn; <__media__> is mtmd_default_marker().
CHAT_PROMPT = ("<|im_start|>user\n<__media__>\nWhich word does the image show?<|im_end|>\n"
               "<|im_start|>assistant\n")
_SCALED_EMBEDDING_ARCHS = ("gemma3", "gemma3n", "gemma-embedding")  # tokens only, not images
_GAIN, _THRESHOLD, _RAMP = 40.0, 0.2, 4.0  # see the docstring


def _field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


def _token_id(reader: gguf.GGUFReader, word: str) -> int:
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = {bytes(field.parts[i]): n for n, i in enumerate(field.data)}
    stripped = word.lstrip(" ")
    candidates = [word] + (["\u0120" + stripped, "\u2581" + stripped] if stripped != word else [])
    for candidate in candidates:
        if candidate.encode() in tokens:
            return tokens[candidate.encode()]
    raise ValueError(f"{word!r} is not a single token of {reader.data.filename}")


def token_id(text_model_path: str | os.PathLike[str], word: str) -> int:
    """The id of the single token spelling `word` (a leading space as BPE "Ġ" or SentencePiece "▁")."""
    return _token_id(gguf.GGUFReader(text_model_path), word)


def token_embeddings(text_model_path: str | os.PathLike[str], ids: list[int]) -> np.ndarray:
    """Rows `ids` of the text model's `token_embd.weight`, dequantized to float32."""
    return _token_embeddings(gguf.GGUFReader(text_model_path), ids)


def _token_embeddings(reader: gguf.GGUFReader, ids: list[int]) -> np.ndarray:
    tensor = next(t for t in reader.tensors if t.name == "token_embd.weight")
    rows = np.asarray(tensor.data)[ids]  # one row per token, raw blocks when quantized
    return np.asarray(gguf.quants.dequantize(rows, tensor.tensor_type), dtype=np.float32)


def _mlp_weights(words: np.ndarray, d: int, n_merged: int) -> tuple[np.ndarray, ...]:
    """(mm.0 weight, mm.0 bias, mm.2 weight) of the colour-to-word MLP (module docstring).

    The MLP's input is `n_merged` patches' d features side by side (1 for LLaVA,
    4 for Qwen2-VL's 2x2 merger), and x is averaged over them.
    """
    mm0 = np.zeros((4, d), dtype=np.float32)
    mm0[0:2, :2] = (_GAIN / 2, -_GAIN / 2)  # G x, x = (R - B) / 2
    mm0[2:4, :2] = (-_GAIN / 2, _GAIN / 2)  # G (-x)
    mm0 = np.tile(mm0, (1, n_merged)) / n_merged
    mm0_bias = np.array([0.0, -_RAMP, 0.0, -_RAMP], dtype=np.float32) - _GAIN * _THRESHOLD
    ramp = np.array([[1.0, -1.0, 0.0, 0.0], [0.0, 0.0, 1.0, -1.0]], dtype=np.float32) / _RAMP
    return mm0, mm0_bias, (words.T @ ramp).astype(np.float32)  # mm.2: (n_embd, 4)


def _write_clip(path: Path, projector_type: str, words: np.ndarray, image_size: int, patch_size: int) -> Path:
    n_embd, d = words.shape[1], 4
    qwen = projector_type == "qwen2vl_merger"
    mm0, mm0_bias, mm2 = _mlp_weights(words, d, 4 if qwen else 1)
    patch = np.zeros((d, 3, patch_size, patch_size), dtype=np.float32)  # ggml [p, p, 3, d]
    patch[0, 0] = patch[1, 2] = 1.0 / patch_size**2  # feature 0: mean R, feature 1: mean B
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(path, "clip")
    w.add_string("clip.projector_type", projector_type)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    for key, value in [("image_size", image_size), ("patch_size", patch_size), ("embedding_length", d),
                       ("feed_forward_length", d), ("projection_dim", n_embd), ("block_count", int(qwen)),
                       ("attention.head_count", 1)]:
        w.add_uint32(f"clip.vision.{key}", value)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_tensor("v.patch_embd.weight", patch)
    if qwen:  # the second temporal frame's kernel; a still image is fed to both
        w.add_tensor("v.patch_embd.weight.1", np.zeros_like(patch))
        # One identity block: its output projections are zero. With none the graph
        # never reads the M-RoPE "positions" input and clip.cpp aborts setting it.
        for name in ("attn_q", "attn_k", "attn_v", "attn_out", "ffn_up", "ffn_down"):
            w.add_tensor(f"v.blk.0.{name}.weight", np.zeros((d, d), dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v"):
            w.add_tensor(f"v.blk.0.{name}.bias", np.zeros(d, dtype=np.float32))
    else:
        w.add_tensor("v.patch_embd.bias", np.zeros(d, dtype=np.float32))
        n_patches = (image_size // patch_size) ** 2
        w.add_tensor("v.position_embd.weight", np.zeros((n_patches, d), dtype=np.float32))
    w.add_tensor("mm.0.weight", mm0)
    w.add_tensor("mm.0.bias", mm0_bias)
    w.add_tensor("mm.2.weight", mm2)
    w.add_tensor("mm.2.bias", np.zeros(n_embd, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _word_embeddings(text_model_path, words: tuple[str, str], embedding_scale: float | None) -> np.ndarray:
    reader = gguf.GGUFReader(text_model_path)
    arch = _field(reader, "general.architecture")
    if embedding_scale is None:
        n_embd = int(_field(reader, f"{arch}.embedding_length"))
        embedding_scale = math.sqrt(n_embd) if arch in _SCALED_EMBEDDING_ARCHS else 1.0
    ids = [_token_id(reader, word) for word in words]
    return _token_embeddings(reader, ids) * np.float32(embedding_scale)  # (2, n_embd)


def write_projector(
    path: str | os.PathLike[str],
    text_model_path: str | os.PathLike[str],
    *,
    red_word: str = " red",
    blue_word: str = " blue",
    image_size: int = IMAGE_SIZE,
    patch_size: int = PATCH_SIZE,
    embedding_scale: float | None = None,
) -> Path:
    """Write an "mlp" mmproj whose red images embed as `red_word`, blue ones as `blue_word`.

    An image is (image_size / patch_size)^2 image tokens. `embedding_scale`
    multiplies the output embeddings; None means sqrt(n_embd) for
    architectures that scale text embeddings only (Gemma 3), else 1.
    """
    if image_size % patch_size:
        raise ValueError("image_size must be a multiple of patch_size")
    words = _word_embeddings(text_model_path, (red_word, blue_word), embedding_scale)
    return _write_clip(Path(path), "mlp", words, image_size, patch_size)


def write_mrope_pair(
    out_dir: str | os.PathLike[str],
    *,
    rope_sections: tuple[int, int, int, int] = (2, 3, 3, 0),
    seed: int = 0,
    **write_model_kwargs,
) -> tuple[Path, Path]:
    """Write a synthetic Qwen2-VL text model and its "qwen2vl_merger" projector.

    The text model is `synthetic.write_model`'s random llama model (shape
    defaults: 2 layers, n_embd 64, 4 heads of 16) rewritten as architecture
    `qwen2vl` with `rope.dimension_sections`, so llama.cpp runs it with M-RoPE
    and mtmd gives an image of w x h merged tokens max(w, h) positions. The
    projector has patch 14 and a 2x2 merger, so one image token is 28x28
    pixels and mtmd's 8-token minimum makes a 28x28 image 84x84: 9 tokens, 3
    positions. Its MLP is the colour-to-word one with " red" and " blue".
    `write_model_kwargs` go to `synthetic.write_model` (vocab, n_layer, ...).
    Returns (text model, mmproj).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shape = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_head_kv": 2, "n_ff": 128, **write_model_kwargs}
    llama = synthetic.write_model(out_dir / "qwen2vl-llama.gguf", seed=seed, **shape)
    text = out_dir / "qwen2vl-text.gguf"
    reader = gguf.GGUFReader(llama)
    w = gguf.GGUFWriter(text, "qwen2vl")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = synthetic._field_value(field)
        w.add_key_value(key.replace("llama.", "qwen2vl.", 1), value.value, value.type, value.sub_type)
    w.add_array("qwen2vl.rope.dimension_sections", list(rope_sections))
    for tensor in reader.tensors:
        w.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    del reader
    llama.unlink()
    words = _word_embeddings(text, (" red", " blue"), 1.0)
    return text, _write_clip(out_dir / "qwen2vl-mmproj.gguf", "qwen2vl_merger", words, 56, PATCH_SIZE)


# ---------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bytes(rgb: tuple[int, int, int] = RED, width: int = IMAGE_SIZE, height: int = IMAGE_SIZE) -> bytes:
    """A solid-colour 8-bit RGB PNG."""
    row = b"\x00" + bytes(rgb) * width  # filter type 0 (None)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header)
            + _png_chunk(b"IDAT", zlib.compress(row * height)) + _png_chunk(b"IEND", b""))


def truncated_png_bytes(rgb: tuple[int, int, int] = RED, width: int = IMAGE_SIZE,
                        height: int = IMAGE_SIZE, keep: float = 0.5) -> bytes:
    """A PNG cut off after `keep` of its bytes: the signature survives, the image data does not."""
    data = png_bytes(rgb, width, height)
    return data[: max(8, int(len(data) * keep))]


def _huffman_codes(counts: list[int], symbols: list[int]) -> dict[int, tuple[int, int]]:
    """Canonical JPEG Huffman codes: symbol -> (code, length)."""
    codes, code, k = {}, 0, 0
    for length, count in enumerate(counts, start=1):
        for _ in range(count):
            codes[symbols[k]] = (code, length)
            code, k = code + 1, k + 1
        code <<= 1
    return codes


_DC_COUNTS = [0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]  # ITU T.81 Annex K.3 luminance DC
_AC_COUNTS = [1] + [0] * 15  # one AC symbol: end-of-block, code "0"


def jpeg_bytes(rgb: tuple[int, int, int] = RED, width: int = IMAGE_SIZE, height: int = IMAGE_SIZE) -> bytes:
    """A solid-colour baseline JPEG (4:4:4, all quantizers 1): every block is its DC term."""
    r, g, b = rgb
    ycc = (0.299 * r + 0.587 * g + 0.114 * b,
           128 - 0.168736 * r - 0.331264 * g + 0.5 * b,
           128 + 0.5 * r - 0.418688 * g - 0.081312 * b)
    dc_values = [int(round(8 * (c - 128))) for c in ycc]  # the FDCT's DC term of a flat block
    dc_codes = _huffman_codes(_DC_COUNTS, list(range(12)))
    bits: list[int] = []

    def put(value: int, length: int) -> None:
        bits.extend((value >> i) & 1 for i in range(length - 1, -1, -1))

    n_mcus = ((width + 7) // 8) * ((height + 7) // 8)
    for mcu in range(n_mcus):
        for dc in dc_values:
            diff = dc if mcu == 0 else 0  # DC is coded as the change from the previous block
            size = abs(diff).bit_length()
            put(*dc_codes[size])
            put(diff if diff >= 0 else diff + (1 << size) - 1, size)
            put(0, 1)  # end of block
    bits.extend([1] * (-len(bits) % 8))
    scan = bytes(int("".join(map(str, bits[i:i + 8])), 2) for i in range(0, len(bits), 8))
    scan = scan.replace(b"\xff", b"\xff\x00")

    def segment(marker: int, payload: bytes) -> bytes:
        return struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload

    components = b"".join(bytes((i, 0x11, 0)) for i in (1, 2, 3))
    return (b"\xff\xd8"
            + segment(0xDB, b"\x00" + b"\x01" * 64)
            + segment(0xC0, struct.pack(">BHHB", 8, height, width, 3) + components)
            + segment(0xC4, b"\x00" + bytes(_DC_COUNTS) + bytes(range(12)))
            + segment(0xC4, b"\x10" + bytes(_AC_COUNTS) + b"\x00")
            + segment(0xDA, b"\x03" + b"".join(bytes((i, 0x00)) for i in (1, 2, 3)) + b"\x00\x3f\x00")
            + scan + b"\xff\xd9")


def write_image(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write image bytes to `path`; return it."""
    path = Path(path)
    path.write_bytes(data)
    return path
